// Causal paged attention on the tensor cores over 64-position tiles of the paged cache, bf16 mma
// with f32 accumulation. q and the probabilities are rounded to bf16 for the products, so results
// differ from attention.cu's f32 kernel within bf16 rounding. Two kernels:
// - flash_attention_kernel: one block per (row, kv head, tile of the row's new tokens), walking
//   the row's tiles in order (prefill chunks, windows, and large decode batches in the fast mode).
// - tile_decode_kernel: decode steps and short windows, one warp per (row, kv head, 16 of the
//   row's (token, head) pairs, tile), so a long history is read by many SMs at once; a second
//   kernel folds the tiles in order.
// Batch invariant: a token's output depends only on its q and its row's cache. Every token walks
// the cache tiles 0, 1, 2, ... in order whatever its block; the tiles past its own visible length
// (its block reaches further for a later token) mask it to nothing and leave its sums exactly as
// they were (the rescale factor is exactly 1 when the running maximum does not change, and its
// probabilities there are exactly 0). Mma rows do not mix. So a prefill chunk, a verify window
// and single decode steps give each token the same bits, alone or beside other rows. For the
// decode kernel to give those bits too, the batch-invariant mode's flash kernel runs its tile-fold
// form: each tile is a softmax from nothing (its own maximum, sum and P·V) folded into the running
// result by fold_weights/fold_sum, which is exactly what the decode kernel's merge does with the
// tiles it computed apart. The fast mode's flash kernel keeps the running accumulator (one
// multiply fewer an element a tile) and does not promise bits equal to its decode kernel.
#include <cuda_bf16.h>

#include <algorithm>

#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"

namespace specdec::cuda {
namespace {

constexpr int kFlashWarps = 4;
constexpr int kFlashThreads = kFlashWarps * 32;
constexpr int kKvTile = kFlashKvTile;

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo
  return *reinterpret_cast<const uint32_t*>(&v);
}

// d += a · b: one m16n8k16 bf16 product with f32 accumulators (PTX fragment layouts).
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem_row) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// 16-byte asynchronous copy global -> shared; bytes = 0 fills the 16 bytes with zeros.
__device__ __forceinline__ void cp_async16_zfill(unsigned smem_dst, const void* global_src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_dst), "l"(global_src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async16_zfill(void* smem_dst, const void* global_src, int bytes) {
  cp_async16_zfill(static_cast<unsigned>(__cvta_generic_to_shared(smem_dst)), global_src, bytes);
}

// Four 8x8 bf16 matrices from shared memory, untransposed: lanes 8i to 8i + 7 give matrix i's row
// addresses, and lane l receives row l / 4, columns 2 (l % 4) and + 1 of each.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void cp_async_commit_group() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// The pool slot of cached position pos of a row (its block table `table`), -1 at or past `end`
// or for a table entry outside the pool: such positions are staged as zeros.
__device__ __forceinline__ int64_t cache_slot(const AttentionArgs& a, const int* table, int pos, int end,
                                              int64_t pool_slots) {
  if (pos >= end || pos / a.block_size >= a.max_blocks) return -1;
  const int64_t slot = static_cast<int64_t>(table[pos / a.block_size]) * a.block_size + pos % a.block_size;
  return slot < pool_slots ? slot : -1;
}

// ---- One tile, shared by both kernels so that a token's tile gives the same bits in either ----
// Lane (g = lane / 4, q4 = lane % 4) holds mma rows g and g + 8 and, of each 8-position block nb,
// positions nb * 8 + 2 * q4 and + 1 (the accumulator layout of m16n8k16).

// The lane's two q rows (q0, q1; zeros where not valid) as bf16 A fragments, one per 16 columns
// of the head.
template <int D>
__device__ __forceinline__ void q_fragments(uint32_t (&qa)[D / 16][4], const float* q0, const float* q1,
                                            const bool (&valid)[2], int q4) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const int c = kk * 16 + 2 * q4;
    const float2 z = make_float2(0.0f, 0.0f);
    const float2 x00 = valid[0] ? *reinterpret_cast<const float2*>(q0 + c) : z;
    const float2 x10 = valid[1] ? *reinterpret_cast<const float2*>(q1 + c) : z;
    const float2 x01 = valid[0] ? *reinterpret_cast<const float2*>(q0 + c + 8) : z;
    const float2 x11 = valid[1] ? *reinterpret_cast<const float2*>(q1 + c + 8) : z;
    qa[kk][0] = pack_bf16(x00.x, x00.y);
    qa[kk][1] = pack_bf16(x10.x, x10.y);
    qa[kk][2] = pack_bf16(x01.x, x01.y);
    qa[kk][3] = pack_bf16(x11.x, x11.y);
  }
}

// s = q · Kᵀ over the tile's 64 staged K rows (row stride LD), q as bf16 A fragments. K's B
// fragments come by ldmatrix, four 8x8 matrices a load: lane l points at row nb * 8 + l % 8 and
// column 8 (l / 8) of a 32-column stretch, so the matrices are b0 and b1 of kk and of kk + 1.
template <int D, int LD>
__device__ __forceinline__ void tile_scores(float (&s)[kKvTile / 8][4], const uint32_t (&qa)[D / 16][4],
                                            const __nv_bfloat16* ks, int lane) {
  static_assert((D / 16) % 2 == 0, "head_dim a multiple of 32");
#pragma unroll
  for (int nb = 0; nb < kKvTile / 8; ++nb) {
    s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.0f;
    const __nv_bfloat16* krow = ks + (nb * 8 + lane % 8) * LD + 8 * (lane / 8);
#pragma unroll
    for (int kk = 0; kk < D / 16; kk += 2) {
      uint32_t b[4];
      ldmatrix_x4(b, krow + kk * 16);
      mma_bf16(s[nb], qa[kk], b[0], b[1]);
      mma_bf16(s[nb], qa[kk + 1], b[2], b[3]);
    }
  }
}

