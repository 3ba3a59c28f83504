// The tensor-core linear: out[M, N] = x[M, K] · w[N, K]ᵀ for 16-bit weights, with the row
// kernel's fused forms (several projections of one x, the residual add, the SwiGLU gate). x is
// f32 in memory; each element is rounded to the weight's type (round to nearest even) as it is
// read into an MMA fragment, and products are summed in f32 by mma.sync m16n8k16.
//
// Reduction order, a function of K alone: K is cut into slices of slice_len(K) (a multiple of
// 64). Within a slice an output (m, n) is one f32 accumulator that starts at zero and takes the
// MMA k-steps of the slice in increasing k, each step adding its 16 products as the tensor core
// does (a function of the step's 16 pairs and the accumulator alone). The output is then
// 0 + p_0 + p_1 + ... over the slices' sums, left to right. Which rows share a tile, the tile
// sizes, the pipeline depth, the grid shape and which warp sums a slice change which thread
// computes an output, never its operations: a row's bits are the same at any M, in any batch,
// for any kernel here.
//
// Two kernels share that order. The tiled kernel (many rows: verify windows, prefill chunks,
// large batches) walks K in order in every block and folds each slice's accumulator into a
// running sum as it leaves the slice. The stream kernel (a few rows: decode steps) gives each
// (8-column tile, slice) pair to one warp, so that a step has the thousands of independent
// weight streams that keep the memory busy, then sums the slices in a block.
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

// Tiles of the tiled kernel (see tile_for for the choice): many rows (prefill chunks) reuse each
// staged operand across large warp tiles. SmallTile serves few rows only when forced (the stream
// kernel reads their weights faster).
using SmallTile = Tile<16, 32, 16, 8, 64, 8>;
using MidTile = Tile<64, 64, 32, 32, 32, 5>;
using LargeTile = Tile<128, 128, 64, 32, 32, 3>;
// The large tile with 16 warps of 32 x 32 (half the registers a thread holds; tile 7).
using LargeTile16 = Tile<128, 128, 32, 32, 32, 3>;

// The slice length of K (see the top of this file): about eight slices per 4,096 of K, so that a
// decode step's weights split into enough streams, each a multiple of 512 (the stream kernel's
// widest chunk; a whole number of every tile's BK).
__host__ __device__ constexpr int slice_len(int K) {
  const int target = 8 * ((K + 4095) / 4096);
  const int len = ((K + target - 1) / target + 511) / 512 * 512;
  return len < 512 ? 512 : len;
}

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
      if (a.segments > 2 && c >= a.seg[1].n)
        return static_cast<const W*>(a.seg[2].w) + static_cast<int64_t>(c - a.seg[1].n) * a.K;
      return static_cast<const W*>(a.seg[1].w) + static_cast<int64_t>(c) * a.K;
    }
    return static_cast<const W*>(a.seg[0].w) + static_cast<int64_t>(c) * a.K;
  }
}

