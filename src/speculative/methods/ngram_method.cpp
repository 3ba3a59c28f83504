// NgramRows: per row, the tokens before its pending token and their n-gram index. The pending
// token joins the key only while drafting; commit records it and the accepted drafts, while the
// target's own last token stays pending for the next round.
#include "speculative/methods/ngram_method.h"

#include <algorithm>

#include "core/error.h"
#include "speculative/methods/ngram.h"

namespace specdec {

namespace {

class NgramRows : public DraftRows {
 public:
  NgramRows(NgramOptions options, std::string ns) : options_(options), ns_(std::move(ns)) {}

  int row_count() const override { return static_cast<int>(rows_.size()); }

  PreparedChange prepare_append(std::span<const Checkpoint* const> checkpoints) override {
    auto added = std::make_shared<std::vector<NgramIndex>>();
    for (const Checkpoint* cp : checkpoints) {
      NgramIndex index(options_.max_ngram, options_.min_ngram);
      if (cp) {
        check_checkpoint(*cp, ns_);
        index.append(cp->tokens);
      }
      added->push_back(std::move(index));
    }
    return PreparedChange(
        [this, added] {
          for (auto& index : *added) rows_.push_back(std::move(index));
        },
        [] {});
  }

  void filter_rows(std::span<const int> keep) override {
    std::vector<NgramIndex> next;
    next.reserve(keep.size());
    for (int i : keep) next.push_back(std::move(rows_.at(static_cast<size_t>(i))));
    rows_ = std::move(next);
  }

  void prefill(int row, std::span<const int32_t> tokens, const TargetContext&) override {
    rows_.at(static_cast<size_t>(row)).append(tokens);
  }

  std::vector<DraftProposal> draft(std::span<const DraftRequestRow> asks) override {
    std::vector<DraftProposal> out(asks.size());
    for (size_t i = 0; i < asks.size(); ++i) {
      NgramIndex& index = rows_.at(static_cast<size_t>(asks[i].row));
      const size_t before = index.size();
      index.append(std::span<const int32_t>(&asks[i].pending, 1));
      std::vector<int32_t> tokens = index.propose(options_.max_ngram, options_.min_ngram,
                                                  std::min(asks[i].depth, options_.num_draft));
      index.truncate(before);
      out[i].tokens = std::move(tokens);
      // n-gram drafts are deterministic: their distribution q is one-hot.
      if (asks[i].want_q) out[i].q.assign(out[i].tokens.size(), {});
    }
    return out;
  }

  void commit(std::span<const RowCommit> commits) override {
    for (const RowCommit& c : commits) {
      NgramIndex& index = rows_.at(static_cast<size_t>(c.row));
      index.append(std::span<const int32_t>(&c.pending, 1));
      index.append(std::span<const int32_t>(c.emitted.data(), c.emitted.size() - 1));
    }
  }

  Checkpoint capture(int row) const override {
    const NgramIndex& index = rows_.at(static_cast<size_t>(row));
    Checkpoint cp;
    cp.ns = ns_;
    cp.tokens = index.tokens();
    cp.processed_tokens = static_cast<int64_t>(cp.tokens.size());
    return cp;
  }

 private:
  NgramOptions options_;
  std::string ns_;
  std::vector<NgramIndex> rows_;
};

}  // namespace

NgramMethod::NgramMethod(NgramOptions options) : options_(options) {
  SPECDEC_CHECK(options_.min_ngram >= 1 && options_.max_ngram >= options_.min_ngram,
                "n-gram sizes must satisfy 1 <= min <= max, got min ", options_.min_ngram, " max ", options_.max_ngram);
  SPECDEC_CHECK(options_.num_draft >= 1, "n-gram draft count must be at least 1, got ", options_.num_draft);
}

std::string NgramMethod::checkpoint_namespace() const {
  return str_cat("ngram-history-v1:", options_.max_ngram, ":", options_.min_ngram, ":", options_.num_draft);
}

std::unique_ptr<DraftRows> NgramMethod::open(const TargetView&) {
  return std::make_unique<NgramRows>(options_, checkpoint_namespace());
}

}  // namespace specdec
