// Token logprobs in OpenAI's two shapes: chat's `logprobs.content[]` ({token, logprob, bytes,
// top_logprobs[]}) and the legacy completions' `logprobs` ({tokens, token_logprobs, top_logprobs,
// text_offset}). A token's text is its own decoded piece; one that is not valid UTF-8 on its own
// (a fragment of a character) is written as vLLM writes it, "bytes:\xNN...", with its raw bytes
// in `bytes`.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <vector>

#include "specdec/engine.h"

namespace specdec::server {

// {"content": [...], "refusal": null}
nlohmann::json chat_logprobs(const Engine& engine, const std::vector<TokenLogprob>& tokens);

// {"tokens", "token_logprobs", "top_logprobs", "text_offset"}; text_offset counts on from
// `offset` (the bytes of the choice's text before these tokens), which it advances.
nlohmann::json completion_logprobs(const Engine& engine, const std::vector<TokenLogprob>& tokens, size_t& offset);

// The echoed prompt in the completions shape, text_offset from 0: its first token (no context:
// null logprob and null top_logprobs, as OpenAI writes it), then the `scored` prompt tokens
// (GenerationResult::prompt_logprobs) with at most `top` alternatives each.
nlohmann::json echo_logprobs(const Engine& engine, int32_t first_token, const std::vector<TokenLogprob>& scored,
                             int top);

// `more` (the completion's logprobs object) appended to `into` (the echoed prompt's), field by field.
void append_logprobs(nlohmann::json& into, const nlohmann::json& more);

// vLLM's `prompt_logprobs`: null for the first prompt token, then per scored token an object
// {"<token id>": {"logprob", "rank", "decoded_token"}} holding the token and its `top` most
// likely alternatives (rank 1 = most likely).
nlohmann::json vllm_prompt_logprobs(const Engine& engine, const std::vector<TokenLogprob>& scored, int top);

}  // namespace specdec::server