// Output (m, n) of the epilogue E from its dot product v (and, for silu_gate, the up row's
// product up): the row kernel's arithmetic (linear.cu), so the two agree where they compute the
// same dot product. n counts the columns of all segments consecutively.
template <LinearEpilogue E>
__device__ __forceinline__ void store_output(const LinearRowsArgs& a, int m, int n, int n_total, float v, float up) {
  if constexpr (E == LinearEpilogue::silu_gate) {
    a.seg[0].out[static_cast<int64_t>(m) * n_total + n] = v / (1.0f + expf(-v)) * up;
  } else {
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

template <typename W, typename T, LinearEpilogue E>
__global__ void __launch_bounds__(T::THREADS) gemm_kernel(LinearRowsArgs a, int n_total, int x_aligned) {
  constexpr int BM = T::BM, BN = T::BN, BK = T::BK, STAGES = T::STAGES, NT = T::THREADS;
  static_assert(512 % BK == 0, "slices hold whole k-tiles");
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

  // acc: the current slice's sums; sum: 0 + the finished slices' sums, left to right.
  float acc[MI][NI][4], sum[MI][NI][4];
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = sum[i][j][e] = 0.0f;
  const auto fold = [&] {
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int j = 0; j < NI; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          sum[i][j][e] += acc[i][j][e];
          acc[i][j][e] = 0.0f;
        }
  };
  const int tiles_per_slice = slice_len(K) / BK;

  const int g = lane / 4, t = lane % 4;
  for (int kt = 0; kt < k_tiles; ++kt) {
    if (kt > 0 && kt % tiles_per_slice == 0) fold();
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
  fold();
  wait_group<0>();
  __syncthreads();  // the pipeline's shared memory becomes the output tile

  float* sc = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j) {
      const int r = warp_m * T::WM + i * 16 + g, c = warp_n * T::WN + j * 8 + 2 * t;
      sc[r * T::C_STRIDE + c] = sum[i][j][0];
      sc[r * T::C_STRIDE + c + 1] = sum[i][j][1];
      sc[(r + 8) * T::C_STRIDE + c] = sum[i][j][2];
      sc[(r + 8) * T::C_STRIDE + c + 1] = sum[i][j][3];
    }
  __syncthreads();

  constexpr int H = E == LinearEpilogue::silu_gate ? BN / 2 : BN;
  for (int i = tid; i < BM * H; i += NT) {
    const int r = i / H, c = i % H;
    const int m = m0 + r, n = tile_n * H + c;
    if (m >= M || n >= n_total) continue;
    const float up = E == LinearEpilogue::silu_gate ? sc[r * T::C_STRIDE + H + c] : 0.0f;
    store_output<E>(a, m, n, n_total, sc[r * T::C_STRIDE + c], up);
  }
}

// A stream kernel configuration: WARPS a block, each keeping DEPTH - 1 chunks of CK columns of K
// (8 weight rows each) in flight.
template <int WARPS_, int DEPTH_, int CK_, bool XS_ = false>
struct Stream {
  static constexpr int WARPS = WARPS_, DEPTH = DEPTH_, CK = CK_;
  // XS: each chunk's columns of x (its M rows, f32) travel with the weights through the ring,
  // so a k-step's x comes from shared memory instead of a global load in the MMA's chain.
  static constexpr bool XS = XS_;
  static constexpr int X_STRIDE = CK + 8;       // floats per staged row of x
  static constexpr int ROW_STRIDE = CK + 8;     // 16-bit elements per staged weight row (ldmatrix)
  static constexpr int CHUNK = 8 * ROW_STRIDE;  // elements of one staged chunk
  static constexpr int PER = CK / 32;           // 16-byte pieces a lane copies per chunk
  static_assert(512 % CK == 0 && CK % 64 == 0, "slices hold whole chunks");
  // Lane l copies pieces l, l + 32, ...: from CK = 256 up each copy instruction e reads one row,
  // row e / (CK / 256), so a lane's row pointers are the 8 rows' (else one per piece).
  static constexpr bool ROW_PER_COPY = CK >= 256;
  static constexpr int PTRS = ROW_PER_COPY ? 8 : PER;
};
constexpr int kStreamMaxM = 16;         // rows of x: one MMA tile
using StreamNarrow = Stream<8, 6, 64>;  // tile 5
using StreamWide = Stream<4, 4, 256>;   // tile 4: each copy instruction reads 512 bytes of one row
using StreamMid = Stream<8, 4, 128>;    // tile 6
using StreamLong = Stream<4, 3, 512>;   // tile 8: 1,024 contiguous bytes of a row per chunk
// Tile 9, the default: tile 6 with x through the ring (tile 6 where M rows of x do not fit).
using StreamStaged = Stream<8, 4, 128, true>;

// The stream kernel (few rows). A block owns 8 output columns (for silu_gate their 8 gate and 8
// up rows, two 8-column tiles), i.e. NTILE weight tiles of 8 rows. Its units are (tile, slice)
// pairs; warp w takes units w, w + WARPS, ... and streams their weights in chunks of CK columns
// through its own cp.async ring, one chunk after another across its units, so a warp's loads
// never drain between units. A unit's slice sum goes to shared memory; the block then adds the
// slices of each output in order. x (at most 16 rows) comes with each chunk through the ring
// (XS), or else straight from global memory, where each MMA then waits on a load; it is rounded
// as the tiled kernel rounds it. Weight fragments come from the ring by the tiled kernel's
// ldmatrix. Rows of the MMA tile past M are zero.
template <typename W, typename C, LinearEpilogue E>
__global__ void __launch_bounds__(C::WARPS * 32) gemm_stream_kernel(LinearRowsArgs a, int n_total, int x_aligned) {
  constexpr int NTILE = E == LinearEpilogue::silu_gate ? 2 : 1, ROWS = 8 * NTILE;
  constexpr int CK = C::CK, DEPTH = C::DEPTH, WARPS = C::WARPS, PER = C::PER;
  extern __shared__ float4 smem4[];
  const int M = a.M, K = a.K;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int len = slice_len(K), slices = (K + len - 1) / len;
  const int units = NTILE * slices;
  // A ring slot: the chunk's weights, then (XS) its M rows of x.
  const int slot_bytes = C::CHUNK * static_cast<int>(sizeof(W)) + (C::XS ? M * C::X_STRIDE * 4 : 0);
  char* ring = reinterpret_cast<char*>(smem4) + warp * DEPTH * slot_bytes;
  float* part = reinterpret_cast<float*>(reinterpret_cast<char*>(smem4) + WARPS * DEPTH * slot_bytes);

  // This warp's chunks, numbered across its units: unit u = warp + q * WARPS holds chunks_of(u)
  // chunks. Every slice but the last holds len / CK.
  const int full = len / CK, last = (K - (slices - 1) * len + CK - 1) / CK;
  const auto chunks_of = [&](int u) { return u % slices == slices - 1 ? last : full; };
  int total = 0;
  for (int u = warp; u < units; u += WARPS) total += chunks_of(u);

  // Lane l copies the 16-byte pieces l, l + 32, ... of a chunk (CK / 8 pieces a row).
  const W* wrow[NTILE][C::PTRS];
#pragma unroll
  for (int j = 0; j < NTILE; ++j)
#pragma unroll
    for (int e = 0; e < C::PTRS; ++e)
      wrow[j][e] =
          weight_row<W, ROWS, E>(a, n_total, blockIdx.x, j * 8 + (C::ROW_PER_COPY ? e : (lane + 32 * e) / (CK / 8)));
  // Producer position: the unit and chunk the next load is for.
  int pu = warp, pc = 0;
  const auto load_next = [&](int slot) {
    if (pu < units) {
      const int j = pu / slices, k0 = (pu % slices) * len + pc * CK;
      W* dst = reinterpret_cast<W*>(ring + slot * slot_bytes);
      if constexpr (C::XS) {  // M rows of CK floats: CK / 4 pieces a row
        float* xd = reinterpret_cast<float*>(ring + slot * slot_bytes + C::CHUNK * sizeof(W));
        for (int piece = lane; piece < M * (CK / 4); piece += 32) {
          const int m = piece / (CK / 4), c = (piece % (CK / 4)) * 4, k = k0 + c;
          const bool ok = k < K;
          cp_async_16(xd + m * C::X_STRIDE + c, ok ? a.x + static_cast<int64_t>(m) * K + k : a.x, ok ? 16 : 0);
        }
      }
#pragma unroll
      for (int e = 0; e < PER; ++e) {
        const int piece = lane + 32 * e, r = piece / (CK / 8), c = (piece % (CK / 8)) * 8;
        const int k = k0 + c;
        const W* row = wrow[j][C::ROW_PER_COPY ? e / (CK / 256) : e];
        const bool ok = row != nullptr && k < K;
        cp_async_16(dst + r * C::ROW_STRIDE + c, ok ? static_cast<const void*>(row + k) : a.seg[0].w, ok ? 16 : 0);
      }
      if (++pc == chunks_of(pu)) {
        pc = 0;
        pu += WARPS;
      }
    }
    commit_group();
  };
  // Weights are never written by a kernel: the first loads go out before the wait for the
  // previous kernel, unless they carry x (which that kernel may be writing).
  if constexpr (!C::XS) {
#pragma unroll
    for (int s = 0; s < DEPTH - 1; ++s) load_next(s);
  }
  allow_dependents();
  grid_dependency_wait();
  if constexpr (C::XS) {
#pragma unroll
    for (int s = 0; s < DEPTH - 1; ++s) load_next(s);
  }

  const int g = lane / 4, t = lane % 4;
  const float* x0 = a.x + static_cast<int64_t>(g) * K;
  const float* x1 = a.x + static_cast<int64_t>(g + 8) * K;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  int cu = warp, cc = 0;  // consumer position
  for (int q = 0; q < total; ++q) {
    wait_group<DEPTH - 2>();
    __syncwarp();  // chunk q has landed for every lane; chunk q - 1 is consumed by every lane
    load_next((q + DEPTH - 1) % DEPTH);
    const W* sb = reinterpret_cast<const W*>(ring + (q % DEPTH) * slot_bytes);
    const float* xs = reinterpret_cast<const float*>(ring + (q % DEPTH) * slot_bytes + C::CHUNK * sizeof(W));
    const int k0 = (cu % slices) * len + cc * CK;
#pragma unroll
    for (int ks = 0; ks < CK; ks += 16) {
      const int k = k0 + ks;
      if (k >= K) break;  // the tiled kernel's k-steps: none starts past K
      uint32_t af[4];
      float2 v[4] = {};
      const int kk = k + 2 * t;     // and kk + 8: whole pairs, as K is a multiple of 8
      const bool high = k + 8 < K;  // the step's upper 8 columns exist (else zero, as staged)
      if constexpr (C::XS) {        // zero-filled past K by the copies
        const float* r0 = xs + g * C::X_STRIDE + ks + 2 * t;
        if (g < M) v[0] = *reinterpret_cast<const float2*>(r0), v[2] = *reinterpret_cast<const float2*>(r0 + 8);
        if (g + 8 < M) {
          v[1] = *reinterpret_cast<const float2*>(r0 + 8 * C::X_STRIDE);
          v[3] = *reinterpret_cast<const float2*>(r0 + 8 * C::X_STRIDE + 8);
        }
      } else if (x_aligned) {
        if (g < M) {
          v[0] = __ldg(reinterpret_cast<const float2*>(x0 + kk));
          if (high) v[2] = __ldg(reinterpret_cast<const float2*>(x0 + kk + 8));
        }
        if (g + 8 < M) {
          v[1] = __ldg(reinterpret_cast<const float2*>(x1 + kk));
          if (high) v[3] = __ldg(reinterpret_cast<const float2*>(x1 + kk + 8));
        }
      } else {
        if (g < M) {
          v[0] = make_float2(x0[kk], x0[kk + 1]);
          if (high) v[2] = make_float2(x0[kk + 8], x0[kk + 9]);
        }
        if (g + 8 < M) {
          v[1] = make_float2(x1[kk], x1[kk + 1]);
          if (high) v[3] = make_float2(x1[kk + 8], x1[kk + 9]);
        }
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) af[e] = Mma<W>::pack(v[e].x, v[e].y);
      uint32_t bf[2];
      ldmatrix_x2(bf, sb + (lane & 7) * C::ROW_STRIDE + ks + ((lane >> 3) & 1) * 8);
      Mma<W>::run(acc, af, bf[0], bf[1]);
    }
    if (++cc == chunks_of(cu)) {  // the unit's slice is summed: to shared memory, rows < M
      float* p = part + cu * (kStreamMaxM * 8);
      if (g < M) p[g * 8 + 2 * t] = acc[0], p[g * 8 + 2 * t + 1] = acc[1];
      if (g + 8 < M) p[(g + 8) * 8 + 2 * t] = acc[2], p[(g + 8) * 8 + 2 * t + 1] = acc[3];
      acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
      cc = 0;
      cu += WARPS;
    }
  }
  wait_group<0>();
  __syncthreads();

  // 0 + the slices' sums left to right, as the tiled kernel's fold; then its epilogue.
  constexpr int H = E == LinearEpilogue::silu_gate ? 8 : ROWS;
  for (int i = threadIdx.x; i < M * H; i += WARPS * 32) {
    const int m = i / H, c = i % H, n = blockIdx.x * H + c;
    if (n >= n_total) continue;
    float v = 0.0f, up = 0.0f;
    for (int sl = 0; sl < slices; ++sl) v += part[sl * (kStreamMaxM * 8) + m * 8 + c];
    if constexpr (E == LinearEpilogue::silu_gate)
      for (int sl = 0; sl < slices; ++sl) up += part[(slices + sl) * (kStreamMaxM * 8) + m * 8 + c];
    store_output<E>(a, m, n, n_total, v, up);
  }
}

template <typename C>
size_t stream_smem(int M, int K, LinearEpilogue e, size_t w_bytes) {
  const int len = slice_len(K), slices = (K + len - 1) / len;
  const int units = (e == LinearEpilogue::silu_gate ? 2 : 1) * slices;
  const size_t slot = C::CHUNK * w_bytes + (C::XS ? size_t(M) * C::X_STRIDE * 4 : 0);
  return size_t(C::WARPS) * C::DEPTH * slot + size_t(units) * kStreamMaxM * 8 * sizeof(float);
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
    const bool ok = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)) ==
                    cudaSuccess;
    if (!ok) cudaGetLastError();
    return ok;
  }();
  (void)raised;  // a failure shows as the launch's error
  const int per_tile = E == LinearEpilogue::silu_gate ? T::BN / 2 : T::BN;
  const dim3 grid(static_cast<unsigned>((a.M + T::BM - 1) / T::BM),
                  static_cast<unsigned>((n_total + per_tile - 1) / per_tile));
  const int x_aligned = reinterpret_cast<uintptr_t>(a.x) % 16 == 0 ? 1 : 0;
  launch(kernel, grid, dim3(T::THREADS), smem, ctx, a, n_total, x_aligned);
}

