// Prompt lookup: the proposal order (longest n first, first occurrence, count limits, no match)
// on hand-made histories, and NgramIndex == propose_ngram on random histories under appends and
// truncations.
#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "sampling/philox.h"
#include "speculative/methods/ngram.h"

namespace specdec {
namespace {

using Tokens = std::vector<int32_t>;

TEST(Ngram, LongestNgramWinsOverEarlierShorterMatch) {
  // Suffix [1 2 3]: the 3-gram occurs at 4 (followed by 9 8); the 1-gram [3] occurs earlier at
  // 0 (followed by 5), but longer keys are tried first.
  const Tokens h{3, 5, 0, 0, 1, 2, 3, 9, 8, 1, 2, 3};
  EXPECT_EQ(propose_ngram(h, 3, 1, 2), (Tokens{9, 8}));
  // With max_ngram 1 only [3] is tried: its first occurrence is at 0.
  EXPECT_EQ(propose_ngram(h, 1, 1, 2), (Tokens{5, 0}));
  // With max 2 the 2-gram [2 3] first occurs at 5.
  EXPECT_EQ(propose_ngram(h, 2, 1, 3), (Tokens{9, 8, 1}));
}

TEST(Ngram, FirstOccurrenceFromTheStart) {
  const Tokens h{7, 1, 4, 7, 1, 5, 7, 1};
  EXPECT_EQ(propose_ngram(h, 2, 1, 1), (Tokens{4}));                  // [7 1] at 0, not at 3
  EXPECT_EQ(propose_ngram(h, 2, 1, 10), (Tokens{4, 7, 1, 5, 7, 1}));  // clipped at the end
}

TEST(Ngram, LatestOccurrenceClosestToTheEnd) {
  const Tokens h = {7, 1, 4, 7, 1, 5, 7, 1};
  EXPECT_EQ(propose_ngram(h, 2, 1, 1, Occurrence::latest), (Tokens{5}));  // [7 1] at 3, not at 0
  EXPECT_EQ(propose_ngram(h, 2, 1, 10, Occurrence::latest), (Tokens{5, 7, 1}));
  NgramIndex index(2, 1, Occurrence::latest);
  index.append(h);
  EXPECT_EQ(index.propose(1), (Tokens{5}));
  index.truncate(5);  // [7 1 4 7 1]: the latest [7 1] before the suffix is at 0 again
  EXPECT_EQ(index.propose(1), (Tokens{4}));
}

TEST(Ngram, CountLimitsAndHistoryEnd) {
  const Tokens h{1, 2, 3, 4, 5, 1, 2};
  EXPECT_EQ(propose_ngram(h, 3, 1, 3), (Tokens{3, 4, 5}));
  EXPECT_EQ(propose_ngram(h, 3, 1, 0), Tokens{});
  EXPECT_EQ(propose_ngram(h, 3, 1, -1), Tokens{});
  // Overlapping match: suffix [1 1] of [1 1 1] first occurs at 0, followed by one token only.
  EXPECT_EQ(propose_ngram(Tokens{1, 1, 1}, 3, 1, 5), (Tokens{1}));
  EXPECT_EQ(propose_ngram(Tokens{4, 4, 4, 4, 4}, 3, 1, 10), (Tokens{4, 4}));
}

TEST(Ngram, NoMatchIsEmpty) {
  EXPECT_EQ(propose_ngram(Tokens{1, 2, 3, 4}), Tokens{});
  EXPECT_EQ(propose_ngram(Tokens{}), Tokens{});
  EXPECT_EQ(propose_ngram(Tokens{5}), Tokens{});
  // min_ngram 2: the 1-gram [3] would match, but shorter keys than min are not tried.
  EXPECT_EQ(propose_ngram(Tokens{3, 9, 1, 3}, 3, 2, 4), Tokens{});
  EXPECT_EQ(propose_ngram(Tokens{3, 9, 1, 3}, 3, 1, 4), (Tokens{9, 1, 3}));
  // The suffix itself is not a match.
  EXPECT_EQ(propose_ngram(Tokens{8, 9}, 2, 2, 4), Tokens{});
}

TEST(Ngram, RejectsBadSizes) {
  EXPECT_THROW(propose_ngram(Tokens{1, 2}, 0, 0, 1), Error);
  EXPECT_THROW(propose_ngram(Tokens{1, 2}, 1, 2, 1), Error);
  EXPECT_THROW(NgramIndex(2, 3), Error);
  EXPECT_THROW(NgramIndex().propose(1, 2, 3), Error);
}

TEST(NgramIndex, MatchesTheScanOnRandomHistories) {
  // Small alphabets make long matches common; larger ones make misses common.
  uint64_t draw = 0;
  auto next = [&](uint64_t seed) { return uniform01(seed, draw++, 3); };
  for (const Occurrence which : {Occurrence::first, Occurrence::latest})
    for (int alphabet : {2, 3, 5, 16}) {
      for (int trial = 0; trial < 20; ++trial) {
        const uint64_t seed = static_cast<uint64_t>(alphabet * 1000 + trial);
        NgramIndex index(4, 1, which);
        Tokens history;
        for (int step = 0; step < 150; ++step) {
          const float action = next(seed);
          if (action < 0.15f && !history.empty()) {
            // Roll back a few tokens, as a rejected burst does.
            const size_t drop = 1 + static_cast<size_t>(next(seed) * 5);
            const size_t keep = history.size() > drop ? history.size() - drop : 0;
            history.resize(keep);
            index.truncate(keep);
          } else {
            Tokens burst(1 + static_cast<size_t>(next(seed) * 4));
            for (int32_t& t : burst) t = static_cast<int32_t>(next(seed) * static_cast<float>(alphabet));
            history.insert(history.end(), burst.begin(), burst.end());
            index.append(burst);
          }
          ASSERT_EQ(index.tokens(), history);
          for (auto [max, min] : {std::pair{4, 1}, std::pair{3, 2}, std::pair{2, 2}, std::pair{6, 1}}) {
            for (int num : {1, 3, 10}) {
              ASSERT_EQ(index.propose(max, min, num), propose_ngram(history, max, min, num, which))
                  << (which == Occurrence::first ? "first" : "latest") << " alphabet " << alphabet << " trial " << trial
                  << " step " << step << " n " << max << ".." << min << " num " << num;
            }
          }
        }
      }
    }
}

TEST(NgramIndex, TruncateThenReappendRestoresState) {
  const Tokens h{1, 2, 3, 1, 2, 4, 1, 2};
  NgramIndex index;
  index.append(h);
  EXPECT_EQ(index.propose(3), (Tokens{3, 1, 2}));
  index.truncate(3);  // [1 2 3]: nothing repeats
  EXPECT_EQ(index.propose(10), Tokens{});
  index.truncate(10);  // longer than the history: no-op
  EXPECT_EQ(index.size(), 3u);
  index.append(Tokens{1, 2, 4, 1, 2});
  EXPECT_EQ(index.propose(3), (Tokens{3, 1, 2}));
  index.truncate(0);
  EXPECT_EQ(index.size(), 0u);
  EXPECT_EQ(index.propose(3), Tokens{});
}

TEST(NgramIndex, LongHistoryStaysExact) {
  // A 20k-token history with a repeated span far back: the proposal comes from its first copy.
  Tokens history;
  for (int i = 0; i < 20000; ++i) history.push_back(static_cast<int32_t>(100 + i % 9973));
  NgramIndex index(3, 1);
  index.append(history);
  EXPECT_EQ(index.propose(4), propose_ngram(history, 3, 1, 4));
  // The suffix is 100 + {51, 52, 53} (19997 mod 9973 = 51); its first copy starts at 51.
  EXPECT_EQ(index.propose(4), (Tokens{154, 155, 156, 157}));
}

}  // namespace
}  // namespace specdec
