// The draft model's KV prefix cache: a row whose context begins with full blocks another row
// has fed starts past them (it catches up only the rest), and drafts exactly what a group that
// computed everything drafts.
#include <gtest/gtest.h>

#include "backend/backend.h"
#include "model/model.h"
#include "speculative/methods/draft_model.h"

namespace specdec {
namespace {

class DraftPrefixCache : public ::testing::Test {
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
  static void append(DraftRows& rows) {
    const Checkpoint* none = nullptr;
    rows.prepare_append(std::span<const Checkpoint* const>(&none, 1)).commit();
  }
  static DraftProposal propose(DraftRows& rows, int row, int32_t pending, int64_t position) {
    static const SamplingParams greedy = [] {
      SamplingParams p;
      p.temperature = 0;
      return p;
    }();
    DraftRequestRow ask;
    ask.row = row;
    ask.pending = pending;
    ask.depth = 4;
    ask.position = position;
    ask.sampling = &greedy;
    return rows.draft(std::span<const DraftRequestRow>(&ask, 1))[0];
  }
  static inline Backend* backend_ = nullptr;
  static inline std::shared_ptr<Model> draft_;
};

TEST_F(DraftPrefixCache, ASharedPrefixIsNotFedAgainAndChangesNoDraft) {
  std::vector<int32_t> prompt;
  for (int i = 0; i < 45; ++i) prompt.push_back(static_cast<int32_t>((i * 37 + 11) % 1000 + 100));
  const int32_t pending = 1858;
  const auto pos = static_cast<int64_t>(prompt.size());

  auto reference = open();
  append(*reference);
  reference->prefill(0, prompt, {});
  const DraftProposal alone = propose(*reference, 0, pending, pos);
  EXPECT_EQ(alone.caught_up, static_cast<int>(prompt.size()) - 1);

  auto group = open();
  append(*group);
  group->prefill(0, prompt, {});
  EXPECT_EQ(propose(*group, 0, pending, pos).tokens, alone.tokens);
  // The first row has gone; its blocks stay cached. A second request with the same prompt (and a
  // third whose prompt only shares the first block) start past what is cached.
  group->filter_rows(std::vector<int>{});
  append(*group);
  group->prefill(0, prompt, {});
  const DraftProposal again = propose(*group, 0, pending, pos);
  EXPECT_EQ(again.tokens, alone.tokens);
  const int block = 16, cached = static_cast<int>(prompt.size()) / block * block;
  EXPECT_EQ(again.caught_up, static_cast<int>(prompt.size()) - cached - 1);

  std::vector<int32_t> other(prompt.begin(), prompt.begin() + 20);
  other.insert(other.end(), 20, 7);
  auto fresh = open();
  append(*fresh);
  fresh->prefill(0, other, {});
  const DraftProposal other_alone = propose(*fresh, 0, pending, static_cast<int64_t>(other.size()));
  append(*group);
  group->prefill(1, other, {});
  const DraftProposal other_shared = propose(*group, 1, pending, static_cast<int64_t>(other.size()));
  EXPECT_EQ(other_shared.tokens, other_alone.tokens);
  EXPECT_EQ(other_shared.caught_up, static_cast<int>(other.size()) - block - 1);
}

}  // namespace
}  // namespace specdec
