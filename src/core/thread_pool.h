// A fixed pool of worker threads running one parallel loop at a time.
// Work is split into contiguous chunks by a static rule that depends only on (n, threads),
// so a kernel that keeps each output's arithmetic inside one chunk is deterministic.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace specdec {

class ThreadPool {
 public:
  // threads == 0 means one per hardware thread.
  explicit ThreadPool(size_t threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  size_t size() const { return workers_.size() + 1; }

  // Calls fn(begin, end) over [0, n) in at most size() chunks, each a multiple of `grain`
  // except the last; returns when all are done. The calling thread takes the first chunk.
  void parallel_for(size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn);

 private:
  void worker(size_t index);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  const std::function<void(size_t, size_t)>* job_ = nullptr;
  std::vector<std::pair<size_t, size_t>> chunks_;
  size_t generation_ = 0;
  size_t pending_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace specdec
