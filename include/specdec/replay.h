// Engine::replay's request and report: each prompt's speculative decoding replayed against this
// machine's measured costs, for the default depth policy, every fixed depth and the best schedule
// any policy could follow. The requests' tokens and each method's proposals are fixed: greedy
// tokens, or seeded sampled ones (a draw is a function of the seed and the position, and exact
// verification accepts the drafts that equal the target's draws).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "specdec/request.h"

namespace specdec {

struct ReplayPrompt {
  std::string name;
  std::vector<int32_t> tokens;
  int max_tokens = 0;
};

struct ReplayRequest {
  std::vector<ReplayPrompt> prompts;
  std::vector<int32_t> context;     // target forwards and draft calls are timed after this context
  std::vector<std::string> drafts;  // draft ids of the engine
  int num_draft_tokens = 0;         // the most drafts a round asks for; 0 = each method's default
  double window_cost = 1.0;         // what if a window's tokens beyond the first cost this many times as much
  std::vector<double> forward_ms;   // the target forward of 1, 2, ... tokens instead of the measured ones
  std::vector<double> draft_ms;     // {fixed, per step}: a draft call of depth k instead of the measured one
  int timing_repeats = 15;          // calls timed per measurement (fewer: a quicker, noisier replay)
  // How the requests sample (greedy unless a temperature is set; unset fields as the model's
  // generation defaults give them, as for any request).
  SamplingOptions sampling{0.0f, 1.0f, 0, 0.0f, 1.0f};
};

struct ReplayOutcome {
  double decode_speedup = 0;  // over plain decoding, the decode phase
  double speedup = 0;         // the whole request, prefill counted in both
  int rounds = 0;
  int drafted = 0;
  int accepted = 0;
  double tokens_per_forward = 0;
};

struct ReplayPromptReport {
  std::string name;
  double plain_ms = 0;    // plain decoding, prefill included
  double prefill_ms = 0;  // the target's
  ReplayOutcome policy;
  int best_fixed_depth = 0;
  ReplayOutcome best_fixed;
  ReplayOutcome best_schedule;
};

struct ReplayMethodReport {
  std::string draft;
  int depth = 0;                   // the most drafts a round asks for
  bool timed_draft_calls = false;  // false for an n-gram lookup, whose calls cost nothing next to a forward
  double draft_fixed_ms = 0;       // a draft call of depth k: fixed + per_step * k
  double draft_step_ms = 0;
  std::vector<double> forward_after_call_ms;  // [w - 1]: a target window of w tokens right after a draft call
  std::vector<ReplayPromptReport> prompts;
};

struct ReplayReport {
  std::vector<double> forward_ms;  // [w - 1]: a target forward of w tokens (measured, or as given)
  std::vector<ReplayMethodReport> methods;
};

}  // namespace specdec
