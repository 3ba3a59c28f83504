// The batch-invariant mode's linear for a few rows: out[M, N] (f32) = x[M, K] · w[N, K]ᵀ (+ out),
// x and w of one 16-bit type, with the bits of cuBLASLt's algorithms that keep K in one pass,
// which serve every larger M of that mode. Those bits come from one f32 accumulator per output
// taking m16n8k16 MMAs in increasing k, each MMA over 16 consecutive k from a multiple of 16
// (tools/gpu/mma_bits_probe.cu checks the claim; so do the GPU tests, against cuBLASLt at larger
// M). That order allows neither a split of K over warps nor the fast mode's skinny kernel's
// permuted k: each 8-column tile is one chain of K / 16 dependent MMAs, and a 4,096-wide
// projection has only 512 such chains. So the chains must never wait on a load they issued:
// - a block is kConsumers warps, one 8-column tile each (for silu_gate a gate tile and its up
//   tile), and one producer warp that streams the block's weight rows and the M rows of x, kKc k
//   at a time, into a ring of shared-memory stages by bulk asynchronous copies (one per row and
//   stage, each lane its own row), each stage's arrival counted by an mbarrier;
// - a consumer waits only for a stage to be full, reads its B fragments (weights) and A fragments
//   (x) by ldmatrix from rows padded to a 16-byte bank shift, runs the stage's MMAs, and releases
//   the stage to the producer by a second mbarrier;
// - the ring holds about 96 KB (two blocks an SM): enough bytes in flight for an SM's share of
//   the memory bandwidth with the producer running a whole ring ahead of the chains.
// The epilogues are the skinny kernel's (SkinnyEpilogue): columns to up to three outputs, the
// residual add, or silu(gate) * up of stacked gate/up rows, each with the values cuBLASLt's GEMM
// followed by the separate pass would produce.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"

