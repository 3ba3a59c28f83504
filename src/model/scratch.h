// Carver: lays out consecutive regions of one scratch buffer, each 256-byte aligned (alignment
// for every kernel). With a null base it only measures, so the same layout code sizes a buffer
// and then hands out views into it.
#pragma once

#include <cstddef>
#include <initializer_list>

#include "core/error.h"
#include "core/tensor.h"

namespace specdec {

class Carver {
 public:
  Carver(void* base, size_t bytes, Device device) : base_(static_cast<char*>(base)), bytes_(bytes), device_(device) {}
  static Carver measure() { return Carver(nullptr, 0, Device::cpu); }
  static Carver of(const Buffer& b) { return Carver(b.data(), b.bytes(), b.device()); }

  Tensor take(DType dtype, std::initializer_list<int64_t> shape) {
    Tensor t(base_ ? base_ + offset_ : nullptr, dtype, shape, device_);
    advance(t.bytes());
    return t;
  }
  // The next `bytes` as a carver of their own (measuring when this one measures), for a region
  // whose layout another part owns.
  Carver region(size_t bytes) {
    Carver r(base_ ? base_ + offset_ : nullptr, bytes, device_);
    advance(bytes);
    return r;
  }
  size_t size() const { return offset_; }

 private:
  static size_t align_up(size_t bytes) { return (bytes + 255) / 256 * 256; }
  void advance(size_t bytes) {
    offset_ += align_up(bytes);
    SPECDEC_CHECK(!base_ || offset_ <= bytes_, "scratch layout of ", offset_, " bytes exceeds ", bytes_);
  }

  char* base_;
  size_t bytes_;
  Device device_;
  size_t offset_ = 0;
};

}  // namespace specdec