// Scales the scores to log2 units and masks positions at or past each row's visible length;
// returns each row's maximum over the tile (exact; -inf when nothing is visible).
__device__ __forceinline__ void tile_mask_max(float (&s)[kKvTile / 8][4], int kv0, const int (&vis)[2], float scale2,
                                              int q4, float (&mx)[2]) {
  mx[0] = mx[1] = -INFINITY;
#pragma unroll
  for (int nb = 0; nb < kKvTile / 8; ++nb)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = e / 2, pos = kv0 + nb * 8 + 2 * q4 + (e & 1);
      s[nb][e] = pos < vis[i] ? s[nb][e] * scale2 : -INFINITY;
      mx[i] = fmaxf(mx[i], s[nb][e]);
    }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
  }
}

// The tile's softmax from nothing: p = exp2(s - m_t) in place, l_t = each row's sum of p (this
// lane's parts in position order, then the quad's by a fixed butterfly), and P packed to bf16 A
// fragments, 16 positions each.
__device__ __forceinline__ void tile_probabilities(float (&s)[kKvTile / 8][4], const float (&mt)[2], float (&lt)[2],
                                                   uint32_t (&pa)[kKvTile / 16][4]) {
  lt[0] = lt[1] = 0.0f;
#pragma unroll
  for (int nb = 0; nb < kKvTile / 8; ++nb)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float base = mt[e / 2] == -INFINITY ? 0.0f : mt[e / 2];
      s[nb][e] = exp2f(s[nb][e] - base);
      lt[e / 2] += s[nb][e];
    }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    lt[i] += __shfl_xor_sync(0xffffffffu, lt[i], 1);
    lt[i] += __shfl_xor_sync(0xffffffffu, lt[i], 2);
  }
#pragma unroll
  for (int kp16 = 0; kp16 < kKvTile / 16; ++kp16) {
    pa[kp16][0] = pack_bf16(s[2 * kp16][0], s[2 * kp16][1]);
    pa[kp16][1] = pack_bf16(s[2 * kp16][2], s[2 * kp16][3]);
    pa[kp16][2] = pack_bf16(s[2 * kp16 + 1][0], s[2 * kp16 + 1][1]);
    pa[kp16][3] = pack_bf16(s[2 * kp16 + 1][2], s[2 * kp16 + 1][3]);
  }
}

// t0, t1 = P · V of output blocks nb and nb + 1 over the tile's 64 positions, from zero, 16
// positions a step in order. V is read transposed by ldmatrix: lanes 0-7 positions 0-7 and lanes
// 8-15 positions 8-15 at columns nb * 8, lanes 16-31 the same at nb * 8 + 8.
template <int LD>
__device__ __forceinline__ void tile_pv_pair(const uint32_t (&pa)[kKvTile / 16][4], const __nv_bfloat16* vs, int nb,
                                             int lane, float (&t0)[4], float (&t1)[4]) {
  t0[0] = t0[1] = t0[2] = t0[3] = 0.0f;
  t1[0] = t1[1] = t1[2] = t1[3] = 0.0f;
#pragma unroll
  for (int kp16 = 0; kp16 < kKvTile / 16; ++kp16) {
    const int prow = kp16 * 16 + (lane % 8) + 8 * ((lane / 8) & 1);
    uint32_t b[4];
    ldmatrix_x4_trans(b, vs + prow * LD + nb * 8 + 8 * (lane / 16));
    mma_bf16(t0, pa[kp16], b[0], b[1]);
    mma_bf16(t1, pa[kp16], b[2], b[3]);
  }
}

// Folding a tile's (m_t, l_t, o_t) into the running (M, L, O): M' = max(M, m_t), and the weights
// of the old and the new part, exactly 1 where that part holds the maximum (so a fully masked
// tile, m_t = -inf, leaves the sums as they were). Rounded the same way wherever it runs (no
// contraction left to the compiler).
__device__ __forceinline__ void fold_weights(float& M, float mt, float& wa, float& wb) {
  const float mn = fmaxf(M, mt);
  wa = M == mn ? 1.0f : exp2f(M - mn);
  wb = mt == mn ? 1.0f : exp2f(mt - mn);
  M = mn;
}
__device__ __forceinline__ float fold_sum(float acc, float wa, float part, float wb) {
  return __fmaf_rn(acc, wa, __fmul_rn(part, wb));
}
// Folds a tile's row maxima mt and sums lt into the running m and l, leaving the two weights
// for the tile's P·V.
__device__ __forceinline__ void fold_tile_sums(float (&m)[2], float (&l)[2], const float (&mt)[2],
                                               const float (&lt)[2], float (&wa)[2], float (&wb)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    fold_weights(m[i], mt[i], wa[i], wb[i]);
    l[i] = fold_sum(l[i], wa[i], lt[i], wb[i]);
  }
}
// Folds the tile's P·V (V staged at vs) into the running output o, output blocks two at a time.
template <int D, int LD>
__device__ __forceinline__ void fold_tile_pv(float (&o)[D / 8][4], const uint32_t (&pa)[kKvTile / 16][4],
                                             const __nv_bfloat16* vs, int lane, const float (&wa)[2],
                                             const float (&wb)[2]) {
#pragma unroll
  for (int nb = 0; nb < D / 8; nb += 2) {
    float t0[4], t1[4];
    tile_pv_pair<LD>(pa, vs, nb, lane, t0, t1);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      o[nb][e] = fold_sum(o[nb][e], wa[e / 2], t0[e], wb[e / 2]);
      o[nb + 1][e] = fold_sum(o[nb + 1][e], wa[e / 2], t1[e], wb[e / 2]);
    }
  }
}
// The final division, one expression for both kernels.
__device__ __forceinline__ float normalized(float o, float l) { return o * (l > 0.0f ? 1.0f / l : 0.0f); }

