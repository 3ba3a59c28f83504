// Paged KV writes and causal paged attention over a ragged batch (prefill chunks, decode steps
// and verify windows in one launch). One block per (token, head): warp w visits the row's cached
// positions w, w + W, ... in increasing order, in groups of kUnroll, with an online softmax; the
// W partial states are then merged in warp order. The order depends only on the token's own row, so a row's output
// is the same alone or with neighbours (batch invariant).
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"

namespace specdec::cuda {
namespace {

constexpr int kAttnWarps = 16;

template <typename T>
__global__ void kv_write_kernel(const float* __restrict__ k, const float* __restrict__ v, T* __restrict__ k_pool,
                                T* __restrict__ v_pool, const int* __restrict__ slots, int width,
                                int64_t pool_slots) {
  const int t = blockIdx.x;
  const int slot = slots[t];
  if (slot < 0 || slot >= pool_slots) return;
  const float* ks = k + static_cast<int64_t>(t) * width;
  const float* vs = v + static_cast<int64_t>(t) * width;
  T* kd = k_pool + static_cast<int64_t>(slot) * width;
  T* vd = v_pool + static_cast<int64_t>(slot) * width;
  for (int i = threadIdx.x; i < width; i += blockDim.x) {
    kd[i] = from_float<T>(ks[i]);
    vd[i] = from_float<T>(vs[i]);
  }
}

// Lane l holds elements [l*E, l*E + E) of a head vector (E = head_dim / 32).
template <int E, typename T>
__device__ __forceinline__ void load_lane(const T* p, float* out) {
#pragma unroll
  for (int j = 0; j < E; ++j) out[j] = to_float(p[j]);
}

template <int E, typename T>
__global__ void __launch_bounds__(kAttnWarps * 32) attention_kernel(AttentionArgs a) {
  constexpr int D = E * 32;
  constexpr int kUnroll = E <= 4 ? 8 : 4;  // positions whose K/V loads a warp issues together
  __shared__ float s_m[kAttnWarps], s_l[kAttnWarps];
  __shared__ float s_acc[kAttnWarps][D];
  const int h = blockIdx.x, t = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  // The token's row: the last r with row_starts[r] <= t.
  int lo = 0, hi = a.rows - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (a.row_starts[mid] <= t) lo = mid; else hi = mid - 1;
  }
  const int r = lo;
  const int len = min(a.positions[t] + 1, a.row_lens[r]);
  const int kvh = h / (a.heads / a.kv_heads);
  const int* table = a.block_table + static_cast<int64_t>(r) * a.max_blocks;
  const T* kp = static_cast<const T*>(a.k_pool);
  const T* vp = static_cast<const T*>(a.v_pool);
  const int64_t pool_slots = a.pool_blocks * a.block_size;

  float q[E];
  load_lane<E>(a.q + (static_cast<int64_t>(t) * a.heads + h) * D + lane * E, q);

  float m = -INFINITY, l = 0.0f, acc[E];
#pragma unroll
  for (int j = 0; j < E; ++j) acc[j] = 0.0f;

