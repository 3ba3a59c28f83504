// Tensor: a non-owning, contiguous, row-major view of up to 4 dimensions in one device's memory.
// Buffer: the RAII owner of such memory, made by a Backend (or wrapping a host allocation).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>

#include "core/dtype.h"
#include "core/error.h"

namespace specdec {

enum class Device : uint8_t { cpu, cuda };

constexpr std::string_view device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device = Device::cpu;
  int rank = 0;
  std::array<int64_t, 4> dims{};

  Tensor() = default;
  Tensor(void* ptr, DType type, std::initializer_list<int64_t> shape, Device dev = Device::cpu);

  int64_t dim(int i) const { return dims[static_cast<size_t>(i < 0 ? rank + i : i)]; }
  int64_t numel() const;
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  bool empty() const { return data == nullptr; }

  // Same memory, new shape with the same number of elements.
  Tensor reshape(std::initializer_list<int64_t> shape) const;
  // Rows [begin, begin + count) of the first dimension.
  Tensor rows(int64_t begin, int64_t count) const;

  template <typename T>
  T* ptr() const { return static_cast<T*>(data); }

  std::string shape_string() const;
};

// Whether two views share any byte (an output that must not alias an input).
bool overlaps(const Tensor& a, const Tensor& b);

// Owns device or host memory; released through the deleter given by whoever allocated it.
class Buffer {
 public:
  Buffer() = default;
  Buffer(void* data, size_t bytes, Device device, std::function<void(void*)> release)
      : data_(data), bytes_(bytes), device_(device), release_(std::move(release)) {}
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& other) noexcept { swap(other); }
  Buffer& operator=(Buffer&& other) noexcept {
    Buffer(std::move(other)).swap(*this);
    return *this;
  }
  ~Buffer() {
    if (data_ && release_) release_(data_);
  }

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  // A view of the whole buffer (or its start) with this type and shape.
  Tensor view(DType dtype, std::initializer_list<int64_t> shape) const;

  // 64-byte aligned host memory.
  static Buffer host(size_t bytes);

 private:
  void swap(Buffer& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    std::swap(device_, o.device_);
    std::swap(release_, o.release_);
  }
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_ = Device::cpu;
  std::function<void(void*)> release_;
};

}  // namespace specdec