// Block: 4 warps; warp w takes q head h0 + w % hpc and 16 tokens starting at (w / hpc) * 16 of
// the block's tile of 16 * 4 / hpc tokens (hpc: q heads a block serves, sharing each K/V tile).
// Per K/V tile of 64 positions (staged in shared memory, the next tile's copies in flight during
// this one's products): S = q·Kᵀ (mma, K rows read as the B operand), masked by each token's
// visible length, online softmax in f32 (exp2), then O += P·V with P taken from S's accumulator
// layout as the A operand and V transposed by ldmatrix.
// kFold: the tile-fold form (see the top), for the batch-invariant mode.
template <int D, bool kFold>
__global__ void __launch_bounds__(kFlashThreads) flash_attention_kernel(AttentionArgs a, int tiles_per_row, int hpc) {
  enter_kernel();
  static_assert(D % 16 == 0 && D <= 128, "head_dim a multiple of 16, at most 128");
  constexpr int LD = D + 8;  // staged row stride in elements: conflict-free 32-bit and ldmatrix reads
  constexpr int KK = D / 16;
  constexpr int NB = D / 8;
  constexpr int CH = D / 8;  // 16-byte pieces of one position's row
  extern __shared__ __align__(16) unsigned char flash_smem[];
  __nv_bfloat16* sk = reinterpret_cast<__nv_bfloat16*>(flash_smem);  // [2][kKvTile][LD]
  __nv_bfloat16* sv = sk + 2 * kKvTile * LD;                         // [2][kKvTile][LD]
  __shared__ int s_end;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, q4 = lane % 4;
  const int bq = 16 * (kFlashWarps / hpc);
  const int r = static_cast<int>(blockIdx.x / static_cast<unsigned>(tiles_per_row));
  // The longest tiles (a row's last tokens) first: the grid's tail is short tiles.
  const int tile = tiles_per_row - 1 - static_cast<int>(blockIdx.x % static_cast<unsigned>(tiles_per_row));
  const int row_begin = a.row_starts[r], row_end = a.row_starts[r + 1];
  const int t0 = row_begin + tile * bq;
  if (t0 >= row_end) return;  // block-uniform
  const int nt = min(bq, row_end - t0);
  const int row_len = a.row_lens[r];
  const int group = a.heads / a.kv_heads, per_kv = group / hpc;
  const int kvh = static_cast<int>(blockIdx.y) / per_kv;
  const int h = kvh * group + (static_cast<int>(blockIdx.y) % per_kv) * hpc + warp % hpc;
  const int wt0 = (warp / hpc) * 16;  // this warp's first token in the tile

  if (tid == 0) s_end = 0;
  __syncthreads();
  if (tid < nt) atomicMax(&s_end, max(0, min(a.positions[t0 + tid] + 1, row_len)));
  // This thread's two rows: tokens wt0 + g and wt0 + g + 8 of the tile.
  int vis[2];
  bool valid[2];
  for (int i = 0; i < 2; ++i) {
    const int tok = wt0 + g + 8 * i;
    valid[i] = tok < nt;
    vis[i] = valid[i] ? max(0, min(a.positions[t0 + tok] + 1, row_len)) : 0;
  }
  __syncthreads();
  const int kv_end = s_end;

  // q of both rows as bf16 A fragments, one per 16 columns of the head.
  uint32_t qa[KK][4];
  {
    const float* q0 = a.q + (static_cast<int64_t>(t0 + wt0 + g) * a.heads + h) * D;
    q_fragments<D>(qa, q0, q0 + static_cast<int64_t>(8) * a.heads * D, valid, q4);
  }

  const __nv_bfloat16* kp = static_cast<const __nv_bfloat16*>(a.k_pool);
  const __nv_bfloat16* vp = static_cast<const __nv_bfloat16*>(a.v_pool);
  const int64_t pool_slots = a.pool_blocks * a.block_size;
  const int* table = a.block_table + static_cast<int64_t>(r) * a.max_blocks;
  // Stages tile j's K and V rows into buffer j & 1; positions past kv_end or with a bad table
  // entry are zeros (their scores are masked, and zeros keep p·V finite).
  auto stage = [&](int j) {
    __nv_bfloat16* kd = sk + (j & 1) * kKvTile * LD;
    __nv_bfloat16* vd = sv + (j & 1) * kKvTile * LD;
    for (int i = tid; i < kKvTile * CH; i += kFlashThreads) {
      const int p = i / CH, c = i % CH;
      const int64_t slot = cache_slot(a, table, j * kKvTile + p, kv_end, pool_slots);
      const int64_t off = (max(slot, int64_t{0}) * a.kv_heads + kvh) * D + c * 8;
      const int bytes = slot >= 0 ? 16 : 0;
      cp_async16_zfill(kd + p * LD + c * 8, kp + off, bytes);
      cp_async16_zfill(vd + p * LD + c * 8, vp + off, bytes);
    }
    cp_async_commit_group();
  };

  float o[NB][4];
#pragma unroll
  for (int nb = 0; nb < NB; ++nb) o[nb][0] = o[nb][1] = o[nb][2] = o[nb][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const float scale2 = a.scale * 1.4426950408889634f;  // scores in log2 units: exp2 below
  const int tiles = (kv_end + kKvTile - 1) / kKvTile;
  if (tiles > 0) stage(0);
  for (int j = 0; j < tiles; ++j) {
    if (j + 1 < tiles) {
      stage(j + 1);  // its buffer was last read in iteration j - 1, before that iteration's barrier
      cp_async_wait_group<1>();
    } else {
      cp_async_wait_group<0>();
    }
    __syncthreads();
    const __nv_bfloat16* ks = sk + (j & 1) * kKvTile * LD;
    const __nv_bfloat16* vs = sv + (j & 1) * kKvTile * LD;
    const int kv0 = j * kKvTile;

    float s[kKvTile / 8][4];
    tile_scores<D, LD>(s, qa, ks, lane);
    float mx[2];
    tile_mask_max(s, kv0, vis, scale2, q4, mx);
    if constexpr (kFold) {
      float lt[2], wa[2], wb[2];
      uint32_t pa[kKvTile / 16][4];
      tile_probabilities(s, mx, lt, pa);
      fold_tile_sums(m, l, mx, lt, wa, wb);
      fold_tile_pv<D, LD>(o, pa, vs, lane, wa, wb);
    } else {
      float alpha[2], base[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float m_new = fmaxf(m[i], mx[i]);
        base[i] = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing visible yet stays at zero
        // 0 for the first visible tile (m = -inf); exactly 1 while the maximum holds (see the top).
        alpha[i] = m_new == m[i] ? 1.0f : exp2f(m[i] - base[i]);
        m[i] = m_new;
        l[i] *= alpha[i];
      }
#pragma unroll
      for (int nb = 0; nb < NB; ++nb) {
        o[nb][0] *= alpha[0];
        o[nb][1] *= alpha[0];
        o[nb][2] *= alpha[1];
        o[nb][3] *= alpha[1];
      }
#pragma unroll
      for (int nb = 0; nb < kKvTile / 8; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float p = exp2f(s[nb][e] - base[e / 2]);  // exp2(-inf) = 0 for masked positions
          s[nb][e] = p;
          l[e / 2] += p;  // this lane's part of the row sum; the quad's parts are added at the end
        }
      }
      // O += P · V, 16 positions per step: P's A fragment is S's accumulators of two 8-wide blocks.
#pragma unroll
      for (int kp16 = 0; kp16 < kKvTile / 16; ++kp16) {
        uint32_t pa[4];
        pa[0] = pack_bf16(s[2 * kp16][0], s[2 * kp16][1]);
        pa[1] = pack_bf16(s[2 * kp16][2], s[2 * kp16][3]);
        pa[2] = pack_bf16(s[2 * kp16 + 1][0], s[2 * kp16 + 1][1]);
        pa[3] = pack_bf16(s[2 * kp16 + 1][2], s[2 * kp16 + 1][3]);
        const int prow = kp16 * 16 + (lane % 8) + 8 * ((lane / 8) & 1);
        const int pcol = 8 * (lane / 16);
#pragma unroll
        for (int nb = 0; nb < NB; nb += 2) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, vs + prow * LD + nb * 8 + pcol);
          mma_bf16(o[nb], pa, b[0], b[1]);
          mma_bf16(o[nb + 1], pa, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // this buffer is consumed: the next iteration stages into it
  }

  if constexpr (!kFold) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
      l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    }
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (!valid[i]) continue;  // a token with no visible position gets zeros (normalized)
    float* out = a.out + (static_cast<int64_t>(t0 + wt0 + g + 8 * i) * a.heads + h) * D + 2 * q4;
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
      *reinterpret_cast<float2*>(out + nb * 8) =
          make_float2(normalized(o[nb][2 * i], l[i]), normalized(o[nb][2 * i + 1], l[i]));
  }
}

