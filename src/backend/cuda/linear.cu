// The row-streaming linear kernel: out[M, N] = x[M, K] · w[N, K]ᵀ with f32 accumulation, plus
// its fused forms (several projections of one x in one launch, the residual add, the SwiGLU
// gate). One warp owns C output columns and a tile of up to MT rows of x; x is staged in shared
// memory by K tiles, w is streamed once per M tile with
// 16-byte loads. The reduction order of one output is fixed by K alone: lane l accumulates the
// 16-byte vectors l, l+32, ... in increasing order (fma per element, in element order), then the
// tail elements, then the warp butterfly. Neither M, MT, the K tile nor the fusion changes it,
// so the kernel is batch invariant.
#include <algorithm>
#include <atomic>
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

// Output (m, c) of the epilogue E from its dot product v (and, for silu_gate, the up row's dot
// product up), for the stream kernel: linear_rows_kernel's epilogue arithmetic, which keeps its
// own inline copy (a call here changed that kernel's register allocation and slowed it);
// GpuLinear.SingleRowEqualsItsRowInAPairBits holds the two to the same bits.
template <LinearEpilogue E>
__device__ __forceinline__ void store_output(const LinearRowsArgs& a, int n_total, int m, int c, float v, float up) {
  if constexpr (E == LinearEpilogue::silu_gate) {
    a.seg[0].out[static_cast<int64_t>(m) * n_total + c] = v / (1.0f + expf(-v)) * up;
  } else {
    int local = 0;
    const LinearSegment sg = segment_of(a, c, local);
    const float b = sg.bias ? sg.bias[local] : 0.0f;
    float* o = sg.out + static_cast<int64_t>(m) * sg.n + local;
    if constexpr (E == LinearEpilogue::add) {
      *o = *o + (v + b);
    } else {
      *o = v + b;
    }
  }
}

// The RMSNorm folded into the linears' reading of x: rms_norm_kernel's arithmetic, kept here
// once for both kernels, so that a folded norm gives the bits of rms_norm followed by the linear
// whichever kernel runs. Thread t of the kThreads has summed the squares of its elements t,
// t + 256, ... of each row in that order (fmaf). norm_inverse folds each warp's sums (warp_sum)
// and adds the warps' sums in warp order, as block_sum does, one exchange through `scratch`
// (MT * kWarps floats) serving all MT rows; it returns each row's 1 / sqrt(mean square + eps).
// Called by every thread of the block; contains a barrier.
template <int MT>
__device__ __forceinline__ void norm_inverse(float (&ss)[MT], int K, float eps, float* scratch, float (&inv)[MT]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int m = 0; m < MT; ++m) ss[m] = warp_sum(ss[m]);
  if (lane == 0) {
#pragma unroll
    for (int m = 0; m < MT; ++m) scratch[m * kWarps + warp] = ss[m];
  }
  __syncthreads();
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    float total = 0.0f;
    for (int w = 0; w < kWarps; ++w) total += scratch[m * kWarps + w];
    inv[m] = 1.0f / sqrtf(total / static_cast<float>(K) + eps);
  }
}

// An element x of a row with inverse RMS inv, normalised and scaled by its norm weight g.
__device__ __forceinline__ float normed(float x, float inv, float g) { return (x * inv) * g; }

// Folds the RMSNorm (weight g, epsilon eps) into staged rows of x in shared memory (the whole
// row of K staged, mt <= MT rows at xs + m * kc). Called by every thread of the block; contains
// barriers.
template <typename W, int MT>
__device__ __forceinline__ void fold_norm(const W* g, int K, float eps, float* xs, int kc, int mt, float* scratch) {
  float ss[MT];
#pragma unroll
  for (int m = 0; m < MT; ++m) ss[m] = 0.0f;
  for (int i = threadIdx.x; i < K; i += kThreads) {
#pragma unroll
    for (int m = 0; m < MT; ++m)
      if (m < mt) ss[m] = fmaf(xs[m * kc + i], xs[m * kc + i], ss[m]);
  }
  float inv[MT];
  norm_inverse<MT>(ss, K, eps, scratch, inv);
  for (int i = threadIdx.x; i < K; i += kThreads) {
    const float gi = to_float(g[i]);
#pragma unroll
    for (int m = 0; m < MT; ++m)
      if (m < mt) xs[m * kc + i] = normed(xs[m * kc + i], inv[m], gi);
  }
  __syncthreads();
}