template <typename W, typename C, LinearEpilogue E>
bool launch_stream(const LinearRowsArgs& a, int n_total, const Context& ctx) {
  const auto kernel = gemm_stream_kernel<W, C, E>;
  const size_t smem = stream_smem<C>(a.M, a.K, E, sizeof(W));
  if (a.M > kStreamMaxM || smem > 227 * 1024) return false;
  if (C::XS && reinterpret_cast<uintptr_t>(a.x) % 16 != 0) return false;  // rows copied in 16 bytes
  static const bool raised = [&] {
    const bool ok =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024) == cudaSuccess;
    if (!ok) cudaGetLastError();
    return ok;
  }();
  (void)raised;  // a failure shows as the launch's error
  const int x_aligned = reinterpret_cast<uintptr_t>(a.x) % 8 == 0 ? 1 : 0;
  launch(kernel, dim3(static_cast<unsigned>((n_total + 7) / 8)), dim3(C::WARPS * 32), smem, ctx, a, n_total, x_aligned);
  return true;
}

// Which kernel serves M rows: the stream kernel with x staged while a step reads each weight once
// for at most 16 rows; then the tiled kernel, on its 16-warp large tile once those blocks fill the
// device and its mid tile below. The choice changes no result (see the top of this file); CudaTuning::gemm_tile
// forces one (1 small tile, 2 mid, 3 large with 8 warps, 7 large with 16; the stream kernel in
// chunks of 256 (4), 64 (5), 128 (6), 512 (8) columns, or 128 with x staged (9); a stream kernel
// takes at most 16 rows).
bool is_stream(int tile) { return (tile >= 4 && tile <= 6) || tile >= 8; }
int tile_for(int M, int n_total, int forced) {
  if (forced >= 1 && forced <= 9) return is_stream(forced) && M > kStreamMaxM ? 1 : forced;
  if (M <= kStreamMaxM) return 9;
  const int64_t large_blocks = int64_t{(M + 127) / 128} * ((n_total + 127) / 128);
  if (large_blocks >= 2 * sm_count()) return 7;
  return 2;
}

