// The per-instruction-set kernel table of the CPU backend: one implementation per ISA (scalar,
// AVX2+FMA, AVX-512), chosen once at backend creation. Only the hot loops live behind this table;
// validation, threading and the cheap element-wise kernels are shared (cpu_backend.cpp).
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace specdec::cpu {

// out[m, n] = x[m, :] · w[n, :] (+ bias[n]) for one call of linear. Row-major, unpadded.
struct LinearArgs {
  const float* x = nullptr;  // [M, K]
  const void* w = nullptr;   // [N, K] of wdtype (f32, bf16 or f16)
  DType wdtype = DType::f32;
  const float* bias = nullptr;  // [N] or null
  float* out = nullptr;         // [M, N]
  const uint16_t* x_bf16 = nullptr;  // x rounded to bf16 [M, K], for kernels that ask for it
  int64_t M = 0;
  int64_t N = 0;
  int64_t K = 0;
};

// Invariant every implementation keeps: out[m, n] is a pure function of (x[m, :], w[n, :],
// bias[n], K). The sequence of floating-point operations for one output (lane assignment over K,
// tail handling, reduction tree) does not depend on M, on m's place in a register tile, or on
// the [n_begin, n_end) split, so results are batch- and thread-count-invariant.
using LinearFn = void (*)(const LinearArgs& args, int64_t n_begin, int64_t n_end);
// Fixed-order dot product of two f32 vectors of length n.
using DotFn = float (*)(const float* a, const float* b, int64_t n);
// y[i] += a * x[i], element by element (no reduction: order-free).
using AxpyFn = void (*)(float a, const float* x, float* y, int64_t n);

struct Kernels {
  const char* isa;  // "scalar", "avx2", "avx512", "avx512-bf16"
  LinearFn linear;
  DotFn dot;
  AxpyFn axpy;
  // linear wants LinearArgs::x_bf16 filled when the weights are bf16.
  bool bf16_activations = false;
};

// Instruction-set kernel files must not instantiate std templates or other inline functions
// with out-of-line bodies: the linker keeps one copy of each, possibly the AVX-512 one, and
// would hand it to the portable path.

const Kernels& scalar_kernels();
const Kernels& avx2_kernels();
const Kernels& avx512_kernels();
// AVX-512 with bf16 dot products (_mm512_dpbf16_ps) for bf16 weights: activations are rounded to
// bf16, so results differ from the f32 reference. Opt-in only.
const Kernels& avx512_bf16_kernels();

}  // namespace specdec::cpu
