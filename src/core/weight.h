// Weight: the matrix of a linear layer, [N, K], as a backend reads it. Dense today (f32, bf16 or
// f16 elements); the type can also describe a block-quantized matrix (packed codes plus one scale
// per group of K), whose size is therefore not its element count times a dtype size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace specdec {

struct Weight {
  // The stored codes. Dense: the [N, K] matrix itself. Quantized: the packed codes, typed and
  // shaped as the format stores them (their bytes are the storage; they are not N × K elements).
  Tensor data;
  // The type of the matrix's elements: data.dtype when dense, the code type when quantized.
  DType dtype = DType::f32;
  // Quantized only: [N, K / group_size] scales, one per group of group_size consecutive columns.
  Tensor scales;
  int group_size = 0;  // 0: dense
  // Dense only, optional: the same matrix in a layout of the backend's own that its linear reads
  // faster (Backend::pack_weight; the CPU's is described at cpu::kPackRows), in memory the
  // backend's owner keeps. `data` stays the row-major matrix for everything else that reads it
  // (row gathers, a tied embedding), and a Weight without it is read from `data`.
  Tensor packed;

  Weight() = default;
  // A dense weight: the [N, K] tensor as it is.
  explicit Weight(const Tensor& dense) : data(dense), dtype(dense.dtype) {}

  bool empty() const { return data.empty(); }
  bool quantized() const { return group_size > 0; }
  Device device() const { return data.device; }
  // The logical shape [N, K], dense or quantized.
  int64_t rows() const { return quantized() ? scales.dim(0) : data.dim(0); }
  int64_t cols() const { return quantized() ? scales.dim(1) * group_size : data.dim(1); }
  // What the weight occupies in memory, and so what one pass over it reads: codes and scales.
  size_t bytes() const { return data.bytes() + scales.bytes(); }

  // The dense matrix, for kernels that read only dense weights. Throws naming `op` when the weight
  // is quantized, so a format a backend lacks fails clearly instead of reading codes as values.
  const Tensor& dense(const char* op) const;
  std::string shape_string() const;
};

}  // namespace specdec
