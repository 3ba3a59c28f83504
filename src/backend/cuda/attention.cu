// Paged KV writes and causal paged attention over a ragged batch (prefill chunks, decode steps
// and verify windows in one launch). One block per (token, head) over the row's visible cached
// positions, chunk by chunk with an online softmax (details at attention_kernel). The order of
// every reduction depends only on the token's own row, so a row's output is the same alone or
// with neighbours (batch invariant).
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"

namespace specdec::cuda {
namespace {

constexpr int kThreads = 256;  // attention block size
constexpr int kChunk = kAttentionChunk;  // positions scored per pass, one per thread
static_assert(kChunk == kThreads, "one position per thread in the scoring pass");

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

// Reductions over the block whose result every thread gets; the combining order is fixed.
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float r = -INFINITY;
  for (int w = 0; w < warps; ++w) r = fmaxf(r, scratch[w]);
  return r;
}

// score = (q · k) * scale with k a head vector of D elements of T, in element order.
template <int D, typename T>
__device__ __forceinline__ float score_of(const float* s_q, const T* k) {
  constexpr int V = 16 / sizeof(T);
  const uint4* k4 = reinterpret_cast<const uint4*>(k);
  float dot = 0.0f;
#pragma unroll 4
  for (int v = 0; v < D / V; ++v) {
    const uint4 raw = __ldg(k4 + v);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int j = 0; j < V; ++j) dot = fmaf(s_q[v * V + j], to_float(e[j]), dot);
  }
  return dot;
}

// One block of kThreads per (token, head). The row's visible positions are taken in chunks of
// kChunk: (A) thread i scores position chunk + i (its own dot product, no shuffles); (B) the
// chunk's max and exponentials update the running max and sum (online softmax, chunk by chunk);
// (C) thread (d, s) accumulates dimension d of p·V over positions s, s + S, ... of the chunk.
// The S partial sums are added in order at the end. Every step's order depends only on the
// token's own row, so the result is batch invariant.
template <int D, typename T, bool kSplit>
__global__ void __launch_bounds__(kThreads) attention_kernel(AttentionArgs a) {
  constexpr int S = kThreads / D;  // position subsets of the p·V phase
  __shared__ float s_q[D];
  __shared__ float s_p[kChunk];
  __shared__ int s_slot[kChunk];
  __shared__ float s_red[32];
  __shared__ float s_acc[S * D];
  const int h = blockIdx.x, t = blockIdx.y, tid = threadIdx.x;

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
  const float* qv = a.q + (static_cast<int64_t>(t) * a.heads + h) * D;
  for (int i = tid; i < D; i += kThreads) s_q[i] = qv[i];
  __syncthreads();

  // kSplit: this block covers chunk blockIdx.z only, the last split also any chunks past it (only
  // when max_row_len understated the rows: still correct); otherwise all chunks in turn.
  const int c_begin = kSplit ? static_cast<int>(blockIdx.z) * kChunk : 0;
  const bool last_split = static_cast<int>(blockIdx.z) == a.max_splits - 1;
  const int c_end = kSplit && !last_split ? min(len, c_begin + kChunk) : len;
  if (kSplit && c_begin >= len && c_begin > 0) return;  // past this token's positions (block-uniform)
  const int d = tid % D, sub = tid / D;
  float m = -INFINITY, l = 0.0f, acc = 0.0f;
  for (int c0 = c_begin; c0 < c_end; c0 += kChunk) {
    const int n = min(kChunk, len - c0);
    // (A) scores
    float sc = -INFINITY;
    int slot = -1;
    if (tid < n) {
      const int p = c0 + tid;
      if (p / a.block_size < a.max_blocks) {
        const int64_t sl = static_cast<int64_t>(table[p / a.block_size]) * a.block_size + p % a.block_size;
        if (sl >= 0 && sl < pool_slots) slot = static_cast<int>(sl);  // a bad table entry skips the position
      }
      if (slot >= 0) sc = score_of<D>(s_q, kp + (static_cast<int64_t>(slot) * a.kv_heads + kvh) * D) * a.scale;
    }
    // (B) online softmax over chunks
    const float m_new = fmaxf(m, block_max(sc, s_red));
    if (m_new == -INFINITY) continue;  // nothing visible yet (block-uniform)
    const float e = slot >= 0 ? expf(sc - m_new) : 0.0f;
    s_p[tid] = e;
    s_slot[tid] = slot;
    const float corr = expf(m - m_new);  // 0 while nothing was seen (m = -inf)
    l = l * corr + block_sum(e, s_red);  // block_sum's barriers also publish s_p and s_slot
    acc *= corr;
    m = m_new;
    // (C) p·V
    if (sub < S) {
      for (int j = sub; j < n; j += S) {
        const int sl = s_slot[j];
        if (sl >= 0) acc = fmaf(s_p[j], to_float(vp[(static_cast<int64_t>(sl) * a.kv_heads + kvh) * D + d]), acc);
      }
    }
    __syncthreads();  // s_p and s_slot are rewritten by the next chunk
  }
  if (sub < S) s_acc[sub * D + d] = acc;
  __syncthreads();
  if constexpr (kSplit) {
    const int64_t pi = (static_cast<int64_t>(t) * a.heads + h) * a.max_splits + blockIdx.z;
    if (tid == 0) {
      a.partial_m[pi] = m;
      a.partial_l[pi] = l;
    }
    for (int i = tid; i < D; i += kThreads) {
      float sum = 0.0f;
      for (int k = 0; k < S; ++k) sum += s_acc[k * D + i];
      a.partial_acc[pi * D + i] = sum;
    }
  } else {
    float* o = a.out + (static_cast<int64_t>(t) * a.heads + h) * D;
    for (int i = tid; i < D; i += kThreads) {
      float sum = 0.0f;
      for (int k = 0; k < S; ++k) sum += s_acc[k * D + i];
      o[i] = l > 0.0f ? sum / l : 0.0f;  // a token with no visible position gets zeros
    }
  }
}

