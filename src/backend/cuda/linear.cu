// The row-streaming linear kernel: out[M, N] = x[M, K] · w[N, K]ᵀ with f32 accumulation.
// One warp owns R output columns (R rows of w) and a tile of up to MT rows of x; x is staged
// in shared memory by K tiles, w is streamed once per M tile with 16-byte loads. The reduction
// order of one output is fixed by K alone: lane l accumulates the 16-byte vectors l, l+32, ...
// in increasing order (fma per element, in element order), then the tail elements, then the
// warp butterfly. Neither M, MT nor the K tile size changes it, so the kernel is batch invariant.
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"

namespace specdec::cuda {
namespace {

constexpr int kWarps = 8;  // output columns per block
constexpr int kThreads = kWarps * 32;
constexpr int kSmemBudget = 32 * 1024;  // bytes of staged x per block

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

// acc[r][m] += w_r[k .. k+V) · x_m[k .. k+V), one fma per element in element order.
template <typename W, int MT, int R>
__device__ __forceinline__ void accumulate_vec(const uint4 (&raw)[R], const float* xs, int kc, int offset,
                                               float (&acc)[R][MT]) {
  constexpr int V = Vec16<W>::n;
  float wf[R][V];
#pragma unroll
  for (int r = 0; r < R; ++r) Vec16<W>::widen(raw[r], wf[r]);
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    const float4* xr = reinterpret_cast<const float4*>(xs + m * kc + offset);
#pragma unroll
    for (int q = 0; q < V / 4; ++q) {
      const float4 xv = xr[q];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        acc[r][m] = fmaf(wf[r][4 * q + 0], xv.x, acc[r][m]);
        acc[r][m] = fmaf(wf[r][4 * q + 1], xv.y, acc[r][m]);
        acc[r][m] = fmaf(wf[r][4 * q + 2], xv.z, acc[r][m]);
        acc[r][m] = fmaf(wf[r][4 * q + 3], xv.w, acc[r][m]);
      }
    }
  }
}

// One warp computes R consecutive output columns for MT rows of x. kVec: w rows are 16-byte
// aligned and read as vectors; otherwise element by element (V = 1). kVec is chosen by K and the
// weight's alignment; R and MT change which outputs a warp computes, not the order of any one.
template <typename W, int MT, int R, bool kVec>
__global__ void __launch_bounds__(kThreads) linear_rows_kernel(const float* __restrict__ x, const W* __restrict__ w,
                                                               const float* __restrict__ bias, float* __restrict__ out,
                                                               int M, int N, int K, int kc) {
  extern __shared__ float4 smem_raw[];
  float* xs = reinterpret_cast<float*>(smem_raw);  // [MT][kc]
  constexpr int V = kVec ? Vec16<W>::n : 1;
  constexpr int U = R >= 4 ? 1 : 4 / R;  // vectors per row loaded together: R * U loads in flight
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n0 = (blockIdx.x * kWarps + warp) * R;
  const int m0 = blockIdx.y * MT;
  const int mt = min(MT, M - m0);
  const int kvec_end = K / V * V;
  const bool x_vec = K % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  const W* wrow[R];
#pragma unroll
  for (int r = 0; r < R; ++r) wrow[r] = w + static_cast<int64_t>(min(n0 + r, N - 1)) * K;  // clamped: not stored

  float acc[R][MT];
#pragma unroll
  for (int r = 0; r < R; ++r)
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
    if (n0 >= N) continue;
    const int vend = min(k0 + klen, kvec_end);
    int k = k0 + lane * V;
    if constexpr (kVec) {
      for (; k + (U - 1) * 32 * V < vend; k += U * 32 * V) {
        uint4 raw[U][R];
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
          for (int r = 0; r < R; ++r) raw[u][r] = __ldg(reinterpret_cast<const uint4*>(wrow[r] + k + u * 32 * V));
#pragma unroll
        for (int u = 0; u < U; ++u) accumulate_vec<W, MT, R>(raw[u], xs, kc, k + u * 32 * V - k0, acc);
      }
      for (; k < vend; k += 32 * V) {  // the last vectors, one at a time (same per-lane order)
        uint4 raw[R];
#pragma unroll
        for (int r = 0; r < R; ++r) raw[r] = __ldg(reinterpret_cast<const uint4*>(wrow[r] + k));
        accumulate_vec<W, MT, R>(raw, xs, kc, k - k0, acc);
      }
      if (k0 + klen == K) {  // tail elements past the last whole vector (fewer than V < 32)
        const int kt = kvec_end + lane;
        if (kt < K) {
#pragma unroll
          for (int r = 0; r < R; ++r) {
            const float wv = to_float(wrow[r][kt]);
#pragma unroll
            for (int m = 0; m < MT; ++m) acc[r][m] = fmaf(wv, xs[m * kc + kt - k0], acc[r][m]);
          }
        }
      }
    } else {
      for (; k < vend; k += 32) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const float wv = to_float(wrow[r][k]);
#pragma unroll
          for (int m = 0; m < MT; ++m) acc[r][m] = fmaf(wv, xs[m * kc + k - k0], acc[r][m]);
        }
      }
    }
  }
  if (n0 >= N) return;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[r][m] = warp_sum(acc[r][m]);
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int n = n0 + r;
      if (n >= N) break;
      const float b = bias ? bias[n] : 0.0f;
      for (int m = 0; m < mt; ++m) out[static_cast<int64_t>(m0 + m) * N + n] = acc[r][m] + b;
    }
  }
}