// One warp computes C consecutive output columns for MT rows of x, loading RR weight rows (C,
// or 2C for silu_gate: the gate rows, then the up rows). kVec: weight rows are 16-byte aligned
// and read as vectors; otherwise element by element (V = 1). C, RR and MT change which outputs a
// warp computes, never the order of any one output's operations. x is staged in shared memory
// even for one row: read straight from global memory it competes with the weight stream.
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
    if constexpr (MT <= kLeanRows) {
      if (a.norm_w != nullptr) {  // the whole row is staged (klen == K)
        fold_norm<W, MT>(static_cast<const W*>(a.norm_w), K, a.norm_eps, xs, kc, mt, norm_scratch);
      }
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
        for (int u = 0; u < U; ++u) accumulate_vec<W, MT, RR>(raw[u], xs, kc, k + u * 32 * V - k0, acc);
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

// 16-byte asynchronous copy global -> shared (kept in L2 only: weights are streamed once), and
// the group bookkeeping of such copies.
__device__ __forceinline__ void cp_async16(void* smem_dst, const void* global_src) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(global_src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Weight vectors per row a lane of the stream kernel has in flight: deep enough to keep the memory
// pipe full, shallow enough that an SM keeps room for a block of the next linear, which then
// starts its loads during this one's tail (the depths tried are in docs/perf-notes.md).
constexpr int kStreamDepth = 6;
constexpr int kStagePer = 16;   // x elements per thread the stream kernel stages in one round trip
constexpr int kWideWarps = 16;  // warps a block of the stream kernel has when no norm is folded

// The one-row linear as a stream (M = 1, 16-byte weight vectors): a persistent grid in which warp
// w of the W warps computes columns w, w + W, w + 2W, ... Each lane keeps kStreamDepth of its
// weight vectors in flight through cp.async into its own ring of shared memory, across the end of
// a column into the next, so a warp's bytes in flight do not cost registers and do not drain at
// column boundaries, and a warp left alone at the end still streams fast. Lane l accumulates the
// vectors l, l + 32, ... of a row in order, fma per element (accumulate_vec), then the warp
// butterfly: the order of linear_rows_kernel, so the same bits. x (the whole row) is staged once
// per block, with the norm folded as linear_rows_kernel does. NW warps a block: kWarps, or
// kWideWarps for rows without a norm (the norm's order is that of 256 threads). A warp's unit is
// one column (RR = 1), a column's gate and up rows (silu_gate) or, paired (RR = 2, store and add),
// the two columns 2u and 2u + 1 streamed side by side: each column's arithmetic is unchanged.
// Units of the stream kernel's work (one per warp pass, see below) for n_total output columns.
template <int RR, LinearEpilogue E>
__host__ __device__ constexpr int stream_units(int n_total) {
  return E == LinearEpilogue::silu_gate ? n_total : n_total / RR;
}

template <typename W, int RR, LinearEpilogue E, int NW>
__global__ void __launch_bounds__(NW * 32) linear_stream_kernel(LinearRowsArgs a, int n_total) {
  allow_dependents();
  extern __shared__ float4 smem_raw[];
  constexpr int V = Vec16<W>::n;
  constexpr bool kGate = E == LinearEpilogue::silu_gate;
  static_assert(kGate ? RR == 2 : RR == 1 || RR == 2, "gate and up rows, or one or two columns a unit");
  const int K = a.K;
  const int kx = (K + 3) / 4 * 4;  // staged floats, 16-byte aligned ring after them
  float* xs = reinterpret_cast<float*>(smem_raw);
  uint4* ring = reinterpret_cast<uint4*>(xs + kx);  // [warp][depth][RR][lane]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint4* my_ring = ring + static_cast<int64_t>(warp) * kStreamDepth * RR * 32 + lane;
  const int nvec = K / V;
  const int steps = (nvec + 31) / 32;  // vector steps per row (lanes past nvec idle)
  constexpr int NT = NW * 32;
  const int w0 = blockIdx.x * NW + warp, wn = gridDim.x * NW;
  const int units = stream_units<RR, E>(n_total);  // the launcher pairs only an even n_total
  const int columns = w0 < units ? (units - 1 - w0) / wn + 1 : 0;
  const int total = columns * steps;

  // The issuing side runs kStreamDepth steps ahead of the consuming side, possibly in a later
  // column: it keeps its own column and row pointers.
  int issue_col = w0, issue_step = 0;
  const W* issue_row[RR];
  auto point_at = [&](int c) {
    if constexpr (E == LinearEpilogue::silu_gate) {
      issue_row[0] = static_cast<const W*>(a.seg[0].w) + static_cast<int64_t>(c) * K;
      issue_row[1] = static_cast<const W*>(a.seg[1].w) + static_cast<int64_t>(c) * K;
    } else {
#pragma unroll
      for (int r = 0; r < RR; ++r) {
        int local = 0;
        const LinearSegment sg = segment_of(a, RR * c + r, local);
        issue_row[r] = static_cast<const W*>(sg.w) + static_cast<int64_t>(local) * K;
      }
    }
  };
  if (columns > 0) point_at(issue_col);
  int issued = 0;
  auto issue = [&]() {  // the loads of step `issued` into its ring slot, as one group
    if (issued < total) {
      const int j = lane + 32 * issue_step;
      uint4* slot = my_ring + (issued % kStreamDepth) * RR * 32;
      if (j < nvec) {
#pragma unroll
        for (int r = 0; r < RR; ++r) cp_async16(slot + r * 32, issue_row[r] + static_cast<int64_t>(j) * V);
      }
      if (++issue_step == steps) {
        issue_step = 0;
        issue_col += wn;
        if (issued + 1 < total) point_at(issue_col);
      }
    }
    ++issued;
    cp_async_commit();  // possibly empty: every step is one group, so the waits count steps
  };
  // Weights are never written by a kernel: the first loads go out before the wait, and so do
  // the norm weights of a row staged in registers (see below).
#pragma unroll 1
  for (int i = 0; i < kStreamDepth; ++i) issue();
  const bool in_registers = NW == kWarps && a.norm_w != nullptr && K <= kStagePer * kThreads;
  float gv[kStagePer];
  if (in_registers) {
    const W* g = static_cast<const W*>(a.norm_w);
#pragma unroll
    for (int j = 0; j < kStagePer; ++j) {
      const int i = threadIdx.x + j * kThreads;
      gv[j] = i < K ? to_float(g[i]) : 0.0f;
    }
  }

  grid_dependency_wait();
  __shared__ float norm_scratch[kWarps];
  if (in_registers) {
    // x staged with the norm folded in one pass: thread t loads elements t, t + 256, ... (all
    // loads issued before the first is used), sums their squares in that order and scales them
    // in registers: fold_norm's arithmetic (norm_inverse, normed), so the same bits, with one
    // round trip to memory and one pass over shared memory instead of a chain of loads and three
    // passes.
    float v[kStagePer];
#pragma unroll
    for (int j = 0; j < kStagePer; ++j) {
      const int i = threadIdx.x + j * kThreads;
      v[j] = i < K ? a.x[i] : 0.0f;
    }
    float ss[1] = {0.0f}, inv[1];
#pragma unroll
    for (int j = 0; j < kStagePer; ++j)
      if (threadIdx.x + j * kThreads < K) ss[0] = fmaf(v[j], v[j], ss[0]);
    norm_inverse<1>(ss, K, a.norm_eps, norm_scratch, inv);
#pragma unroll
    for (int j = 0; j < kStagePer; ++j) {
      const int i = threadIdx.x + j * kThreads;
      if (i < K) xs[i] = normed(v[j], inv[0], gv[j]);
    }
    if (K + static_cast<int>(threadIdx.x) < kx) xs[K + threadIdx.x] = 0.0f;
    __syncthreads();
  } else {
    // Plain staging, kStagePer / 2 16-byte loads per thread in flight before their stores.
    constexpr int B = kStagePer / 2;
    const int n4 = kx / 4;
    for (int base = threadIdx.x; base < n4; base += NT * B) {
      float4 v[B];
#pragma unroll
      for (int u = 0; u < B; ++u) {
        const int i = base + u * NT, k4 = 4 * i;
        v[u] = i >= n4      ? make_float4(0.0f, 0.0f, 0.0f, 0.0f)
               : k4 + 3 < K ? __ldg(reinterpret_cast<const float4*>(a.x) + i)
                            : make_float4(k4 < K ? a.x[k4] : 0.0f, k4 + 1 < K ? a.x[k4 + 1] : 0.0f,
                                          k4 + 2 < K ? a.x[k4 + 2] : 0.0f, 0.0f);
      }
#pragma unroll
      for (int u = 0; u < B; ++u)
        if (base + u * NT < n4) reinterpret_cast<float4*>(xs)[base + u * NT] = v[u];
    }
    __syncthreads();
    if constexpr (NW == kWarps) {
      if (a.norm_w != nullptr) fold_norm<W, 1>(static_cast<const W*>(a.norm_w), K, a.norm_eps, xs, kx, 1, norm_scratch);
    }
  }

  float acc[RR][1];
#pragma unroll
  for (int r = 0; r < RR; ++r) acc[r][0] = 0.0f;
  int col = w0, step = 0;
#pragma unroll 1
  for (int g = 0; g < total; ++g) {
    cp_async_wait<kStreamDepth - 1>();  // step g's group has landed (this lane's own copies)
    const int j = lane + 32 * step;
    if (j < nvec) {
      const uint4* slot = my_ring + (g % kStreamDepth) * RR * 32;
      uint4 raw[RR];
#pragma unroll
      for (int r = 0; r < RR; ++r) raw[r] = slot[r * 32];
      accumulate_vec<W, 1, RR>(raw, xs, 0, j * V, acc);
    }
    issue();  // refills the slot just read (its values are in registers and used)
    if (++step == steps) {
#pragma unroll
      for (int r = 0; r < RR; ++r) acc[r][0] = warp_sum(acc[r][0]);
      if (lane == 0) {
        if constexpr (kGate) {
          store_output<E>(a, n_total, 0, col, acc[0][0], acc[1][0]);
        } else {
#pragma unroll
          for (int r = 0; r < RR; ++r) store_output<E>(a, n_total, 0, RR * col + r, acc[r][0], 0.0f);
        }
      }
#pragma unroll
      for (int r = 0; r < RR; ++r) acc[r][0] = 0.0f;
      step = 0;
      col += wn;
    }
  }
  cp_async_wait<0>();
}

int multiprocessors() {
  static const int n = [] {
    int device = 0, count = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return count;
  }();
  return n;
}

std::atomic<uint64_t> stream_launches{0};

// Whether a one-row store or add linear streams two columns a warp (CudaTuning::paired_columns;
// by default when the norm is folded): paired, the q/k/v projection's columns fit one pass of the
// grid; pairing o and down as well leaves them one 16-warp block per SM, which loses what it gains.
bool paired_columns(const LinearRowsArgs& a, PairedColumns mode) {
  return mode == PairedColumns::always || (mode == PairedColumns::with_folded_norm && a.norm_w != nullptr);
}

size_t stream_smem(int K, int RR, int NW) {
  return static_cast<size_t>((K + 3) / 4 * 4) * sizeof(float) + size_t(NW) * kStreamDepth * RR * 32 * 16;
}

// launch_stream with NW warps a block.
template <typename W, int RR, LinearEpilogue E, int NW>
bool launch_stream_warps(const LinearRowsArgs& a, int n_total, const Context& ctx) {
  const size_t smem = stream_smem(a.K, RR, NW);
  const int sms = multiprocessors();
  if (sms == 0) return false;
  const auto kernel = linear_stream_kernel<W, RR, E, NW>;
  // The most dynamic shared memory a block may ask for: the device's opt-in limit less the
  // kernel's static shared memory (asking for more fails). Raised once per kernel.
  static const size_t max_dynamic = [&]() -> size_t {
    int device = 0, optin = 0;
    cudaFuncAttributes fa{};
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess ||
        cudaFuncGetAttributes(&fa, kernel) != cudaSuccess || static_cast<size_t>(optin) <= fa.sharedSizeBytes) {
      cudaGetLastError();
      return 0;
    }
    const size_t limit = static_cast<size_t>(optin) - fa.sharedSizeBytes;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(limit)) !=
        cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return limit;
  }();
  if (smem > max_dynamic) return false;
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, NW * 32, smem) != cudaSuccess || per_sm < 1) {
    cudaGetLastError();
    return false;
  }
  const int64_t wanted = (int64_t{stream_units<RR, E>(n_total)} + NW - 1) / NW;
  const int blocks = static_cast<int>(std::min<int64_t>(wanted, int64_t{per_sm} * sms));
  launch(kernel, blocks, NW * 32, smem, ctx, a, n_total);
  stream_launches.fetch_add(1, std::memory_order_relaxed);
  return true;
}

