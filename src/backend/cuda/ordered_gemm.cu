// The batch-invariant mode's linear for a few rows: out[M, N] (f32) = x[M, K] · w[N, K]ᵀ (+ out),
// x and w of one 16-bit type, with the bits of cuBLASLt's algorithms that keep K in one pass,
// which serve every larger M of that mode. Those bits come from one f32 accumulator per output
// taking m16n8k16 MMAs in increasing k, each MMA over 16 consecutive k from a multiple of 16
// (tools/gpu/mma_bits_probe.cu checks the claim; so do the GPU tests, against cuBLASLt at larger
// M). That order allows neither a split of K over warps nor the fast mode's skinny kernel's
// permuted k, so the kernel keeps its many weight loads in flight another way:
// - one warp per 8 output columns (the weights as the MMA's B operand, x as A), each walking all
//   of K: 512 warps for a 4,096-wide projection, a few KB of loads in flight each;
// - each lane loads 16 bytes of its weight row (k 8t .. 8t+7 of row g) straight into registers,
//   bypassing L1, U chunks of 32 k ahead of the MMAs; the four lanes of a row then exchange
//   32-bit words (a 4 x 4 transpose in four shuffles) so that lane t holds k pairs 2t and 2t + 8
//   of both 16-k halves, the B fragment's layout, with no shared memory on the way;
// - x (a few rows, L1-resident) is read as the A fragment's 32-bit pairs directly.
// The epilogues are the skinny kernel's (SkinnyEpilogue): columns to up to three outputs, the
// residual add, or silu(gate) * up of stacked gate/up rows, each with the values cuBLASLt's GEMM
// followed by the separate pass would produce.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>

#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"

namespace specdec::cuda {
namespace {

constexpr int kOrderedWarps = 4;  // warps a block, each with its own columns
constexpr int kChunk = 32;        // k a lane group loads at once: 4 lanes x 8 elements

std::atomic<uint64_t> launches{0};

// Lane t of a quad holds words v[j] = w[t][j] (row t of a 4 x 4 matrix of 32-bit words); returns
// column t: {w[0][t], w[1][t], w[2][t], w[3][t]}. Two butterfly stages of two shuffles each.
__device__ __forceinline__ uint4 quad_transpose(uint4 v, int t) {
  const bool odd = t & 1, high = t & 2;
  // Stage 1, partners t ^ 1: keep the words whose column has t's parity, trade the others.
  const uint32_t got0 = __shfl_xor_sync(0xffffffffu, odd ? v.x : v.y, 1);
  const uint32_t got1 = __shfl_xor_sync(0xffffffffu, odd ? v.z : v.w, 1);
  const uint32_t keep0 = odd ? v.y : v.x, keep1 = odd ? v.w : v.z;
  // Column (t & 1) and column 2 + (t & 1), each from rows t & ~1 (lo) and t | 1 (hi).
  const uint32_t a_lo = odd ? got0 : keep0, a_hi = odd ? keep0 : got0;
  const uint32_t b_lo = odd ? got1 : keep1, b_hi = odd ? keep1 : got1;
  // Stage 2, partners t ^ 2: lanes 0-1 keep column t (a) and trade column t + 2 (b); 2-3 the reverse.
  const uint32_t r_lo = __shfl_xor_sync(0xffffffffu, high ? a_lo : b_lo, 2);
  const uint32_t r_hi = __shfl_xor_sync(0xffffffffu, high ? a_hi : b_hi, 2);
  return high ? make_uint4(r_lo, r_hi, b_lo, b_hi) : make_uint4(a_lo, a_hi, r_lo, r_hi);
}

// T 8-column tiles a warp (two for silu_gate: the gate's and the up's columns), U chunks of 32 k a
// pipeline step, X2: rows 8-15 of x present (M > 8).
template <typename W, int T, int U, bool X2, SkinnyEpilogue E>
__global__ void __launch_bounds__(kOrderedWarps * 32) ordered_kernel(SkinnyArgs a) {
  static_assert(E != SkinnyEpilogue::silu_gate || T == 2, "silu_gate pairs a gate tile with an up tile");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int M = a.M, K = a.K;
  const int cols = E == SkinnyEpilogue::silu_gate ? a.N / 2 : a.N;  // output columns
  const int col0 = (blockIdx.x * kOrderedWarps + warp) * 8;
  if (col0 >= cols) return;                      // a whole warp past the last column (no shuffle partners left behind)
  const int chunks = (K + kChunk - 1) / kChunk;  // the last one half full where K % 32 == 16
  const W* w = static_cast<const W*>(a.w);
  const W* x = static_cast<const W*>(a.x);

  const W* wrow[T];
  bool wok[T];
#pragma unroll
  for (int f = 0; f < T; ++f) {
    const int col = col0 + g;
    wok[f] = col < cols;
    wrow[f] = w + static_cast<int64_t>(wok[f] ? col + f * cols : 0) * K + 8 * t;
  }
  // x rows g and g + 8 as 32-bit pairs: k (2t, 2t + 1) of each 8-k group.
  const uint32_t* xrow[2];
  bool xok[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = g + 8 * h;
    xok[h] = row < M && (h == 0 || X2);
    xrow[h] = reinterpret_cast<const uint32_t*>(x + static_cast<int64_t>(xok[h] ? row : 0) * K) + t;
  }

  const uint4 zero = make_uint4(0, 0, 0, 0);
  // Per chunk: weights (one 16-byte load a tile), x as {k 2t, 2t + 8, 2t + 16, 2t + 24} of each row.
  uint4 wc[U][T], wn[U][T], xc[U][X2 ? 2 : 1], xn[U][X2 ? 2 : 1];
  const auto load = [&](uint4(&wd)[U][T], uint4(&xd)[U][X2 ? 2 : 1], int c) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int k = (c + u) * kChunk;
      const bool in = c + u < chunks;
      const bool whole = k + kChunk <= K;  // else only the first 16 k exist
#pragma unroll
      for (int f = 0; f < T; ++f) wd[u][f] = in && wok[f] && (whole || t < 2) ? load_stream(wrow[f] + k) : zero;
#pragma unroll
      for (int h = 0; h < (X2 ? 2 : 1); ++h) {
        const uint32_t* p = xrow[h] + k / 2;
        const bool ok = in && xok[h];
        xd[u][h] = make_uint4(ok ? p[0] : 0u, ok ? p[4] : 0u, ok && whole ? p[8] : 0u, ok && whole ? p[12] : 0u);
      }
    }
  };

