// Helpers for the CPU backend tests: the instruction sets this CPU can run, seeded random
// tensors (never zeros), and owning host tensors.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "cpu_features.h"

namespace specdec::test {

// "scalar" always; "avx2" and "avx512" when this CPU has them.
inline std::vector<std::string> cpu_isas() {
  std::vector<std::string> isas{"scalar"};
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && specdec::test::cpu_has_f16c();
  if (avx2) isas.push_back("avx2");
  if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    isas.push_back("avx512");
  }
  return isas;
}

// Test-name suffix for a parameterised suite over cpu_isas().
inline std::string isa_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string name = info.param;
  for (char& c : name) c = c == '-' ? '_' : c;
  return name;
}

// cpu_isas() plus the "avx512-bf16" linear when this CPU has AVX-512 BF16, and the "amx" linear
// when it has AMX.
inline std::vector<std::string> cpu_linear_isas() {
  std::vector<std::string> isas = cpu_isas();
  if (isas.back() == "avx512" && __builtin_cpu_supports("avx512bf16")) isas.push_back("avx512-bf16");
  if (isas.back() == "avx512-bf16" && specdec::test::cpu_has_amx()) isas.push_back("amx");
  return isas;
}

// Whether linear on this instruction set rounds x to bf16 before multiplying bf16 weights.
inline bool rounds_activations(const std::string& isa) { return isa == "avx512-bf16" || isa == "amx"; }

inline std::unique_ptr<Backend> make_cpu(const std::string& isa, size_t threads) {
  BackendOptions o;
  o.device = Device::cpu;
  o.cpu_isa = isa;
  o.threads = threads;
  return make_backend(o);
}

// A host tensor that owns its storage.
struct HostTensor {
  Buffer buffer;
  Tensor t;
  HostTensor(DType dtype, std::initializer_list<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    buffer = Buffer::host(static_cast<size_t>(n) * dtype_size(dtype) + 1);
    t = Tensor(buffer.data(), dtype, shape);
  }
  float* f() const { return t.ptr<float>(); }
  int32_t* i() const { return t.ptr<int32_t>(); }
  int64_t numel() const { return t.numel(); }
};

// Uniform in ±[0.05, 1): random signs, never zero.
inline float nonzero(std::mt19937& rng) {
  std::uniform_real_distribution<float> mag(0.05f, 1.0f);
  const float v = mag(rng);
  return (rng() & 1u) ? v : -v;
}

inline HostTensor random_f32(std::mt19937& rng, std::initializer_list<int64_t> shape) {
  HostTensor h(DType::f32, shape);
  for (int64_t i = 0; i < h.numel(); ++i) h.f()[i] = nonzero(rng);
  return h;
}

// Random values of this dtype; the f32 values they stand for come back in `exact`.
inline HostTensor random_weights(std::mt19937& rng, DType dtype, std::initializer_list<int64_t> shape,
                                 std::vector<float>& exact) {
  HostTensor h(dtype, shape);
  exact.resize(static_cast<size_t>(h.numel()));
  for (int64_t i = 0; i < h.numel(); ++i) {
    const float v = nonzero(rng);
    float stored = v;
    if (dtype == DType::f32) {
      h.f()[i] = v;
    } else if (dtype == DType::bf16) {
      const uint16_t b = f32_to_bf16(v);
      h.t.ptr<uint16_t>()[i] = b;
      stored = bf16_to_f32(b);
    } else {
      const uint16_t b = f32_to_f16(v);
      h.t.ptr<uint16_t>()[i] = b;
      stored = f16_to_f32(b);
    }
    exact[static_cast<size_t>(i)] = stored;
  }
  return h;
}

inline bool same_bits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

}  // namespace specdec::test
