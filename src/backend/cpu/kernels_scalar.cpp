// Portable linear (no instruction-set extensions): the reference path of the CPU backend and
// the fallback on CPUs without AVX2. Each dot product keeps 16 partial sums (lane l takes the
// k ≡ l mod 16 terms) and folds them with a fixed tree, so the compiler may vectorise the lanes
// without changing any result.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_kernels.h"

namespace specdec::cpu {
namespace {

constexpr int kLanes = 16;
constexpr int64_t kRowsPerBlock = 8;  // weight rows widened to f32 at once, reused by every x row

float dot_lanes(const float* a, const float* b, int64_t n) {
  float acc[kLanes] = {};
  int64_t k = 0;
  for (; k + kLanes <= n; k += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const float p = a[k + l] * b[k + l];
      acc[l] = acc[l] + p;
    }
  }
  for (int l = 0; k + l < n; ++l) {
    const float p = a[k + l] * b[k + l];
    acc[l] = acc[l] + p;
  }
  for (int width = kLanes / 2; width >= 1; width /= 2) {
    for (int l = 0; l < width; ++l) acc[l] = acc[l] + acc[l + width];
  }
  return acc[0];
}

void widen_row(const void* w, DType dtype, int64_t row, int64_t K, float* dst) {
  switch (dtype) {
    case DType::f32:
      std::memcpy(dst, static_cast<const float*>(w) + row * K, static_cast<size_t>(K) * sizeof(float));
      return;
    case DType::bf16: {
      const uint16_t* src = static_cast<const uint16_t*>(w) + row * K;
      for (int64_t k = 0; k < K; ++k) dst[k] = bf16_to_f32(src[k]);
      return;
    }
    case DType::f16: {
      const uint16_t* src = static_cast<const uint16_t*>(w) + row * K;
      for (int64_t k = 0; k < K; ++k) dst[k] = f16_to_f32(src[k]);
      return;
    }
    case DType::i32:
      break;
  }
}

void linear_scalar(const LinearArgs& a, int64_t n_begin, int64_t n_end) {
  std::vector<float> wbuf(static_cast<size_t>(kRowsPerBlock * a.K));
  for (int64_t n0 = n_begin; n0 < n_end; n0 += kRowsPerBlock) {
    const int64_t nb = std::min(kRowsPerBlock, n_end - n0);
    for (int64_t j = 0; j < nb; ++j) widen_row(a.w, a.wdtype, n0 + j, a.K, wbuf.data() + j * a.K);
    for (int64_t m = 0; m < a.M; ++m) {
      const float* x = a.x + m * a.K;
      float* out = a.out + m * a.N + n0;
      for (int64_t j = 0; j < nb; ++j) {
        float v = dot_lanes(x, wbuf.data() + j * a.K, a.K);
        if (a.bias) v = v + a.bias[n0 + j];
        out[j] = v;
      }
    }
  }
}

}  // namespace

// The scalar and AVX2 tables' Kernels::silu_mul, which silu_mul and the fused gated_linear share,
// so both round every output identically.
void silu_mul_scalar(const float* g, const float* u, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

double sum_exp_scalar(const float* x, int64_t n, float shift) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(x[i] - shift);
  return sum;
}

const Kernels& scalar_kernels() {
  static const Kernels k{"scalar", linear_scalar, attend_scalar, silu_mul_scalar, sum_exp_scalar};
  return k;
}

}  // namespace specdec::cpu