// The stream kernel C for up to 16 rows whose x fits beside its ring, else the small tile.
template <typename W, typename C, LinearEpilogue E>
void launch_stream_or_small(const LinearRowsArgs& a, int n_total, const Context& ctx) {
  if (!launch_stream<W, C, E>(a, n_total, ctx)) launch_tile<W, SmallTile, E>(a, n_total, ctx);
}

template <typename W, LinearEpilogue E>
void launch_for(const LinearRowsArgs& a, int n_total, const Context& ctx) {
  switch (tile_for(a.M, E == LinearEpilogue::silu_gate ? 2 * n_total : n_total, ctx.tuning.gemm_tile)) {
    case 1:
      return launch_tile<W, SmallTile, E>(a, n_total, ctx);
    case 2:
      return launch_tile<W, MidTile, E>(a, n_total, ctx);
    case 4:
      return launch_stream_or_small<W, StreamWide, E>(a, n_total, ctx);
    case 5:
      return launch_stream_or_small<W, StreamNarrow, E>(a, n_total, ctx);
    case 6:
      return launch_stream_or_small<W, StreamMid, E>(a, n_total, ctx);
    case 7:
      return launch_tile<W, LargeTile16, E>(a, n_total, ctx);
    case 8:
      return launch_stream_or_small<W, StreamLong, E>(a, n_total, ctx);
    case 9:  // x staged where it fits, else the same chunks with x read from global memory
      if (launch_stream<W, StreamStaged, E>(a, n_total, ctx)) return;
      return launch_stream_or_small<W, StreamMid, E>(a, n_total, ctx);
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
