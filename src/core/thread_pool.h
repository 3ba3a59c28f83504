// A fixed pool of worker threads running one parallel loop at a time.
// Work is split into contiguous chunks by a static rule that depends only on (n, threads),
// so a kernel that keeps each output's arithmetic inside one chunk is deterministic. Which
// thread runs a chunk is not fixed: each chunk is claimed once, by its own worker or by any
// thread that finished its own first, so a worker the OS has switched out does not hold up the
// loop. Idle workers spin for ~100 µs before they sleep, so back-to-back kernels do not pay a
// wake-up.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace specdec {

class ThreadPool {
 public:
  // threads == 0 means one per hardware thread. Throws std::system_error when the threads
  // cannot be created (after joining those that were).
  explicit ThreadPool(size_t threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  size_t size() const { return workers_.size() + 1; }

  // Calls fn(begin, end) over [0, n) in at most size() chunks, each a multiple of `grain`
  // except the last; returns when all are done. The calling thread takes the first chunk, then
  // any chunk no worker has claimed yet.
  void parallel_for(size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn);

 private:
  void worker(size_t index);
  void stop_and_join();  // wakes every worker with stop_ set and joins it
  // Claims and runs the unclaimed chunks [0, parts) of job `generation`, starting at `first`.
  void run_chunks(size_t generation, size_t parts, size_t first, const std::function<void(size_t, size_t)>* fn);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  const std::function<void(size_t, size_t)>* job_ = nullptr;
  // One slot per thread, written under mutex_ when a job starts; chunk i is read only by the
  // thread that claimed it for the current job, which cannot end before that chunk does.
  std::vector<std::pair<size_t, size_t>> chunks_;
  size_t parts_ = 0;
  // Workers spin briefly on generation_ before sleeping: kernels of a decode step are tens of
  // microseconds apart, and waking a sleeping thread costs about as much as the work itself.
  std::atomic<size_t> generation_{0};
  // claimed_[i]: the last generation whose chunk i some thread took (a chunk is taken by moving
  // this up to the job's generation, once); remaining_: chunks of the current job not finished.
  std::vector<std::atomic<size_t>> claimed_;
  std::atomic<size_t> remaining_{0};
  std::atomic<bool> stop_{false};
  std::exception_ptr error_;
};

}  // namespace specdec