template <int D, bool kFold>
bool launch_flash_typed(const AttentionArgs& a, int max_row_tokens, const Context& ctx) {
  const int group = a.heads / a.kv_heads;
  const int hpc = group % 4 == 0 ? 4 : group % 2 == 0 ? 2 : 1;
  const int bq = 16 * (kFlashWarps / hpc);
  const int tiles_per_row = (max_row_tokens + bq - 1) / bq;
  const int64_t blocks = int64_t{a.rows} * tiles_per_row;
  if (blocks > 0x7fffffff || a.kv_heads * (group / hpc) > 65535) return false;
  const size_t smem = size_t{4} * kKvTile * (D + 8) * sizeof(__nv_bfloat16);
  static const bool raised =
      cudaFuncSetAttribute(flash_attention_kernel<D, kFold>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem)) == cudaSuccess;
  if (!raised) {
    cudaGetLastError();
    return false;
  }
  launch(flash_attention_kernel<D, kFold>, dim3(static_cast<unsigned>(blocks), a.kv_heads * (group / hpc)),
         kFlashThreads, smem, ctx, a, tiles_per_row, hpc);
  return true;
}

// Row r of a batch: the one whose [row_starts[r], row_starts[r + 1]) holds token t.
__device__ __forceinline__ int row_of_token(const int* row_starts, int rows, int t) {
  int lo = 0, hi = rows - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (row_starts[mid] <= t) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// Pair w = token * heads + head: its tile partials folded in tile order, as the tile-fold flash
// kernel folds its tiles, and the normalized output written; one warp, lane taking D / 32
// columns. The partials may have been written by other blocks of the same launch (the last
// warp's fold, below), so they are read past the L1.
template <int D>
__device__ __forceinline__ void merge_pair(const AttentionArgs& a, int tiles, int64_t w, int lane) {
  constexpr int C = D / 32;  // columns a lane folds
  const int t = static_cast<int>(w / a.heads);
  const int len = max(0, min(a.positions[t] + 1, a.row_lens[row_of_token(a.row_starts, a.rows, t)]));
  const int n_tiles = min((len + kKvTile - 1) / kKvTile, tiles);
  float M = -INFINITY, L = 0.0f, O[C];
#pragma unroll
  for (int c = 0; c < C; ++c) O[c] = 0.0f;
  const int64_t n0 = w * tiles;
#pragma unroll 4
  for (int j = 0; j < n_tiles; ++j) {
    const float mt = __ldcg(a.partial_m + n0 + j), lt = __ldcg(a.partial_l + n0 + j);
    const float* po = a.partial_acc + (n0 + j) * D + lane * C;
    float wa, wb;
    fold_weights(M, mt, wa, wb);
    L = fold_sum(L, wa, lt, wb);
#pragma unroll
    for (int c = 0; c < C; ++c) O[c] = fold_sum(O[c], wa, __ldcg(po + c), wb);
  }
  float* out = a.out + w * D + lane * C;
#pragma unroll
  for (int c = 0; c < C; ++c) out[c] = normalized(O[c], L);
}

// Decode steps and short windows: one warp per (row, kv head, 16 of the row's (token, q head)
// pairs of that kv head, tile; or every stride-th tile when the rows alone give warps enough).
// Pair p is the row's token p / group and the group's head p % group: the mma's 16 rows, each
// with its own visible length. The warp stages its tile's K and V (V's copies land while it
// scores), computes the tile as the tile-fold flash kernel does and writes each pair's (m_t, l_t,
// o_t) to the partials [tokens, heads, tiles]; the tiles are folded by tile_decode_merge_kernel,
// or, with a.arrivals, by the last warp of each (row, kv head, pairs) to finish (the same fold,
// so the same bits; its counter reset for the next launch). The grid's last tile slot also folds
// any tiles past the partials' room, in order (a stated max_row_len below a row's length: close,
// not the flash kernel's bits). With warp_fold (tiles == stride; the launch sets it in the fast
// mode and wherever stride is 1), the warp of tile slot y folds all its tiles y, y + stride, ...
// into one running softmax and writes one partial, at slot y.
// Fused decode step (a.k_new set; one new token a row): as rope_kv_write and then this kernel.
// Each warp rotates its pairs' q heads into shared memory, and the new token's k (and takes its
// v), rounded as the cache holds them, as the rope and cache-write kernels do; the warp of tile
// slot 0 writes them at slots[t]; a warp whose tile holds that slot takes them from shared
// memory in place of the pool's row. q and k are left as they were.
template <int D>
__global__ void __launch_bounds__(32)
    tile_decode_kernel(AttentionArgs a, int tiles, int pair_blocks, int stride, bool warp_fold) {
  static_assert(D % 16 == 0 && D <= 128, "head_dim a multiple of 16, at most 128");
  constexpr int LD = D + 8;
  constexpr int KK = D / 16;
  constexpr int NB = D / 8;
  constexpr int CH = D / 8;
  extern __shared__ __align__(16) unsigned char decode_smem[];
  __nv_bfloat16* sk = reinterpret_cast<__nv_bfloat16*>(decode_smem);  // [kKvTile][LD]
  __nv_bfloat16* sv = sk + kKvTile * LD;                              // [kKvTile][LD]
  const int group = a.heads / a.kv_heads;
  // Fused: the rotated q of the warp's pairs (one token's group, at most 16), then the new k and
  // v; sized to the group, so that with a group of four six warps fit an SM, as unfused.
  float* sq = reinterpret_cast<float*>(sv + kKvTile * LD);                           // [min(16, group)][D]
  __nv_bfloat16* s_new = reinterpret_cast<__nv_bfloat16*>(sq + min(16, group) * D);  // [2][D]

  const int lane = static_cast<int>(threadIdx.x), g = lane / 4, q4 = lane % 4;
  const int x = static_cast<int>(blockIdx.x);
  const int r = x / (a.kv_heads * pair_blocks), kvh = (x / pair_blocks) % a.kv_heads, pb = x % pair_blocks;
  enter_kernel();
  const int row_begin = a.row_starts[r], pairs = (a.row_starts[r + 1] - row_begin) * group;
  const int row_len = a.row_lens[r];
  if (pb * 16 >= pairs) return;  // warp-uniform
  bool valid[2];
  int tok[2], head[2], vis[2];
  for (int i = 0; i < 2; ++i) {
    const int p = pb * 16 + g + 8 * i;
    valid[i] = p < pairs;
    const int pc = min(p, pairs - 1);
    tok[i] = row_begin + pc / group;
    head[i] = kvh * group + pc % group;
    vis[i] = valid[i] ? max(0, min(a.positions[tok[i]] + 1, row_len)) : 0;
  }
  int len = max(vis[0], vis[1]);
  for (int off = 16; off > 0; off /= 2) len = max(len, __shfl_xor_sync(0xffffffffu, len, off));
  const int n_tiles = (len + kKvTile - 1) / kKvTile;
  const bool fused = a.k_new != nullptr;
  // A warp past its pairs' tiles only arrives (with arrivals), and writes nothing else.
  const bool work = static_cast<int>(blockIdx.y) < n_tiles;
  if (!work && a.arrivals == nullptr) return;  // warp-uniform

  const int64_t pool_slots = a.pool_blocks * a.block_size;
  uint32_t qa[KK][4];
  int64_t new_slot = -1;  // fused: the new token's slot, where valid
  if (fused) {
    constexpr int HALF = D / 2;
    const int t = row_begin;  // the row's one token
    const float pos = static_cast<float>(a.positions[t]);
    const float* kn = a.k_new + (static_cast<int64_t>(t) * a.kv_heads + kvh) * D;
    const float* vn = a.v_new + (static_cast<int64_t>(t) * a.kv_heads + kvh) * D;
    for (int i = lane; i < HALF; i += 32) {
      float sn, cs, x0, x1;
      sincosf(pos * a.inv_freq[i], &sn, &cs);
      rotate_pair(kn[i], kn[i + HALF], cs, sn, a.rope_scaling, x0, x1);
      s_new[i] = from_float<__nv_bfloat16>(x0);
      s_new[i + HALF] = from_float<__nv_bfloat16>(x1);
      for (int p = 0; p < 16 && pb * 16 + p < pairs; ++p) {
        const float* qh = a.q + (static_cast<int64_t>(t) * a.heads + kvh * group + (pb * 16 + p) % group) * D;
        rotate_pair(qh[i], qh[i + HALF], cs, sn, a.rope_scaling, sq[p * D + i], sq[p * D + i + HALF]);
      }
    }
    for (int i = lane; i < D; i += 32) s_new[D + i] = from_float<__nv_bfloat16>(vn[i]);
    const int slot = a.slots[t];
    if (slot >= 0 && slot < pool_slots) new_slot = slot;
    __syncwarp();
    if (blockIdx.y == 0 && pb == 0 && new_slot >= 0) {
      __nv_bfloat16* kd = static_cast<__nv_bfloat16*>(const_cast<void*>(a.k_pool)) + (new_slot * a.kv_heads + kvh) * D;
      __nv_bfloat16* vd = static_cast<__nv_bfloat16*>(const_cast<void*>(a.v_pool)) + (new_slot * a.kv_heads + kvh) * D;
      for (int i = lane; i < D; i += 32) {
        kd[i] = s_new[i];
        vd[i] = s_new[D + i];
      }
    }
    if (work) q_fragments<D>(qa, sq + g * D, sq + (g + 8) * D, valid, q4);
  } else if (work) {
    q_fragments<D>(qa, a.q + (static_cast<int64_t>(tok[0]) * a.heads + head[0]) * D,
                   a.q + (static_cast<int64_t>(tok[1]) * a.heads + head[1]) * D, valid, q4);
  }

  const int* table = a.block_table + static_cast<int64_t>(r) * a.max_blocks;
  const float scale2 = a.scale * 1.4426950408889634f;
  // Pool rows (slot * kv_heads + kvh) of tile j's positions lane and lane + 32, -1 past the
  // warp's longest visible length or for a bad table entry (staged as zeros, as the flash kernel
  // does), and whether each is the new token's slot (fused). Looked up before the tile's copies
  // are issued: a table load between two copies would wait behind them.
  struct TileRows {
    int prow[2];  // the launch checks that the pool's rows fit an int
    bool is_new[2];
  };
  const auto lookup = [&](int j) {
    TileRows t;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t slot = cache_slot(a, table, j * kKvTile + lane + 32 * h, len, pool_slots);
      t.prow[h] = slot >= 0 ? static_cast<int>(slot * a.kv_heads + kvh) : -1;
      t.is_new[h] = slot >= 0 && slot == new_slot;
    }
    return t;
  };
  // The new token's row from shared memory over the pool's (which tile slot 0 may be writing).
  const auto take_new = [&](const TileRows& t, __nv_bfloat16* dst, const __nv_bfloat16* src) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if (t.is_new[h])
        for (int c = 0; c < CH; ++c)
          reinterpret_cast<uint4*>(dst + (lane + 32 * h) * LD)[c] = reinterpret_cast<const uint4*>(src)[c];
    __syncwarp();
  };
  // Copy i of a pool: position i / CH, 16-byte piece i % CH (consecutive lanes, consecutive
  // pieces of one position); one commit group. Where CH divides 32, a lane's copies are its
  // piece lane % CH of positions lane / CH + k (32 / CH), the offsets fixed at compile time past
  // one shuffle for the row: a tile's copies are most of the warp's instructions, and with a few
  // warps an SM their issue, not the memory, would set the pace.
  const auto stage = [&](const TileRows& t, __nv_bfloat16* dst, const void* pool) {
    const __nv_bfloat16* src = static_cast<const __nv_bfloat16*>(pool);
    if constexpr (32 % CH == 0) {
      constexpr int kStride = 32 / CH;  // positions one pass of the warp covers
      const int c = lane % CH, p0 = lane / CH;
      const char* piece = reinterpret_cast<const char*>(src + c * 8);
      const unsigned d0 = static_cast<unsigned>(__cvta_generic_to_shared(dst + p0 * LD + c * 8));
#pragma unroll
      for (int k = 0; k < kKvTile / kStride; ++k) {
        const int row = __shfl_sync(0xffffffffu, k * kStride < 32 ? t.prow[0] : t.prow[1], p0 + (k * kStride) % 32);
        const size_t off = static_cast<size_t>(static_cast<unsigned>(max(row, 0))) * (D * sizeof(__nv_bfloat16));
        cp_async16_zfill(d0 + static_cast<unsigned>(k * kStride * LD * sizeof(__nv_bfloat16)), piece + off,
                         row >= 0 ? 16 : 0);
      }
    } else {
#pragma unroll 4
      for (int i = lane; i < kKvTile * CH; i += 32) {
        const int p = i / CH, c = i % CH;
        const int lo = __shfl_sync(0xffffffffu, t.prow[0], p % 32);  // p differs across the lanes
        const int hi = __shfl_sync(0xffffffffu, t.prow[1], p % 32);
        const int row = p < 32 ? lo : hi;
        const size_t off = static_cast<size_t>(static_cast<unsigned>(max(row, 0))) * D;
        cp_async16_zfill(dst + p * LD + c * 8, src + off + c * 8, row >= 0 ? 16 : 0);
      }
    }
    cp_async_commit_group();
  };
  // The warp's tiles in the order it takes them: j0 = blockIdx.y, j0 + stride, ... (each its own
  // partial), the last tile slot's run j0 .. n_tiles - 1 folded into one; with warp_fold all of
  // them folded into one (j0 + stride is then past j_end).
  const int j_end = min(n_tiles, tiles);
  const int step = warp_fold ? stride : 1;
  const auto next_tile = [&](int j0, int j1, int j) {
    if (j + step < j1) return j + step;
    return j0 + stride < j_end ? j0 + stride : -1;
  };
  // With more than one tile a warp, the next tile's K is copied while this tile's P·V waits for
  // its V and runs, and its V while the next scores: a tile's copies are in flight during the
  // warp's own arithmetic, not only other warps'. The arithmetic and its order are the same.
  TileRows cur{};
  bool staged = false;  // cur's K and V copies are in flight
  for (int j0 = static_cast<int>(blockIdx.y); work && j0 < j_end; j0 += stride) {
    const int j1 = warp_fold || j0 == tiles - 1 ? n_tiles : j0 + 1;
    float o[NB][4];
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) o[nb][0] = o[nb][1] = o[nb][2] = o[nb][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    for (int j = j0; j < j1; j += step) {
      if (!staged) {
        cur = lookup(j);
        stage(cur, sk, a.k_pool);
        stage(cur, sv, a.v_pool);
      }
      const int nt = next_tile(j0, j1, j);
      TileRows nxt{};
      if (nt >= 0) nxt = lookup(nt);
      cp_async_wait_group<1>();  // K
      __syncwarp();
      if (fused) take_new(cur, sk, s_new);
      float s[kKvTile / 8][4];
      tile_scores<D, LD>(s, qa, sk, lane);
      float mx[2], lt[2], wa[2], wb[2];
      tile_mask_max(s, j * kKvTile, vis, scale2, q4, mx);
      uint32_t pa[kKvTile / 16][4];
      tile_probabilities(s, mx, lt, pa);
      fold_tile_sums(m, l, mx, lt, wa, wb);
      if (nt >= 0) {
        __syncwarp();  // every lane's reads of sk are done
        stage(nxt, sk, a.k_pool);
        cp_async_wait_group<1>();  // V (the next K may stay in flight)
      } else {
        cp_async_wait_group<0>();  // V
      }
      __syncwarp();
      if (fused) take_new(cur, sv, s_new + D);
      fold_tile_pv<D, LD>(o, pa, sv, lane, wa, wb);
      __syncwarp();  // the tile is consumed before the next one is staged over it
      staged = nt >= 0;
      if (staged) {
        stage(nxt, sv, a.v_pool);
        cur = nxt;
      }
    }

#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (!valid[i]) continue;
      const int64_t n = (static_cast<int64_t>(tok[i]) * a.heads + head[i]) * tiles + j0;
      if (q4 == 0) {
        a.partial_m[n] = m[i];
        a.partial_l[n] = l[i];
      }
      float* po = a.partial_acc + n * D + 2 * q4;
#pragma unroll
      for (int nb = 0; nb < NB; ++nb)
        *reinterpret_cast<float2*>(po + nb * 8) = make_float2(o[nb][2 * i], o[nb][2 * i + 1]);
    }
  }
  if (a.arrivals == nullptr) return;

  // The last warp of this (row, kv head, pairs) to arrive folds its pairs' partials, as the
  // merge kernel would.
  __threadfence();  // this warp's partials are visible device-wide before it arrives
  __syncwarp();
  int last = 0;
  if (lane == 0) {
    int* counter = a.arrivals + x;
    last = atomicAdd(counter, 1) == static_cast<int>(gridDim.y) - 1;
    if (last) *counter = 0;  // every warp has arrived: ready for the next launch
  }
  if (!__shfl_sync(0xffffffffu, last, 0)) return;
  __threadfence();
  for (int p = pb * 16; p < min(pairs, pb * 16 + 16); ++p)
    merge_pair<D>(a, tiles, static_cast<int64_t>(row_begin + p / group) * a.heads + kvh * group + p % group, lane);
}

