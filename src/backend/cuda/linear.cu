// The row-streaming linear kernel: out[M, N] = x[M, K] · w[N, K]ᵀ with f32 accumulation, plus
// its fused forms (several projections of one x in one launch, the residual add, the SwiGLU
// gate). One warp owns C output columns and a tile of up to MT rows of x; x is staged in shared
// memory by K tiles, w is streamed once per M tile with
// 16-byte loads. The reduction order of one output is fixed by K alone: lane l accumulates the
// 16-byte vectors l, l+32, ... in increasing order (fma per element, in element order), then the
// tail elements, then the warp butterfly. Neither M, MT, the K tile nor the fusion changes it,
// so the kernel is batch invariant.
#include <algorithm>
#include <cstdlib>

#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"

namespace specdec::cuda {
namespace {

constexpr int kWarps = 8;  // output columns per block
constexpr int kThreads = kWarps * 32;
constexpr int kSmemBudget = 32 * 1024;  // bytes of staged x per block
// Tiles of at most this many rows of x (decode steps) load weights early and fold the RMSNorm.
// Both keep values live across the staging, which costs registers: in the 8- and 16-row tiles
// of verify windows they pushed 128 registers per thread to 198-253 (half the blocks per SM).
constexpr int kLeanRows = 2;

// A 16-byte vector of W widened to f32.
template <typename W>
struct Vec16 {
  static constexpr int n = 16 / sizeof(W);
  __device__ __forceinline__ static void widen(const uint4& raw, float* out) {
    const W* e = reinterpret_cast<const W*>(&raw);
#pragma unroll
    for (int j = 0; j < n; ++j) out[j] = to_float(e[j]);
  }
};

// acc[r][m] += w_r[k .. k+V) · x_m[k .. k+V), one fma per element in element order, with x_m
// staged in shared memory at xs + m * kc + offset.
template <typename W, int MT, int RR>
__device__ __forceinline__ void accumulate_vec(const uint4 (&raw)[RR], const float* xs, int kc, int offset,
                                               float (&acc)[RR][MT]) {
  constexpr int V = Vec16<W>::n;
  float wf[RR][V];
#pragma unroll
  for (int r = 0; r < RR; ++r) Vec16<W>::widen(raw[r], wf[r]);
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    const float4* xr = reinterpret_cast<const float4*>(xs + m * kc + offset);
#pragma unroll
    for (int q = 0; q < V / 4; ++q) {
      const float4 xv = xr[q];
#pragma unroll
      for (int r = 0; r < RR; ++r) {
        acc[r][m] = fmaf(wf[r][4 * q + 0], xv.x, acc[r][m]);
        acc[r][m] = fmaf(wf[r][4 * q + 1], xv.y, acc[r][m]);
        acc[r][m] = fmaf(wf[r][4 * q + 2], xv.z, acc[r][m]);
        acc[r][m] = fmaf(wf[r][4 * q + 3], xv.w, acc[r][m]);
      }
    }
  }
}

// The segment holding column c (columns of all segments numbered consecutively), with c's row
// in it. Only constant indices into a.seg: a computed index would copy the kernel's parameters
// to local memory in every thread.
__device__ __forceinline__ LinearSegment segment_of(const LinearRowsArgs& a, int c, int& local) {
  local = c;
  if (a.segments > 1 && local >= a.seg[0].n) {
    local -= a.seg[0].n;
    if (a.segments > 2 && local >= a.seg[1].n) {
      local -= a.seg[1].n;
      return a.seg[2];
    }
    return a.seg[1];
  }
  return a.seg[0];
}

// One warp computes C consecutive output columns for MT rows of x, loading RR weight rows (C,
// or 2C for silu_gate: the gate rows, then the up rows). kVec: weight rows are 16-byte aligned
// and read as vectors; otherwise element by element (V = 1). C, RR and MT change which outputs a
// warp computes, never the order of any one output's operations. (Reading x straight from global
// memory for one row instead of staging it was measured slower: 65 % against 86 % of the copy
// bandwidth for a 14336 x 4096 bf16 weight at M = 1.)
//
// early: how many of the first loop iteration's U weight vectors per row a warp loads before it
// waits for the previous kernel (0, 1, or 2 = all U). Weights are never written by a kernel, so
// these loads may run while that kernel finishes: they fill the memory pipe during its tail and
// this kernel's x staging instead of starting after both.
template <typename W, int MT, int C, int RR, bool kVec, LinearEpilogue E>
__global__ void __launch_bounds__(kThreads) linear_rows_kernel(LinearRowsArgs a, int n_total, int kc, int early) {
  allow_dependents();
  extern __shared__ float4 smem_raw[];
  float* xs = reinterpret_cast<float*>(smem_raw);  // [MT][kc]
  constexpr int V = kVec ? Vec16<W>::n : 1;
  constexpr int U = RR >= 4 ? 1 : 4 / RR;  // vectors per row loaded together: RR * U loads in flight
  static_assert(E != LinearEpilogue::silu_gate || RR == 2 * C, "silu_gate loads gate and up rows");
  static_assert(E == LinearEpilogue::silu_gate || RR == C, "one weight row per column");
  const int M = a.M, K = a.K;
  const float* __restrict__ x = a.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n0 = (blockIdx.x * kWarps + warp) * C;
  const int m0 = blockIdx.y * MT;
  const int mt = min(MT, M - m0);
  const int kvec_end = K / V * V;
  const bool x_vec = K % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  const W* wrow[RR];
#pragma unroll
  for (int r = 0; r < C; ++r) {
    const int c = min(n0 + r, n_total - 1);  // clamped: computed, not stored
    if constexpr (E == LinearEpilogue::silu_gate) {
      wrow[r] = static_cast<const W*>(a.seg[0].w) + static_cast<int64_t>(c) * K;
      wrow[C + r] = static_cast<const W*>(a.seg[1].w) + static_cast<int64_t>(c) * K;
    } else {
      int local = 0;
      const LinearSegment sg = segment_of(a, c, local);
      wrow[r] = static_cast<const W*>(sg.w) + static_cast<int64_t>(local) * K;
    }
  }
  // The first loop iteration's vectors u < have_first (see `early`), when that iteration runs.
  uint4 first[U][RR];
  int have_first = 0;
  if constexpr (kVec && MT <= kLeanRows) {
    if (early > 0 && n0 < n_total && lane * V + (U - 1) * 32 * V < min(min(kc, K), kvec_end)) {
      have_first = early >= 2 ? U : 1;
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int r = 0; r < RR; ++r)
          if (u < have_first) first[u][r] = __ldg(reinterpret_cast<const uint4*>(wrow[r] + lane * V + u * 32 * V));
    }
  }
  grid_dependency_wait();
  __shared__ float norm_scratch[MT <= kLeanRows ? MT * kWarps : 1];
  float acc[RR][MT];
#pragma unroll
  for (int r = 0; r < RR; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[r][m] = 0.0f;

  for (int k0 = 0; k0 < K; k0 += kc) {
    const int klen = min(kc, K - k0);
    __syncthreads();  // the previous tile is consumed
    if (x_vec) {
      // 16-byte loads, several issued before their stores: staging is latency-bound otherwise.
      const int kl4 = klen / 4;
#pragma unroll 4
      for (int i = threadIdx.x; i < MT * kl4; i += kThreads) {
        const int m = i / kl4, k4 = i - m * kl4;
        const float4 v = m < mt ? __ldg(reinterpret_cast<const float4*>(x + static_cast<int64_t>(m0 + m) * K + k0) + k4)
                                : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        reinterpret_cast<float4*>(xs + m * kc)[k4] = v;
      }
    } else {
      for (int i = threadIdx.x; i < MT * klen; i += kThreads) {
        const int m = i / klen, k = i - m * klen;
        xs[m * kc + k] = m < mt ? x[static_cast<int64_t>(m0 + m) * K + k0 + k] : 0.0f;
      }
    }
    __syncthreads();
    if (MT <= kLeanRows && a.norm_w != nullptr) {
      // The whole row is staged (klen == K). rms_norm_kernel's arithmetic for every row at once:
      // thread t sums the squares of elements t, t + 256, ... in order, each warp folds its
      // threads' sums (warp_sum), and the warps' sums are added in warp order, as block_sum does;
      // one exchange through shared memory serves all rows.
      const W* g = static_cast<const W*>(a.norm_w);
      float ss[MT];
#pragma unroll
      for (int m = 0; m < MT; ++m) ss[m] = 0.0f;
      for (int i = threadIdx.x; i < K; i += kThreads) {
#pragma unroll
        for (int m = 0; m < MT; ++m)
          if (m < mt) ss[m] = fmaf(xs[m * kc + i], xs[m * kc + i], ss[m]);
      }
#pragma unroll
      for (int m = 0; m < MT; ++m) ss[m] = warp_sum(ss[m]);
      if (lane == 0) {
#pragma unroll
        for (int m = 0; m < MT; ++m) norm_scratch[m * kWarps + warp] = ss[m];
      }
      __syncthreads();
      float inv[MT];
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        float total = 0.0f;
        for (int w = 0; w < kWarps; ++w) total += norm_scratch[m * kWarps + w];
        inv[m] = 1.0f / sqrtf(total / static_cast<float>(K) + a.norm_eps);
      }
      for (int i = threadIdx.x; i < K; i += kThreads) {
        const float gi = to_float(g[i]);
#pragma unroll
        for (int m = 0; m < MT; ++m)
          if (m < mt) xs[m * kc + i] = (xs[m * kc + i] * inv[m]) * gi;
      }
      __syncthreads();
    }
    if (n0 >= n_total) continue;
    const int vend = min(k0 + klen, kvec_end);
    int k = k0 + lane * V;
    if constexpr (kVec) {
      for (; k + (U - 1) * 32 * V < vend; k += U * 32 * V) {
        uint4 raw[U][RR];
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
          for (int r = 0; r < RR; ++r) {
            raw[u][r] = u < have_first ? first[u][r] : __ldg(reinterpret_cast<const uint4*>(wrow[r] + k + u * 32 * V));
          }
        have_first = 0;
#pragma unroll
        for (int u = 0; u < U; ++u)
          accumulate_vec<W, MT, RR>(raw[u], xs, kc, k + u * 32 * V - k0, acc);
      }
      for (; k < vend; k += 32 * V) {  // the last vectors, one at a time (same per-lane order)
        uint4 raw[RR];
#pragma unroll
        for (int r = 0; r < RR; ++r) raw[r] = __ldg(reinterpret_cast<const uint4*>(wrow[r] + k));
        accumulate_vec<W, MT, RR>(raw, xs, kc, k - k0, acc);
      }
      if (k0 + klen == K) {  // tail elements past the last whole vector (fewer than V < 32)
        const int kt = kvec_end + lane;
        if (kt < K) {
#pragma unroll
          for (int r = 0; r < RR; ++r) {
            const float wv = to_float(wrow[r][kt]);
#pragma unroll
            for (int m = 0; m < MT; ++m) acc[r][m] = fmaf(wv, xs[m * kc + kt - k0], acc[r][m]);
          }
        }
      }
    } else {
      for (; k < vend; k += 32) {
#pragma unroll
        for (int r = 0; r < RR; ++r) {
          const float wv = to_float(wrow[r][k]);
#pragma unroll
          for (int m = 0; m < MT; ++m) acc[r][m] = fmaf(wv, xs[m * kc + k - k0], acc[r][m]);
        }
      }
    }
  }
  if (n0 >= n_total) return;
#pragma unroll
  for (int r = 0; r < RR; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[r][m] = warp_sum(acc[r][m]);
  if (lane != 0) return;
#pragma unroll
  for (int r = 0; r < C; ++r) {
    const int c = n0 + r;
    if (c >= n_total) break;
    if constexpr (E == LinearEpilogue::silu_gate) {
      float* out = a.seg[0].out;
      for (int m = 0; m < mt; ++m) {
        const float g = acc[r][m];
        out[static_cast<int64_t>(m0 + m) * n_total + c] = g / (1.0f + expf(-g)) * acc[C + r][m];
      }
    } else {
      int local = 0;
      const LinearSegment sg = segment_of(a, c, local);
      const float b = sg.bias ? sg.bias[local] : 0.0f;
      for (int m = 0; m < mt; ++m) {
        float* o = sg.out + static_cast<int64_t>(m0 + m) * sg.n + local;
        if constexpr (E == LinearEpilogue::add) {
          *o = *o + (acc[r][m] + b);
        } else {
          *o = acc[r][m] + b;
        }
      }
    }
  }
}

// How many weight vectors linear kernels load before waiting for the previous kernel (see
// linear_rows_kernel's `early`): SPECDEC_CUDA_EARLY_WEIGHTS=0, 1 or 2, to measure what each buys.
int early_weight_loads() {
  static const int level = [] {
    const char* v = std::getenv("SPECDEC_CUDA_EARLY_WEIGHTS");
    return v == nullptr ? 2 : std::clamp(std::atoi(v), 0, 2);
  }();
  return level;
}

// Rows of x one block stages (launch_for_m's choice) and the K tile that fits them.
int tile_rows(int M) { return M <= 1 ? 1 : M <= 2 ? 2 : M <= 4 ? 4 : M <= 8 ? 8 : 16; }
int k_tile(int MT) { return kSmemBudget / (MT * static_cast<int>(sizeof(float))) / 256 * 256; }

template <typename W, int MT, int C, int RR, bool kVec, LinearEpilogue E>
void launch_shape(const LinearRowsArgs& a, int n_total, cudaStream_t stream) {
  const int cols_per_block = kWarps * C;
  const dim3 grid((n_total + cols_per_block - 1) / cols_per_block, (a.M + MT - 1) / MT);
  // K tile: as much of K as fits the budget, a multiple of 256 (whole vectors for every lane).
  int kc = k_tile(MT);
  const int k_round = (a.K + 255) / 256 * 256;
  if (kc > k_round) kc = k_round;
  const size_t smem = static_cast<size_t>(MT) * kc * sizeof(float);
  launch(linear_rows_kernel<W, MT, C, RR, kVec, E>, grid, kThreads, smem, stream, a, n_total, kc, early_weight_loads());
}

template <typename W, int MT, LinearEpilogue E>
void launch_tile(const LinearRowsArgs& a, int n_total, cudaStream_t stream) {
  constexpr bool kGate = E == LinearEpilogue::silu_gate;
  bool vec = a.K % Vec16<W>::n == 0;
  for (int j = 0; j < (kGate ? 2 : a.segments); ++j) vec = vec && reinterpret_cast<uintptr_t>(a.seg[j].w) % 16 == 0;
  if (!vec) return launch_shape<W, MT, 1, kGate ? 2 : 1, false, E>(a, n_total, stream);
  // Weight rows per warp RR: any choice gives the same per-output order, so it is chosen for
  // speed from M and the rows streamed. Few rows of x (bandwidth-bound): many blocks, so every
  // SM holds an even share of the weight stream. More rows: more weight rows per warp, so each x
  // value read feeds several of them.
  const int rows = kGate ? 2 * n_total : n_total;
  const int RR = MT <= 2 ? (rows >= 32768 ? 4 : (rows >= 12288 ? 2 : 1)) : (rows >= 8192 ? 4 : (rows >= 2048 ? 2 : 1));
  if constexpr (kGate) {
    if (RR >= 4) return launch_shape<W, MT, 2, 4, true, E>(a, n_total, stream);
    return launch_shape<W, MT, 1, 2, true, E>(a, n_total, stream);
  } else {
    if (RR == 4) return launch_shape<W, MT, 4, 4, true, E>(a, n_total, stream);
    if (RR == 2) return launch_shape<W, MT, 2, 2, true, E>(a, n_total, stream);
    launch_shape<W, MT, 1, 1, true, E>(a, n_total, stream);
  }
}

template <typename W, LinearEpilogue E>
void launch_for_m(const LinearRowsArgs& a, int n_total, cudaStream_t stream) {
  switch (tile_rows(a.M)) {
    case 1: return launch_tile<W, 1, E>(a, n_total, stream);
    case 2: return launch_tile<W, 2, E>(a, n_total, stream);
    case 4: return launch_tile<W, 4, E>(a, n_total, stream);
    case 8: return launch_tile<W, 8, E>(a, n_total, stream);
    default: return launch_tile<W, 16, E>(a, n_total, stream);
  }
}

template <typename W>
void launch_epilogue(const LinearRowsArgs& a, int n_total, cudaStream_t stream) {
  switch (a.epilogue) {
    case LinearEpilogue::store: return launch_for_m<W, LinearEpilogue::store>(a, n_total, stream);
    case LinearEpilogue::add: return launch_for_m<W, LinearEpilogue::add>(a, n_total, stream);
    case LinearEpilogue::silu_gate: return launch_for_m<W, LinearEpilogue::silu_gate>(a, n_total, stream);
  }
}

}  // namespace

bool linear_rows_folds_norm(int M, int K) { return tile_rows(M) <= kLeanRows && K <= k_tile(tile_rows(M)); }

void launch_linear_rows(const LinearRowsArgs& args, cudaStream_t stream) {
  int n_total = 0;
  if (args.epilogue == LinearEpilogue::silu_gate) {
    n_total = args.seg[0].n;
  } else {
    for (int j = 0; j < args.segments; ++j) n_total += args.seg[j].n;
  }
  if (args.M == 0 || n_total == 0) return;
  SPECDEC_DISPATCH_ELEM(args.w_type, W, launch_epilogue<W>(args, n_total, stream));
}

void launch_linear_rows(const float* x, const void* w, ElemType w_type, const float* bias, float* out, int M, int N,
                        int K, cudaStream_t stream) {
  LinearRowsArgs a;
  a.x = x;
  a.w_type = w_type;
  a.M = M;
  a.K = K;
  a.seg[0] = LinearSegment{w, bias, out, N};
  launch_linear_rows(a, stream);
}

}  // namespace specdec::cuda
