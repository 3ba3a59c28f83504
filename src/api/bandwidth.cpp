// Bandwidth measurements: every host thread sums its slice of a large buffer, or the device
// copies a large buffer to another; the best of several repeats, so that a moment of other load
// does not lower the figure.
#include "api/bandwidth.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "core/thread_pool.h"

namespace specdec {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double host_read_bandwidth(size_t threads) {
  const size_t bytes = size_t(1) << 30;
  Buffer buf = Buffer::host(bytes);
  auto* words = static_cast<uint64_t*>(buf.data());
  const size_t n = bytes / sizeof(uint64_t);
  ThreadPool pool(threads);
  pool.parallel_for(n, 4096, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) words[i] = i * 0x9e3779b97f4a7c15ull;
  });
  double best = 0;
  std::vector<uint64_t> sinks(pool.size() * 8, 0);
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    pool.parallel_for(n, 4096, [&](size_t b, size_t e) {
      uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
      size_t i = b;
      for (; i + 4 <= e; i += 4) {
        a0 += words[i];
        a1 += words[i + 1];
        a2 += words[i + 2];
        a3 += words[i + 3];
      }
      for (; i < e; ++i) a0 += words[i];
      sinks[(b / 4096) % sinks.size()] += a0 ^ a1 ^ a2 ^ a3;
    });
    best = std::max(best, bytes / seconds_since(t0));
  }
  volatile uint64_t keep = 0;  // the sums must look used, or the reads could be dropped
  for (uint64_t v : sinks) keep = keep + v;
  return best;
}

// Bytes read plus bytes written per second.
double device_copy_bandwidth(Backend& backend) {
  const size_t bytes = size_t(1) << 30;
  Buffer host = Buffer::host(bytes);
  auto* words = static_cast<uint64_t*>(host.data());
  for (size_t i = 0; i < bytes / 8; ++i) words[i] = i * 0x9e3779b97f4a7c15ull;
  Buffer a = backend.allocate(bytes), b = backend.allocate(bytes);
  const Tensor ta = a.view(DType::i32, {static_cast<int64_t>(bytes / 4)});
  const Tensor tb = b.view(DType::i32, {static_cast<int64_t>(bytes / 4)});
  backend.copy(host.view(DType::i32, {static_cast<int64_t>(bytes / 4)}), ta);
  backend.copy(ta, tb);  // warm-up
  backend.synchronize();
  double best = 0;
  for (int rep = 0; rep < 10; ++rep) {
    const auto t0 = Clock::now();
    backend.copy(ta, tb);
    backend.synchronize();
    best = std::max(best, 2.0 * bytes / seconds_since(t0));
  }
  return best;
}

}  // namespace

MemoryBandwidth measure_memory_bandwidth(Backend& backend, size_t threads) {
  if (backend.device() == Device::cuda) return {device_copy_bandwidth(backend), "device-to-device copy, read + write"};
  return {host_read_bandwidth(threads), "host read"};
}

}  // namespace specdec
