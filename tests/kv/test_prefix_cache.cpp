// The prefix cache: full blocks registered under their prefix are shared by a later sequence
// whose tokens begin the same way (reference counted, never rewritten), survive their last
// holder until the space is needed (least recently released first), and are only matched when
// every token of the prefix is equal.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "kv/kv_cache.h"

namespace specdec {
namespace {

class PrefixCacheTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> backend = make_backend(BackendOptions{});
};

std::vector<int32_t> tokens(int n, int32_t first = 1) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

// A sequence holding `toks` (written and registered).
KvCache::SeqId filled(KvCache& cache, const std::vector<int32_t>& toks) {
  const KvCache::SeqId s = cache.create();
  EXPECT_TRUE(cache.reserve(s, static_cast<int>(toks.size())));
  cache.set_length(s, static_cast<int>(toks.size()));
  cache.cache_full_blocks(s, toks);
  return s;
}

TEST_F(PrefixCacheTest, ASecondSequenceSharesTheFullBlocksOfACommonPrefix) {
  KvCache cache(*backend, 1, 1, 4, 10);
  const auto a_tokens = tokens(40);  // 2 full blocks + 8
  const KvCache::SeqId a = filled(cache, a_tokens);
  EXPECT_EQ(cache.free_blocks(), 7);

  auto b_tokens = tokens(40);
  b_tokens[35] = 999;  // differs in the third (partial) block only
  const KvCache::SeqId b = cache.create();
  EXPECT_EQ(cache.share_prefix(b, b_tokens), 32);
  EXPECT_EQ(cache.length(b), 32);
  const auto& ta = cache.block_table(a);
  const auto& tb = cache.block_table(b);
  ASSERT_EQ(tb.size(), 2u);
  EXPECT_EQ(tb[0], ta[0]);
  EXPECT_EQ(tb[1], ta[1]);
  EXPECT_EQ(cache.free_blocks(), 7);  // nothing new taken
  EXPECT_EQ(cache.prefix_hit_tokens(), 32);
  // b writes past its shared blocks into its own.
  ASSERT_TRUE(cache.reserve(b, 40));
  EXPECT_NE(cache.block_table(b)[2], ta[2]);
  // Rolling back into the shared prefix is refused: it would rewrite K/V another sequence reads.
  cache.set_length(b, 40);
  cache.cache_full_blocks(b, b_tokens);
  EXPECT_THROW(cache.truncate(b, 20), Error);
  EXPECT_NO_THROW(cache.truncate(b, 33));
}

TEST_F(PrefixCacheTest, AMismatchInAnEarlierBlockSharesNothingAfterIt) {
  KvCache cache(*backend, 1, 1, 4, 10);
  filled(cache, tokens(48));
  auto other = tokens(48);
  other[3] = 777;  // first block differs: the second block's hash chain differs too
  const KvCache::SeqId s = cache.create();
  EXPECT_EQ(cache.share_prefix(s, other), 0);
  EXPECT_TRUE(cache.block_table(s).empty());
}

TEST_F(PrefixCacheTest, ReleasedBlocksStayFindableUntilTheSpaceIsNeeded) {
  KvCache cache(*backend, 1, 1, 4, 4);
  const auto first = tokens(32);
  cache.release(filled(cache, first));
  EXPECT_EQ(cache.free_blocks(), 4);  // cached blocks nobody holds count as free
  const KvCache::SeqId again = cache.create();
  EXPECT_EQ(cache.share_prefix(again, first), 32);
  cache.release(again);
  // Another sequence needs all four blocks: the cached ones are evicted, oldest first.
  const KvCache::SeqId big = cache.create();
  ASSERT_TRUE(cache.reserve(big, 64));
  cache.set_length(big, 64);
  cache.release(big);
  const KvCache::SeqId late = cache.create();
  EXPECT_EQ(cache.share_prefix(late, first), 0);
}

TEST_F(PrefixCacheTest, EvictionTakesTheLeastRecentlyReleasedFirst) {
  KvCache cache(*backend, 1, 1, 4, 3);
  const auto a = tokens(16, 100), b = tokens(16, 200);
  cache.release(filled(cache, a));  // released first
  cache.release(filled(cache, b));
  // One new block: the free block goes first, then the oldest cached one (a's).
  const KvCache::SeqId s = cache.create();
  ASSERT_TRUE(cache.reserve(s, 32));
  const KvCache::SeqId probe_a = cache.create(), probe_b = cache.create();
  EXPECT_EQ(cache.share_prefix(probe_a, a), 0);
  EXPECT_EQ(cache.share_prefix(probe_b, b), 16);
}

TEST_F(PrefixCacheTest, SharedBlocksReturnOnlyWithTheirLastHolder) {
  KvCache cache(*backend, 1, 1, 4, 6);
  const auto t = tokens(32);
  const KvCache::SeqId a = filled(cache, t);
  std::vector<KvCache::SeqId> sharers;
  for (int i = 0; i < 3; ++i) {
    sharers.push_back(cache.create());
    EXPECT_EQ(cache.share_prefix(sharers.back(), t), 32);
  }
  cache.release(a);
  for (KvCache::SeqId s : sharers) {
    EXPECT_EQ(cache.free_blocks(), 4);
    cache.release(s);
  }
  EXPECT_EQ(cache.free_blocks(), 6);
}

TEST_F(PrefixCacheTest, OnlyBlocksTheTokensCoverAreRegistered) {
  KvCache cache(*backend, 1, 1, 4, 6);
  const KvCache::SeqId s = cache.create();
  ASSERT_TRUE(cache.reserve(s, 40));
  cache.set_length(s, 40);
  const auto t = tokens(40);
  cache.cache_full_blocks(s, std::span<const int32_t>(t).first(20));  // one full block known
  const KvCache::SeqId probe = cache.create();
  EXPECT_EQ(cache.share_prefix(probe, t), 16);
  EXPECT_THROW(cache.share_prefix(probe, t), Error);  // not empty any more
}

// The blocks ever handed out, which on the CPU is the cache's resident share (the pools are
// allocated untouched): a block taken again is not counted twice, free blocks go before cached
// ones are evicted, and the count stops at the pool.
TEST_F(PrefixCacheTest, TouchedBlocksCountEachBlockHandedOutOnce) {
  const int layers = 2, heads = 1, head_dim = 4, block = 16, total = 10;
  KvCache cache(*backend, layers, heads, head_dim, total, block);
  const size_t block_bytes = 2 * layers * block * heads * head_dim * dtype_size(backend->kv_dtype());
  EXPECT_EQ(cache.touched_blocks(), 0);
  EXPECT_EQ(cache.touched_bytes(), 0u);

  const auto a_tokens = tokens(40);  // 2 full blocks + 8
  const KvCache::SeqId a = filled(cache, a_tokens);
  EXPECT_EQ(cache.touched_blocks(), 3);
  cache.release(a);  // 2 stay cached, the partial one goes back to the free blocks
  const KvCache::SeqId b = cache.create();
  EXPECT_EQ(cache.share_prefix(b, a_tokens), 32);
  ASSERT_TRUE(cache.reserve(b, 40));  // the freed partial block again
  EXPECT_EQ(cache.touched_blocks(), 3);
  EXPECT_EQ(cache.touched_bytes(), 3 * block_bytes);
  cache.release(b);

  // 4 blocks of other tokens: the freed one and 3 fresh ones, not the 2 cached ones nobody holds.
  const KvCache::SeqId c = filled(cache, tokens(64, 1000));
  EXPECT_EQ(cache.touched_blocks(), 6);
  cache.release(c);
  // The whole pool, evicting what it must: every block handed out, none counted twice.
  const KvCache::SeqId d = filled(cache, tokens(total * block, 5000));
  EXPECT_EQ(cache.touched_blocks(), total);
  EXPECT_EQ(cache.touched_bytes(), static_cast<size_t>(total) * block_bytes);
  cache.release(d);
  const KvCache::SeqId e = filled(cache, tokens(3 * block, 9000));
  EXPECT_EQ(cache.touched_blocks(), total);
  cache.release(e);
}

}  // namespace
}  // namespace specdec
