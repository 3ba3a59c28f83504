// `specdec bench --replay`: each suite request's rounds replayed against this machine's measured
// costs (Engine::replay), for the default policy, every fixed depth and the best schedule; this
// file prints the report.
#include <cstdio>
#include <sstream>

#include "cli/bench_run.h"

namespace specdec::cli {

namespace {

nlohmann::json outcome_json(const ReplayOutcome& r) {
  return nlohmann::json{{"decode_speedup", r.decode_speedup},
                        {"speedup", r.speedup},
                        {"rounds", r.rounds},
                        {"drafted", r.drafted},
                        {"accepted", r.accepted}};
}

nlohmann::json print_method(const BenchCommand& o, const ReplayMethodReport& m, const std::string& draft) {
  const auto& f = m.forward_after_call_ms;
  if (m.timed_draft_calls)
    std::printf(
        "draft model %s: a call of depth k after a target forward: %.3f + %.3f k ms; a window of 2 / 4 / 8 tokens "
        "after a call: %.3f / %.3f / %.3f ms\n",
        draft.c_str(), m.draft_fixed_ms, m.draft_step_ms, f[1], f[3], f[7]);
  std::ostringstream scaled;
  if (o.replay_window_cost != 1.0) scaled << ", window tokens at " << o.replay_window_cost << "x";
  std::printf(
      "\nreplay: %s (depth up to %d%s); speedups over plain decoding: decode phase / whole request (prefill "
      "counted in both)\n",
      draft.c_str(), m.depth, scaled.str().c_str());
  std::printf("%-18s %9s %15s %9s %20s %15s\n", "prompt", "plain ms", "policy", "tok/fwd", "best fixed depth",
              "best schedule");
  nlohmann::json per_prompt = nlohmann::json::array();
  for (const ReplayPromptReport& p : m.prompts) {
    std::printf("%-18s %9.1f %6.2fx / %5.2fx %9.2f %3d: %6.2fx / %5.2fx %6.2fx / %5.2fx\n", p.name.c_str(), p.plain_ms,
                p.policy.decode_speedup, p.policy.speedup, p.policy.tokens_per_forward, p.best_fixed_depth,
                p.best_fixed.decode_speedup, p.best_fixed.speedup, p.best_schedule.decode_speedup,
                p.best_schedule.speedup);
    nlohmann::json fixed = outcome_json(p.best_fixed);
    fixed["depth"] = p.best_fixed_depth;
    per_prompt.push_back({{"prompt", p.name},
                          {"plain_ms", p.plain_ms},
                          {"prefill_ms", p.prefill_ms},
                          {"policy", outcome_json(p.policy)},
                          {"best_fixed_depth", fixed},
                          {"best_schedule", outcome_json(p.best_schedule)}});
  }
  return {{"method", draft},
          {"draft_call_ms", {{"fixed", m.draft_fixed_ms}, {"per_step", m.draft_step_ms}}},
          {"prompts", per_prompt}};
}

}  // namespace

void replay_bench(const BenchCommand& o, Engine& engine, nlohmann::json& report) {
  ReplayRequest request;
  for (const SuitePrompt& p : o.suite) request.prompts.push_back({p.name, engine.encode(p.text, false), p.max_tokens});
  request.context = synthetic_prompt(engine, suite_text(o.suite), 128, 3);
  for (const DraftSpec& d : o.engine.drafts) request.drafts.push_back(draft_id(d));
  request.num_draft_tokens = o.num_draft;
  request.window_cost = o.replay_window_cost;
  request.forward_ms = o.replay_forward_ms;
  request.draft_ms = o.replay_draft_ms;
  request.timing_repeats = o.replay_repeats;
  request.sampling = o.sampling;
  const ReplayReport r = engine.replay(request);
  const auto& f = r.forward_ms;
  std::printf(
      "\nreplay: %s, %s; target forward of 1 / 2 / 4 / 8 / 11 / 16 tokens: %.3f / %.3f / %.3f / %.3f / %.3f / %.3f "
      "ms\n",
      engine.device_name().c_str(), describe(o.sampling).c_str(), f[0], f[1], f[3], f[7], f[10], f[15]);
  nlohmann::json methods = nlohmann::json::array();
  for (size_t i = 0; i < r.methods.size(); ++i) methods.push_back(print_method(o, r.methods[i], o.drafts[i]));
  report["replay"] = {{"forward_ms", r.forward_ms}, {"methods", methods}};
}

}  // namespace specdec::cli
