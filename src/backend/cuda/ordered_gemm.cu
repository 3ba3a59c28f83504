// The batch-invariant mode's linear for a few rows: out[M, N] (f32) = x[M, K] · w[N, K]ᵀ (+ out),
// x and w of one 16-bit type, with the bits of cuBLASLt's algorithms that keep K in one pass,
// which serve every larger M of that mode. Those bits come from one f32 accumulator per output
// taking m16n8k16 MMAs in increasing k, each MMA over 16 consecutive k from a multiple of 16
// (tools/gpu/mma_bits_probe.cu checks the claim; so do the GPU tests, against cuBLASLt at larger
// M). That order allows neither a split of K over warps nor the fast mode's skinny kernel's
// permuted k: each 8-column tile is one chain of K / 16 dependent MMAs, and a 4,096-wide
// projection has only 512 such chains. So the chains must never wait on a load they issued, and
// the weights must arrive at the copy bandwidth with few blocks to ask for them:
// - a block is C consumer warps (four; eight with CudaTuning::ordered_warps), one 8-column tile
//   each (for silu_gate a gate tile and its up tile), and one producer warp that streams those
//   tiles' weight rows, kKc k a stage, into a ring of shared-memory stages by tensor-map copies,
//   and the M rows of x by one bulk copy a row and stage; each stage's arrival is counted by an
//   mbarrier;
// - what a block has in flight is bounded by the number of its outstanding copies rather than
//   their bytes, so each copy is large: one 3-D box a consumer and stage (its tile's 8 rows x kKc
//   k, 8 KB; the tile3d form below), or 2-D boxes of 32 rows x 64 k (4 KB; box2d, for K not a
//   multiple of 64); the 128-byte swizzle of those boxes lets 8 rows be read by one ldmatrix
//   without bank conflicts;
// - a consumer waits only for a stage to be full, reads its B fragments (weights) and A fragments
//   (x, rows padded to a 16-byte bank shift) by ldmatrix, runs the stage's MMAs, and releases the
//   stage to the producer by a second mbarrier;
// - the ring holds about 200 KB (one block an SM), several stages ahead of the chains.
// x may instead come in f32 (SkinnyArgs::x32) where its rows fit beside the ring: the whole block
// then rounds them into shared memory once, before the first stage, after the RMSNorm before the
// projection where there is one (norm weights given). That is the arithmetic of the separate
// passes that would otherwise write the 16-bit x (rms_inverse's reduction, then each element
// rounded to nearest), so the bits are the same, and a decode step is spared a launch and a pass
// over x before each of a layer's linears.
// The epilogues are the skinny kernel's (SkinnyEpilogue): columns to up to three outputs, the
// residual add, or silu(gate) * up of stacked gate/up rows, each with the values cuBLASLt's GEMM
// followed by the separate pass would produce.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <tuple>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"
#include "core/error.h"