// Launches the stream kernel for one row of x; false (nothing launched) when it does not apply.
// Rows without a folded norm take blocks of kWideWarps warps: one staging of x serves twice the
// warps, and the down projection (57 KB of x a block) gets 32 warps per SM instead of 16. A
// folded norm keeps kWarps, the 256 threads whose order the norm's sums follow.
template <typename W, int RR, LinearEpilogue E>
bool launch_stream(const LinearRowsArgs& a, int n_total, const Context& ctx) {
  if (a.norm_w == nullptr) return launch_stream_warps<W, RR, E, kWideWarps>(a, n_total, ctx);
  return launch_stream_warps<W, RR, E, kWarps>(a, n_total, ctx);
}

// Rows of x one block stages (launch_for_m's choice) and the K tile that fits them.
int tile_rows(int M) { return M <= 1 ? 1 : M <= 2 ? 2 : M <= 4 ? 4 : M <= 8 ? 8 : 16; }
int k_tile(int MT) { return kSmemBudget / (MT * static_cast<int>(sizeof(float))) / 256 * 256; }

template <typename W, int MT, int C, int RR, bool kVec, LinearEpilogue E>
void launch_shape(const LinearRowsArgs& a, int n_total, const Context& ctx) {
  const int cols_per_block = kWarps * C;
  const dim3 grid((n_total + cols_per_block - 1) / cols_per_block, (a.M + MT - 1) / MT);
  // K tile: as much of K as fits the budget, a multiple of 256 (whole vectors for every lane).
  int kc = k_tile(MT);
  const int k_round = (a.K + 255) / 256 * 256;
  if (kc > k_round) kc = k_round;
  const size_t smem = static_cast<size_t>(MT) * kc * sizeof(float);
  // grid.y is capped at 65535 tiles of MT rows: more rows go in several launches over slices of
  // x and out. A row's result does not depend on the slice it is in.
  const int64_t max_rows = int64_t{65535} * MT;
  for (int64_t first = 0; first < a.M; first += max_rows) {
    LinearRowsArgs s = a;
    s.M = static_cast<int>(std::min<int64_t>(max_rows, a.M - first));
    s.x = a.x + first * a.K;
    for (int j = 0; j < kMaxLinearSegments; ++j)
      if (s.seg[j].out != nullptr) s.seg[j].out += first * (E == LinearEpilogue::silu_gate ? n_total : s.seg[j].n);
    const dim3 g(grid.x, static_cast<unsigned>((s.M + MT - 1) / MT));
    launch(linear_rows_kernel<W, MT, C, RR, kVec, E>, g, kThreads, smem, ctx, s, n_total, kc, ctx.tuning.early_weights);
  }
}

