// What a client submits to an Engine and what comes back: the request (prompt, sampling, stop
// criteria, speculative choice), the events streamed while it runs and the final result with its
// figures and speculative telemetry.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "specdec/options.h"

namespace specdec {

// Fields left unset take the model's generation_config.json defaults (sampling off unless it
// says do_sample).
struct SamplingOptions {
  std::optional<float> temperature;         // 0 = greedy
  std::optional<float> top_p;               // 1 = off
  std::optional<int> top_k;                 // 0 = off
  std::optional<float> min_p;               // 0 = off
  std::optional<float> repetition_penalty;  // 1 = off
  float presence_penalty = 0;
  float frequency_penalty = 0;
  // (token id, added to its logit, in [-100, 100]) before temperature and filters, wherever the
  // target's distribution is formed: plain and greedy steps and speculative verification alike.
  std::vector<std::pair<int32_t, float>> logit_bias = {};
  uint64_t seed = 0;

  // Throws std::runtime_error naming a set field outside its range, as submit would.
  void validate() const;
};

struct SpeculativeOptions {
  std::string draft;         // id of a draft method of the engine; empty = plain decoding
  int num_draft_tokens = 0;  // most drafts per round; 0 = the method's default
  bool adaptive = true;      // adapt the depth to measured acceptance and cost (in rejection mode, to
                             // acceptance at fixed prices, so seeded requests repeat); false = always the most
  VerifyMode mode = VerifyMode::exact;
};

enum class Finish { none, length, stop, eos, cancelled, error };
// "length", "stop" (a stop string or the end-of-sequence token), "cancelled", "error", "none".
std::string_view to_string(Finish finish);

// The log-probability of one generated token and of the most likely tokens at its position,
// from the target's distribution there: the log-softmax of its logits after the request's
// penalties and logit_bias, before temperature and the top-k/top-p/min-p filters (so the same
// numbers whether or not the token was drafted, and whatever the sampling temperature).
struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // the `logprobs` most likely, most likely first (ties: lower id)
  int rank = 1;                                // 1 + the number of tokens more likely than `token` there
};

struct GenerationEvent {
  int64_t request_id = 0;
  std::string text;              // new text (never a broken UTF-8 sequence)
  std::vector<int32_t> tokens;   // new tokens
  Finish finish = Finish::none;  // set on the request's last event
  // When the request asked for logprobs: one per new token that is part of the output (an
  // end-of-sequence or stop token that ended the request has none).
  std::vector<TokenLogprob> logprobs = {};
  // On the request's first event, when it asked for prompt_logprobs: GenerationResult's.
  std::vector<TokenLogprob> prompt_logprobs = {};
};

struct GenerationRequest {
  std::string prompt;                  // text, encoded with the model's tokenizer (special tokens parsed)
  std::vector<int32_t> prompt_tokens;  // or the prompt as token ids (then `prompt` stays empty)
  int max_tokens = 128;
  SamplingOptions sampling;
  std::vector<std::string> stop;  // generation ends before the first occurrence
  // Tokens that end the request like the end-of-sequence token (not part of the output), e.g. a
  // chat template's end-of-turn token; ignore_eos does not apply to them.
  std::vector<int32_t> stop_token_ids = {};
  bool ignore_eos = false;
  // Unset: no logprobs. k in [0, 20]: each output token's logprob and its position's k most
  // likely tokens (TokenLogprob). Such a request draws its tokens on the host.
  std::optional<int> logprobs;
  // Unset: none. k in [0, 20]: the logprob of each prompt token after the first (which has no
  // context) and its position's k most likely tokens, as TokenLogprob defines them with the
  // prompt before the token as the history (so presence and frequency penalties, which count
  // generated tokens, do not apply; repetition_penalty and logit_bias do). Prompt P + C scores C
  // as generating C from P does. They come from the prefill, so such a request shares no cached
  // prompt prefix: it prefills the whole prompt (in chunks, as any prompt).
  std::optional<int> prompt_logprobs;
  SpeculativeOptions speculative;
  // Called on the engine's loop thread: keep it short, and do not submit or wait from it
  // (cancel is fine). If it throws, its request ends as cancelled.
  std::function<void(const GenerationEvent&)> on_event;
};

// Counters of one request's speculative rounds (see Engine for what a round is).
struct SpeculativeStats {
  std::string draft;     // the draft method's id
  int64_t drafted = 0;   // draft tokens proposed
  int64_t accepted = 0;  // draft tokens accepted
  int64_t rounds = 0;    // verify rounds (a round with no drafts is a plain step)
  int64_t emitted = 0;   // tokens emitted: accepted drafts plus one per round
  int64_t target_forwards = 0;
  std::vector<int64_t> drafted_at;   // [i]: rounds that proposed a draft at window position i
  std::vector<int64_t> accepted_at;  // [i]: rounds that accepted it
  double draft_seconds = 0;
  double verify_seconds = 0;

  double acceptance_rate() const;       // accepted / drafted
  double mean_accepted_length() const;  // emitted / rounds
  std::string to_json() const;          // the engine's telemetry record, as one JSON object
};

struct GenerationStats {
  int prompt_tokens = 0;
  int generated_tokens = 0;
  // Finish "length" came from the end of the model's context, before the request's max_tokens.
  bool context_full = false;
  double queue_seconds = 0;                     // submit → admitted
  double prefill_seconds = 0;                   // admitted → first token
  double decode_seconds = 0;                    // first token → finished
  double ttft_seconds = 0;                      // submit → first token
  std::optional<SpeculativeStats> speculative;  // set when the request named a draft method

  double prefill_tokens_per_s() const;  // prompt tokens / prefill seconds
  double decode_tokens_per_s() const;   // tokens after the first / decode seconds
};

struct GenerationResult {
  int64_t request_id = 0;
  std::string text;  // a stop string that ended the request is not included
  std::vector<int32_t> tokens;
  std::vector<TokenLogprob> logprobs;  // one per token, when the request asked for logprobs
  // prompt tokens - 1 entries, for prompt tokens 1.., when the request asked for prompt_logprobs
  std::vector<TokenLogprob> prompt_logprobs;
  Finish finish = Finish::none;
  std::string error;  // when finish == Finish::error
  GenerationStats stats;
};

}  // namespace specdec
