// The skinny linear of the fast mode: out[M, N] (f32) = x[M, K] · w[N, K]ᵀ (+ out) for x and w of
// one 16-bit type and a few rows of x (decode steps). Bound by reading w once, so the kernel is
// built to keep many weight loads in flight and nothing else on their path:
// - no shared memory on the way in: each lane loads 16 bytes of a weight row straight into the
//   registers of an m16n8k16 A fragment. The fragment wants k pairs (2t, 2t+1) and (2t+8, 2t+9)
//   of rows g and g+8; lane (g, t) instead loads k = 8t .. 8t+7 of both rows, and its x load
//   (row g of x, the same eight k) fills the B fragment with the same permutation, so two MMAs
//   take 32 k of the product with every k paired to itself. The fast mode owes no order of
//   summation to anyone, so the permuted k order is free;
// - weights for the next U chunks of 32 k and their x are loaded before this step's MMAs;
// - a block is kSkinnyWarps warps over one tile of 16·FT output columns, each warp a quarter of
//   K; their sums meet in shared memory and are added in warp order, so an output's bits depend on
//   K alone (deterministic, and the same at any M the kernel serves);
// - the epilogue writes where the next kernel reads: columns of stacked q/k/v weights straight
//   into their three outputs, silu(gate) * up of stacked gate/up weights, or the residual add.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>

#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"

namespace specdec::cuda {
namespace {

constexpr int kSkinnyWarps = 4;  // ways K is split in a block
constexpr int kChunk = 32;       // k per lane-group load: 4 lanes x 8 elements

std::atomic<uint64_t> launches{0};

// FT 16-column tiles of w and NT 8-row tiles of x a warp; U chunks of 32 k a pipeline step. The
// block's tiles are rows base, base + stride, ... of w: consecutive (stride 16) for store and
// add, the gate rows and the up rows of the same columns (stride N / 2, FT = 2) for silu_gate.
template <typename W, int FT, int NT, int U, SkinnyEpilogue E>
__global__ void __launch_bounds__(kSkinnyWarps * 32) skinny_kernel(SkinnyArgs a) {
  static_assert(E != SkinnyEpilogue::silu_gate || FT == 2, "silu_gate pairs a gate tile with an up tile");
  constexpr int R = FT * NT * 4;  // accumulators a lane
  __shared__ float partial[kSkinnyWarps][R][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int M = a.M, K = a.K;
  const int cols = E == SkinnyEpilogue::silu_gate ? a.N / 2 : a.N;  // output columns
  const int stride = E == SkinnyEpilogue::silu_gate ? cols : 16;
  const int base = blockIdx.x * (E == SkinnyEpilogue::silu_gate ? 16 : 16 * FT);
  const int chunks = K / kChunk;
  const int c_begin = static_cast<int>(int64_t{chunks} * warp / kSkinnyWarps);
  const int c_end = static_cast<int>(int64_t{chunks} * (warp + 1) / kSkinnyWarps);
  const W* w = static_cast<const W*>(a.w);
  const W* x = static_cast<const W*>(a.x);

  const W* wrow[FT][2];
  bool wok[FT][2];
#pragma unroll
  for (int f = 0; f < FT; ++f)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int col = base + (E == SkinnyEpilogue::silu_gate ? 0 : 16 * f) + g + 8 * h;
      const int row = col + (E == SkinnyEpilogue::silu_gate ? f * stride : 0);
      wok[f][h] = col < cols;
      wrow[f][h] = w + static_cast<int64_t>(wok[f][h] ? row : 0) * K + 8 * t;
    }
  const W* xrow[NT];
  bool xok[NT];
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    const int row = 8 * n + g;
    xok[n] = row < M;
    xrow[n] = x + static_cast<int64_t>(xok[n] ? row : 0) * K + 8 * t;
  }

  const uint4 zero = make_uint4(0, 0, 0, 0);
  uint4 wc[U][FT][2], wn[U][FT][2], xc[U][NT], xn[U][NT];
  const auto load_w = [&](uint4(&dst)[U][FT][2], int c) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int f = 0; f < FT; ++f)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          dst[u][f][h] = c + u < c_end && wok[f][h] ? load_stream(wrow[f][h] + (c + u) * kChunk) : zero;
  };
  const auto load_x = [&](uint4(&dst)[U][NT], int c) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int n = 0; n < NT; ++n)
        dst[u][n] = c + u < c_end && xok[n] ? *reinterpret_cast<const uint4*>(xrow[n] + (c + u) * kChunk) : zero;
  };

  float acc[FT][NT][4];