namespace specdec::cuda {
namespace {

constexpr int kBox2dRows = 32;              // rows of a box2d box: four consumers' tiles
constexpr int kKc = 512;                    // k a stage
constexpr int kBoxK = 64;                   // k of a box: 128 bytes, the most the 128-byte swizzle allows
constexpr int kBoxes = kKc / kBoxK;         // 64-k slabs a stage
constexpr int kSlab = 8 * kBoxK * 2;        // bytes of one tile's 8 rows x 64 k
constexpr int kTileStage = kBoxes * kSlab;  // bytes of one tile's 8 rows in a stage
constexpr int kXPitch = kKc * 2 + 16;       // bytes of an x row in a stage
constexpr int kMaxStages = 16;
constexpr int kHeader = 2048;  // the barriers and the norm's scratch, then x or the ring from a 1,024-byte boundary
constexpr int kBarrierBytes = 2 * kMaxStages * 8;
constexpr int kScratchBytes = kNormThreads / 32 * 4;
constexpr int kRingBytes = 200 * 1024;
constexpr int kMaxSmem = kHeader + kRingBytes;
constexpr int kFullXBytes = 72 * 1024;  // the most the rows of an f32 x take, rounded, out of the ring

std::atomic<uint64_t> launches{0};

// Stage layout: the weights, C * T tiles of 8 rows x kKc k, then the M rows of x, kXPitch bytes
// each, rounded up to 1,024 bytes so every slab starts on the swizzle's period. Every weight row
// is stored as 128-byte pieces (64 k), the 16-byte unit u of row r at u ^ (r % 8). Two forms:
// - box2d: a block's four consumers own four consecutive tiles; for each tile index f < T and
//   64-k box j, one 2-D box of their 32 rows (4 KB), at (f * kBoxes + j) * 4 KB;
// - tile3d: for each consumer w and tile index f, one 3-D box of its tile's 8 rows and all of the
//   stage's k (8 KB, the map's dimensions k % 64, row, k / 64), at (w * T + f) * 8 KB, its 64-k
//   slabs 1 KB apart. A consumer's tile is then free of its neighbours', so the blocks, one an SM,
//   can take equal shares of the tiles (a 6,144-wide projection: 768 tiles of 8 columns, five or
//   six an SM, where 32-column blocks leave 192 for 132 SMs).
enum class Form { box2d, tile3d };

__host__ __device__ constexpr int stage_bytes(int C, int T, int M) {
  return (C * T * kTileStage + M * kXPitch + 1023) / 1024 * 1024;
}
// An f32 x rounded whole: M rows of K 16-bit values, each row 16 bytes past a bank period (as
// kXPitch), ahead of the ring.
__host__ __device__ constexpr int full_x_pitch(int K) { return K * 2 + 16; }
__host__ __device__ constexpr int full_x_bytes(int M, int K) { return (M * full_x_pitch(K) + 1023) / 1024 * 1024; }

__device__ __forceinline__ float norm_weight(const SkinnyArgs& a, int i) {
  switch (a.norm_type) {
    case ElemType::bf16:
      return to_float(static_cast<const __nv_bfloat16*>(a.norm)[i]);
    case ElemType::f16:
      return to_float(static_cast<const __half*>(a.norm)[i]);
    default:
      return static_cast<const float*>(a.norm)[i];
  }
}

// Rows 0 .. M - 1 of the f32 x, each normalised first where a.norm is set, rounded to W into
// shared memory at x_smem, full_x_pitch(K) bytes a row. The whole block takes part; each thread
// has four 16-byte loads in flight before it rounds them (K is a multiple of 16).
template <typename W>
__device__ __forceinline__ void round_x(const SkinnyArgs& a, unsigned char* x_smem, float* scratch) {
  constexpr int kBatch = 4;
  const int n4 = a.K / 4;
  for (int r = 0; r < a.M; ++r) {
    const float* xr = a.x32 + static_cast<int64_t>(r) * a.K;
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    unsigned char* dst = x_smem + r * full_x_pitch(a.K);
    const float inv = a.norm ? rms_inverse(xr, a.K, a.eps, scratch) : 1.0f;
    for (int i0 = threadIdx.x; i0 < n4; i0 += kBatch * blockDim.x) {
      float v[kBatch][4], g[kBatch][4];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int i = i0 + u * blockDim.x;
        if (i >= n4) break;
        const float4 f = x4[i];
        v[u][0] = f.x, v[u][1] = f.y, v[u][2] = f.z, v[u][3] = f.w;
        if (a.norm)
#pragma unroll
          for (int e = 0; e < 4; ++e) g[u][e] = norm_weight(a, 4 * i + e);
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int i = i0 + u * blockDim.x;
        if (i >= n4) break;
        W o[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) o[e] = from_float<W>(a.norm ? (v[u][e] * inv) * g[u][e] : v[u][e]);
        *reinterpret_cast<uint2*>(dst + i * 8) = *reinterpret_cast<const uint2*>(o);
      }
    }
  }
}
static_assert(2 * stage_bytes(4, 2, kOrderedMaxM) <= kRingBytes, "two stages of the largest call fit the ring");
static_assert(2 * stage_bytes(8, 1, kOrderedMaxM) <= kRingBytes, "two stages of the largest call fit the ring");
static_assert(2 * stage_bytes(4, 2, 0) + kFullXBytes <= kRingBytes, "and beside the largest whole x");
static_assert(kBarrierBytes + kScratchBytes + 1023 <= kHeader, "the header holds the barriers and the scratch");

// v rounded to the 16-bit `type` (nearest even) and back.
__device__ __forceinline__ float round_16(ElemType type, float v) {
  return type == ElemType::f16 ? to_float(from_float<__half>(v)) : to_float(from_float<__nv_bfloat16>(v));
}

// Stores tile column col0 .. col0 + 7's accumulators by the epilogue E. Accumulator e: row g
// (+8 for e >= 2), column 2t (+1 for odd e) of the tile.
template <int T, SkinnyEpilogue E>
__device__ __forceinline__ void store_tile(const SkinnyArgs& a, const float (&acc)[T][4], int col0, int cols,
                                           int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int row = g + (e >= 2 ? 8 : 0);
    const int col = col0 + 2 * t + (e & 1);
    if (row >= a.M || col >= cols) continue;
    if constexpr (E == SkinnyEpilogue::silu_gate) {
      float g = acc[0][e], u = acc[1][e];
      if (a.round_gate_up) g = round_16(a.type, g), u = round_16(a.type, u);
      a.out[0][static_cast<int64_t>(row) * cols + col] = silu_times(g, u);
    } else if constexpr (E == SkinnyEpilogue::add) {
      float* o = a.out[0] + static_cast<int64_t>(row) * cols + col;
      *o += acc[0][e];
    } else {
      float* o = a.out[0];
      int width = a.n[0], local = col;
      if (a.parts > 1 && local >= a.n[0]) {
        local -= a.n[0];
        o = a.out[1], width = a.n[1];
        if (a.parts > 2 && local >= a.n[1]) {
          local -= a.n[1];
          o = a.out[2], width = a.n[2];
        }
      }
      o[static_cast<int64_t>(row) * width + local] = acc[0][e];
    }
  }
}