template <typename W, int MT, LinearEpilogue E>
void launch_tile(const LinearRowsArgs& a, int n_total, const Context& ctx) {
  constexpr bool kGate = E == LinearEpilogue::silu_gate;
  bool vec = a.K % Vec16<W>::n == 0;
  for (int j = 0; j < (kGate ? 2 : a.segments); ++j) vec = vec && reinterpret_cast<uintptr_t>(a.seg[j].w) % 16 == 0;
  if (!vec) return launch_shape < W, MT, 1, kGate ? 2 : 1, false, E > (a, n_total, ctx);
  // Weight rows per warp RR: any choice gives the same per-output order, so it is chosen for
  // speed from M and the rows streamed. Few rows of x (bandwidth-bound): many blocks, so every
  // SM holds an even share of the weight stream. More rows: more weight rows per warp, so each x
  // value read feeds several of them.
  const int rows = kGate ? 2 * n_total : n_total;
  const int RR = MT <= 2 ? (rows >= 32768 ? 4 : (rows >= 12288 ? 2 : 1)) : (rows >= 8192 ? 4 : (rows >= 2048 ? 2 : 1));
  if constexpr (kGate) {
    if (RR >= 4) return launch_shape<W, MT, 2, 4, true, E>(a, n_total, ctx);
    return launch_shape<W, MT, 1, 2, true, E>(a, n_total, ctx);
  } else {
    if (RR == 4) return launch_shape<W, MT, 4, 4, true, E>(a, n_total, ctx);
    if (RR == 2) return launch_shape<W, MT, 2, 2, true, E>(a, n_total, ctx);
    launch_shape<W, MT, 1, 1, true, E>(a, n_total, ctx);
  }
}

