// The draft seam's contracts: checkpoint namespaces, two-phase membership (a failed or dropped
// append leaves the group unchanged), the n-gram history rule and the draft model's re-feed rule.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "backend/backend.h"
#include "core/error.h"
#include "model/model.h"
#include "speculative/methods/draft_model.h"
#include "speculative/methods/ngram_method.h"

namespace specdec {
namespace {

using ::testing::HasSubstr;

const Checkpoint* kEmpty = nullptr;

void append(DraftRows& rows, const Checkpoint* cp) {
  rows.prepare_append(std::span<const Checkpoint* const>(&cp, 1)).commit();
}

TEST(NgramSeam, NamespaceNamesEveryKnob) {
  EXPECT_EQ(NgramMethod().checkpoint_namespace(), "ngram-history-v1:3:1:10");
  EXPECT_EQ(NgramMethod({4, 2, 5}).checkpoint_namespace(), "ngram-history-v1:4:2:5");
}

TEST(NgramSeam, RefusesCheckpointOfAnotherNamespace) {
  NgramMethod a({3, 1, 10}), b({4, 1, 10});
  auto ra = a.open(TargetView{});
  auto rb = b.open(TargetView{});
  append(*ra, kEmpty);
  const std::vector<int32_t> prompt = {1, 2, 3, 4};
  ra->prefill(0, prompt, {});
  const Checkpoint cp = ra->capture(0);
  try {
    const Checkpoint* p = &cp;
    rb->prepare_append(std::span<const Checkpoint* const>(&p, 1));
    FAIL() << "expected a namespace error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("namespace"));
    EXPECT_THAT(e.what(), HasSubstr("ngram-history-v1:3:1:10"));
  }
  EXPECT_EQ(rb->row_count(), 0);
}

TEST(NgramSeam, FailedOrDroppedAppendLeavesGroupUnchanged) {
  NgramMethod m;
  auto rows = m.open(TargetView{});
  append(*rows, kEmpty);
  const std::vector<int32_t> prompt = {5, 6, 7, 5, 6};
  rows->prefill(0, prompt, {});
  Checkpoint bad = rows->capture(0);
  bad.ns = "ngram-history-v1:9:9:9";
  const Checkpoint good = rows->capture(0);
  const Checkpoint* both[] = {&good, &bad};
  EXPECT_THROW(rows->prepare_append(both), Error);
  EXPECT_EQ(rows->row_count(), 1);
  {
    const Checkpoint* one[] = {&good};
    PreparedChange dropped = rows->prepare_append(one);
  }  // destroyed without commit
  EXPECT_EQ(rows->row_count(), 1);
  EXPECT_EQ(rows->capture(0).tokens, prompt);
}

TEST(NgramSeam, HistoryRecordsPendingAndAcceptedDraftsNotTheTargetToken) {
  NgramMethod m;
  auto rows = m.open(TargetView{});
  append(*rows, kEmpty);
  const std::vector<int32_t> prompt = {10, 11, 12, 13, 10, 11};
  rows->prefill(0, prompt, {});
  DraftRequestRow ask;
  ask.row = 0;
  ask.pending = 12;  // key "10 11 12" occurred at the start: propose what followed
  ask.depth = 3;
  ask.position = 6;
  auto got = rows->draft(std::span<const DraftRequestRow>(&ask, 1));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].tokens, (std::vector<int32_t>{13, 10, 11}));
  RowCommit c;
  c.row = 0;
  c.pending = 12;
  c.accepted = 2;
  c.drafted = 3;
  c.emitted = {13, 10, 99};  // two drafts accepted, then the target's own token 99
  rows->commit(std::span<const RowCommit>(&c, 1));
  EXPECT_EQ(rows->capture(0).tokens, (std::vector<int32_t>{10, 11, 12, 13, 10, 11, 12, 13, 10}));
}

TEST(NgramSeam, FilterRowsKeepsChosenRowsInOrder) {
  NgramMethod m;
  auto rows = m.open(TargetView{});
  for (int i = 0; i < 3; ++i) append(*rows, kEmpty);
  for (int i = 0; i < 3; ++i) {
    const std::vector<int32_t> t = {i, i, i};
    rows->prefill(i, t, {});
  }
  const std::vector<int> keep = {0, 2};
  rows->filter_rows(keep);
  ASSERT_EQ(rows->row_count(), 2);
  EXPECT_EQ(rows->capture(1).tokens, (std::vector<int32_t>{2, 2, 2}));
}

