// The tensor-core linear: out[M, N] = x[M, K] · w[N, K]ᵀ for 16-bit weights, with the row
// kernel's fused forms (several projections of one x, the residual add, the SwiGLU gate). x is
// f32 in memory; each element is rounded to the weight's type (round to nearest even) as it is
// read into an MMA fragment, and products are summed in f32 by mma.sync m16n8k16.
//
// Reduction order: an output (m, n) is one f32 accumulator that starts at zero and takes the
// MMA k-steps k = 0, 16, 32, ... < K in that order, each step adding the 16 products of that step
// as the tensor core does (a function of the step's 16 pairs and the accumulator alone). No
// split of K, no exchange between threads before the epilogue. Which rows share a tile, the tile
// sizes, the pipeline depth and the grid shape change which thread computes an output, never
// its operations: a row's bits are the same at any M, in any batch, for any tile config.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"

namespace specdec::cuda {
namespace {

// 16-byte (or 4-byte) asynchronous copies global -> shared; src_bytes < size fills the rest of
// the destination with zeros (rows past M, columns past K, weight rows past N).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, int src_bytes) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_4(void* dst, const void* src, int src_bytes) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(d), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void commit_group() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait_group() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

template <typename W>
struct Mma;

template <>
struct Mma<__nv_bfloat16> {
  __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  __device__ __forceinline__ static void run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

template <>
struct Mma<__half> {
  __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  __device__ __forceinline__ static void run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
}

// A tile config: BM x BN outputs a block, WM x WN a warp, K staged BK at a time in STAGES.
template <int BM_, int BN_, int WM_, int WN_, int BK_, int STAGES_>
struct Tile {
  static constexpr int BM = BM_, BN = BN_, WM = WM_, WN = WN_, BK = BK_, STAGES = STAGES_;
  static constexpr int WARPS_M = BM / WM, WARPS_N = BN / WN, THREADS = WARPS_M * WARPS_N * 32;
  static constexpr int A_STRIDE = BK + 8;  // f32 per staged row of x (conflict-free 8-byte reads)
  static constexpr int B_STRIDE = BK + 8;  // 16-bit elements per staged weight row (ldmatrix)
  static constexpr int A_BYTES = BM * A_STRIDE * 4, B_BYTES = BN * B_STRIDE * 2;
  static constexpr int STAGE_BYTES = A_BYTES + B_BYTES;
  static constexpr int C_STRIDE = BN + 4;
  static constexpr size_t smem() {
    const size_t pipe = size_t(STAGES) * STAGE_BYTES, c = size_t(BM) * C_STRIDE * 4;
    return pipe > c ? pipe : c;
  }
  static_assert(WM % 16 == 0 && WN % 8 == 0 && BK % 16 == 0, "MMA shape");
  static_assert(WN == 8 || WN % 16 == 0, "B fragments in pairs of n8 tiles, or one");
};

// Tiles (see launch_gemm for the choice): few rows (decode steps) stream narrow column tiles
// deep; many rows (prefill chunks) reuse each staged operand across large warp tiles.
using SmallTile = Tile<16, 32, 16, 8, 64, 8>;
using MidTile = Tile<64, 64, 32, 32, 32, 5>;
using LargeTile = Tile<128, 128, 64, 32, 32, 3>;
// Alternatives kept for measurement (CudaTuning::gemm_tile 4..6): a deeper small tile, a
// narrower one (twice the blocks), and a wider large one. None streams one row's weights faster
// than SmallTile (docs/benchmarks.md), nor does a small tile of 512-byte pieces of each row.
using DeepSmallTile = Tile<16, 32, 16, 8, 64, 12>;
using NarrowSmallTile = Tile<16, 16, 16, 8, 64, 12>;
using WideLargeTile = Tile<128, 256, 64, 64, 32, 3>;

// Weight row r of a block's BN virtual rows: the row (or nullptr past the end) whose dot
// products fill column r of the tile. silu_gate tiles hold BN/2 gate rows, then the same BN/2
// up rows, so that an output's gate and up products meet in the block.
template <typename W, int BN, LinearEpilogue E>
__device__ __forceinline__ const W* weight_row(const LinearRowsArgs& a, int n_total, int tile_n, int r) {
  if constexpr (E == LinearEpilogue::silu_gate) {
    const int c = tile_n * (BN / 2) + (r % (BN / 2));
    if (c >= n_total) return nullptr;
    return static_cast<const W*>(a.seg[r < BN / 2 ? 0 : 1].w) + static_cast<int64_t>(c) * a.K;
  } else {
    int c = tile_n * BN + r;
    if (c >= n_total) return nullptr;
    if (a.segments > 1 && c >= a.seg[0].n) {
      c -= a.seg[0].n;
      if (a.segments > 2 && c >= a.seg[1].n) return static_cast<const W*>(a.seg[2].w) + static_cast<int64_t>(c - a.seg[1].n) * a.K;
      return static_cast<const W*>(a.seg[1].w) + static_cast<int64_t>(c) * a.K;
    }
    return static_cast<const W*>(a.seg[0].w) + static_cast<int64_t>(c) * a.K;
  }
}

template <typename W, typename T, LinearEpilogue E>
__global__ void __launch_bounds__(T::THREADS) gemm_kernel(LinearRowsArgs a, int n_total, int x_aligned) {
  constexpr int BM = T::BM, BN = T::BN, BK = T::BK, STAGES = T::STAGES, NT = T::THREADS;
  constexpr int MI = T::WM / 16, NI = T::WN / 8;
  extern __shared__ float4 smem4[];
  char* smem = reinterpret_cast<char*>(smem4);
  const int M = a.M, K = a.K;
  const int tile_m = blockIdx.x, tile_n = blockIdx.y;
  const int m0 = tile_m * BM;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int warp_m = warp / T::WARPS_N, warp_n = warp % T::WARPS_N;
  const int k_tiles = (K + BK - 1) / BK;

  // This thread's weight chunks (16 bytes = 8 elements) of each stage: fixed rows, so the row
  // pointers are found once.
  constexpr int B_CHUNKS = BN * BK / 8, B_PER = (B_CHUNKS + NT - 1) / NT;
  const W* brow[B_PER];
  int bcol[B_PER], bdst[B_PER];
#pragma unroll
  for (int j = 0; j < B_PER; ++j) {
    const int i = tid + j * NT;
    const int r = i / (BK / 8), c = (i % (BK / 8)) * 8;
    brow[j] = i < B_CHUNKS ? weight_row<W, BN, E>(a, n_total, tile_n, r) : nullptr;
    bcol[j] = i < B_CHUNKS ? c : -1;
    bdst[j] = r * T::B_STRIDE + c;
  }
  auto load_b = [&](int stage, int kt) {
    W* sb = reinterpret_cast<W*>(smem + stage * T::STAGE_BYTES + T::A_BYTES);
    const int k0 = kt * BK;
#pragma unroll
    for (int j = 0; j < B_PER; ++j) {
      if (bcol[j] < 0) continue;
      const int k = k0 + bcol[j];
      const bool ok = brow[j] != nullptr && k < K;
      cp_async_16(sb + bdst[j], ok ? static_cast<const void*>(brow[j] + k) : a.seg[0].w, ok ? 16 : 0);
    }
  };
  constexpr int A_CHUNKS = BM * BK / 4, A_PER = (A_CHUNKS + NT - 1) / NT;
  auto load_a = [&](int stage, int kt) {
    float* sa = reinterpret_cast<float*>(smem + stage * T::STAGE_BYTES);
    const int k0 = kt * BK;
#pragma unroll
    for (int j = 0; j < A_PER; ++j) {
      const int i = tid + j * NT;
      if (i >= A_CHUNKS) continue;
      const int r = i / (BK / 4), c = (i % (BK / 4)) * 4;
      const int m = m0 + r, k = k0 + c;
      if (m >= M) continue;  // zeroed once below, never loaded
      const bool ok = k < K;
      const float* src = ok ? a.x + static_cast<int64_t>(m) * K + k : a.x;
      float* dst = sa + r * T::A_STRIDE + c;
      if (x_aligned) {
        cp_async_16(dst, src, ok ? 16 : 0);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) cp_async_4(dst + e, ok ? src + e : a.x, ok ? 4 : 0);
      }
    }
  };