template <typename W, LinearEpilogue E>
void launch_for_m(const LinearRowsArgs& a, int n_total, const Context& ctx) {
  if (a.M == 1 && ctx.tuning.stream_linear) {
    constexpr bool kGate = E == LinearEpilogue::silu_gate;
    bool vec = a.K % Vec16<W>::n == 0 && a.K % 4 == 0 && reinterpret_cast<uintptr_t>(a.x) % 16 == 0;
    for (int j = 0; j < (kGate ? 2 : a.segments); ++j) vec = vec && reinterpret_cast<uintptr_t>(a.seg[j].w) % 16 == 0;
    if (vec && !kGate && n_total % 2 == 0 && paired_columns(a, ctx.tuning.paired_columns) &&
        launch_stream<W, 2, E>(a, n_total, ctx))
      return;
    if (vec && launch_stream < W, kGate ? 2 : 1, E > (a, n_total, ctx)) return;
  }
  switch (tile_rows(a.M)) {
    case 1:
      return launch_tile<W, 1, E>(a, n_total, ctx);
    case 2:
      return launch_tile<W, 2, E>(a, n_total, ctx);
    case 4:
      return launch_tile<W, 4, E>(a, n_total, ctx);
    case 8:
      return launch_tile<W, 8, E>(a, n_total, ctx);
    default:
      return launch_tile<W, 16, E>(a, n_total, ctx);
  }
}