template <typename W, int MT, int R, bool kVec>
void launch_shape(const float* x, const void* w, const float* bias, float* out, int M, int N, int K,
                  cudaStream_t stream) {
  // K tile: as much of K as fits the budget, a multiple of 256 (whole vectors for every lane).
  int kc = kSmemBudget / (MT * static_cast<int>(sizeof(float))) / 256 * 256;
  const int k_round = (K + 255) / 256 * 256;
  if (kc > k_round) kc = k_round;
  const int cols_per_block = kWarps * R;
  const dim3 grid((N + cols_per_block - 1) / cols_per_block, (M + MT - 1) / MT);
  const size_t smem = static_cast<size_t>(MT) * kc * sizeof(float);
  linear_rows_kernel<W, MT, R, kVec><<<grid, kThreads, smem, stream>>>(x, static_cast<const W*>(w), bias, out, M, N,
                                                                      K, kc);
}

template <typename W, int MT>
void launch_tile(const float* x, const void* w, const float* bias, float* out, int M, int N, int K,
                 cudaStream_t stream) {
  const bool vec = K % Vec16<W>::n == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0;
  if (!vec) return launch_shape<W, MT, 1, false>(x, w, bias, out, M, N, K, stream);
  // Columns per warp R: any R gives the same per-output order, so it is chosen for speed from
  // M and N. Few rows of x (bandwidth-bound): many blocks, so every SM holds an even share of
  // the weight stream. More rows: larger R, so each x value read from shared memory feeds R
  // weight rows.
  const int R = MT <= 2 ? (N >= 32768 ? 4 : (N >= 12288 ? 2 : 1)) : (N >= 8192 ? 4 : (N >= 2048 ? 2 : 1));
  if (R == 4) return launch_shape<W, MT, 4, true>(x, w, bias, out, M, N, K, stream);
  if (R == 2) return launch_shape<W, MT, 2, true>(x, w, bias, out, M, N, K, stream);
  launch_shape<W, MT, 1, true>(x, w, bias, out, M, N, K, stream);
}

template <typename W>
void launch_for_m(const float* x, const void* w, const float* bias, float* out, int M, int N, int K,
                  cudaStream_t stream) {
  if (M <= 1) {
    launch_tile<W, 1>(x, w, bias, out, M, N, K, stream);
  } else if (M <= 2) {
    launch_tile<W, 2>(x, w, bias, out, M, N, K, stream);
  } else if (M <= 4) {
    launch_tile<W, 4>(x, w, bias, out, M, N, K, stream);
  } else if (M <= 8) {
    launch_tile<W, 8>(x, w, bias, out, M, N, K, stream);
  } else {
    launch_tile<W, 16>(x, w, bias, out, M, N, K, stream);
  }
}

}  // namespace

void launch_linear_rows(const float* x, const void* w, ElemType w_type, const float* bias, float* out, int M, int N,
                        int K, cudaStream_t stream) {
  if (M == 0 || N == 0) return;
  SPECDEC_DISPATCH_ELEM(w_type, W, launch_for_m<W>(x, w, bias, out, M, N, K, stream));
}

}  // namespace specdec::cuda
