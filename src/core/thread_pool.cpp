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
  claimed_ = std::vector<std::atomic<size_t>>(threads);
  chunks_.resize(threads);
  workers_.reserve(threads - 1);
  try {
    for (size_t i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker(i); });
  } catch (...) {
    // Thread creation fails when the machine is out of threads or address space. No destructor
    // runs for a half-built pool, so the workers already started are stopped and joined here;
    // otherwise a joinable std::thread would be destroyed (terminate) or a worker left waiting.
    stop_and_join();
    throw;
  }
}

ThreadPool::~ThreadPool() { stop_and_join(); }

void ThreadPool::stop_and_join() {
  {
    std::lock_guard lock(mutex_);
    stop_.store(true);
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
  workers_.clear();
}

void ThreadPool::run_chunks(size_t generation, size_t parts, size_t first,
                            const std::function<void(size_t, size_t)>* fn) {
  for (size_t k = 0; k < parts; ++k) {
    const size_t i = (first + k) % parts;
    // Take chunk i for this generation unless someone already did (or a later job runs).
    size_t seen = claimed_[i].load(std::memory_order_acquire);
    bool mine = false;
    while (seen < generation &&
           !(mine = claimed_[i].compare_exchange_weak(seen, generation, std::memory_order_acq_rel))) {
    }
    if (!mine) continue;
    try {
      (*fn)(chunks_[i].first, chunks_[i].second);  // fn is alive: its job's chunk i was unclaimed
    } catch (...) {
      std::lock_guard lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
    // The error (if any) is recorded before the count drops: the caller sees it once it is 0.
    if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard lock(mutex_);
      done_cv_.notify_one();
    }
  }
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
  size_t generation = 0;
  {
    std::lock_guard lock(mutex_);
    for (size_t p = 0; p < parts; ++p)
      chunks_[p] = {std::min(n, units * p / parts * grain), std::min(n, units * (p + 1) / parts * grain)};
    parts_ = parts;
    job_ = &fn;
    error_ = nullptr;
    remaining_.store(parts, std::memory_order_relaxed);
    generation = generation_.fetch_add(1, std::memory_order_release) + 1;
  }
  start_cv_.notify_all();
  run_chunks(generation, parts, 0, &fn);  // chunk 0 first, then whatever no worker took yet
  spin_until([this] { return remaining_.load(std::memory_order_acquire) == 0; });
  std::unique_lock lock(mutex_);
  done_cv_.wait(lock, [this] { return remaining_.load(std::memory_order_acquire) == 0; });
  job_ = nullptr;
  if (error_) std::rethrow_exception(error_);
}

void ThreadPool::worker(size_t index) {
  size_t seen = 0;
  for (;;) {
    size_t parts = 0;
    const std::function<void(size_t, size_t)>* job;
    spin_until([&] { return stop_.load() || generation_.load(std::memory_order_acquire) != seen; });
    {
      std::unique_lock lock(mutex_);
      start_cv_.wait(lock, [&] { return stop_.load() || generation_.load(std::memory_order_acquire) != seen; });
      if (stop_.load()) return;
      seen = generation_.load(std::memory_order_acquire);
      if (index >= parts_ || job_ == nullptr) continue;  // no chunk of its own this time
      parts = parts_;
      job = job_;
    }
    // A worker that wakes after its job was finished by others claims nothing: every chunk of
    // that generation is taken, so `job` (possibly gone) is never called.
    run_chunks(seen, parts, index, job);
  }
}

}  // namespace specdec