template <typename W>
void launch_epilogue(const LinearRowsArgs& a, int n_total, const Context& ctx) {
  switch (a.epilogue) {
    case LinearEpilogue::store:
      return launch_for_m<W, LinearEpilogue::store>(a, n_total, ctx);
    case LinearEpilogue::add:
      return launch_for_m<W, LinearEpilogue::add>(a, n_total, ctx);
    case LinearEpilogue::silu_gate:
      return launch_for_m<W, LinearEpilogue::silu_gate>(a, n_total, ctx);
  }
}

}  // namespace

uint64_t linear_stream_launches() { return stream_launches.load(std::memory_order_relaxed); }

bool linear_rows_folds_norm(int M, int K) { return tile_rows(M) <= kLeanRows && K <= k_tile(tile_rows(M)); }

void launch_linear_rows(const LinearRowsArgs& args, const Context& ctx) {
  int n_total = 0;
  if (args.epilogue == LinearEpilogue::silu_gate) {
    n_total = args.seg[0].n;
  } else {
    for (int j = 0; j < args.segments; ++j) n_total += args.seg[j].n;
  }
  if (args.M == 0 || n_total == 0) return;
  SPECDEC_DISPATCH_ELEM(args.w_type, W, launch_epilogue<W>(args, n_total, ctx));
}

void launch_linear_rows(const float* x, const void* w, ElemType w_type, const float* bias, float* out, int M, int N,
                        int K, const Context& ctx) {
  LinearRowsArgs a;
  a.x = x;
  a.w_type = w_type;
  a.M = M;
  a.K = K;
  a.seg[0] = LinearSegment{w, bias, out, N};
  launch_linear_rows(a, ctx);
}

}  // namespace specdec::cuda
