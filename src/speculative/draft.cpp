// Checks shared by every draft method's restore path.
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

}  // namespace specdec
