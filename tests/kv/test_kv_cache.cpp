// KvCache block accounting: reservation, failure without side effects, rollback and release,
// and the invariant that every block is either free or owned by exactly one sequence.
#include "kv/kv_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "backend/backend.h"

namespace specdec {
namespace {

class KvCacheTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> backend = make_backend(BackendOptions{});
};

// Every block id in [0, total) is free or owned by exactly one live sequence; tables fit lengths.
void expect_consistent(const KvCache& cache, const std::vector<KvCache::SeqId>& live) {
  std::multiset<int32_t> owned;
  for (KvCache::SeqId s : live) {
    const auto& table = cache.block_table(s);
    owned.insert(table.begin(), table.end());
    EXPECT_LE(cache.length(s), static_cast<int>(table.size()) * cache.block_size());
    EXPECT_EQ(cache.capacity(s), static_cast<int>(table.size()) * cache.block_size());
  }
  EXPECT_EQ(static_cast<int>(owned.size()) + cache.free_blocks(), cache.total_blocks());
  std::set<int32_t> unique(owned.begin(), owned.end());
  EXPECT_EQ(unique.size(), owned.size()) << "a block is owned by two sequences";
  for (int32_t b : unique) {
    EXPECT_GE(b, 0);
    EXPECT_LT(b, cache.total_blocks());
  }
}

TEST_F(KvCacheTest, PoolsHaveTheDocumentedShape) {
  KvCache cache(*backend, 3, 2, 8, 10);
  EXPECT_EQ(cache.total_blocks(), 10);
  EXPECT_EQ(cache.free_blocks(), 10);
  EXPECT_EQ(cache.block_size(), 16);
  for (int layer = 0; layer < 3; ++layer) {
    for (const Tensor* pool : {&cache.k_pool(layer), &cache.v_pool(layer)}) {
      EXPECT_EQ(pool->rank, 4);
      EXPECT_EQ(pool->dim(0), 10);
      EXPECT_EQ(pool->dim(1), 16);
      EXPECT_EQ(pool->dim(2), 2);
      EXPECT_EQ(pool->dim(3), 8);
      EXPECT_EQ(pool->dtype, backend->kv_dtype());
    }
  }
  EXPECT_NE(cache.k_pool(0).data, cache.v_pool(0).data);
  EXPECT_NE(cache.k_pool(0).data, cache.k_pool(1).data);
  EXPECT_THROW(cache.k_pool(3), Error);
  EXPECT_THROW(cache.v_pool(-1), Error);
}

TEST_F(KvCacheTest, BlocksForMemoryCountsKAndVOfEveryLayer) {
  // One block: 2 (K, V) * 4 layers * 16 positions * 2 heads * 8 dims * 4 bytes = 8192 bytes.
  EXPECT_EQ(KvCache::blocks_for_memory(8192 * 5, 4, 2, 8, DType::f32), 5);
  EXPECT_EQ(KvCache::blocks_for_memory(8192 * 5 - 1, 4, 2, 8, DType::f32), 4);
  EXPECT_EQ(KvCache::blocks_for_memory(8192 * 5, 4, 2, 8, DType::bf16), 10);
  EXPECT_EQ(KvCache::blocks_for_memory(100, 4, 2, 8, DType::f32), 0);
  EXPECT_EQ(KvCache::blocks_for_memory(8192, 4, 2, 8, DType::f32, 8), 2);
}

TEST_F(KvCacheTest, ReserveAllocatesWholeBlocksOnDemand) {
  KvCache cache(*backend, 1, 1, 4, 8);
  const auto s = cache.create();
  EXPECT_EQ(cache.length(s), 0);
  EXPECT_TRUE(cache.block_table(s).empty());
  EXPECT_EQ(cache.blocks_needed(s, 0), 0);
  EXPECT_EQ(cache.blocks_needed(s, 1), 1);
  EXPECT_EQ(cache.blocks_needed(s, 16), 1);
  EXPECT_EQ(cache.blocks_needed(s, 17), 2);
  ASSERT_TRUE(cache.reserve(s, 1));
  EXPECT_EQ(cache.block_table(s).size(), 1u);
  EXPECT_EQ(cache.free_blocks(), 7);
  ASSERT_TRUE(cache.reserve(s, 16));  // already covered
  EXPECT_EQ(cache.free_blocks(), 7);
  EXPECT_EQ(cache.blocks_needed(s, 33), 2);
  ASSERT_TRUE(cache.reserve(s, 33));
  EXPECT_EQ(cache.block_table(s).size(), 3u);
  EXPECT_EQ(cache.capacity(s), 48);
  EXPECT_EQ(cache.length(s), 0);  // reserving does not write
  cache.set_length(s, 48);
  EXPECT_EQ(cache.length(s), 48);
  EXPECT_THROW(cache.set_length(s, 49), Error);
  EXPECT_EQ(cache.length(s), 48);
  expect_consistent(cache, {s});
}

TEST_F(KvCacheTest, FailedReserveChangesNothing) {
  KvCache cache(*backend, 2, 1, 4, 4);
  const auto a = cache.create();
  const auto b = cache.create();
  ASSERT_TRUE(cache.reserve(a, 40));  // 3 blocks
  cache.set_length(a, 40);
  ASSERT_TRUE(cache.reserve(b, 5));  // 1 block: pool now empty
  const std::vector<int32_t> table_b = cache.block_table(b);
  EXPECT_EQ(cache.free_blocks(), 0);
  EXPECT_EQ(cache.blocks_needed(b, 17), 1);
  EXPECT_FALSE(cache.reserve(b, 17));
  EXPECT_EQ(cache.block_table(b), table_b);
  EXPECT_EQ(cache.free_blocks(), 0);

  const auto c = cache.create();
  cache.truncate(a, 16);  // frees 2 blocks
  EXPECT_EQ(cache.free_blocks(), 2);
  EXPECT_FALSE(cache.reserve(c, 48));  // needs 3
  EXPECT_TRUE(cache.block_table(c).empty());
  EXPECT_EQ(cache.free_blocks(), 2);
  EXPECT_TRUE(cache.reserve(c, 32));
  EXPECT_EQ(cache.free_blocks(), 0);
  expect_consistent(cache, {a, b, c});
}

TEST_F(KvCacheTest, TruncateFreesWholeBlocksPastTheLength) {
  KvCache cache(*backend, 1, 1, 4, 6);
  const auto s = cache.create();
  ASSERT_TRUE(cache.reserve(s, 40));
  cache.set_length(s, 40);
  const std::vector<int32_t> table = cache.block_table(s);
  ASSERT_EQ(table.size(), 3u);
  cache.truncate(s, 33);  // still needs block 2
  EXPECT_EQ(cache.block_table(s).size(), 3u);
  EXPECT_EQ(cache.length(s), 33);
  cache.truncate(s, 32);
  EXPECT_EQ(cache.block_table(s), std::vector<int32_t>(table.begin(), table.begin() + 2));
  EXPECT_EQ(cache.free_blocks(), 4);
  cache.truncate(s, 17);
  EXPECT_EQ(cache.block_table(s).size(), 2u);
  cache.truncate(s, 16);
  EXPECT_EQ(cache.block_table(s).size(), 1u);
  EXPECT_EQ(cache.block_table(s)[0], table[0]);  // the kept prefix is the same blocks
  cache.truncate(s, 0);
  EXPECT_TRUE(cache.block_table(s).empty());
  EXPECT_EQ(cache.free_blocks(), 6);
  EXPECT_THROW(cache.truncate(s, 1), Error);  // beyond the length
  EXPECT_THROW(cache.truncate(s, -1), Error);
  expect_consistent(cache, {s});
}

TEST_F(KvCacheTest, ReleaseReturnsBlocksAndForgetsTheSequence) {
  KvCache cache(*backend, 1, 1, 4, 5);
  const auto a = cache.create();
  const auto b = cache.create();
  EXPECT_NE(a, b);
  ASSERT_TRUE(cache.reserve(a, 50));
  ASSERT_TRUE(cache.reserve(b, 10));
  EXPECT_EQ(cache.free_blocks(), 0);
  cache.release(a);
  EXPECT_EQ(cache.free_blocks(), 4);
  EXPECT_FALSE(cache.contains(a));
  EXPECT_THROW(cache.length(a), Error);
  EXPECT_THROW(cache.block_table(a), Error);
  EXPECT_THROW(cache.reserve(a, 1), Error);
  EXPECT_THROW(cache.release(a), Error);
  const auto c = cache.create();
  EXPECT_NE(c, b);
  EXPECT_TRUE(cache.reserve(c, 64));
  expect_consistent(cache, {b, c});
  cache.release(b);
  cache.release(c);
  EXPECT_EQ(cache.free_blocks(), 5);
  EXPECT_EQ(cache.sequence_count(), 0u);
}

TEST_F(KvCacheTest, RandomOperationsKeepEveryBlockAccountedFor) {
  KvCache cache(*backend, 1, 1, 4, 20);
  std::mt19937 rng(7);
  std::vector<KvCache::SeqId> live;
  std::map<KvCache::SeqId, int> expected_len;
  for (int step = 0; step < 2000; ++step) {
    const int op = static_cast<int>(rng() % 5);
    if (op == 0 || live.empty()) {
      live.push_back(cache.create());
      expected_len[live.back()] = 0;
    } else {
      const size_t i = rng() % live.size();
      const auto s = live[i];
      if (op == 1) {
        const int want = cache.length(s) + static_cast<int>(rng() % 40);
        const int free_before = cache.free_blocks();
        const int need = cache.blocks_needed(s, want);
        const bool ok = cache.reserve(s, want);
        EXPECT_EQ(ok, need <= free_before);
        EXPECT_EQ(cache.free_blocks(), ok ? free_before - need : free_before);
        if (ok) {
          cache.set_length(s, want);
          expected_len[s] = want;
        }
      } else if (op == 2) {
        const int len = expected_len[s] == 0 ? 0 : static_cast<int>(rng() % static_cast<unsigned>(expected_len[s] + 1));
        cache.truncate(s, len);
        expected_len[s] = len;
        EXPECT_EQ(cache.block_table(s).size(), static_cast<size_t>((len + 15) / 16));
      } else if (op == 3) {
        cache.release(s);
        expected_len.erase(s);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      }
    }
    for (auto [s, len] : expected_len) ASSERT_EQ(cache.length(s), len);
    expect_consistent(cache, live);
  }
}

TEST_F(KvCacheTest, RejectsBadGeometry) {
  EXPECT_THROW(KvCache(*backend, 0, 1, 4, 4), Error);
  EXPECT_THROW(KvCache(*backend, 1, 1, 4, -1), Error);
  EXPECT_THROW(KvCache(*backend, 1, 1, 4, 4, 0), Error);
  KvCache empty(*backend, 1, 1, 4, 0);
  const auto s = empty.create();
  EXPECT_TRUE(empty.reserve(s, 0));
  EXPECT_FALSE(empty.reserve(s, 1));
}

}  // namespace
}  // namespace specdec