// C consumer warps, each T 8-column tiles (two for silu_gate: the gate's and the up's columns). A
// block's tiles are [first, end): with box2d the four at blockIdx.x * 4, with tile3d an equal share
// of all of them among the grid's blocks, taken C at a time (a pass), each consumer one. kEarly:
// the producer asks for the first ring of weights before waiting on the kernel before it (which
// never writes them), so that their latency passes while that kernel finishes.
template <typename W, int T, SkinnyEpilogue E, Form F, int C, bool kEarly>
__global__ void __launch_bounds__((C + 1) * 32)
    ordered_kernel(const __grid_constant__ CUtensorMap map, SkinnyArgs a, int stages) {
  static_assert(E != SkinnyEpilogue::silu_gate || T == 2, "silu_gate pairs a gate tile with an up tile");
  static_assert(F == Form::tile3d || C * 8 == kBox2dRows, "a box2d box is four consumers' rows");
  extern __shared__ __align__(128) unsigned char smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem);
  uint64_t* empty = full + kMaxStages;
  float* scratch = reinterpret_cast<float*>(smem + kBarrierBytes);
  // x rounded whole (an f32 x), then the ring, from the first 1,024-byte boundary past the
  // barriers and the scratch.
  const bool whole_x = a.x32 != nullptr;  // block-uniform
  const unsigned base = smem_addr(smem);
  const unsigned x_whole = (base + kBarrierBytes + kScratchBytes + 1023) / 1024 * 1024;
  const unsigned ring = x_whole + (whole_x ? full_x_bytes(a.M, a.K) : 0);
  unsigned char* ring_ptr = smem + (ring - base);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int M = a.M, K = a.K;
  const int cols = E == SkinnyEpilogue::silu_gate ? a.N / 2 : a.N;  // output columns
  const int tiles = (cols + 7) / 8;
  const int bytes_per_stage = stage_bytes(C, T, whole_x ? 0 : M);
  const int x_rows = whole_x ? 0 : M;  // rows of x a stage carries
  const int x_off = C * T * kTileStage;
  const int chunks = (K + kKc - 1) / kKc;
  int first, end;
  if constexpr (F == Form::box2d) {
    first = blockIdx.x * C;
    end = min(first + C, tiles);
  } else {
    first = static_cast<int>(static_cast<int64_t>(blockIdx.x) * tiles / gridDim.x);
    end = static_cast<int>(static_cast<int64_t>(blockIdx.x + 1) * tiles / gridDim.x);
  }
  const int passes = (end - first + C - 1) / C;

  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      barrier_init(&full[s], 1);
      barrier_init(&empty[s], C);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  const W* x = static_cast<const W*>(a.x);
  // Stage n of the block's walk: pass n / chunks, k from (n % chunks) * kKc.
  const auto weights = [&](int n) {  // lane 0: the stage's expected bytes and its weight copies
    const int pass = n / chunks, c = n % chunks, slot = n % stages;
    const int tile0 = first + pass * C, k0 = c * kKc, k_len = min(kKc, K - k0);
    unsigned char* stage = ring_ptr + slot * bytes_per_stage;
    // A box past the tensor's edge is filled with zeros and counts whole.
    if constexpr (F == Form::box2d) {
      const int boxes = (k_len + kBoxK - 1) / kBoxK;
      barrier_expect(&full[slot], T * boxes * C * kSlab + x_rows * k_len * 2);
#pragma unroll
      for (int f = 0; f < T; ++f)
        for (int j = 0; j < boxes; ++j)
          box_copy_2d(stage + (f * kBoxes + j) * C * kSlab, &map, k0 + j * kBoxK, tile0 * 8 + f * cols, &full[slot]);
    } else {
      const int active = min(C, end - tile0);
      barrier_expect(&full[slot], active * T * kTileStage + x_rows * k_len * 2);
      for (int w = 0; w < active; ++w)
#pragma unroll
        for (int f = 0; f < T; ++f)
          box_copy_3d(stage + (w * T + f) * kTileStage, &map, 0, (tile0 + w) * 8 + f * cols, k0 / kBoxK, &full[slot]);
    }
  };
  const auto activations = [&](int n) {  // lanes < M: the stage's rows of x
    const int c = n % chunks, slot = n % stages, k0 = c * kKc, k_len = min(kKc, K - k0);
    if (lane < M)
      bulk_copy(ring_ptr + slot * bytes_per_stage + x_off + lane * kXPitch, x + static_cast<int64_t>(lane) * K + k0,
                k_len * 2, &full[slot]);
  };
  const int total = passes * chunks;
  // Weights are never written by the kernel before: with kEarly, or where the block rounds x
  // itself first, the first ring of them is asked for before the wait and the rounding.
  const int early = kEarly || whole_x ? min(stages, total) : 0;
  if (warp == C && lane == 0)
    for (int n = 0; n < early; ++n) weights(n);
  // x is only read after this; without kEarly the launch follows the previous kernel's end
  // (see launch_with), and the wait is for form's sake.
  if (whole_x) {
    grid_dependency_wait();
    round_x<W>(a, smem + (x_whole - base), scratch);
    __syncthreads();
  }

  if (warp == C) {  // the producer
    if (!whole_x) grid_dependency_wait();
    __syncwarp();
    if (!whole_x)
      for (int n = 0; n < early; ++n) activations(n);
    for (int n = early; n < total; ++n) {
      const int slot = n % stages, round = n / stages;
      if (round > 0) barrier_wait(&empty[slot], (round - 1) & 1);
      if (lane == 0) weights(n);
      __syncwarp();
      if (!whole_x) activations(n);
    }
    allow_dependents();
    return;
  }

  // A consumer. ldmatrix of B (weights, [n][k]) for k-steps 2p and 2p + 1 of a 64-k slab: lanes
  // 0-7 its rows 0-7 at 16-byte unit 4p, lanes 8-15 at 4p + 1, 16-23 at 4p + 2, 24-31 at 4p + 3:
  // b0, b1 of both steps. A (x, row-major [m][k]): lanes 0-15 rows 0-15 at k 0-7, lanes 16-31 at
  // k 8-15: a0 .. a3. Rows of the tile past M read row 0 (their outputs are never stored).
  constexpr int kSlabStride = F == Form::box2d ? C * kSlab : kSlab;  // bytes between 64-k slabs of a tile
  unsigned b_row[T];
