// A checked CompletionRequest made into the engine's requests: prompts tokenized, max_tokens
// defaulted and checked against the context, the speculative choice narrowed from the server's,
// one GenerationRequest per (prompt, choice).
#pragma once

#include <string>
#include <vector>

#include "server/completion_request.h"
#include "server/server_options.h"
#include "specdec/engine.h"

namespace specdec::server {

struct PlannedChoice {
  GenerationRequest request;  // prompt_tokens set, on_event left to the caller
  int prompt_index = 0;
  std::string prompt_text;  // for echo: the prompt as text
};

struct GenerationPlan {
  std::vector<PlannedChoice> choices;  // index = prompt_index * n + choice
  int prompt_tokens = 0;               // over all prompts (each counted once, as OpenAI's usage does)
};

// Throws ApiError: 400 for a prompt that does not fit the context with its max_tokens, a token id
// outside the vocabulary, or a speculative method the server was not started with.
GenerationPlan plan_generation(const CompletionRequest& request, const Engine& engine, const ServerOptions& options);

}  // namespace specdec::server
