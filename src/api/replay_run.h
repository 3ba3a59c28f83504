// Engine::replay's measurement, on the loop thread: the target's costs, each method's draft
// costs and proposals through the seam, and every prompt's replay for the default policy, each
// fixed depth and the best schedule (speculative/replay.h does the replaying).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/model.h"
#include "specdec/options.h"
#include "specdec/replay.h"
#include "speculative/draft.h"

namespace specdec {

struct ReplayMethod {
  std::string id;
  DraftKind kind = DraftKind::ngram;
  std::shared_ptr<DraftMethod> method;
};

// generated[i]: prompt i's tokens from plain decoding with `sampling` (speculative decoding in
// exact mode emits the same).
ReplayReport run_replay(Model& target, const std::vector<ReplayMethod>& methods, const ReplayRequest& request,
                        const std::vector<std::vector<int32_t>>& generated, const SamplingParams& sampling);

}  // namespace specdec
