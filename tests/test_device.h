// Which backend the model and engine tests run on: the CPU by default, the CUDA backend (in
// batch-invariant mode) when SPECDEC_TEST_DEVICE=cuda, so the same parity and identity tests
// run on the GPU host.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include "backend/backend.h"

namespace specdec::testing {

inline bool test_on_gpu() {
  const char* d = std::getenv("SPECDEC_TEST_DEVICE");
  return d != nullptr && std::string(d) == "cuda";
}

inline BackendOptions test_backend_options(const std::string& cpu_isa = "") {
  BackendOptions o;
  if (test_on_gpu()) {
    o.device = Device::cuda;
    o.batch_invariant = true;
    o.kv_dtype = DType::f32;  // parity with the f32 references; bf16 KV is measured by the benchmarks
  } else {
    o.cpu_isa = cpu_isa;
  }
  return o;
}

// The backend for parity against f32 references (transformers fixtures, CPU results): on the
// GPU the batch-invariant mode with f32 activations in every linear (the row-streaming kernels:
// CudaTuning::invariant_cublaslt off), so the tolerances below stay about f32 arithmetic. The
// engine's identity tests run the default kernels (test_backend_options), which round the
// activations to bf16 for the tensor cores; the GPU tests bound those against the CPU.
inline BackendOptions reference_backend_options(const std::string& cpu_isa = "") {
  // On the CPU the fastest exact kernels unless told otherwise: the default takes AMX, whose
  // activations are bf16, where the CPU has it.
  BackendOptions o = test_backend_options(cpu_isa.empty() ? "best" : cpu_isa);
  if (test_on_gpu()) o.cuda.invariant_cublaslt = false;
  return o;
}

// Logit tolerance against the f32 references: the GPU computes in f32 too (batch-invariant
// linear, f32 KV) but with other reduction orders and fast exp; allow one more digit there.
inline double logit_tolerance(double cpu) { return test_on_gpu() ? 10 * cpu : cpu; }

// Records a measured figure in the test output (and in the XML report) for the notes.
inline void report(const std::string& key, double value) {
  std::printf("[measure] %s = %.6g\n", key.c_str(), value);
}

}  // namespace specdec::testing