#pragma unroll
  for (int f = 0; f < T; ++f)
    b_row[f] = ring + (F == Form::box2d ? f * kBoxes * C * kSlab + (warp * 8 + (lane & 7)) * 128
                                        : (warp * T + f) * kTileStage + (lane & 7) * 128);
  const int b_unit = lane >> 3, b_swz = lane & 7;
  const int xr = (lane & 15) < M ? lane & 15 : 0;
  // Where this lane's x row is read: in each stage, or once for all stages (whole_x; chunk c at
  // c * kKc k).
  const unsigned a_row =
      whole_x ? x_whole + xr * full_x_pitch(K) + (lane >> 4) * 16 : ring + x_off + xr * kXPitch + (lane >> 4) * 16;

  int n = 0;  // stages consumed so far
  for (int pass = 0; pass < passes; ++pass) {
    const int tile = first + pass * C + warp;
    const bool mine = tile < end;  // warp-uniform; a warp without a tile still passes each stage on
    float acc[T][4];
#pragma unroll
    for (int f = 0; f < T; ++f)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[f][e] = 0.0f;
    for (int c = 0; c < chunks; ++c, ++n) {
      const int slot = n % stages;
      barrier_wait(&full[slot], (n / stages) & 1);
      const unsigned stage = slot * bytes_per_stage;
      const unsigned a_at = whole_x ? a_row + c * (kKc * 2) : a_row + stage;
      const int all_steps = mine ? min(kKc, K - c * kKc) / 16 : 0;
      for (int j = 0; j < kBoxes; ++j) {
        const int steps = all_steps - j * 4;
        if (steps <= 0) break;  // warp-uniform
        // Every fragment of the slab first, then the chain of MMAs, so that no MMA waits on a read.
        uint32_t b[2][T][4], xa[4][4];
#pragma unroll
        for (int p = 0; p < 2; ++p) {
          if (2 * p >= steps) break;
#pragma unroll
          for (int f = 0; f < T; ++f)
            ldmatrix_x4(b[p][f], b_row[f] + stage + j * kSlabStride + (((4 * p + b_unit) ^ b_swz) << 4));
          ldmatrix_x4(xa[2 * p], a_at + j * 128 + p * 64);
          ldmatrix_x4(xa[2 * p + 1], a_at + j * 128 + p * 64 + 32);
        }
#pragma unroll
        for (int s = 0; s < 4; ++s) {
          if (s >= steps) break;
#pragma unroll
          for (int f = 0; f < T; ++f)
            Mma<W>::run(acc[f], xa[s], b[s / 2][f][(s & 1) * 2], b[s / 2][f][(s & 1) * 2 + 1]);
        }
      }
      __syncwarp();
      if (lane == 0) barrier_arrive(&empty[slot]);
    }
    if (mine) store_tile<T, E>(a, acc, tile * 8, cols, lane);
  }
}

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiled encoder() {
  static const EncodeTiled encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t err =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found);
    SPECDEC_CHECK(err == cudaSuccess && found == cudaDriverEntryPointSuccess && fn != nullptr,
                  "the CUDA driver has no cuTensorMapEncodeTiled (needed by the ordered linear)");
    return reinterpret_cast<EncodeTiled>(fn);
  }();
  return encode;
}

