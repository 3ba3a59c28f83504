// ThreadPool: every index of a loop is run exactly once in grain-aligned chunks, whatever the
// pool size; an exception from any chunk reaches the caller and leaves the pool usable; many
// back-to-back small loops (where workers wake late and chunks are claimed by whoever is first)
// still run each chunk once.
#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <numeric>
#include <stdexcept>
#include <vector>

namespace specdec {
namespace {

TEST(ThreadPool, EveryIndexOnceInGrainAlignedChunks) {
  for (size_t threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    for (size_t n : {0, 1, 5, 64, 1000}) {
      for (size_t grain : {1, 16}) {
        std::vector<std::atomic<int>> hits(n);
        std::atomic<bool> misaligned{false};
        pool.parallel_for(n, grain, [&](size_t b, size_t e) {
          if (b % grain != 0 || (e % grain != 0 && e != n)) misaligned = true;
          for (size_t i = b; i < e; ++i) hits[i].fetch_add(1);
        });
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << threads << " threads, n " << n << ", i " << i;
        EXPECT_FALSE(misaligned.load()) << threads << " threads, n " << n << ", grain " << grain;
      }
    }
  }
}

TEST(ThreadPool, ExceptionsReachTheCallerAndThePoolStaysUsable) {
  ThreadPool pool(4);
  for (size_t bad : {size_t{0}, size_t{99}}) {  // the caller's chunk, then a worker's
    EXPECT_THROW(pool.parallel_for(100, 1,
                                   [&](size_t b, size_t e) {
                                     if (b <= bad && bad < e) throw std::runtime_error("chunk failed");
                                   }),
                 std::runtime_error);
    std::atomic<size_t> sum{0};
    pool.parallel_for(100, 1, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) sum += i;
    });
    EXPECT_EQ(sum.load(), 4950u);
  }
}

TEST(ThreadPool, ManyBackToBackLoopsRunEachChunkOnce) {
  ThreadPool pool(3);
  std::vector<size_t> data(96);
  std::iota(data.begin(), data.end(), 0);
  size_t total = 0;
  for (int round = 0; round < 20000; ++round) {
    std::atomic<size_t> sum{0};
    pool.parallel_for(data.size(), 8, [&](size_t b, size_t e) {
      size_t s = 0;
      for (size_t i = b; i < e; ++i) s += data[i];
      sum += s;
    });
    total += sum.load();
  }
  EXPECT_EQ(total, size_t{20000} * (95 * 96 / 2));
}

}  // namespace
}  // namespace specdec