  // Rows of the tile past M: zero in every stage (their outputs are not stored; an MMA output
  // depends on its own row of x alone, so they could hold anything, but stay defined).
  if (m0 + BM > M) {
    for (int i = tid; i < STAGES * BM * T::A_STRIDE; i += NT) {
      const int stage = i / (BM * T::A_STRIDE), e = i % (BM * T::A_STRIDE);
      if (m0 + e / T::A_STRIDE >= M) reinterpret_cast<float*>(smem + stage * T::STAGE_BYTES)[e] = 0.0f;
    }
  }
  // Weights are never written by a kernel: the prologue's weight loads go out before the wait
  // for the previous kernel (they join the first stage's group).
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s)
    if (s < k_tiles) load_b(s, s);
  allow_dependents();
  grid_dependency_wait();
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < k_tiles) load_a(s, s);
    commit_group();
  }

  float acc[MI][NI][4];
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

  const int g = lane / 4, t = lane % 4;
  for (int kt = 0; kt < k_tiles; ++kt) {
    wait_group<STAGES - 2>();
    __syncthreads();  // stage kt has landed for all threads; stage kt - 1 is consumed by all
    {
      const int next = kt + STAGES - 1;
      if (next < k_tiles) {
        load_b(next % STAGES, next);
        load_a(next % STAGES, next);
      }
      commit_group();
    }
    const float* sa = reinterpret_cast<const float*>(smem + (kt % STAGES) * T::STAGE_BYTES);
    const W* sb = reinterpret_cast<const W*>(smem + (kt % STAGES) * T::STAGE_BYTES + T::A_BYTES);
#pragma unroll
    for (int ks = 0; ks < BK; ks += 16) {
      if (kt * BK + ks >= K) break;  // k-steps past K are not taken (same steps for any tile)
      uint32_t af[MI][4];
#pragma unroll
      for (int i = 0; i < MI; ++i) {
        const float* p = sa + (warp_m * T::WM + i * 16 + g) * T::A_STRIDE + ks + 2 * t;
        const float2 v0 = *reinterpret_cast<const float2*>(p);
        const float2 v1 = *reinterpret_cast<const float2*>(p + 8 * T::A_STRIDE);
        const float2 v2 = *reinterpret_cast<const float2*>(p + 8);
        const float2 v3 = *reinterpret_cast<const float2*>(p + 8 * T::A_STRIDE + 8);
        af[i][0] = Mma<W>::pack(v0.x, v0.y);
        af[i][1] = Mma<W>::pack(v1.x, v1.y);
        af[i][2] = Mma<W>::pack(v2.x, v2.y);
        af[i][3] = Mma<W>::pack(v3.x, v3.y);
      }
      uint32_t bf[NI][2];
      if constexpr (NI == 1) {
        const W* p = sb + (warp_n * T::WN + (lane & 7)) * T::B_STRIDE + ks + ((lane >> 3) & 1) * 8;
        ldmatrix_x2(bf[0], p);
      } else {
#pragma unroll
        for (int j = 0; j < NI; j += 2) {
          const W* p = sb + (warp_n * T::WN + j * 8 + (lane & 7) + ((lane >> 4) << 3)) * T::B_STRIDE + ks +
                       ((lane >> 3) & 1) * 8;
          uint32_t r[4];
          ldmatrix_x4(r, p);
          bf[j][0] = r[0];
          bf[j][1] = r[1];
          bf[j + 1][0] = r[2];
          bf[j + 1][1] = r[3];
        }
      }
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j) Mma<W>::run(acc[i][j], af[i], bf[j][0], bf[j][1]);
    }
  }
  wait_group<0>();
  __syncthreads();  // the pipeline's shared memory becomes the output tile

  float* sc = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j) {
      const int r = warp_m * T::WM + i * 16 + g, c = warp_n * T::WN + j * 8 + 2 * t;
      sc[r * T::C_STRIDE + c] = acc[i][j][0];
      sc[r * T::C_STRIDE + c + 1] = acc[i][j][1];
      sc[(r + 8) * T::C_STRIDE + c] = acc[i][j][2];
      sc[(r + 8) * T::C_STRIDE + c + 1] = acc[i][j][3];
    }
  __syncthreads();

  // The epilogue's arithmetic is the row kernel's (linear.cu), so the two agree where they
  // compute the same dot product.
  if constexpr (E == LinearEpilogue::silu_gate) {
    constexpr int H = BN / 2;
    float* out = a.seg[0].out;
    for (int i = tid; i < BM * H; i += NT) {
      const int r = i / H, c = i % H;
      const int m = m0 + r, n = tile_n * H + c;
      if (m >= M || n >= n_total) continue;
      const float gv = sc[r * T::C_STRIDE + c], up = sc[r * T::C_STRIDE + H + c];
      out[static_cast<int64_t>(m) * n_total + n] = gv / (1.0f + expf(-gv)) * up;
    }
  } else {
    for (int i = tid; i < BM * BN; i += NT) {
      const int r = i / BN, c = i % BN;
      const int m = m0 + r;
      int n = tile_n * BN + c;
      if (m >= M || n >= n_total) continue;
      const float v = sc[r * T::C_STRIDE + c];
      LinearSegment sg = a.seg[0];
      if (a.segments > 1 && n >= a.seg[0].n) {
        n -= a.seg[0].n;
        sg = a.seg[1];
        if (a.segments > 2 && n >= a.seg[1].n) {
          n -= a.seg[1].n;
          sg = a.seg[2];
        }
      }
      const float b = sg.bias ? sg.bias[n] : 0.0f;
      float* o = sg.out + static_cast<int64_t>(m) * sg.n + n;
      if constexpr (E == LinearEpilogue::add) {
        *o = *o + (v + b);
      } else {
        *o = v + b;
      }
    }
  }
}