// Merges a token's splits in split order: with one split it reproduces the unsplit result bit
// for bit (the factors are expf(0) = 1).
__global__ void attention_merge_kernel(AttentionArgs a) {
  const int h = blockIdx.x, t = blockIdx.y, D = a.head_dim;
  int lo = 0, hi = a.rows - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (a.row_starts[mid] <= t) lo = mid; else hi = mid - 1;
  }
  const int len = min(a.positions[t] + 1, a.row_lens[lo]);
  const int splits = min(a.max_splits, max(0, (len + kChunk - 1) / kChunk));
  const int64_t base = (static_cast<int64_t>(t) * a.heads + h) * a.max_splits;
  float m_all = -INFINITY;
  for (int s = 0; s < splits; ++s) m_all = fmaxf(m_all, a.partial_m[base + s]);
  float l_all = 0.0f;
  for (int s = 0; s < splits; ++s)
    if (a.partial_l[base + s] > 0.0f) l_all += a.partial_l[base + s] * expf(a.partial_m[base + s] - m_all);
  float* o = a.out + (static_cast<int64_t>(t) * a.heads + h) * D;
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    float sum = 0.0f;
    for (int s = 0; s < splits; ++s)
      if (a.partial_l[base + s] > 0.0f) sum += a.partial_acc[(base + s) * D + i] * expf(a.partial_m[base + s] - m_all);
    o[i] = l_all > 0.0f ? sum / l_all : 0.0f;
  }
}

template <typename T, bool kSplit>
void launch_attention_typed(const AttentionArgs& a, cudaStream_t stream) {
  const dim3 grid(a.heads, a.tokens, kSplit ? a.max_splits : 1);
  switch (a.head_dim) {
    case 16: attention_kernel<16, T, kSplit><<<grid, kThreads, 0, stream>>>(a); break;
    case 32: attention_kernel<32, T, kSplit><<<grid, kThreads, 0, stream>>>(a); break;
    case 48: attention_kernel<48, T, kSplit><<<grid, kThreads, 0, stream>>>(a); break;
    case 80: attention_kernel<80, T, kSplit><<<grid, kThreads, 0, stream>>>(a); break;
    case 112: attention_kernel<112, T, kSplit><<<grid, kThreads, 0, stream>>>(a); break;
    case 64: attention_kernel<64, T, kSplit><<<grid, kThreads, 0, stream>>>(a); break;
    case 96: attention_kernel<96, T, kSplit><<<grid, kThreads, 0, stream>>>(a); break;
    case 128: attention_kernel<128, T, kSplit><<<grid, kThreads, 0, stream>>>(a); break;
    case 160: attention_kernel<160, T, kSplit><<<grid, kThreads, 0, stream>>>(a); break;
    case 192: attention_kernel<192, T, kSplit><<<grid, kThreads, 0, stream>>>(a); break;
    case 224: attention_kernel<224, T, kSplit><<<grid, kThreads, 0, stream>>>(a); break;
    case 256: attention_kernel<256, T, kSplit><<<grid, kThreads, 0, stream>>>(a); break;
    default: return;  // rejected by the backend before launch
  }
  if (kSplit) attention_merge_kernel<<<dim3(a.heads, a.tokens), 128, 0, stream>>>(a);
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
  if (args.max_splits > 1) {
    SPECDEC_DISPATCH_ELEM(args.pool_type, T, (launch_attention_typed<T, true>(args, stream)));
  } else {
    SPECDEC_DISPATCH_ELEM(args.pool_type, T, (launch_attention_typed<T, false>(args, stream)));
  }
}

}  // namespace specdec::cuda
