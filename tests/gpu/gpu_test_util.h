// Helpers of the CUDA backend tests: random host data (never zeros), upload to a backend,
// download, and the error measures the tests bound. Each test compares the CUDA backend with
// the scalar CPU backend, an independent implementation of the same contracts.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "backend/backend.h"

namespace specdec::gpu_test {

struct Backends {
  std::unique_ptr<Backend> cpu;
  std::unique_ptr<Backend> gpu;
};

inline Backends make_backends(bool batch_invariant = true) {
  BackendOptions c;
  c.device = Device::cpu;
  c.cpu_isa = "scalar";
  c.threads = 1;
  BackendOptions g;
  g.device = Device::cuda;
  g.batch_invariant = batch_invariant;
  return {make_backend(c), make_backend(g)};
}

// A CUDA backend with the given kernel switches.
inline std::unique_ptr<Backend> make_gpu(const CudaTuning& tuning = {}, bool batch_invariant = true) {
  BackendOptions o;
  o.device = Device::cuda;
  o.batch_invariant = batch_invariant;
  o.cuda = tuning;
  return make_backend(o);
}

#define SPECDEC_REQUIRE_GPU() \
  if (!::specdec::cuda_available()) GTEST_SKIP() << "no CUDA device"

// Values in ±[lo, hi]: random sign, magnitude away from zero so no product vanishes.
inline std::vector<float> random_floats(size_t n, uint32_t seed, float lo = 0.05f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mag(lo, hi);
  std::bernoulli_distribution sign(0.5);
  std::vector<float> v(n);
  for (auto& x : v) x = sign(rng) ? mag(rng) : -mag(rng);
  return v;
}

// Raw element bits of `values` in dtype (f32, bf16 or f16).
inline std::vector<uint8_t> encode(const std::vector<float>& values, DType dtype) {
  std::vector<uint8_t> out(values.size() * dtype_size(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::f32) {
      std::memcpy(out.data() + 4 * i, &values[i], 4);
    } else {
      const uint16_t h = dtype == DType::bf16 ? f32_to_bf16(values[i]) : f32_to_f16(values[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

// values rounded to dtype (to nearest even) and widened back: what a 16-bit conversion keeps.
inline std::vector<float> rounded(const std::vector<float>& values, DType dtype) {
  std::vector<float> out(values);
  if (dtype == DType::bf16) {
    for (auto& v : out) v = bf16_to_f32(f32_to_bf16(v));
  } else if (dtype == DType::f16) {
    for (auto& v : out) v = f16_to_f32(f32_to_f16(v));
  }
  return out;
}

// A CudaTuning switch as the backend reads it from the environment (any value but "0" turns it
// on), else `fallback`.
inline bool env_switch(const char* name, bool fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::strcmp(v, "0") != 0 : fallback;
}

// Whether the batch-invariant CUDA linear rounds x to the weights' type for this shape: 16-bit
// weights with K a multiple of 8 take cuBLASLt (CudaTuning::invariant_cublaslt,
// SPECDEC_CUDA_INVARIANT_LT; N a multiple of 8 too) or the tensor-core linear
// (CudaTuning::invariant_tensor_cores, SPECDEC_CUDA_INVARIANT_GEMM) (see cuda_backend.cpp).
inline bool invariant_rounds_x(DType wt, int64_t K, int64_t N) {
  const bool lt = env_switch("SPECDEC_CUDA_INVARIANT_LT", CudaTuning{}.invariant_cublaslt) && N % 8 == 0;
  const bool gemm = env_switch("SPECDEC_CUDA_INVARIANT_GEMM", CudaTuning{}.invariant_tensor_cores);
  return (lt || gemm) && wt != DType::f32 && K % 8 == 0;
}

// Whether the batch-invariant mode rounds gated_linear's gate and up products of 16-bit weights
// [N, K] to their type before the SwiGLU (CudaTuning::invariant_half_gate_up, on the shapes it runs
// on cuBLASLt), under the environment's switches.
inline bool invariant_rounds_gate_up(DType wt, int64_t K, int64_t N) {
  const CudaTuning d;
  return env_switch("SPECDEC_CUDA_INVARIANT_HALF_GATE_UP", d.invariant_half_gate_up) &&
         env_switch("SPECDEC_CUDA_INVARIANT_LT", d.invariant_cublaslt) &&
         !env_switch("SPECDEC_CUDA_INVARIANT_GEMM", d.invariant_tensor_cores) && wt != DType::f32 && K % 8 == 0 &&
         N % 8 == 0;
}

// A tensor owned together with its buffer.
struct Owned {
  Buffer buffer;
  Tensor tensor;
};

inline Owned upload_bytes(Backend& b, const void* data, DType dtype, std::initializer_list<int64_t> shape) {
  Tensor probe(nullptr, dtype, shape);
  Owned o{b.allocate(std::max<size_t>(probe.bytes(), 1)), {}};
  o.tensor = Tensor(o.buffer.data(), dtype, shape, b.device());
  Tensor host(const_cast<void*>(data), dtype, shape, Device::cpu);
  if (probe.bytes() > 0) b.copy(host, o.tensor);
  return o;
}

inline Owned upload(Backend& b, const std::vector<float>& values, DType dtype, std::initializer_list<int64_t> shape) {
  const auto bytes = encode(values, dtype);
  return upload_bytes(b, bytes.data(), dtype, shape);
}

inline Owned upload_i32(Backend& b, const std::vector<int32_t>& values, std::initializer_list<int64_t> shape) {
  return upload_bytes(b, values.data(), DType::i32, shape);
}

inline Owned empty(Backend& b, DType dtype, std::initializer_list<int64_t> shape) {
  Tensor probe(nullptr, dtype, shape);
  Owned o{b.allocate(std::max<size_t>(probe.bytes(), 1)), {}};
  o.tensor = Tensor(o.buffer.data(), dtype, shape, b.device());
  return o;
}

inline std::vector<float> download(Backend& b, const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  SPECDEC_CHECK(t.dtype == DType::f32, "download expects f32, got ", t.shape_string());
  Tensor host(out.data(), DType::f32, {t.numel()}, Device::cpu);
  b.copy(t.reshape({t.numel()}), host);
  b.synchronize();
  return out;
}

inline std::vector<int32_t> download_i32(Backend& b, const Tensor& t) {
  std::vector<int32_t> out(static_cast<size_t>(t.numel()));
  Tensor host(out.data(), DType::i32, {t.numel()}, Device::cpu);
  b.copy(t.reshape({t.numel()}), host);
  b.synchronize();
  return out;
}

// max |got - want| / max |want|: the error relative to the tensor's scale.
inline double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    diff = std::max(diff, std::abs(static_cast<double>(got[i]) - want[i]));
    scale = std::max(scale, std::abs(static_cast<double>(want[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

// Rows [first, first + M) of x (rows of K) through b.linear with the [N, K] weight w.
inline std::vector<float> linear_rows(Backend& b, const std::vector<float>& x, const Owned& w, int first, int M, int N,
                                      int K) {
  std::vector<float> xm(x.begin() + static_cast<size_t>(first) * K, x.begin() + static_cast<size_t>(first + M) * K);
  Owned xt = upload(b, xm, DType::f32, {M, K});
  Owned o = empty(b, DType::f32, {M, N});
  b.linear(xt.tensor, Weight(w.tensor), nullptr, o.tensor);
  return download(b, o.tensor);
}

// Bitwise equality of two f32 vectors (so -0 vs +0 or NaN payloads would count as different).
inline bool bit_equal(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

}  // namespace specdec::gpu_test
