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

}  // namespace specdec::server
