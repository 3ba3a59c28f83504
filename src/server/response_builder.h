// OpenAI's response shapes: a whole completion or chat completion, the chunks of a streamed one
// (SSE `data:` lines), usage and finish reasons, for both endpoints from one set of functions.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "server/completion_request.h"
#include "specdec/request.h"

namespace specdec::server {

struct ResponseHead {
  Endpoint endpoint = Endpoint::completions;
  std::string id;  // cmpl-… or chatcmpl-…
  std::string model;
  int64_t created = 0;  // Unix seconds
};

ResponseHead response_head(Endpoint endpoint, std::string model);

struct ChoiceOutput {
  std::string text;
  Finish finish = Finish::none;
  nlohmann::json logprobs;         // null, or the endpoint's logprobs object (logprobs_json.h)
  nlohmann::json prompt_logprobs;  // completions, when asked for: vLLM's prompt_logprobs list
};

// "stop" (a stop string or the end of sequence), "length"; null while running.
nlohmann::json finish_reason(Finish finish);
nlohmann::json usage(int prompt_tokens, int completion_tokens);
nlohmann::json full_response(const ResponseHead& head, const std::vector<ChoiceOutput>& choices, int prompt_tokens,
                             int completion_tokens);

// A streamed chunk for one choice. Chat: `role_delta` sends the assistant role (the first chunk);
// finish set: the closing chunk (an empty delta for chat). include_usage: "usage": null as OpenAI
// puts on every chunk but the last one.
nlohmann::json choice_chunk(const ResponseHead& head, int index, const std::string& text, Finish finish,
                            bool role_delta, bool include_usage, nlohmann::json logprobs = nullptr);
nlohmann::json usage_chunk(const ResponseHead& head, int prompt_tokens, int completion_tokens);

// One server-sent event: "data: <json>\n\n".
std::string sse_data(const nlohmann::json& j);
inline constexpr const char* kSseDone = "data: [DONE]\n\n";

}  // namespace specdec::server
