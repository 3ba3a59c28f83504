// The verifier: given one row's window of target logits and the drafts, decides how many drafts
// are accepted and which token follows. It knows no draft method; drafts are only proposals and
// the target's own distribution decides every emitted token.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "sampling/sampling.h"

namespace specdec {

struct VerifyResult {
  int accepted = 0;              // drafts accepted, 0..k
  std::vector<int32_t> emitted;  // the accepted drafts, then the target's token: accepted + 1
};

// Inputs shared by both modes, for one row with k drafts:
// - window: (k + 1) rows of `vocab` logits, row-major: row i holds the target's logits for the
//   token after pending + drafts[0, i), i.e. the token at absolute position first_position + i.
// - history: the row's prompt and generated tokens up to and including pending; the verifier
//   appends drafts[0, i) to `generated` for window row i, exactly as plain decoding would have.
// - first_position: the absolute position of the token sampled from window row 0 (the index it
//   will have in prompt + generated). Plain decoding at position p draws with key (seed, p).

// exact mode (the default): window row i samples the target's own token with key
// (seed, first_position + i); drafts are accepted while they equal it; the first mismatch emits
// the target's token, a full accept emits one bonus token. The output is therefore identical to
// plain decoding at any temperature.
VerifyResult verify_exact(std::span<const float> window, int64_t vocab,
                          std::span<const int32_t> drafts, const SamplingParams& params,
                          const TokenHistory& history, uint64_t first_position);

// exact mode when the target's own tokens were already drawn where the logits were computed
// (Backend::sample, for rows whose params are logits_only()): targets[i] is window row i's token,
// drawn with key (seed, first_position + i). Same result as verify_exact on the logits those
// tokens came from.
VerifyResult verify_exact(std::span<const int32_t> targets, std::span<const int32_t> drafts);

// rejection mode: classic speculative sampling. Draft x at window row i is accepted with
// probability min(1, p(x) / q(x)), drawn with stream `accept`; on rejection the token comes from
// norm(max(0, p - q)) with stream `resample` and the round stops; a full accept draws the bonus
// from p like plain decoding. p is probabilities(...) of the window row. `q` is empty (every
// drafter deterministic) or holds k entries, each a full distribution over `vocab` or empty for
// a deterministic draft (q one-hot at the draft). At temperature 0 this is exactly verify_exact.
// The emitted distribution equals plain decoding's; the samples differ.
VerifyResult verify_rejection(std::span<const float> window, int64_t vocab,
                              std::span<const int32_t> drafts,
                              std::span<const std::vector<float>> q, const SamplingParams& params,
                              const TokenHistory& history, uint64_t first_position);

// Where a stop condition cuts an emitted burst.
struct BurstCut {
  size_t kept = 0;      // tokens of the burst that stand (an EOS that fired is included)
  bool eos = false;     // the last kept token is an EOS id
  bool length = false;  // the token budget ran out at the last kept token (and no EOS fired)
};

// Keeps tokens up to and including the first one in eos_ids, and at most `remaining` tokens
// (the request's max tokens minus what it has already generated). The engine rolls its KV and
// draft state back to the kept prefix.
BurstCut cut_burst(std::span<const int32_t> emitted, std::span<const int32_t> eos_ids,
                   size_t remaining);

}  // namespace specdec