// One warp per (token, head): folds the token's tile partials in tile order (merge_pair), as
// the tile-fold flash kernel folds its tiles, and writes the normalized output.
template <int D>
__global__ void __launch_bounds__(128) tile_decode_merge_kernel(AttentionArgs a, int tiles) {
  enter_kernel();
  const int64_t w = static_cast<int64_t>(blockIdx.x) * 4 + threadIdx.x / 32;
  if (w >= static_cast<int64_t>(a.tokens) * a.heads) return;
  merge_pair<D>(a, tiles, w, static_cast<int>(threadIdx.x % 32));
}

template <int D>
bool launch_tile_decode_typed(const AttentionArgs& a, int max_row_tokens, int tiles, bool warp_fold,
                              const Context& ctx) {
  const int group = a.heads / a.kv_heads;
  const int pair_blocks = static_cast<int>((int64_t{max_row_tokens} * group + 15) / 16);
  const int64_t blocks = int64_t{a.rows} * a.kv_heads * pair_blocks;
  const int64_t merge_blocks = (int64_t{a.tokens} * a.heads + 3) / 4;
  // The kernel indexes the pool's rows (slot and kv head) as ints.
  const bool rows_fit_int = a.pool_blocks * a.block_size * a.kv_heads <= 0x7fffffff;
  if (blocks > 0x7fffffff || merge_blocks > 0x7fffffff || tiles < 1 || tiles > 65535 || !rows_fit_int) return false;
  // The K and V tiles, and for a fused step (one token a row) the rotated q of its group and the
  // new k and v: under the 48 KB default.
  const size_t smem =
      size_t{2} * kKvTile * (D + 8) * sizeof(__nv_bfloat16) +
      (a.k_new ? static_cast<size_t>(std::min(16, group)) * D * sizeof(float) + 2 * D * sizeof(__nv_bfloat16) : 0);
  // Enough warps to keep every SM's six tile buffers busy a few times over; past that, a warp
  // takes several of its row's tiles in turn (fewer warps that find nothing to do once the
  // stated length is padded past the rows' own). From kOneWarpBlocks blocks on, the blocks alone
  // fill the SMs' buffers, and each takes all its row's tiles in one warp.
  constexpr int64_t kWarpsWanted = 2048, kOneWarpBlocks = 1024;
  const int stride =
      blocks >= kOneWarpBlocks
          ? 1
          : static_cast<int>(std::min<int64_t>(tiles, std::max<int64_t>(1, (kWarpsWanted + blocks - 1) / blocks)));
  // A warp that walks all its row's tiles (stride 1) folds them as it goes, in tile order, into
  // one partial: the fold the merge would do, step for step, so the same bits in either mode, and
  // one partial a token to write and reread instead of one a tile. With warp_fold (the fast mode),
  // at any stride: one partial a warp.
  const bool fold = warp_fold || stride == 1;
  const int slots = fold ? stride : tiles;
  launch(tile_decode_kernel<D>, dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(stride)), 32, smem, ctx, a,
         slots, pair_blocks, stride, fold);
  if (a.arrivals == nullptr)
    launch(tile_decode_merge_kernel<D>, dim3(static_cast<unsigned>(merge_blocks)), 128, 0, ctx, a, slots);
  return true;
}

}  // namespace