int sm_count() {
  static const int n = [] {
    int device = 0, count = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      cudaGetLastError();
      return 132;
    }
    return count;
  }();
  return n;
}

template <typename W, typename T, LinearEpilogue E>
void launch_tile(const LinearRowsArgs& a, int n_total, const Context& ctx) {
  const auto kernel = gemm_kernel<W, T, E>;
  constexpr size_t smem = T::smem();
  static_assert(smem <= 227 * 1024, "a block's shared memory");
  static const bool raised = [&] {
    if (smem <= 48 * 1024) return true;
    const bool ok = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem)) == cudaSuccess;
    if (!ok) cudaGetLastError();
    return ok;
  }();
  (void)raised;  // a failure shows as the launch's error
  const int per_tile = E == LinearEpilogue::silu_gate ? T::BN / 2 : T::BN;
  const dim3 grid(static_cast<unsigned>((a.M + T::BM - 1) / T::BM), static_cast<unsigned>((n_total + per_tile - 1) / per_tile));
  const int x_aligned = reinterpret_cast<uintptr_t>(a.x) % 16 == 0 ? 1 : 0;
  launch(kernel, grid, dim3(T::THREADS), smem, ctx, a, n_total, x_aligned);
}

// Which tile serves M rows: the small tile while a step reads each weight once for at most 16
// rows; the large tile once its blocks fill the device; the mid tile between. The choice changes
// no result (see the top of this file); CudaTuning::gemm_tile forces one.
int tile_for(int M, int n_total, int forced) {
  if (forced >= 1 && forced <= 6) return forced;
  if (M <= 16) return 1;
  const int64_t large_blocks = int64_t{(M + 127) / 128} * ((n_total + 127) / 128);
  if (large_blocks >= 2 * sm_count()) return 3;
  return 2;
}

