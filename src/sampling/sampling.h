// Sampling: the request's sampling parameters, the logits-processor pipeline (penalties, bias,
// temperature, top-k, top-p, min-p) and the sampler keyed by (seed, position). A sampled token is
// a pure function of (logits, params, history, position), which is what makes speculative output
// identical to plain output.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "sampling/sample_row.h"

namespace specdec {

// The draws a position may make; each is an independent Philox stream of (seed, position).
enum class RandomStream : uint32_t {
  token = 0,     // the target's own token (plain decoding and exact verification)
  accept = 1,    // rejection mode: the accept/reject test of a draft
  resample = 2,  // rejection mode: the residual draw after a rejection
};

struct SamplingParams {
  float temperature = 1.0f;         // 0 = greedy
  int top_k = 0;                    // 0 = off
  float top_p = 1.0f;               // 1 = off
  float min_p = 0.0f;               // 0 = off
  float repetition_penalty = 1.0f;  // HF semantics over prompt + generated; 1 = off
  float presence_penalty = 0.0f;    // OpenAI semantics over generated tokens
  float frequency_penalty = 0.0f;   // OpenAI semantics over generated tokens
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token, added to its logit)
  uint64_t seed = 0;

  bool greedy() const { return temperature == 0.0f; }
  // Whether the token is the argmax of the raw logits: greedy, and no penalty or logit bias
  // changes the logits first (top-k/p and min-p keep the argmax).
  bool selects_argmax() const { return greedy() && logits_only(); }
  // Whether any stage reads the token history (penalties); without, history is never touched.
  bool uses_history() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f;
  }
  // Whether the token depends on nothing but the logits and the (seed, position) key: no penalty
  // reads the history and no bias changes the logits. Such a row fits a SampleRow, so a backend
  // can draw it where the logits were computed (Backend::sample).
  bool logits_only() const { return !uses_history() && logit_bias.empty(); }
  // Throws specdec::Error naming the field and its allowed range. With vocab_size > 0 the
  // logit_bias token ids are checked against it too.
  void validate(int64_t vocab_size = 0) const;
};

// The tokens a row has seen: the prompt and what was generated after it (in a verify window,
// generated includes the drafts before the position being sampled).
struct TokenHistory {
  std::span<const int32_t> prompt;
  std::span<const int32_t> generated;
};

// The pipeline, in the order Hugging Face and vLLM apply it. Every stage works in place on one
// row of logits; filters set removed tokens to -infinity. The constructor validates the params.
// The sampler applies the penalties and the bias from here; its temperature and filters run in
// draw.h's passes, of which these stages (a softmax summed in double, sorts) are the plain
// statement the tests hold them to.
class LogitsProcessor {
 public:
  explicit LogitsProcessor(const SamplingParams& params);

  // Repetition penalty on every token of prompt + generated (positive logits divided, negative
  // multiplied), then presence/frequency penalties on generated tokens:
  // logit -= presence * [count > 0] + frequency * count.
  void apply_penalties(std::span<float> logits, const TokenHistory& history) const;
  void apply_logit_bias(std::span<float> logits) const;
  // No-op at temperature 0 (greedy takes the argmax of the penalised logits).
  void apply_temperature(std::span<float> logits) const;
  // Keeps the top_k highest logits; ties with the k-th value are kept too (HF TopKLogitsWarper).
  void apply_top_k(std::span<float> logits) const;
  // Keeps the smallest set of most probable tokens whose mass reaches top_p (at least one).
  // Tokens of equal probability are taken in id order, so the set is deterministic.
  void apply_top_p(std::span<float> logits) const;
  // Keeps tokens whose probability is at least min_p times the largest probability.
  void apply_min_p(std::span<float> logits) const;

  // All stages in order: penalties, bias, temperature, top-k, top-p, min-p.
  void apply(std::span<float> logits, const TokenHistory& history) const;

  const SamplingParams& params() const { return params_; }

 private:
  SamplingParams params_;
};

// The final distribution over the vocabulary after the whole pipeline; removed tokens get 0.
// Sampled, it is the distribution sample() draws from (draw.h's draw_probabilities: each token's
// mass over the total, so the softmax of the filtered, scaled logits to within 2^-40 of the
// largest weight). At temperature 0 it is one-hot at the greedy token, so rejection sampling
// degenerates to exact matching.
std::vector<float> probabilities(std::span<const float> logits, const SamplingParams& params,
                                 std::span<const int32_t> prompt,
                                 std::span<const int32_t> generated);

// The token at absolute `position`: argmax at temperature 0 (lowest id on ties), otherwise the
// inverse CDF of the final distribution at u = uniform01(seed, position), walked in token-id
// order over exact integer masses (draw.h's draw_sampled: the distribution of probabilities(...)
// to within 2^-40 of the largest weight, summed without rounding).
int32_t sample(std::span<const float> logits, const SamplingParams& params,
               std::span<const int32_t> prompt, std::span<const int32_t> generated,
               uint64_t position);

// The most alternatives a request may ask logprobs for (OpenAI's top_logprobs limit).
inline constexpr int kMaxTopLogprobs = 20;

// The log-probability of a generated token and the most likely tokens at its position.
struct TokenLogprobs {
  int32_t token = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // most likely first; ties: lower id first
  // 1 + the number of tokens strictly more likely than `token`.
  int rank = 1;
};

// The log-softmax of `logits` after the params' penalties (over `history`) and logit bias, before
// temperature and the filters: the distribution the request's sampling starts from, whatever its
// temperature. Returns `token`'s logprob and the `top` (0..vocab) most likely tokens.
TokenLogprobs token_logprobs(std::span<const float> logits, const SamplingParams& params, const TokenHistory& history,
                             int32_t token, int top);

// Where a token is drawn: on the backend that computed its logits (only the token crosses back)
// when the draw reads nothing but the logits and its (seed, position) key; on the host, from
// copied logits, when it reads the history or bias (logits_only() is false) or when the caller
// must weigh the whole distribution (rejection sampling, a draft's q). The one rule every
// caller (the target's verify windows, a draft model's steps) follows.
inline bool draws_on_backend(const SamplingParams& params, bool weighs_distribution) {
  return params.logits_only() && !weighs_distribution;
}

// The SampleRow of history-free params (logits_only()) drawing at `position`; throws otherwise.
SampleRow sample_row(const SamplingParams& params, uint64_t position);
// The params a SampleRow stands for (the inverse of sample_row, position aside).
SamplingParams sampling_params(const SampleRow& row);
// Throws specdec::Error naming the field, as SamplingParams::validate does.
void validate(const SampleRow& row);
// sample(logits, params, {}, {}, row.position) for the params the row carries: the definition
// every Backend::sample implementation follows.
int32_t sample(std::span<const float> logits, const SampleRow& row);

// Helpers shared with the verifier.

// Index of the largest value; lowest index on ties. The span must not be empty.
int32_t argmax(std::span<const float> values);
// softmax in place over finite logits (-inf -> 0), with the sum taken in index order.
void softmax_in_place(std::span<float> logits);
// Inverse CDF over non-negative weights that need not sum to 1: the first token (in id order)
// whose cumulative weight exceeds u * total. Never returns a zero-weight token. Throws if every
// weight is zero.
int32_t sample_from_weights(std::span<const float> weights, float u);

}  // namespace specdec
