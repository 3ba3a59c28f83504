// Causal paged attention on the tensor cores: one block per (row, kv head, tile of the row's new
// tokens), flash-style online softmax over 64-position tiles of the paged cache, bf16 mma with f32
// accumulation. q and the probabilities are rounded to bf16 for the products, so results differ
// from attention.cu's f32 kernel within bf16 rounding.
// Batch invariant: a token's output depends only on its q and its row's cache. Every token walks
// the cache tiles 0, 1, 2, ... in order whatever its block; the tiles past its own visible length
// (its block reaches further for a later token) mask it to nothing and leave its sums exactly as
// they were (the rescale factor is exactly 1 when the running maximum does not change, and its
// probabilities there are exactly 0). Mma rows do not mix. So a prefill chunk, a verify window
// and single decode steps give each token the same bits, alone or beside other rows.
#include <cuda_bf16.h>

#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"

namespace specdec::cuda {
namespace {

constexpr int kFlashWarps = 4;
constexpr int kFlashThreads = kFlashWarps * 32;
constexpr int kKvTile = 64;  // cached positions per tile (one pass of the softmax)

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
__device__ __forceinline__ void cp_async16_zfill(void* smem_dst, const void* global_src, int bytes) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(global_src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit_group() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Block: 4 warps; warp w takes q head h0 + w % hpc and 16 tokens starting at (w / hpc) * 16 of
// the block's tile of 16 * 4 / hpc tokens (hpc: q heads a block serves, sharing each K/V tile).
// Per K/V tile of 64 positions (staged in shared memory, the next tile's copies in flight during
// this one's products): S = q·Kᵀ (mma, K rows read as the B operand), masked by each token's
// visible length, online softmax in f32 (exp2), then O += P·V with P taken from S's accumulator
// layout as the A operand and V transposed by ldmatrix.
template <int D>
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
    const float* q1 = q0 + static_cast<int64_t>(8) * a.heads * D;
#pragma unroll
    for (int kk = 0; kk < KK; ++kk) {
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
      const int p = i / CH, c = i % CH, pos = j * kKvTile + p;
      int64_t slot = -1;
      if (pos < kv_end && pos / a.block_size < a.max_blocks) {
        slot = static_cast<int64_t>(table[pos / a.block_size]) * a.block_size + pos % a.block_size;
        if (slot >= pool_slots) slot = -1;
      }
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
#pragma unroll
    for (int nb = 0; nb < kKvTile / 8; ++nb) {
      s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.0f;
      const __nv_bfloat16* krow = ks + (nb * 8 + g) * LD + 2 * q4;
#pragma unroll
      for (int kk = 0; kk < KK; ++kk) {
        const uint32_t b0 = *reinterpret_cast<const uint32_t*>(krow + kk * 16);
        const uint32_t b1 = *reinterpret_cast<const uint32_t*>(krow + kk * 16 + 8);
        mma_bf16(s[nb], qa[kk], b0, b1);
      }
    }
    // Mask, scale, and the rows' maxima (each row's 64 scores are spread over a quad of lanes).
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nb = 0; nb < kKvTile / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = e / 2, pos = kv0 + nb * 8 + 2 * q4 + (e & 1);
        s[nb][e] = pos < vis[i] ? s[nb][e] * scale2 : -INFINITY;
        mx[i] = fmaxf(mx[i], s[nb][e]);
      }
    float alpha[2], base[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
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
      // ldmatrix rows: lanes 0-7 positions 0-7 and lanes 8-15 positions 8-15 at columns d0,
      // lanes 16-31 the same at d0 + 8: the B fragments of output blocks d0 and d0 + 8.
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
    __syncthreads();  // this buffer is consumed: the next iteration stages into it
  }

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (!valid[i]) continue;
    const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;  // a token with no visible position gets zeros
    float* out = a.out + (static_cast<int64_t>(t0 + wt0 + g + 8 * i) * a.heads + h) * D + 2 * q4;
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
      *reinterpret_cast<float2*>(out + nb * 8) = make_float2(o[nb][2 * i] * inv, o[nb][2 * i + 1] * inv);
  }
}

template <int D>
bool launch_flash_typed(const AttentionArgs& a, int max_row_tokens, const Context& ctx) {
  const int group = a.heads / a.kv_heads;
  const int hpc = group % 4 == 0 ? 4 : group % 2 == 0 ? 2 : 1;
  const int bq = 16 * (kFlashWarps / hpc);
  const int tiles_per_row = (max_row_tokens + bq - 1) / bq;
  const int64_t blocks = int64_t{a.rows} * tiles_per_row;
  if (blocks > 0x7fffffff || a.kv_heads * (group / hpc) > 65535) return false;
  const size_t smem = size_t{4} * kKvTile * (D + 8) * sizeof(__nv_bfloat16);
  static const bool raised =
      cudaFuncSetAttribute(flash_attention_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem)) == cudaSuccess;
  if (!raised) {
    cudaGetLastError();
    return false;
  }
  launch(flash_attention_kernel<D>, dim3(static_cast<unsigned>(blocks), a.kv_heads * (group / hpc)), kFlashThreads,
         smem, ctx, a, tiles_per_row, hpc);
  return true;
}

}  // namespace

bool flash_attention_supports(ElemType pool_type, int head_dim) {
  return pool_type == ElemType::bf16 && (head_dim == 64 || head_dim == 96 || head_dim == 128);
}

bool launch_flash_attention(const AttentionArgs& a, int max_row_tokens, const Context& ctx) {
  if (a.tokens == 0 || a.heads == 0 || max_row_tokens <= 0) return true;
  if (!flash_attention_supports(a.pool_type, a.head_dim)) return false;
  switch (a.head_dim) {
    case 64:
      return launch_flash_typed<64>(a, max_row_tokens, ctx);
    case 96:
      return launch_flash_typed<96>(a, max_row_tokens, ctx);
    case 128:
      return launch_flash_typed<128>(a, max_row_tokens, ctx);
    default:
      return false;
  }
}

}  // namespace specdec::cuda
