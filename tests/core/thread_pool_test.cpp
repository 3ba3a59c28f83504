// ThreadPool: every index of a loop is run exactly once in grain-aligned chunks, whatever the
// pool size; an exception from any chunk reaches the caller and leaves the pool usable; many
// back-to-back small loops (where workers wake late and chunks are claimed by whoever is first)
// still run each chunk once.
#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <system_error>
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

// Exits 0 when ThreadPool throws std::system_error, 2 when it does not, 3 without the limit.
[[noreturn, maybe_unused]] void create_pool_within_a_small_address_space() {
  size_t pages = 0;
  std::ifstream("/proc/self/statm") >> pages;
  const rlim_t room = pages * static_cast<rlim_t>(sysconf(_SC_PAGESIZE)) + (rlim_t{64} << 20);  // a few stacks
  const rlimit limit{room, room};
  if (setrlimit(RLIMIT_AS, &limit) != 0) _exit(3);
  try {
    ThreadPool pool(4000);
  } catch (const std::system_error&) {
    _exit(0);
  }
  _exit(2);
}

// A pool whose threads cannot all be created (here: an address space too small for their
// stacks) throws after joining the workers it started, instead of hanging or terminating.
TEST(ThreadPool, FailedThreadCreationThrowsInsteadOfHanging) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer reserves more address space than the limit allows";
#else
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(create_pool_within_a_small_address_space(), ::testing::ExitedWithCode(0), "");
#endif
}

}  // namespace
}  // namespace specdec