  float acc[T][4];
#pragma unroll
  for (int f = 0; f < T; ++f)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[f][e] = 0.0f;

  // Launched after the previous kernel has finished (see launch_config), so this wait is for
  // form's sake.
  grid_dependency_wait();
  load(wc, xc, 0);
  for (int c = 0; c < chunks; c += U) {
    if (c + U < chunks) load(wn, xn, c + U);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (c + u >= chunks) break;  // warp-uniform
      const bool whole = (c + u + 1) * kChunk <= K;
      const uint4 xa = xc[u][0];
      const uint4 xb = X2 ? xc[u][X2 ? 1 : 0] : zero;
      // A fragments: {row g k 2t, row g+8 k 2t, row g k 2t+8, row g+8 k 2t+8} of each 16-k half.
      const uint32_t a0[4] = {xa.x, xb.x, xa.y, xb.y};
      const uint32_t a1[4] = {xa.z, xb.z, xa.w, xb.w};
#pragma unroll
      for (int f = 0; f < T; ++f) {
        const uint4 b = quad_transpose(wc[u][f], t);
        Mma<W>::run(acc[f], a0, b.x, b.y);
        if (whole) Mma<W>::run(acc[f], a1, b.z, b.w);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int f = 0; f < T; ++f) wc[u][f] = wn[u][f];
#pragma unroll
      for (int h = 0; h < (X2 ? 2 : 1); ++h) xc[u][h] = xn[u][h];
    }
  }
  allow_dependents();

  // Accumulator e: row g (+8 for e >= 2), column 2t (+1 for odd e) of the tile.
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

template <typename W, int T, int U, bool X2, SkinnyEpilogue E>
void launch_config(const SkinnyArgs& a, const Context& ctx) {
  const int cols = E == SkinnyEpilogue::silu_gate ? a.N / 2 : a.N;
  const int warps = (cols + 7) / 8;
  // Not overlapped with the kernel before it, as the skinny kernel: a grid of hundreds of blocks
  // launched early sits resident, waiting, in the room the kernels before it still need.
  Context c = ctx;
  c.tuning.overlapped_launches = false;
  launch(ordered_kernel<W, T, U, X2, E>, dim3((warps + kOrderedWarps - 1) / kOrderedWarps), dim3(kOrderedWarps * 32), 0,
         c, a);
}

template <typename W, SkinnyEpilogue E>
void launch_rows(const SkinnyArgs& a, const Context& ctx) {
  // Registers bound the chunks in flight: two tiles (silu_gate) or two rows of x halve them.
  constexpr bool gate = E == SkinnyEpilogue::silu_gate;
  if (a.M <= 8)
    launch_config<W, gate ? 2 : 1, gate ? 4 : 8, false, E>(a, ctx);
  else
    launch_config<W, gate ? 2 : 1, gate ? 4 : 6, true, E>(a, ctx);
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