class DraftModelSeam : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    backend_ = make_backend(BackendOptions{}).release();
    draft_ = std::shared_ptr<Model>(Model::load(std::string(SPECDEC_SOURCE_DIR) + "/models/draft", *backend_));
  }
  static std::unique_ptr<DraftRows> open() {
    DraftModelMethod m(draft_, "test", DraftModelOptions{4, 256});
    TargetView view;
    view.vocab_size = draft_->config().vocab_size;
    return m.open(view);
  }
  static std::vector<int32_t> draft(DraftRows& rows, int row, int32_t pending, int64_t position, int depth) {
    return propose(rows, row, pending, position, depth).tokens;
  }
  static DraftProposal propose(DraftRows& rows, int row, int32_t pending, int64_t position, int depth) {
    static const SamplingParams greedy = [] {
      SamplingParams p;
      p.temperature = 0;
      return p;
    }();
    DraftRequestRow ask;
    ask.row = row;
    ask.pending = pending;
    ask.depth = depth;
    ask.position = position;
    ask.sampling = &greedy;
    return rows.draft(std::span<const DraftRequestRow>(&ask, 1))[0];
  }
  static inline Backend* backend_ = nullptr;
  static inline std::shared_ptr<Model> draft_;
};

TEST_F(DraftModelSeam, RefusesMismatchedVocabulary) {
  DraftModelMethod m(draft_, "test");
  TargetView view;
  view.vocab_size = 32000;
  try {
    m.open(view);
    FAIL() << "expected a vocabulary error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("vocabulary"));
    EXPECT_THAT(e.what(), HasSubstr("32000"));
  }
}

// After every accept pattern, the group's next proposal must equal that of a fresh group
// restored from the same tokens: the KV it kept plus what it re-feeds (the last draft and the
// new pending token after a full accept) is exactly the verified history.
TEST_F(DraftModelSeam, ReFeedKeepsStateEqualToHistory) {
  const std::vector<int32_t> prompt = {1012, 287, 1305, 12, 202, 262, 444};  // any ids
  for (int accepted : {0, 1, 3, 4}) {
    auto rows = open();
    append(*rows, kEmpty);
    rows->prefill(0, prompt, {});
    const int32_t pending = 1858;
    const int64_t pos = static_cast<int64_t>(prompt.size());
    const auto d = draft(*rows, 0, pending, pos, 4);
    ASSERT_EQ(d.size(), 4u);
    RowCommit c;
    c.row = 0;
    c.pending = pending;
    c.accepted = accepted;
    c.drafted = 4;
    c.emitted.assign(d.begin(), d.begin() + accepted);
    const int32_t next = accepted == 4 ? 385 : (d[static_cast<size_t>(accepted)] + 1) % 8192;
    c.emitted.push_back(next);
    rows->commit(std::span<const RowCommit>(&c, 1));
    const Checkpoint cp = rows->capture(0);
    EXPECT_EQ(cp.processed_tokens, pos + 1 + accepted);
    const auto again = draft(*rows, 0, next, pos + 1 + accepted, 3);

    auto fresh = open();
    append(*fresh, &cp);
    EXPECT_EQ(draft(*fresh, 0, next, pos + 1 + accepted, 3), again) << "accepted " << accepted;
  }
}

// A round feeds the draft model its pending token, and after a full accept the last draft too;
// only tokens of rounds the row did not draft in (a paused row) count as caught up, so that
// their one-off cost is not taken for the price of a draft.
TEST_F(DraftModelSeam, CountsOnlyMissedRoundsAsCatchUp) {
  const std::vector<int32_t> prompt = {1012, 287, 1305, 12, 202, 262, 444};
  auto rows = open();
  append(*rows, kEmpty);
  rows->prefill(0, prompt, {});
  int64_t pos = static_cast<int64_t>(prompt.size());
  const DraftProposal first = propose(*rows, 0, 1858, pos, 4);
  ASSERT_EQ(first.tokens.size(), 4u);
  // prefill only records the prompt; the first draft feeds it (all but the usual one token).
  EXPECT_EQ(first.caught_up, static_cast<int>(prompt.size()) - 1);
  RowCommit c;
  c.pending = 1858;
  c.accepted = 4;
  c.drafted = 4;
  c.emitted = first.tokens;
  c.emitted.push_back(385);
  rows->commit(std::span<const RowCommit>(&c, 1));
  pos += 5;
  EXPECT_EQ(propose(*rows, 0, 385, pos, 2).caught_up, 0);  // re-feeds the last draft: usual
  // Three plain rounds (nothing drafted): the target emits one token each.
  int32_t pending = 385;
  for (int32_t next : {17, 29, 31}) {
    RowCommit plain;
    plain.pending = pending;
    plain.emitted = {next};
    rows->commit(std::span<const RowCommit>(&plain, 1));
    pending = next;
    ++pos;
  }
  // The draft KV holds 385 (fed with the last round); it now feeds 17, 29 and the pending 31:
  // one token more than a round's usual two.
  EXPECT_EQ(propose(*rows, 0, pending, pos, 2).caught_up, 1);
}