// The tensor map of a weight matrix [rows, K] for form F, made once per matrix and form: weights
// stay where they are for the model's life, and a map is the same for the same address, shape
// and form.
const CUtensorMap& weight_map(const void* w, ElemType type, int rows, int K, Form form) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, int, int, int>, CUtensorMap> maps;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(w, static_cast<int>(type), rows, K, static_cast<int>(form));
  if (const auto it = maps.find(key); it != maps.end()) return it->second;
  const CUtensorMapDataType data =
      type == ElemType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const auto row_bytes = static_cast<cuuint64_t>(K) * 2;
  const auto n_rows = static_cast<cuuint64_t>(rows);
  // tile3d: (k % 64, row, k / 64), a box of 64 x 8 x kBoxes landing as kBoxes slabs of 8 rows x
  // 64 k; box2d: (k, row), a box of 64 x 32.
  const bool three = form == Form::tile3d;
  const cuuint64_t dims[3] = {three ? kBoxK : static_cast<cuuint64_t>(K), n_rows, static_cast<cuuint64_t>(K / kBoxK)};
  const cuuint64_t strides[2] = {row_bytes, kBoxK * 2};
  const cuuint32_t box[3] = {kBoxK, three ? 8u : kBox2dRows, kBoxes};
  const cuuint32_t step[3] = {1, 1, 1};
  CUtensorMap map{};
  const CUresult result = encoder()(&map, data, three ? 3 : 2, const_cast<void*>(w), dims, strides, box, step,
                                    CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  SPECDEC_CHECK(result == CUDA_SUCCESS, "encoding the tensor map of a ", rows, " x ", K,
                " weight for the ordered linear failed (CUresult ", static_cast<int>(result), ")");
  return maps.emplace(key, map).first->second;
}

