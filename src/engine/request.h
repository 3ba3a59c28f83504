// What a client asks of the engine and what it gets back: the request (prompt, sampling, stop
// criteria, speculative options), the streamed events and the final result with its figures.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "sampling/sampling.h"
#include "speculative/spec_options.h"
#include "speculative/telemetry.h"

namespace specdec {

struct StopCriteria {
  int max_tokens = 256;
  std::vector<int32_t> eos_ids;
  bool ignore_eos = false;
  std::vector<int32_t> stop_ids = {};  // end the request like EOS (not output), whatever ignore_eos says
  std::vector<std::string> stop_strings;  // generation ends before the first occurrence
};

enum class FinishReason { none, length, stop, eos, cancelled, error };
const char* finish_reason_name(FinishReason reason);

struct StreamEvent {
  int64_t id = 0;
  std::string text;               // new text (never a broken UTF-8 sequence)
  std::vector<int32_t> tokens;    // new tokens
  FinishReason finish = FinishReason::none;
  std::vector<TokenLogprobs> logprobs = {};  // when requested: one per new output token
  // On the request's first event, when it asked for prompt logprobs: Request::prompt_logprobs.
  std::vector<TokenLogprobs> prompt_logprobs = {};
};

struct Request {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  StopCriteria stop;
  SpecOptions spec;
  int logprobs = -1;  // -1: none; k >= 0: each output token's logprob and its position's top k
  // -1: none; k >= 0: the logprob and top k of each prompt token after the first (which has no
  // context), as token_logprobs defines them with the prompt before it as the history. Computed
  // from the prefill's logits, so such a request shares no cached prefix (it prefills it all).
  int prompt_logprobs = -1;
  std::function<void(const StreamEvent&)> on_event;  // called from the engine's thread
};

struct RequestStats {
  int prompt_tokens = 0;
  int generated_tokens = 0;
  bool context_full = false;  // finish length: the context ended before max_tokens
  double queue_seconds = 0;    // submit → admitted
  double prefill_seconds = 0;  // admitted → first token
  double decode_seconds = 0;   // first token → finished
  double ttft_seconds = 0;     // submit → first token
  SpecTelemetry speculative;   // empty when the request did not speculate
};

struct RequestResult {
  int64_t id = 0;
  std::vector<int32_t> tokens;  // generated tokens (the stop string's tokens included, text excludes it)
  std::vector<TokenLogprobs> logprobs;  // one per token, when requested
  // One per prompt token after the first, when requested.
  std::vector<TokenLogprobs> prompt_logprobs;
  std::string text;
  FinishReason finish = FinishReason::none;
  std::string error;  // when finish == error
  RequestStats stats;
};

}  // namespace specdec