// A call whose forwards paid one-off costs (here the first, which grows the draft model's
// buffers) says so, so that its time is not taken for the price of a draft; calls of shapes
// already run do not.
TEST_F(DraftModelSeam, ReportsCallsThatPaidOneOffCosts) {
  const std::vector<int32_t> prompt = {1012, 287, 1305, 12, 202, 262, 444};
  // A model of its own: the suite's shared one has run these shapes in other tests.
  const std::shared_ptr<Model> model(Model::load(std::string(SPECDEC_SOURCE_DIR) + "/models/draft", *backend_));
  TargetView view;
  view.vocab_size = model->config().vocab_size;
  auto rows = DraftModelMethod(model, "fresh", DraftModelOptions{4, 256}).open(view);
  append(*rows, kEmpty);
  rows->prefill(0, prompt, {});
  int64_t pos = static_cast<int64_t>(prompt.size());
  int32_t pending = 1858;
  std::vector<bool> one_off;
  for (int call = 0; call < 4; ++call) {
    const DraftProposal p = propose(*rows, 0, pending, pos, 3);
    ASSERT_EQ(p.tokens.size(), 3u);
    one_off.push_back(p.one_off);
    RowCommit c;  // nothing accepted: the next call feeds one new token, as the last did
    c.pending = pending;
    c.drafted = 3;
    c.emitted = {(p.tokens[0] + 1) % 8192};
    rows->commit(std::span<const RowCommit>(&c, 1));
    pending = c.emitted[0];
    ++pos;
  }
  EXPECT_TRUE(one_off.front()) << "the first call grew the draft model's buffers";
  EXPECT_FALSE(one_off.back()) << "the fourth call ran shapes the earlier ones ran";
}

// A prompt longer than a catch-up block is fed in blocks; the drafts must be the draft model's
// own greedy continuation, computed here by one forward over the whole prompt and steps.
TEST_F(DraftModelSeam, CatchesUpALongPromptInBlocks) {
  std::vector<int32_t> prompt;
  for (int i = 0; i < 1100; ++i) prompt.push_back(5 + (i * 37) % 4000);
  auto rows = open();
  append(*rows, kEmpty);
  rows->prefill(0, prompt, {});
  const int32_t pending = 1858;
  const DraftProposal got = propose(*rows, 0, pending, static_cast<int64_t>(prompt.size()), 3);
  EXPECT_EQ(got.caught_up, static_cast<int>(prompt.size()) - 1);

  auto cache = draft_->make_cache(128);
  const auto seq = cache->create();
  ASSERT_TRUE(cache->reserve(seq, static_cast<int>(prompt.size()) + 4));
  SequenceInput in;
  in.seq = seq;
  in.tokens = prompt;
  in.tokens.push_back(pending);
  in.logits_at = {static_cast<int32_t>(in.tokens.size()) - 1};
  std::vector<int32_t> want;
  for (int step = 0; step < 3; ++step) {
    ForwardRequest req;
    req.rows = {in};
    req.sampling = {SampleRow{}};
    const ForwardResult res = draft_->forward(req, *cache);
    want.push_back(res.tokens[0]);
    in.tokens = {want.back()};
    in.logits_at = {0};
  }
  EXPECT_EQ(got.tokens, want);
}

TEST_F(DraftModelSeam, FailedAppendLeavesGroupUnchanged) {
  auto rows = open();
  append(*rows, kEmpty);
  Checkpoint bad;
  bad.ns = "ngram-history-v1:3:1:10";
  const Checkpoint* list[] = {kEmpty, &bad};
  EXPECT_THROW(rows->prepare_append(list), Error);
  EXPECT_EQ(rows->row_count(), 1);
}

}  // namespace
}  // namespace specdec