  for (int p0 = warp; p0 < len; p0 += kAttnWarps * kUnroll) {
    float kv[kUnroll][E], vv[kUnroll][E];
    bool live[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int p = p0 + u * kAttnWarps;
      int64_t slot = -1;
      if (p < len && p / a.block_size < a.max_blocks) {
        const int block = table[p / a.block_size];
        slot = static_cast<int64_t>(block) * a.block_size + p % a.block_size;
      }
      live[u] = slot >= 0 && slot < pool_slots;  // a bad table entry skips the position
#pragma unroll
      for (int j = 0; j < E; ++j) kv[u][j] = vv[u][j] = 0.0f;
      if (live[u]) {
        const int64_t off = (slot * a.kv_heads + kvh) * D + lane * E;
        load_lane<E>(kp + off, kv[u]);
        load_lane<E>(vp + off, vv[u]);
      }
    }
    // Scores of the kUnroll positions (independent butterflies), then one online-softmax
    // update for the group: the max over the group first, one rescale of the running state.
    float sc[kUnroll];
    float m_new = m;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float dot = 0.0f;
#pragma unroll
      for (int j = 0; j < E; ++j) dot = fmaf(q[j], kv[u][j], dot);
      sc[u] = warp_sum(dot) * a.scale;
      if (live[u]) m_new = fmaxf(m_new, sc[u]);
    }
    if (m_new == -INFINITY) continue;  // no live position in this group (uniform across the warp)
    const float corr = expf(m - m_new);  // 0 while nothing was seen (m = -inf)
    l *= corr;
#pragma unroll
    for (int j = 0; j < E; ++j) acc[j] *= corr;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (!live[u]) continue;  // uniform across the warp
      const float e = expf(sc[u] - m_new);
      l += e;
#pragma unroll
      for (int j = 0; j < E; ++j) acc[j] = fmaf(e, vv[u][j], acc[j]);
    }
    m = m_new;
  }

  if (lane == 0) {
    s_m[warp] = m;
    s_l[warp] = l;
  }
#pragma unroll
  for (int j = 0; j < E; ++j) s_acc[warp][lane * E + j] = acc[j];
  __syncthreads();

  float m_all = -INFINITY;
  for (int w = 0; w < kAttnWarps; ++w) m_all = fmaxf(m_all, s_m[w]);
  float l_all = 0.0f;
  for (int w = 0; w < kAttnWarps; ++w)
    if (s_l[w] > 0.0f) l_all += s_l[w] * expf(s_m[w] - m_all);
  float* o = a.out + (static_cast<int64_t>(t) * a.heads + h) * D;
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    float sum = 0.0f;
    for (int w = 0; w < kAttnWarps; ++w)
      if (s_l[w] > 0.0f) sum += s_acc[w][i] * expf(s_m[w] - m_all);
    o[i] = l_all > 0.0f ? sum / l_all : 0.0f;  // a token with no visible position gets zeros
  }
}

template <typename T>
void launch_attention_typed(const AttentionArgs& a, cudaStream_t stream) {
  const dim3 grid(a.heads, a.tokens);
  const int threads = kAttnWarps * 32;
  switch (a.head_dim / 32) {
    case 1: attention_kernel<1, T><<<grid, threads, 0, stream>>>(a); break;
    case 2: attention_kernel<2, T><<<grid, threads, 0, stream>>>(a); break;
    case 3: attention_kernel<3, T><<<grid, threads, 0, stream>>>(a); break;
    case 4: attention_kernel<4, T><<<grid, threads, 0, stream>>>(a); break;
    case 5: attention_kernel<5, T><<<grid, threads, 0, stream>>>(a); break;
    case 6: attention_kernel<6, T><<<grid, threads, 0, stream>>>(a); break;
    case 7: attention_kernel<7, T><<<grid, threads, 0, stream>>>(a); break;
    case 8: attention_kernel<8, T><<<grid, threads, 0, stream>>>(a); break;
    default: break;  // rejected by the backend before launch
  }
}

}  // namespace

void launch_kv_write(const float* k, const float* v, void* k_pool, void* v_pool, ElemType pool_type,
                     const int* slots, int tokens, int kv_heads, int head_dim, int64_t pool_slots,
                     cudaStream_t stream) {
  if (tokens == 0) return;
  const int width = kv_heads * head_dim;
  SPECDEC_DISPATCH_ELEM(pool_type, T,
                        kv_write_kernel<T><<<tokens, 256, 0, stream>>>(k, v, static_cast<T*>(k_pool),
                                                                       static_cast<T*>(v_pool), slots, width,
                                                                       pool_slots));
}

void launch_attention(const AttentionArgs& args, cudaStream_t stream) {
  if (args.tokens == 0 || args.heads == 0) return;
  SPECDEC_DISPATCH_ELEM(args.pool_type, T, launch_attention_typed<T>(args, stream));
}

}  // namespace specdec::cuda
