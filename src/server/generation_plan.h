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
// `end_of_turn`: the chat template's end-of-turn tokens, which end a chat choice.
GenerationPlan plan_generation(const CompletionRequest& request, const Engine& engine, const ServerOptions& options,
                               const std::vector<int32_t>& end_of_turn);

// The tokens a chat template closes an assistant turn with, when they are special tokens of the
// tokenizer (ChatML's <|im_end|>, Llama 3's <|eot_id|>, Gemma's <end_of_turn>, ...): found by
// rendering a probe conversation and reading what follows the assistant's text, as llama-server
// and vLLM stop at the template's end-of-turn rather than only the model's EOS. Empty when the
// template closes turns with plain text, or refuses the probe.
std::vector<int32_t> end_of_turn_tokens(const PromptRenderer& render, const Engine& engine);

}  // namespace specdec::server
