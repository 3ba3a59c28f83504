// Paged KV writes and causal paged attention over a ragged batch (prefill chunks, decode steps
// and verify windows in one launch). A token's visible positions are cut into fixed chunks of
// kAttentionChunk; each chunk's softmax partial is computed by one code path and the partials are
// folded in chunk order, so a token's output bits depend only on its own q, row and length.
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"

namespace specdec::cuda {
namespace {

constexpr int kThreads = 256;  // attention block size: 8 warps
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = kAttentionChunk;  // positions of one chunk (one split)
constexpr int kGroup = kAttentionGroup;  // most q heads one block serves (they share a kv head)
static_assert(kChunk % 32 == 0 && kChunk <= kThreads && kGroup <= kWarps, "(B): a warp per head, lanes over positions");

template <typename T>
__global__ void kv_write_kernel(const float* __restrict__ k, const float* __restrict__ v, T* __restrict__ k_pool,
                                T* __restrict__ v_pool, const int* __restrict__ slots, int width, int64_t pool_slots) {
  enter_kernel();
  const int t = blockIdx.x;
  const int slot = slots[t];
  if (slot < 0 || slot >= pool_slots) return;
  store_kv_row(k, v, k_pool, v_pool, t, slot, width);
}

constexpr int pow2_ceil(int n) {
  int p = 1;
  while (p < n) p *= 2;
  return p;
}

// The running softmax state (max m, sum l, unnormalised p·V element acc) of one output element,
// and the one function that folds a chunk's partial into it. Both the in-block path and the
// merge kernel fold chunks in chunk order through fold(), with explicit fma/mul so no
// contraction choice can differ between them: the two paths give the same bits.
struct Running {
  float m = -INFINITY, l = 0.0f, acc = 0.0f;
};

__device__ __forceinline__ void fold(Running& r, float m_c, float l_c, float acc_c) {
  if (m_c == -INFINITY) return;  // a chunk with no visible position adds nothing
  if (r.m == -INFINITY) {        // the first chunk is taken as it is
    r.m = m_c;
    r.l = l_c;
    r.acc = acc_c;
    return;
  }
  const float m = fmaxf(r.m, m_c);
  const float c_run = expf(r.m - m), c_new = expf(m_c - m);
  r.l = fmaf(r.l, c_run, __fmul_rn(l_c, c_new));
  r.acc = fmaf(r.acc, c_run, __fmul_rn(acc_c, c_new));
  r.m = m;
}

__device__ __forceinline__ float finish(const Running& r) { return r.l > 0.0f ? r.acc / r.l : 0.0f; }

// The row r of token t (the last r with row_starts[r] <= t) and the token's visible cached
// positions (0 when none), found by the whole block at once: one parallel round of loads instead
// of a chain of dependent ones. Every thread gets both; s holds 2 ints. Contains barriers.
__device__ __forceinline__ int2 block_row_and_len(const AttentionArgs& a, int t, int* s) {
  if (threadIdx.x == 0) s[0] = s[1] = 0;  // kept only when the metadata is malformed
  __syncthreads();
  for (int i = threadIdx.x; i < a.rows; i += blockDim.x) {
    if (a.row_starts[i] <= t && (i + 1 == a.rows || a.row_starts[i + 1] > t)) {  // one i at most
      s[0] = i;
      s[1] = max(0, min(a.positions[t] + 1, a.row_lens[i]));
    }
  }
  __syncthreads();
  return make_int2(s[0], s[1]);
}

// One block of kThreads per (token, kv head, group of up to kGroup q heads[, chunk]). Per chunk of
// kChunk positions:
//  (A) scores: each position is scored by LP lanes of a warp, each lane dotting its 16-byte
//      vectors of the K row against every q head of the group (K read once for the group), then a
//      butterfly over the LP lanes;
//  (B) per head, one warp takes the chunk's max and exponentials (butterflies, fixed order);
//  (C) p·V: thread (sub, vec) accumulates 16-byte vector vec of the V rows of positions
//      sub, sub + S, ... for every head; the S subsets are added in subset order;
//  then the chunk's (m, l, acc) is folded into the running state (in-block) or written as the
//  chunk's partial (split launch, one chunk per block, folded by the last block to finish or by
//  attention_merge_kernel).
// Every order above depends only on D, T and the chunk, never on the launch, so both launches
// give the same bits. The K and V rows of a chunk are loaded as soon as its slots are known, all
// at once, so a chunk costs about one memory round trip after the block table's. In the fused
// decode form (a.k_new set, see AttentionArgs) the first chunk's loads go out before the wait for
// the previous kernel.
template <int D, typename T>
__global__ void __launch_bounds__(kThreads) attention_kernel(AttentionArgs a) {
  allow_dependents();
  const bool fused = a.k_new != nullptr;
  if (!fused) grid_dependency_wait();
  constexpr int V = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte vector
  static_assert(D % V == 0, "head_dim must be whole 16-byte vectors");
  constexpr int NV = D / V;                          // vectors per head row
  constexpr int LP = NV >= 32 ? 32 : pow2_ceil(NV);  // lanes scoring one position
  constexpr int VPL = (NV + LP - 1) / LP;            // vectors per lane in (A)
  constexpr int PPW = 32 / LP;                       // positions per warp step in (A)
  constexpr int STEPS = (kChunk + kWarps * PPW - 1) / (kWarps * PPW);
  static_assert(STEPS * VPL <= 16, "(A) keeps every K vector of the chunk in registers");
  constexpr int S = kThreads / NV;  // position subsets in (C)
  static_assert(S >= 1, "head_dim too large for the p·V layout");
  constexpr int NJ = (kChunk + S - 1) / S;  // (C) positions per subset
  static_assert(NJ <= 16, "(C) keeps every V vector of its positions in registers");
  constexpr int OUT = (kGroup * D + kThreads - 1) / kThreads;  // output elements per thread
  constexpr int HALF = D / 2;

  __shared__ __align__(16) float s_q[kGroup * D];
  __shared__ float s_score[kGroup * kChunk];  // scores, then exponentials, [head][position]
  __shared__ int s_slot[kChunk];
  __shared__ int s_row[2];
  __shared__ float s_m[kGroup], s_l[kGroup];
  __shared__ float s_part[S * kGroup * D];  // (C)'s per-subset sums [sub][head][d]
  __shared__ __align__(16) T s_new[2 * D];  // fused: the new token's k (rotated) and v, as cached
  __shared__ int s_last;

  const int group = a.heads / a.kv_heads;
  const int group_blocks = (group + a.block_heads - 1) / a.block_heads;
  const int kvh = static_cast<int>(blockIdx.y) / group_blocks;
  const int gb = static_cast<int>(blockIdx.y) % group_blocks;
  const int h0 = kvh * group + gb * a.block_heads;
  const int G = min(a.block_heads, group - gb * a.block_heads);  // q heads in this block (<= kGroup)
  const int t = blockIdx.x, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const bool split = a.partial_m != nullptr;

  const int2 row = block_row_and_len(a, t, s_row);
  const int r = row.x, len = row.y;
  // Split launch: this block takes chunk blockIdx.z; the last one also any chunks past it (only
  // when max_row_len understated the rows: still correct, no longer bit-exact). In-block: all.
  const int c_first = split ? static_cast<int>(blockIdx.z) : 0;
  const int chunks = (len + kChunk - 1) / kChunk;
  // A split block past this token's positions computes nothing (the merge ignores it).
  const bool active = !split || c_first < chunks;
  const int c_last = split && static_cast<int>(blockIdx.z) < a.max_splits - 1 ? c_first + 1 : chunks;

  const int* table = a.block_table + static_cast<int64_t>(r) * a.max_blocks;
  const T* kp = static_cast<const T*>(a.k_pool);
  const T* vp = static_cast<const T*>(a.v_pool);
  const int64_t pool_slots = a.pool_blocks * a.block_size;
  const int sub_lane = lane % LP;
  const int vec = tid % NV, sub = tid / NV;
  int new_slot = -1;  // fused: where the new token's k and v go (-1: nowhere)
  if (fused) {
    const int sl = a.slots[t];
    if (sl >= 0 && sl < pool_slots) new_slot = sl;
  }

  // Every K vector of (A) and V vector of (C) this thread needs for chunk c, loaded together.
  uint4 kraw[STEPS][VPL];
  uint4 vraw[NJ];
  auto load_chunk = [&](int c) {
    const int c0 = c * kChunk;
    const int n = min(kChunk, len - c0);
    if (tid < kChunk) {  // the chunk's slots, one position per thread
      int slot = -1;
      const int p = c0 + tid;
      if (tid < n && p / a.block_size < a.max_blocks) {
        const int64_t sl = static_cast<int64_t>(table[p / a.block_size]) * a.block_size + p % a.block_size;
        if (sl >= 0 && sl < pool_slots) slot = static_cast<int>(sl);  // a bad table entry skips the position
      }
      s_slot[tid] = slot;  // the previous chunk's readers of s_slot passed the barrier after (C)
    }
    __syncthreads();
#pragma unroll
    for (int st = 0; st < STEPS; ++st) {
      const int j = (st * kWarps + warp) * PPW + lane / LP;  // position within the chunk
      const int slot = j < kChunk ? s_slot[j] : -1;
      const uint4* k4 =
          reinterpret_cast<const uint4*>(kp + (static_cast<int64_t>(max(slot, 0)) * a.kv_heads + kvh) * D);
#pragma unroll
      for (int u = 0; u < VPL; ++u) {
        const int vi = sub_lane + u * LP;
        kraw[st][u] = slot >= 0 && slot != new_slot && vi < NV ? __ldg(k4 + vi) : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int i = 0; i < NJ; ++i) {
      const int j = sub + i * S;
      const int slot = sub < S && j < kChunk ? s_slot[j] : -1;
      vraw[i] =
          slot >= 0 && slot != new_slot
              ? __ldg(reinterpret_cast<const uint4*>(vp + (static_cast<int64_t>(slot) * a.kv_heads + kvh) * D) + vec)
              : make_uint4(0, 0, 0, 0);
    }
  };
  // Fused: the new slot's vectors come from s_new, not from the pool (this launch writes it).
  auto take_new = [&]() {
    if (new_slot < 0) return;
#pragma unroll
    for (int st = 0; st < STEPS; ++st) {
      const int j = (st * kWarps + warp) * PPW + lane / LP;
      if (j < kChunk && s_slot[j] == new_slot) {
#pragma unroll
        for (int u = 0; u < VPL; ++u) {
          const int vi = sub_lane + u * LP;
          if (vi < NV) kraw[st][u] = reinterpret_cast<const uint4*>(s_new)[vi];
        }
      }
    }
#pragma unroll
    for (int i = 0; i < NJ; ++i) {
      const int j = sub + i * S;
      if (sub < S && j < kChunk && s_slot[j] == new_slot) vraw[i] = reinterpret_cast<const uint4*>(s_new + D)[vec];
    }
  };

  if (fused) {
    if (active && c_first < c_last) load_chunk(c_first);  // pools and metadata: before the wait
    grid_dependency_wait();
    const float pos = static_cast<float>(a.positions[t]);
    const float* kn = a.k_new + (static_cast<int64_t>(t) * a.kv_heads + kvh) * D;
    const float* vn = a.v_new + (static_cast<int64_t>(t) * a.kv_heads + kvh) * D;
    for (int i = tid; i < HALF; i += kThreads) {
      float sn, cs, x0, x1;
      sincosf(pos * a.inv_freq[i], &sn, &cs);
      rotate_pair(kn[i], kn[i + HALF], cs, sn, a.rope_scaling, x0, x1);
      s_new[i] = from_float<T>(x0);
      s_new[i + HALF] = from_float<T>(x1);
    }
    for (int i = tid; i < D; i += kThreads) s_new[D + i] = from_float<T>(vn[i]);
    for (int i = tid; i < G * HALF; i += kThreads) {
      const int g = i / HALF, j = i % HALF;
      const float* qh = a.q + (static_cast<int64_t>(t) * a.heads + h0 + g) * D;
      float sn, cs;
      sincosf(pos * a.inv_freq[j], &sn, &cs);
      rotate_pair(qh[j], qh[j + HALF], cs, sn, a.rope_scaling, s_q[g * D + j], s_q[g * D + j + HALF]);
    }
  } else {
    for (int i = tid; i < G * D; i += kThreads) s_q[i] = a.q[(static_cast<int64_t>(t) * a.heads + h0) * D + i];
  }
  __syncthreads();  // s_q (and s_new) complete
  if (fused) {
    if (gb == 0 && blockIdx.z == 0 && new_slot >= 0) {
      T* kd = const_cast<T*>(kp) + (static_cast<int64_t>(new_slot) * a.kv_heads + kvh) * D;
      T* vd = const_cast<T*>(vp) + (static_cast<int64_t>(new_slot) * a.kv_heads + kvh) * D;
      for (int i = tid; i < D; i += kThreads) {
        kd[i] = s_new[i];
        vd[i] = s_new[D + i];
      }
    }
    if (active && c_first < c_last) take_new();
  }
  if (split && blockIdx.y == 0 && blockIdx.z == 0 && tid == 0 && a.arrivals == nullptr) a.partial_len[t] = len;

  Running run[OUT];
  for (int c = c_first; active && c < c_last; ++c) {
    const int c0 = c * kChunk;
    const int n = min(kChunk, len - c0);
    if (!fused || c != c_first) {
      load_chunk(c);
      if (fused) take_new();
    }

    // (A) scores
#pragma unroll
    for (int st = 0; st < STEPS; ++st) {
      const int j = (st * kWarps + warp) * PPW + lane / LP;
      const int slot = j < kChunk ? s_slot[j] : -1;
      float dot[kGroup];
#pragma unroll
      for (int g = 0; g < kGroup; ++g) dot[g] = 0.0f;
#pragma unroll
      for (int u = 0; u < VPL; ++u) {
        const int vi = sub_lane + u * LP;
        if (vi < NV) {
          const T* e = reinterpret_cast<const T*>(&kraw[st][u]);
#pragma unroll
          for (int g = 0; g < kGroup; ++g) {
            if (g < G) {
              const float* qg = s_q + g * D + vi * V;
#pragma unroll
              for (int x = 0; x < V; ++x) dot[g] = fmaf(qg[x], to_float(e[x]), dot[g]);
            }
          }
        }
      }
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        if (g < G) {  // block-uniform: every lane takes part in the shuffles
#pragma unroll
          for (int off = LP / 2; off > 0; off >>= 1) dot[g] += __shfl_xor_sync(0xffffffffu, dot[g], off);
          if (sub_lane == 0 && j < kChunk) s_score[g * kChunk + j] = slot >= 0 ? __fmul_rn(dot[g], a.scale) : -INFINITY;
        }
      }
    }
    __syncthreads();

    // (B) softmax of the chunk: warp g takes head g, lane i positions i, i + 32, ...
    if (warp < G) {
      constexpr int E = kChunk / 32;
      float sc[E];
      float mx = -INFINITY;
#pragma unroll
      for (int i = 0; i < E; ++i) {
        sc[i] = s_score[warp * kChunk + lane + 32 * i];
        mx = fmaxf(mx, sc[i]);
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      float sum = 0.0f;
#pragma unroll
      for (int i = 0; i < E; ++i) {
        const float e = sc[i] == -INFINITY ? 0.0f : expf(sc[i] - mx);
        s_score[warp * kChunk + lane + 32 * i] = e;
        sum += e;
      }
      sum = warp_sum(sum);
      if (lane == 0) {
        s_m[warp] = mx;
        s_l[warp] = sum;
      }
    }
    __syncthreads();

    // (C) p·V per subset
    if (sub < S) {
      float acc[kGroup][V];
#pragma unroll
      for (int g = 0; g < kGroup; ++g)
#pragma unroll
        for (int x = 0; x < V; ++x) acc[g][x] = 0.0f;
#pragma unroll
      for (int i = 0; i < NJ; ++i) {
        const int j = sub + i * S;
        if (j >= n || s_slot[j] < 0) continue;
        const T* e = reinterpret_cast<const T*>(&vraw[i]);
#pragma unroll
        for (int g = 0; g < kGroup; ++g) {
          if (g < G) {
            const float p = s_score[g * kChunk + j];
#pragma unroll
            for (int x = 0; x < V; ++x) acc[g][x] = fmaf(p, to_float(e[x]), acc[g][x]);
          }
        }
      }
#pragma unroll
      for (int g = 0; g < kGroup; ++g)
        if (g < G)
#pragma unroll
          for (int x = 0; x < V; ++x) s_part[(sub * kGroup + g) * D + vec * V + x] = acc[g][x];
    }
    __syncthreads();

    // The chunk's partial per output element, folded in chunk order.
#pragma unroll
    for (int k = 0; k < OUT; ++k) {
      const int o = tid + k * kThreads;
      if (o < G * D) {
        const int g = o / D, d = o % D;
        float sum = 0.0f;
        for (int u = 0; u < S; ++u) sum += s_part[(u * kGroup + g) * D + d];
        fold(run[k], s_m[g], s_l[g], sum);
      }
    }
    // The next chunk rewrites s_slot (read last in (C), before the barrier above), then s_score,
    // s_m, s_l and s_part only after its own barriers: no barrier needed here.
  }

#pragma unroll
  for (int k = 0; k < OUT; ++k) {
    const int o = tid + k * kThreads;
    if (!active || o >= G * D) continue;
    const int g = o / D, d = o % D;
    const int64_t th = static_cast<int64_t>(t) * a.heads + h0 + g;
    if (split) {
      const int64_t pi = th * a.max_splits + blockIdx.z;
      a.partial_acc[pi * D + d] = run[k].acc;
      if (d == 0) {
        a.partial_m[pi] = run[k].m;
        a.partial_l[pi] = run[k].l;
      }
    } else {
      a.out[th * D + d] = finish(run[k]);  // a token with no visible position gets zeros
    }
  }
  if (!split || a.arrivals == nullptr) return;

  // The last block of this (token, head group) folds every chunk's partial, in chunk order.
  __threadfence();  // this block's partials are visible device-wide before it arrives
  __syncthreads();
  if (tid == 0) {
    int* counter = a.arrivals + static_cast<int64_t>(t) * gridDim.y + blockIdx.y;
    const bool last = atomicAdd(counter, 1) == static_cast<int>(gridDim.z) - 1;
    if (last) *counter = 0;  // every block has arrived: ready for the next launch
    s_last = last;
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  const int splits = min(a.max_splits, chunks);
  constexpr int kBatch = 8;  // partials loaded together: one L2 round trip per kBatch chunks
  for (int o = tid; o < G * D; o += kThreads) {
    const int g = o / D, d = o % D;
    const int64_t th = static_cast<int64_t>(t) * a.heads + h0 + g;
    Running merged;
    for (int s0 = 0; s0 < splits; s0 += kBatch) {
      float m[kBatch], l[kBatch], acc[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int64_t pi = th * a.max_splits + min(s0 + b, splits - 1);
        m[b] = __ldcg(a.partial_m + pi);
        l[b] = __ldcg(a.partial_l + pi);
        acc[b] = __ldcg(a.partial_acc + pi * D + d);
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b)
        if (s0 + b < splits) fold(merged, m[b], l[b], acc[b]);
    }
    a.out[th * D + d] = finish(merged);
  }
}

// Folds a token's chunk partials in chunk order, as the in-block path does: same bits. The
// splits' (m, l) go through shared memory and each thread loads kBatch splits' acc at once, so
// the fold waits on one round of loads per kBatch splits, not one per split.
constexpr int kMergeThreads = 128;
constexpr int kMergeSplits = 256;  // (m, l) staged per round

__global__ void __launch_bounds__(kMergeThreads) attention_merge_kernel(AttentionArgs a) {
  enter_kernel();
  constexpr int kBatch = 8;
  __shared__ float s_m[kMergeSplits], s_l[kMergeSplits];
  const int h = blockIdx.y, t = blockIdx.x, D = a.head_dim;
  const int len = a.partial_len[t];
  const int splits = min(a.max_splits, (len + kChunk - 1) / kChunk);
  const int64_t base = (static_cast<int64_t>(t) * a.heads + h) * a.max_splits;
  float* o = a.out + (static_cast<int64_t>(t) * a.heads + h) * D;
  for (int d0 = 0; d0 < D; d0 += kMergeThreads) {
    const int d = d0 + static_cast<int>(threadIdx.x);
    Running run;
    for (int r0 = 0; r0 < splits; r0 += kMergeSplits) {
      const int rn = min(kMergeSplits, splits - r0);
      __syncthreads();  // the previous round's readers are done
      for (int i = threadIdx.x; i < rn; i += kMergeThreads) {
        s_m[i] = a.partial_m[base + r0 + i];
        s_l[i] = a.partial_l[base + r0 + i];
      }
      __syncthreads();
      for (int i0 = 0; i0 < rn; i0 += kBatch) {
        float acc[kBatch];
#pragma unroll
        for (int b = 0; b < kBatch; ++b)
          acc[b] = d < D && i0 + b < rn ? a.partial_acc[(base + r0 + i0 + b) * D + d] : 0.0f;
#pragma unroll
        for (int b = 0; b < kBatch; ++b)
          if (i0 + b < rn) fold(run, s_m[i0 + b], s_l[i0 + b], acc[b]);
      }
    }
    if (d < D) o[d] = finish(run);
  }
}

template <typename T>
void launch_attention_typed(const AttentionArgs& a, const Context& ctx) {
  const int group_blocks = (a.heads / a.kv_heads + a.block_heads - 1) / a.block_heads;
  const bool split = a.partial_m != nullptr;
  // Tokens on x (up to 2^31 - 1 blocks): a long prompt or a large batch has no grid limit to hit.
  // Head groups (y) and chunks (z, at most 65535: checked by the backend) are small.
  const dim3 grid(a.tokens, a.kv_heads * group_blocks, split ? a.max_splits : 1);
  switch (a.head_dim) {
    case 16:
      launch(attention_kernel<16, T>, grid, kThreads, 0, ctx, a);
      break;
    case 32:
      launch(attention_kernel<32, T>, grid, kThreads, 0, ctx, a);
      break;
    case 48:
      launch(attention_kernel<48, T>, grid, kThreads, 0, ctx, a);
      break;
    case 64:
      launch(attention_kernel<64, T>, grid, kThreads, 0, ctx, a);
      break;
    case 80:
      launch(attention_kernel<80, T>, grid, kThreads, 0, ctx, a);
      break;
    case 96:
      launch(attention_kernel<96, T>, grid, kThreads, 0, ctx, a);
      break;
    case 112:
      launch(attention_kernel<112, T>, grid, kThreads, 0, ctx, a);
      break;
    case 128:
      launch(attention_kernel<128, T>, grid, kThreads, 0, ctx, a);
      break;
    case 160:
      launch(attention_kernel<160, T>, grid, kThreads, 0, ctx, a);
      break;
    case 192:
      launch(attention_kernel<192, T>, grid, kThreads, 0, ctx, a);
      break;
    case 224:
      launch(attention_kernel<224, T>, grid, kThreads, 0, ctx, a);
      break;
    case 256:
      launch(attention_kernel<256, T>, grid, kThreads, 0, ctx, a);
      break;
    default:
      return;  // rejected by the backend before launch
  }
  if (split && a.arrivals == nullptr) launch(attention_merge_kernel, dim3(a.tokens, a.heads), kMergeThreads, 0, ctx, a);
}

}  // namespace

void launch_kv_write(const float* k, const float* v, void* k_pool, void* v_pool, ElemType pool_type, const int* slots,
                     int tokens, int kv_heads, int head_dim, int64_t pool_slots, const Context& ctx) {
  if (tokens == 0) return;
  const int width = kv_heads * head_dim;
  SPECDEC_DISPATCH_ELEM(pool_type, T,
                        launch(kv_write_kernel<T>, tokens, 256, 0, ctx, k, v, static_cast<T*>(k_pool),
                               static_cast<T*>(v_pool), slots, width, pool_slots));
}

void launch_attention(const AttentionArgs& args, const Context& ctx) {
  if (args.tokens == 0 || args.heads == 0) return;
  SPECDEC_DISPATCH_ELEM(args.pool_type, T, (launch_attention_typed<T>(args, ctx)));
}

}  // namespace specdec::cuda
