// A /v1/completions or /v1/chat/completions body read and checked into typed options: every field
// OpenAI (and vLLM's extensions) define that specdec honours, each bad one a 400 naming it. What
// needs the loaded engine (token counts, the context, the draft methods) is checked later, when
// the request is planned (generation_plan.h).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "server/server_options.h"
#include "specdec/request.h"

namespace specdec::server {

enum class Endpoint { completions, chat };

struct Prompt {
  std::string text;             // a text prompt (the rendered conversation for chat)
  std::vector<int32_t> tokens;  // or token ids (completions only)
};

struct CompletionRequest {
  Endpoint endpoint = Endpoint::completions;
  std::string model;            // empty when the client named none
  std::vector<Prompt> prompts;  // chat: exactly one
  int n = 1;                    // choices per prompt
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool echo = false;           // completions: the prompt's text precedes each choice's
  std::optional<int> max_tokens;
  SamplingOptions sampling;
  bool seeded = false;  // the client gave `seed` (else each request draws one)
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;  // vLLM's extension: tokens that end a choice like EOS
  bool ignore_eos = false;
  // Chat: `logprobs` true gives top_logprobs (default 0) alternatives; completions: `logprobs`
  // is that number. Unset: no logprobs.
  std::optional<int> logprobs;
  // Completions, vLLM's extension: each prompt token's logprob and this many alternatives, in the
  // choice's `prompt_logprobs`. Unset: none. (`echo` with `logprobs` scores the prompt too.)
  std::optional<int> prompt_logprobs;
  std::optional<std::string> spec_method;  // speculative.method: none, ngram or draft
  std::optional<int> num_draft_tokens;     // speculative.num_draft_tokens
};

// Throws ApiError (400) naming the first invalid field. `render` turns chat messages into the
// prompt; without one a chat request is a 400.
CompletionRequest parse_completion_request(const nlohmann::json& body, Endpoint endpoint, const PromptRenderer& render);

}  // namespace specdec::server
