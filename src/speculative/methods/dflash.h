// The DFlash block drafter (with the DSpark confidence cut when its checkpoint is calibrated):
// the target's hidden states after the declared layers, projected once per accepted position
// (fc, hidden_norm) and turned into each drafter layer's K/V, are the drafter's context. One
// forward per round drafts a whole block: the pending token and block_size - 1 mask tokens attend
// to that context and, both ways, to each other; each mask row's logits come from the target's
// own LM head. The embedding and the LM head are the target's (views, no copies).
#pragma once

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>

#include "speculative/draft.h"
#include "speculative/methods/context_lookup.h"
#include "speculative/methods/dflash_format.h"

namespace specdec {

class Backend;

struct DflashOptions {
  // Most drafts a round proposes (0: the most there can be). The block gives at most
  // block_size - 1; with the context lookup, the text's continuation may carry a round on to a
  // verify window of kLookupWindow tokens.
  int num_draft = 0;
  // Whether a calibrated checkpoint's confidence cut shortens the proposals (off: the depth
  // policy's depth stands, as for an uncalibrated checkpoint).
  bool confidence_cut = true;
  // Whether an exact-mode row (greedy, or sampled with the target's keys) may propose what
  // followed its drafts' trailing tokens earlier in the request's text instead of its own token
  // (context_lookup.h).
  bool context_lookup = true;
  int kv_blocks = 0;  // 0 = the engine's rows at the drafter's context, within kv_memory
  size_t kv_memory = 256ull << 20;
};

// Per-round figures of a group, for tests and telemetry.
struct DflashStats {
  int64_t rounds = 0;    // rows drafted
  int64_t asked = 0;     // drafts the depth policy asked for
  int64_t proposed = 0;  // drafts proposed after the confidence cut
  int64_t forwards = 0;  // block forwards (one per call that drafted any row)
  int64_t replayed = 0;  // of them, replayed from a recording (catch-up and block alike)
  // Greedy rows whose argmax repeated the row before (block_repeats.h): proposed as their
  // runner-up; and of those a verified round reached, where the repeat and where the runner-up
  // was the target's token.
  int64_t swapped = 0, scored = 0, repeat_right = 0, runner_right = 0;
  LookupStats lookup;  // exact-mode rows checked against the request's text (context_lookup.h)
};

class DflashMethod : public DraftMethod {
 public:
  // Loads dir (config.json + safetensors, validated) onto `backend`, which must be the target's.
  DflashMethod(const std::filesystem::path& dir, Backend& backend, std::string id, DflashOptions options = {});
  ~DflashMethod() override;

  std::string name() const override { return "dflash"; }
  std::string checkpoint_namespace() const override;
  TargetNeeds needs() const override;
  std::unique_ptr<DraftRows> open(const TargetView& target) override;
  int default_depth() const override;
  int own_depth() const override { return std::min(default_depth(), config_.block_size - 1); }
  bool drafts_in_one_forward() const override { return true; }

  const DflashConfig& config() const { return config_; }
  size_t parameter_count() const;
  bool cuts() const { return options_.confidence_cut && config_.dspark.has_value(); }
  // What the groups this method opened did so far.
  DflashStats stats() const { return *stats_; }

 private:
  DflashConfig config_;
  std::shared_ptr<const DflashWeights> weights_;
  Backend& backend_;
  std::string id_;
  DflashOptions options_;
  std::shared_ptr<DflashStats> stats_;
};

}  // namespace specdec
