// Tensor views and host buffers.
#include "core/tensor.h"

#include <sys/mman.h>

#include <cstdlib>
#include <sstream>

namespace specdec {

Tensor::Tensor(void* ptr, DType type, std::initializer_list<int64_t> shape, Device dev)
    : data(ptr), dtype(type), device(dev), rank(static_cast<int>(shape.size())) {
  SPECDEC_CHECK(shape.size() <= dims.size(), "tensor rank ", shape.size(), " exceeds 4");
  size_t i = 0;
  for (int64_t d : shape) dims[i++] = d;
}

bool overlaps(const Tensor& a, const Tensor& b) {
  const char* a0 = static_cast<const char*>(a.data);
  const char* b0 = static_cast<const char*>(b.data);
  return a0 < b0 + b.bytes() && b0 < a0 + a.bytes();
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= dims[static_cast<size_t>(i)];
  return rank == 0 ? 0 : n;
}

Tensor Tensor::reshape(std::initializer_list<int64_t> shape) const {
  Tensor t(data, dtype, shape, device);
  SPECDEC_CHECK(t.numel() == numel(), "cannot reshape ", shape_string(), " to ", t.shape_string());
  return t;
}

Tensor Tensor::rows(int64_t begin, int64_t count) const {
  SPECDEC_CHECK(rank >= 1 && begin >= 0 && count >= 0 && begin + count <= dims[0], "rows [", begin, ", ", begin + count,
                ") outside ", shape_string());
  Tensor t = *this;
  const int64_t row_elems = dims[0] == 0 ? 0 : numel() / dims[0];
  t.data = static_cast<char*>(data) + static_cast<size_t>(begin * row_elems) * dtype_size(dtype);
  t.dims[0] = count;
  return t;
}

std::string Tensor::shape_string() const {
  std::ostringstream out;
  out << dtype_name(dtype) << '[';
  for (int i = 0; i < rank; ++i) out << (i ? ", " : "") << dims[static_cast<size_t>(i)];
  out << ']';
  return out.str();
}

Tensor Buffer::view(DType dtype, std::initializer_list<int64_t> shape) const {
  Tensor t(data_, dtype, shape, device_);
  SPECDEC_CHECK(t.bytes() <= bytes_, "view ", t.shape_string(), " exceeds buffer of ", bytes_, " bytes");
  return t;
}

Buffer Buffer::host(size_t bytes) {
  // Large buffers (KV pools, activations) start at a 2 MiB boundary and ask for transparent huge
  // pages, so that their first touches fault a 2 MiB page at a time instead of 512 small ones: a
  // fresh engine's first prefill is what first touches its KV pool and scratch.
  constexpr size_t kHuge = size_t{2} << 20;
  const bool large = bytes >= kHuge;
  const size_t align = large ? kHuge : 64;
  const size_t rounded = (bytes + align - 1) / align * align;
  void* p = rounded ? std::aligned_alloc(align, rounded) : nullptr;
  SPECDEC_CHECK(p || rounded == 0, "out of host memory allocating ", bytes, " bytes");
#ifdef MADV_HUGEPAGE
  if (large) madvise(p, rounded, MADV_HUGEPAGE);  // a hint: refused or unsupported changes nothing
#endif
  return Buffer(p, bytes, Device::cpu, [](void* q) { std::free(q); });
}

}  // namespace specdec