namespace specdec::cuda {
namespace {

constexpr int kConsumers = 4;  // consumer warps a block, one column tile (or gate/up pair) each
constexpr int kMaxStages = 16;
constexpr int kRingBytes = 96 * 1024;  // the ring's target size: two blocks fit an SM
constexpr int kBarrierBytes = 2 * kMaxStages * 8;

std::atomic<uint64_t> launches{0};

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void barrier_init(uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void barrier_expect(uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void barrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void barrier_wait(uint64_t* bar, unsigned parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}
// bytes (a multiple of 16) from global src to shared dst, both 16-byte aligned; completion is
// counted on bar's transaction count.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}
// 16 bytes from global src to shared dst (kept in L2 only: weights are read once).
__device__ __forceinline__ void copy_16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
// An arrival on bar once every copy_16 this thread has issued so far has landed; counts as one of
// the arrivals bar was initialised with.
__device__ __forceinline__ void arrive_when_copied(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// Stage layout: T * 8 * kConsumers weight rows (tile f's rows at f * 8 * kConsumers), then the M
// rows of x, kPitch bytes each.
__host__ __device__ constexpr int stage_rows(int T, int M) { return T * 8 * kConsumers + M; }

// T 8-column tiles a consumer (two for silu_gate: the gate's and the up's columns).
template <typename W, int T, SkinnyEpilogue E, bool kBulk, bool kMma = true, bool kStagger = false, int KC = 128>
__global__ void __launch_bounds__((kConsumers + 1) * 32) ordered_kernel(SkinnyArgs a, int stages) {
  static_assert(E != SkinnyEpilogue::silu_gate || T == 2, "silu_gate pairs a gate tile with an up tile");
  constexpr int kTileRows = 8 * kConsumers;  // weight rows a tile index f spans in a stage
  extern __shared__ __align__(128) unsigned char smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem);
  uint64_t* empty = full + kMaxStages;
  unsigned char* ring = smem + kBarrierBytes;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int M = a.M, K = a.K;
  const int cols = E == SkinnyEpilogue::silu_gate ? a.N / 2 : a.N;  // output columns
  const int rows = stage_rows(T, M);
  const int stage_bytes = rows * (KC * 2 + 16);
  const int chunks = (K + KC - 1) / KC;

  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      barrier_init(&full[s], kBulk ? 1 : 32);
      barrier_init(&empty[s], kConsumers);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (warp == kConsumers) {  // the producer
    // Launched after the previous kernel has finished (see launch_config), so this wait is for
    // form's sake; x is only read after it.
    grid_dependency_wait();
    const W* w = static_cast<const W*>(a.w);
    const W* x = static_cast<const W*>(a.x);
    for (int c = 0; c < chunks; ++c) {
      const int slot = c % stages, round = c / stages;
      if (round > 0) barrier_wait(&empty[slot], (round - 1) & 1);
      const int k0 = (kStagger ? (c + blockIdx.x * 5) % chunks : c) * KC;
      const unsigned bytes = static_cast<unsigned>(min(KC, K - k0)) * 2;
      unsigned char* stage = ring + slot * stage_bytes;
      const auto source = [&](int r) {
        if (r < T * kTileRows) {
          // A column past the last is read as the last one (its outputs are never stored).
          const int col = min(blockIdx.x * kTileRows + r % kTileRows, cols - 1) + (r / kTileRows) * cols;
          return w + static_cast<int64_t>(col) * K + k0;
        }
        return x + static_cast<int64_t>(r - T * kTileRows) * K + k0;
      };
      if constexpr (kBulk) {
        if (lane == 0) barrier_expect(&full[slot], bytes * rows);
        __syncwarp();
        for (int r = lane; r < rows; r += 32) bulk_copy(stage + r * (KC * 2 + 16), source(r), bytes, &full[slot]);
      } else {
        // Lane l copies the 16-byte pieces l, l + 32, ... of the stage, KC / 8 a row.
        const int per_row = bytes / 16;
        for (int p = lane; p < rows * (KC / 8); p += 32) {
          const int r = p / (KC / 8), q = p % (KC / 8);
          if (q < per_row) copy_16(stage + r * (KC * 2 + 16) + q * 16, source(r) + q * 8);
        }
        arrive_when_copied(&full[slot]);
      }
    }
    allow_dependents();
    return;
  }

  // A consumer: tile columns col0 .. col0 + 7 (of each of its T tiles).
  const int col0 = (blockIdx.x * kConsumers + warp) * 8;
  // ldmatrix row addresses within a stage. B (weights, [n][k]): lanes 0-7 rows 0-7 at k 0-7,
  // lanes 8-15 at k 8-15, 16-23 at k 16-23, 24-31 at k 24-31: two k-steps' b0, b1. A (x,
  // row-major [m][k]): lanes 0-15 rows 0-15 at k 0-7, lanes 16-31 at k 8-15: a0 .. a3. Rows of
  // the tile past M read row 0 (their outputs are never stored).
  int b_off[T];
#pragma unroll
  for (int f = 0; f < T; ++f) b_off[f] = (f * kTileRows + warp * 8 + (lane & 7)) * (KC * 2 + 16) + (lane >> 3) * 16;
  const int xr = lane & 15;
  const int a_off = (T * kTileRows + (xr < M ? xr : 0)) * (KC * 2 + 16) + (lane >> 4) * 16;

  float acc[T][4];
#pragma unroll
  for (int f = 0; f < T; ++f)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[f][e] = 0.0f;

  for (int c = 0; c < chunks; ++c) {
    const int slot = c % stages;
    barrier_wait(&full[slot], (c / stages) & 1);
    const unsigned char* stage = ring + slot * stage_bytes;
    const int all_steps = min(KC, K - (kStagger ? (c + blockIdx.x * 5) % chunks : c) * KC) / 16;
    for (int sub = 0; sub < KC / 128; ++sub) {
      const int steps = all_steps - sub * 8;
      if (steps <= 0) break;
      const unsigned char* sstage = stage + sub * 256;
      // Every fragment of the stage first, then the chain of MMAs, so that no MMA waits on a read.
      uint32_t b[4][T][4], xa[8][4];
#pragma unroll
      for (int p = 0; p < 4; ++p) {
        if (2 * p >= steps) break;  // warp-uniform
#pragma unroll
        for (int f = 0; f < T; ++f) ldmatrix_x4(b[p][f], sstage + b_off[f] + p * 64);
        ldmatrix_x4(xa[2 * p], sstage + a_off + p * 64);
        ldmatrix_x4(xa[2 * p + 1], sstage + a_off + p * 64 + 32);
      }
#pragma unroll
      for (int s = 0; s < 8; ++s) {
        if (s >= steps) break;
#pragma unroll
        for (int f = 0; f < T; ++f) {
          if constexpr (kMma)
            Mma<W>::run(acc[f], xa[s], b[s / 2][f][(s & 1) * 2], b[s / 2][f][(s & 1) * 2 + 1]);
          else
            acc[f][0] += __uint_as_float(xa[s][0] ^ b[s / 2][f][(s & 1) * 2]);
        }
      }
    }
    __syncwarp();
    if (lane == 0) barrier_arrive(&empty[slot]);
  }
  if (col0 >= cols) return;

  // Accumulator e: row g (+8 for e >= 2), column 2t (+1 for odd e) of the tile.
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int row = g + (e >= 2 ? 8 : 0);
    const int col = col0 + 2 * t + (e & 1);
    if (row >= M || col >= cols) continue;
    if constexpr (E == SkinnyEpilogue::silu_gate) {
      a.out[0][static_cast<int64_t>(row) * cols + col] = silu_times(acc[0][e], acc[1][e]);
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

template <typename W, SkinnyEpilogue E, bool kBulk, bool kMma = true, bool kStagger = false, int KC = 128>
void launch_with(const SkinnyArgs& a, const Context& ctx) {
  constexpr int T = E == SkinnyEpilogue::silu_gate ? 2 : 1;
  const auto kernel = ordered_kernel<W, T, E, kBulk, kMma, kStagger, KC>;
  constexpr int pitch = KC * 2 + 16, ring = KC == 128 ? kRingBytes : 200 * 1024;
  const int stages = std::min(kMaxStages, ring / (stage_rows(T, a.M) * pitch));
  const size_t smem = kBarrierBytes + static_cast<size_t>(stages) * stage_rows(T, a.M) * pitch;
  static const bool sized =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBarrierBytes + ring) == cudaSuccess;
  (void)sized;  // a failure shows as the launch's error
  const int cols = E == SkinnyEpilogue::silu_gate ? a.N / 2 : a.N;
  const int blocks = (cols + 8 * kConsumers - 1) / (8 * kConsumers);
  // Not overlapped with the kernel before it, as the skinny kernel: a grid of hundreds of blocks
  // launched early sits resident, waiting, in the room the kernels before it still need.
  Context c = ctx;
  c.tuning.overlapped_launches = false;
  launch(kernel, dim3(blocks), dim3((kConsumers + 1) * 32), smem, c, a, stages);
}

template <typename W, SkinnyEpilogue E>
void launch_rows(const SkinnyArgs& a, const Context& ctx) {
  static const bool bulk = std::getenv("SPECDEC_CUDA_ORDERED_BULK") != nullptr;
  static const bool nomma = std::getenv("SPECDEC_CUDA_ORDERED_NOMMA") != nullptr;
  static const bool stagger = std::getenv("SPECDEC_CUDA_ORDERED_STAGGER") != nullptr;
  static const bool wide = std::getenv("SPECDEC_CUDA_ORDERED_WIDE") != nullptr;
  if (wide)
    launch_with<W, E, true, true, false, 512>(a, ctx);
  else if (stagger)
    launch_with<W, E, false, true, true>(a, ctx);
  else if (nomma)
    launch_with<W, E, false, false>(a, ctx);
  else if (bulk)
    launch_with<W, E, true>(a, ctx);
  else
    launch_with<W, E, false>(a, ctx);
}

}  // namespace

bool ordered_gemm_supports(ElemType type, int M, int K, const void* x, const void* w) {
  return few_rows_supported(type, M, K, x, w, kOrderedMaxM, 16);
}

void launch_ordered_gemm(const SkinnyArgs& a, const Context& ctx) {
  launches.fetch_add(1, std::memory_order_relaxed);
  for_few_rows(a, [&](auto w, auto e) { launch_rows<decltype(w), decltype(e)::value>(a, ctx); });
}

uint64_t ordered_gemm_launches() { return launches.load(std::memory_order_relaxed); }

}  // namespace specdec::cuda