// tile3d's grid: as many blocks as fit the GPU at once, worked out once per kernel and
// shared-memory size, since calls outside a graph pay it each time.
int resident_blocks(const void* kernel, int threads, size_t smem) {
  static std::mutex mutex;
  static std::map<std::tuple<int, const void*, size_t>, int> known;
  int device = 0;
  SPECDEC_CHECK(cudaGetDevice(&device) == cudaSuccess, "ordered linear: no current CUDA device");
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(device, kernel, smem);
  if (const auto it = known.find(key); it != known.end()) return it->second;
  int sms = 0, per_sm = 0;
  SPECDEC_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess &&
                    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) == cudaSuccess,
                "ordered linear: reading the GPU's multiprocessors failed");
  return known.emplace(key, sms * std::max(per_sm, 1)).first->second;
}

template <typename W, SkinnyEpilogue E, Form F, int C, bool kEarly>
void launch_with(const SkinnyArgs& a, const Context& ctx) {
  constexpr int T = E == SkinnyEpilogue::silu_gate ? 2 : 1;
  const auto kernel = ordered_kernel<W, T, E, F, C, kEarly>;
  const bool whole_x = a.x32 != nullptr;
  const int per_stage = stage_bytes(C, T, whole_x ? 0 : a.M);
  const int x_bytes = whole_x ? full_x_bytes(a.M, a.K) : 0;
  // At least two stages, past the ring's size if need be (16 rows of silu_gate: 81 KB a stage).
  const int stages = std::clamp((kRingBytes - x_bytes) / per_stage, 2, kMaxStages);
  const size_t smem = kHeader + x_bytes + static_cast<size_t>(stages) * per_stage;
  static const bool sized =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem) == cudaSuccess;
  (void)sized;  // a failure shows as the launch's error
  const int cols = E == SkinnyEpilogue::silu_gate ? a.N / 2 : a.N;
  const int groups = ((cols + 7) / 8 + C - 1) / C;
  const int threads = (C + 1) * 32;
  const int blocks = F == Form::box2d
                         ? groups
                         : std::min(groups, resident_blocks(reinterpret_cast<const void*>(kernel), threads, smem));
  const CUtensorMap& map = weight_map(a.w, a.type, a.N, a.K, F);
  // Unless its weights come early, not overlapped with the kernel before it, as the skinny kernel:
  // a grid launched early would sit resident, waiting, in the room that kernel still needs.
  Context c = ctx;
  if (!kEarly) c.tuning.overlapped_launches = false;
  launch(kernel, dim3(blocks), dim3(threads), smem, c, map, a, stages);
}

// The form (tile3d needs K a multiple of 64: its map's last dimension is K / 64), then the
// consumers a block and the early ring (CudaTuning::ordered_warps, ordered_early; eight
// consumers only for tile3d's single-tile calls).
template <typename W, SkinnyEpilogue E>
void launch_rows(const SkinnyArgs& a, const Context& ctx) {
  const bool early = ctx.tuning.ordered_early;
  const auto with_form = [&](auto form) {
    constexpr Form F = decltype(form)::value;
    if constexpr (F == Form::tile3d && E != SkinnyEpilogue::silu_gate) {
      if (ctx.tuning.ordered_warps == 8)
        return early ? launch_with<W, E, F, 8, true>(a, ctx) : launch_with<W, E, F, 8, false>(a, ctx);
    }
    return early ? launch_with<W, E, F, 4, true>(a, ctx) : launch_with<W, E, F, 4, false>(a, ctx);
  };
  if (a.K % kBoxK == 0)
    with_form(std::integral_constant<Form, Form::tile3d>{});
  else
    with_form(std::integral_constant<Form, Form::box2d>{});
}

}  // namespace

bool ordered_gemm_supports(ElemType type, int M, int K, const void* x, const void* w) {
  return few_rows_supported(type, M, K, x, w, kOrderedMaxM, 16);
}

bool ordered_gemm_takes_f32(ElemType type, int M, int K, const float* x, const void* w) {
  // K bounded first: full_x_bytes would overflow an int for a K near its limit.
  return few_rows_supported(type, M, K, x, w, kOrderedMaxM, 16) && K <= kFullXBytes &&
         full_x_bytes(M, K) <= kFullXBytes;
}

void launch_ordered_gemm(const SkinnyArgs& a, const Context& ctx) {
  launches.fetch_add(1, std::memory_order_relaxed);
  for_few_rows(a, [&](auto w, auto e) { launch_rows<decltype(w), decltype(e)::value>(a, ctx); });
}

uint64_t ordered_gemm_launches() { return launches.load(std::memory_order_relaxed); }

}  // namespace specdec::cuda