template <typename W, LinearEpilogue E>
void launch_for(const LinearRowsArgs& a, int n_total, const Context& ctx) {
  switch (tile_for(a.M, E == LinearEpilogue::silu_gate ? 2 * n_total : n_total, ctx.tuning.gemm_tile)) {
    case 1:
      return launch_tile<W, SmallTile, E>(a, n_total, ctx);
    case 2:
      return launch_tile<W, MidTile, E>(a, n_total, ctx);
    case 4:
      return launch_tile<W, DeepSmallTile, E>(a, n_total, ctx);
    case 5:
      return launch_tile<W, NarrowSmallTile, E>(a, n_total, ctx);
    case 6:
      return launch_tile<W, WideLargeTile, E>(a, n_total, ctx);
    default:
      return launch_tile<W, LargeTile, E>(a, n_total, ctx);
  }
}

template <typename W>
void launch_epilogue(const LinearRowsArgs& a, int n_total, const Context& ctx) {
  switch (a.epilogue) {
    case LinearEpilogue::store:
      return launch_for<W, LinearEpilogue::store>(a, n_total, ctx);
    case LinearEpilogue::add:
      return launch_for<W, LinearEpilogue::add>(a, n_total, ctx);
    case LinearEpilogue::silu_gate:
      return launch_for<W, LinearEpilogue::silu_gate>(a, n_total, ctx);
  }
}

}  // namespace

bool gemm_supports(ElemType w_type, int K, const void* const* weights, int count) {
  if (w_type != ElemType::bf16 && w_type != ElemType::f16) return false;
  if (K <= 0 || K % 8 != 0) return false;
  for (int j = 0; j < count; ++j)
    if (reinterpret_cast<uintptr_t>(weights[j]) % 16 != 0) return false;
  return true;
}

void launch_gemm(const LinearRowsArgs& a, const Context& ctx) {
  int n_total = 0;
  if (a.epilogue == LinearEpilogue::silu_gate) {
    n_total = a.seg[0].n;
  } else {
    for (int j = 0; j < a.segments; ++j) n_total += a.seg[j].n;
  }
  if (a.M == 0 || n_total == 0) return;
  if (a.w_type == ElemType::bf16) return launch_epilogue<__nv_bfloat16>(a, n_total, ctx);
  launch_epilogue<__half>(a, n_total, ctx);
}

}  // namespace specdec::cuda
