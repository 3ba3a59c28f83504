// Checks shared by every draft method: its restore path, and the ports it needs of the target.
#include "speculative/draft.h"

#include "core/error.h"

namespace specdec {

void check_checkpoint(const Checkpoint& checkpoint, const std::string& ns) {
  SPECDEC_CHECK(checkpoint.ns == ns, "draft checkpoint namespace '", checkpoint.ns, "' does not match this method's '",
                ns, "'");
  SPECDEC_CHECK(checkpoint.processed_tokens == static_cast<int64_t>(checkpoint.tokens.size()),
                "draft checkpoint claims ", checkpoint.processed_tokens, " processed tokens but holds ",
                checkpoint.tokens.size());
}

void check_ports(const TargetView& target, const TargetNeeds& needs, const std::string& method) {
  const auto missing = [&](const char* port) {
    throw Error(str_cat("draft method '", method, "' needs the target's ", port, ", which this target does not offer"));
  };
  if (!needs.tap_layers.empty() && !target.taps) missing("hidden-state taps");
  for (int layer : needs.tap_layers)
    SPECDEC_CHECK(layer >= 0 && layer <= target.num_layers, "draft method '", method, "' asks for a tap of layer ",
                  layer, " but the target has ", target.num_layers, " layers (taps 0..", target.num_layers, ")");
  if (needs.embedding && !target.embedding) missing("embedding");
  if (needs.lm_head && !target.lm_head) missing("LM head");
  if (needs.kv && !target.kv) missing("KV cache");
}

}  // namespace specdec
