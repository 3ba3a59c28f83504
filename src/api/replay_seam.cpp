// A draft method driven through the seam for a replay: its proposals along a request and the
// cost of its calls.
#include "api/replay_seam.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace specdec {

namespace {

// The replay runs no target forward, so it offers no hidden taps: a method that reads them is
// refused here, by name, before any row state exists. The weights' ports cost nothing.
std::unique_ptr<DraftRows> open_group(DraftMethod& method, const Model& target) {
  TargetView view;
  view.model = &target;
  view.vocab_size = target.config().vocab_size;
  view.hidden_size = target.config().hidden_size;
  view.num_layers = target.config().num_layers;
  view.embedding = &target.embedding();
  view.lm_head = &target.lm_head();
  check_ports(view, method.needs(), method.name());
  return method.open(view);
}

void append_empty_row(DraftRows& rows) {
  const Checkpoint* none[] = {nullptr};
  rows.prepare_append(none).commit();
}

}  // namespace

SeamRow::SeamRow(DraftMethod& method, const Model& target, const SamplingParams& sampling)
    : rows_(open_group(method, target)), sampling_(sampling) {
  append_empty_row(*rows_);
}

void SeamRow::prefill(std::span<const int32_t> tokens) {
  rows_->prefill(0, tokens, TargetContext{});
  position_ += static_cast<int64_t>(tokens.size());
}

DraftProposal SeamRow::draft(int32_t pending, int depth) {
  const DraftRequestRow ask{0, pending, depth, position_, &sampling_, false};
  std::vector<DraftProposal> out = rows_->draft(std::span<const DraftRequestRow>(&ask, 1));
  SPECDEC_CHECK(out.size() == 1, "replay: a draft call for one row returned ", out.size(), " proposals");
  return std::move(out[0]);
}

void SeamRow::commit(int32_t pending, int drafted, int32_t next) {
  const RowCommit c{0, pending, 0, {next}, drafted};
  rows_->commit(std::span<const RowCommit>(&c, 1));
  ++position_;
}

ReplayTrace seam_trace(DraftMethod& method, const Model& target, const std::vector<int32_t>& prompt,
                       const std::vector<int32_t>& generated, int depth, const SamplingParams& sampling) {
  SeamRow row(method, target, sampling);
  row.prefill(prompt);
  ReplayTrace trace;
  trace.run.assign(generated.size(), 0);
  trace.proposal.assign(generated.size(), 0);
  for (size_t t = 1; t < generated.size(); ++t) {
    const DraftProposal p = row.draft(generated[t - 1], depth);
    size_t matched = 0;
    while (matched < p.tokens.size() && t + matched < generated.size() && p.tokens[matched] == generated[t + matched])
      ++matched;
    trace.run[t] = static_cast<int>(matched);
    trace.proposal[t] = static_cast<int>(p.tokens.size());
    row.commit(generated[t - 1], static_cast<int>(p.tokens.size()), generated[t]);
  }
  return trace;
}

DraftCallCosts time_draft_calls(DraftMethod& method, Model& target, Scratch& target_scratch,
                                const std::vector<int32_t>& context, int widths, int reps,
                                const SamplingParams& sampling) {
  SeamRow row(method, target, sampling);
  row.prefill(context);
  constexpr int32_t kToken = 7;
  // Each call is committed with nothing accepted: the row moves on by one token a call, far
  // within its context.
  auto call = [&](int k) {
    std::vector<double> t;
    for (int rep = 0; rep < reps; ++rep) {
      window(target, target_scratch, 4);
      int drafted = 0;
      t.push_back(median_seconds(1, [&] { drafted = static_cast<int>(row.draft(kToken, k).tokens.size()); }));
      row.commit(kToken, drafted, kToken);
    }
    return median_of(t);
  };
  DraftCallCosts costs;
  const double one = call(1), eight = call(8);
  costs.step = std::max(0.0, (eight - one) / 7);
  costs.fixed = std::max(0.0, one - costs.step);
  costs.window_after_call.assign(static_cast<size_t>(widths) + 1, 0.0);
  for (int w = 2; w <= widths; ++w) {
    std::vector<double> t;
    for (int rep = 0; rep < reps; ++rep) {
      const int drafted = static_cast<int>(row.draft(kToken, w - 1).tokens.size());
      t.push_back(median_seconds(1, [&] { window(target, target_scratch, w); }));
      row.commit(kToken, drafted, kToken);
    }
    costs.window_after_call[static_cast<size_t>(w)] = median_of(t);
  }
  return costs;
}

double time_draft_prefill(DraftMethod& method, const Model& target, const std::vector<int32_t>& prompt, int reps) {
  std::unique_ptr<DraftRows> rows = open_group(method, target);
  std::vector<double> t;
  for (int rep = 0; rep < reps; ++rep) {
    append_empty_row(*rows);
    t.push_back(median_seconds(1, [&] { rows->prefill(0, prompt, TargetContext{}); }));
    rows->filter_rows({});
  }
  return median_of(t);
}

}  // namespace specdec
