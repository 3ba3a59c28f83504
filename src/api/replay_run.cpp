// Replaying a suite's requests: costs measured once for the target and once per method, then
// each prompt's trace replayed under every policy.
#include "api/replay_run.h"

#include "api/replay_seam.h"
#include "api/replay_target.h"
#include "core/error.h"
#include "speculative/replay.h"

namespace specdec {

namespace {

constexpr int kWidths = 17;

// The target's forward of 1 .. kWidths tokens (as measured, or as given) and each prompt's prefill.
struct TargetCosts {
  std::vector<double> timed;    // [w], measured
  ReplayCosts costs;            // forward[w]: measured, or given
  std::vector<double> prefill;  // per prompt
};

TargetCosts target_costs(Model& target, Scratch& sc, const ReplayRequest& request) {
  TargetCosts t;
  t.timed = time_windows(target, sc, kWidths, request.timing_repeats);
  t.costs.forward = t.timed;
  // Given costs replace the measured ones; widths past the list go on at its last step.
  if (!request.forward_ms.empty()) {
    ReplayCosts given;
    given.forward.push_back(0.0);  // no width 0
    for (double ms : request.forward_ms) given.forward.push_back(ms * 1e-3);
    for (int w = 1; w <= kWidths; ++w) t.costs.forward[static_cast<size_t>(w)] = given.forward_cost(w);
  }
  for (const ReplayPrompt& p : request.prompts)
    t.prefill.push_back(median_seconds(5, [&] { Scratch fresh = scratch(target, p.tokens, 1); }));
  return t;
}

ReplayOutcome outcome(const ReplayResult& r, double plain, double prefill, double draft_prefill) {
  return ReplayOutcome{plain / r.seconds, (prefill + plain) / (prefill + draft_prefill + r.seconds),
                       r.rounds,          r.drafted,
                       r.accepted,        r.tokens_per_forward()};
}

ReplayPromptReport replay_prompt(const ReplayTrace& trace, const ReplayCosts& costs, int depth, double prefill,
                                 double draft_prefill) {
  const double plain = replay_plain(trace, costs);
  ReplayPromptReport p;
  p.plain_ms = (prefill + plain) * 1e3;
  p.prefill_ms = prefill * 1e3;
  p.policy = outcome(replay_policy(trace, costs, depth, true), plain, prefill, draft_prefill);
  ReplayResult fixed;
  for (int k = 1; k <= depth; ++k) {
    const ReplayResult r = replay_policy(trace, costs, k, false);
    if (p.best_fixed_depth == 0 || r.seconds < fixed.seconds) {
      fixed = r;
      p.best_fixed_depth = k;
    }
  }
  p.best_fixed = outcome(fixed, plain, prefill, draft_prefill);
  p.best_schedule = outcome(replay_best(trace, costs, depth), plain, prefill, draft_prefill);
  return p;
}

ReplayMethodReport replay_method(Model& target, Scratch& sc, const ReplayMethod& m, const TargetCosts& t,
                                 const ReplayRequest& request, const std::vector<std::vector<int32_t>>& generated,
                                 const SamplingParams& sampling) {
  ReplayMethodReport report;
  report.draft = m.id;
  report.depth = request.num_draft_tokens > 0 ? request.num_draft_tokens : m.method->default_depth();
  ReplayCosts costs = t.costs;
  std::vector<double> draft_prefill(request.prompts.size(), 0.0);
  // An n-gram lookup costs microseconds against a forward's milliseconds: it is left untimed, so
  // that a replay on given forward costs comes out the same on every run.
  report.timed_draft_calls = m.kind != DraftKind::ngram;
  if (report.timed_draft_calls) {
    if (request.draft_ms.empty()) {
      const DraftCallCosts calls =
          time_draft_calls(*m.method, target, sc, request.context, kWidths, request.timing_repeats, sampling);
      costs.draft_fixed = calls.fixed;
      costs.draft_step = calls.step;
      // With given forward costs, the window after a call keeps what the call's eviction added here.
      for (int w = 2; w <= kWidths; ++w) {
        const size_t i = static_cast<size_t>(w);
        costs.forward[i] = t.costs.forward[i] + calls.window_after_call[i] - t.timed[i];
      }
    } else {
      // Given draft costs: no call is timed, and with given forward costs too nothing measured
      // is left (a replay of a policy's choices alone, the same on every run).
      costs.draft_fixed = request.draft_ms[0] * 1e-3;
      costs.draft_step = request.draft_ms[1] * 1e-3;
    }
    costs.catch_up = costs.draft_step;  // a catch-up feed costs about one step
    for (size_t i = 0; i < request.prompts.size(); ++i)
      draft_prefill[i] = time_draft_prefill(*m.method, target, request.prompts[i].tokens, 3);
  }
  report.draft_fixed_ms = costs.draft_fixed * 1e3;
  report.draft_step_ms = costs.draft_step * 1e3;
  for (int w = 1; w <= kWidths; ++w)
    report.forward_after_call_ms.push_back(costs.forward[static_cast<size_t>(w)] * 1e3);
  // What if a window's tokens beyond the first cost request.window_cost times as much.
  for (int w = 2; w <= kWidths; ++w) {
    double& f = costs.forward[static_cast<size_t>(w)];
    f = costs.forward[1] + request.window_cost * (f - costs.forward[1]);
  }
  for (size_t i = 0; i < request.prompts.size(); ++i) {
    const ReplayTrace trace =
        seam_trace(*m.method, target, request.prompts[i].tokens, generated[i], report.depth, sampling);
    ReplayPromptReport p = replay_prompt(trace, costs, report.depth, t.prefill[i], draft_prefill[i]);
    p.name = request.prompts[i].name;
    report.prompts.push_back(std::move(p));
  }
  return report;
}

}  // namespace

ReplayReport run_replay(Model& target, const std::vector<ReplayMethod>& methods, const ReplayRequest& request,
                        const std::vector<std::vector<int32_t>>& generated, const SamplingParams& sampling) {
  SPECDEC_CHECK(generated.size() == request.prompts.size(), "replay: tokens for ", generated.size(), " of ",
                request.prompts.size(), " prompts");
  SPECDEC_CHECK(request.timing_repeats >= 1, "replay: timing_repeats must be at least 1, got ", request.timing_repeats);
  SPECDEC_CHECK(request.window_cost >= 0, "replay: the window cost must not be negative, got ", request.window_cost);
  SPECDEC_CHECK(request.draft_ms.empty() || request.draft_ms.size() == 2,
                "replay: draft_ms holds a call's fixed part and its part per step, got ", request.draft_ms.size(),
                " figures");
  Scratch sc = scratch(target, request.context, kWidths + 16);
  const TargetCosts t = target_costs(target, sc, request);
  ReplayReport report;
  for (int w = 1; w <= kWidths; ++w) report.forward_ms.push_back(t.costs.forward[static_cast<size_t>(w)] * 1e3);
  for (const ReplayMethod& m : methods)
    report.methods.push_back(replay_method(target, sc, m, t, request, generated, sampling));
  return report;
}

}  // namespace specdec