#pragma unroll
  for (int f = 0; f < FT; ++f)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[f][n][e] = 0.0f;

  // Launched after the previous kernel has finished (launch_skinny_gemm), so this wait is for
  // form's sake: it keeps the kernel correct if it is ever launched overlapped.
  grid_dependency_wait();
  load_w(wc, c_begin);
  load_x(xc, c_begin);
  for (int c = c_begin; c < c_end; c += U) {
    if (c + U < c_end) {
      load_w(wn, c + U);
      load_x(xn, c + U);
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int f = 0; f < FT; ++f)
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          // Chunks past c_end hold zeros: their products add nothing.
          const uint4 &lo = wc[u][f][0], &hi = wc[u][f][1], &xv = xc[u][n];
          const uint32_t a0[4] = {lo.x, hi.x, lo.y, hi.y};
          const uint32_t a1[4] = {lo.z, hi.z, lo.w, hi.w};
          Mma<W>::run(acc[f][n], a0, xv.x, xv.y);
          Mma<W>::run(acc[f][n], a1, xv.z, xv.w);
        }
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int f = 0; f < FT; ++f) wc[u][f][0] = wn[u][f][0], wc[u][f][1] = wn[u][f][1];
#pragma unroll
      for (int n = 0; n < NT; ++n) xc[u][n] = xn[u][n];
    }
  }
  allow_dependents();

#pragma unroll
  for (int f = 0; f < FT; ++f)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) partial[warp][(f * NT + n) * 4 + e][lane] = acc[f][n][e];
  __syncthreads();
  // The warps' sums of an output are added in warp order, each warp's over its chunks in k
  // order: an output's bits depend on K alone, not on M, the tile shape or the epilogue.
  const auto total = [&](int i) {
    float v = partial[0][i][lane];
#pragma unroll
    for (int s = 1; s < kSkinnyWarps; ++s) v += partial[s][i][lane];
    return v;
  };
  constexpr int outputs = E == SkinnyEpilogue::silu_gate ? NT * 4 : R;
  for (int i = warp; i < outputs; i += kSkinnyWarps) {
    // Accumulator e of an m16n8 tile: column g (+8 for e >= 2), row 2t (+1 for odd e).
    const int f = i / (NT * 4), n = (i / 4) % NT, e = i % 4;
    const int col = base + 16 * f + g + (e >= 2 ? 8 : 0);
    const int row = 8 * n + 2 * t + (e & 1);
    if (row >= M || col >= cols) continue;
    if constexpr (E == SkinnyEpilogue::silu_gate) {
      a.out[0][static_cast<int64_t>(row) * cols + col] = silu_times(total(i), total(NT * 4 + i));
    } else if constexpr (E == SkinnyEpilogue::add) {
      float* o = a.out[0] + static_cast<int64_t>(row) * cols + col;
      *o += total(i);
    } else {
      // Only constant indices into a: a computed one would copy the parameters to local memory.
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
      o[static_cast<int64_t>(row) * width + local] = total(i);
    }
  }
}

template <typename W, int FT, int NT, int U, SkinnyEpilogue E>
void launch_config(const SkinnyArgs& a, const Context& ctx) {
  const int cols = E == SkinnyEpilogue::silu_gate ? a.N / 2 : a.N;
  const int tile = E == SkinnyEpilogue::silu_gate ? 16 : 16 * FT;
  // Not overlapped with the kernel before it: a grid of hundreds of blocks launched early sits
  // resident, waiting, and takes the room the kernels still running before it (a decode step's
  // attention) need. It still lets the kernel after it start early.
  Context c = ctx;
  c.tuning.overlapped_launches = false;
  launch(skinny_kernel<W, FT, NT, U, E>, dim3((cols + tile - 1) / tile), dim3(kSkinnyWarps * 32), 0, c, a);
}

template <typename W, SkinnyEpilogue E>
void launch_rows(const SkinnyArgs& a, const Context& ctx) {
  // A second 8-row tile of x costs registers, so fewer weight chunks in flight; silu_gate holds
  // two column tiles (gate and up), so half the chunks.
  constexpr bool gate = E == SkinnyEpilogue::silu_gate;
  if (a.M <= 8)
    launch_config<W, gate ? 2 : 1, 1, gate ? 2 : 4, E>(a, ctx);
  else
    launch_config<W, gate ? 2 : 1, 2, gate ? 2 : 4, E>(a, ctx);
}

}  // namespace

bool skinny_gemm_supports(ElemType type, int M, int K, const void* x, const void* w) {
  return few_rows_supported(type, M, K, x, w, kSkinnyMaxM, kChunk);
}

void launch_skinny_gemm(const SkinnyArgs& a, const Context& ctx) {
  launches.fetch_add(1, std::memory_order_relaxed);
  for_few_rows(a, [&](auto w, auto e) { launch_rows<decltype(w), decltype(e)::value>(a, ctx); });
}

uint64_t skinny_gemm_launches() { return launches.load(std::memory_order_relaxed); }

}  // namespace specdec::cuda
