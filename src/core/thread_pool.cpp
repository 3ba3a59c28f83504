// ThreadPool: workers wait for a generation counter to move, run their chunk, report back.
#include "core/thread_pool.h"

#include <algorithm>
#include <chrono>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace specdec {

namespace {
constexpr auto kSpin = std::chrono::microseconds(100);

inline void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

// Spins until pred() holds or kSpin passes; returns pred().
template <typename Pred>
bool spin_until(Pred pred) {
  const auto until = std::chrono::steady_clock::now() + kSpin;
  for (int i = 0;; ++i) {
    if (pred()) return true;
    cpu_relax();
    if ((i & 63) == 63 && std::chrono::steady_clock::now() > until) return pred();
  }
}
}  // namespace

ThreadPool::ThreadPool(size_t threads) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  for (size_t i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_.store(true);
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::parallel_for(size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn) {
  if (n == 0) return;
  grain = std::max<size_t>(grain, 1);
  const size_t units = (n + grain - 1) / grain;
  const size_t parts = std::min(units, size());
  if (parts <= 1) {
    fn(0, n);
    return;
  }
  std::vector<std::pair<size_t, size_t>> chunks(size(), {0, 0});
  for (size_t p = 0; p < parts; ++p) {
    const size_t b = std::min(n, units * p / parts * grain);
    const size_t e = std::min(n, units * (p + 1) / parts * grain);
    chunks[p] = {b, e};
  }
  {
    std::lock_guard lock(mutex_);
    chunks_ = std::move(chunks);
    job_ = &fn;
    pending_.store(workers_.size(), std::memory_order_relaxed);
    error_ = nullptr;
    generation_.fetch_add(1, std::memory_order_release);
  }
  start_cv_.notify_all();
  std::exception_ptr mine;
  try {
    if (chunks_[0].first < chunks_[0].second) fn(chunks_[0].first, chunks_[0].second);
  } catch (...) {
    mine = std::current_exception();
  }
  spin_until([this] { return pending_.load(std::memory_order_acquire) == 0; });
  std::unique_lock lock(mutex_);
  done_cv_.wait(lock, [this] { return pending_.load(std::memory_order_acquire) == 0; });
  job_ = nullptr;
  if (mine) std::rethrow_exception(mine);
  if (error_) std::rethrow_exception(error_);
}

void ThreadPool::worker(size_t index) {
  size_t seen = 0;
  for (;;) {
    std::pair<size_t, size_t> chunk;
    const std::function<void(size_t, size_t)>* job;
    spin_until([&] { return stop_.load() || generation_.load(std::memory_order_acquire) != seen; });
    {
      std::unique_lock lock(mutex_);
      start_cv_.wait(lock, [&] { return stop_.load() || generation_.load(std::memory_order_acquire) != seen; });
      if (stop_.load()) return;
      seen = generation_.load(std::memory_order_acquire);
      chunk = chunks_[index];
      job = job_;
    }
    std::exception_ptr err;
    if (chunk.first < chunk.second) {
      try {
        (*job)(chunk.first, chunk.second);
      } catch (...) {
        err = std::current_exception();
      }
    }
    std::lock_guard lock(mutex_);
    if (err && !error_) error_ = err;
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) done_cv_.notify_one();
  }
}

}  // namespace specdec