bool flash_attention_supports(ElemType pool_type, int head_dim) {
  return pool_type == ElemType::bf16 && (head_dim == 64 || head_dim == 96 || head_dim == 128);
}

bool launch_flash_attention(const AttentionArgs& a, int max_row_tokens, bool fold, const Context& ctx) {
  if (a.tokens == 0 || a.heads == 0 || max_row_tokens <= 0) return true;
  if (!flash_attention_supports(a.pool_type, a.head_dim)) return false;
  switch (a.head_dim) {
    case 64:
      return fold ? launch_flash_typed<64, true>(a, max_row_tokens, ctx)
                  : launch_flash_typed<64, false>(a, max_row_tokens, ctx);
    case 96:
      return fold ? launch_flash_typed<96, true>(a, max_row_tokens, ctx)
                  : launch_flash_typed<96, false>(a, max_row_tokens, ctx);
    case 128:
      return fold ? launch_flash_typed<128, true>(a, max_row_tokens, ctx)
                  : launch_flash_typed<128, false>(a, max_row_tokens, ctx);
    default:
      return false;
  }
}

bool launch_tile_decode_attention(const AttentionArgs& a, int max_row_tokens, int tiles, bool warp_fold,
                                  const Context& ctx) {
  if (a.tokens == 0 || a.heads == 0 || max_row_tokens <= 0) return true;
  if (!flash_attention_supports(a.pool_type, a.head_dim) || a.partial_acc == nullptr) return false;
  switch (a.head_dim) {
    case 64:
      return launch_tile_decode_typed<64>(a, max_row_tokens, tiles, warp_fold, ctx);
    case 96:
      return launch_tile_decode_typed<96>(a, max_row_tokens, tiles, warp_fold, ctx);
    case 128:
      return launch_tile_decode_typed<128>(a, max_row_tokens, tiles, warp_fold, ctx);
    default:
      return false;
  }
}

}  // namespace specdec::cuda
