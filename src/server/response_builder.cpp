// The response JSON, field for field as OpenAI's API reference gives it, so that the official
// clients parse it unchanged.
#include "server/response_builder.h"

#include <chrono>
#include <random>

namespace specdec::server {

namespace {

using nlohmann::json;

std::string random_hex(int digits) {
  static constexpr char kHex[] = "0123456789abcdef";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string s;
  for (int i = 0; i < digits; ++i) s += kHex[rng() % 16];
  return s;
}

const char* object_name(Endpoint e, bool chunk) {
  if (e == Endpoint::chat) return chunk ? "chat.completion.chunk" : "chat.completion";
  return "text_completion";
}

json envelope(const ResponseHead& head, bool chunk) {
  return {{"id", head.id},
          {"object", object_name(head.endpoint, chunk)},
          {"created", head.created},
          {"model", head.model},
          {"system_fingerprint", nullptr}};
}

}  // namespace

ResponseHead response_head(Endpoint endpoint, std::string model) {
  ResponseHead h;
  h.endpoint = endpoint;
  h.id = (endpoint == Endpoint::chat ? "chatcmpl-" : "cmpl-") + random_hex(24);
  h.model = std::move(model);
  h.created =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  return h;
}

json finish_reason(Finish f) {
  switch (f) {
    case Finish::stop:
    case Finish::eos:
      return "stop";
    case Finish::length:
      return "length";
    case Finish::none:
      return nullptr;
    case Finish::cancelled:
      return "abort";
    case Finish::error:
      return "error";
  }
  return nullptr;
}

json usage(int prompt_tokens, int completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

json full_response(const ResponseHead& head, const std::vector<ChoiceOutput>& choices, int prompt_tokens,
                   int completion_tokens) {
  json j = envelope(head, false);
  json list = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    json c = {{"index", i}, {"logprobs", choices[i].logprobs}, {"finish_reason", finish_reason(choices[i].finish)}};
    if (head.endpoint == Endpoint::chat)
      c["message"] = {{"role", "assistant"}, {"content", choices[i].text}};
    else
      c["text"] = choices[i].text;
    if (!choices[i].prompt_logprobs.is_null()) c["prompt_logprobs"] = choices[i].prompt_logprobs;
    list.push_back(std::move(c));
  }
  j["choices"] = std::move(list);
  j["usage"] = usage(prompt_tokens, completion_tokens);
  return j;
}

json choice_chunk(const ResponseHead& head, int index, const std::string& text, Finish finish, bool role_delta,
                  bool include_usage, json logprobs) {
  json j = envelope(head, true);
  json c = {{"index", index}, {"logprobs", std::move(logprobs)}, {"finish_reason", finish_reason(finish)}};
  if (head.endpoint == Endpoint::chat) {
    json delta = json::object();
    if (role_delta) delta["role"] = "assistant";
    if (!text.empty() || role_delta) delta["content"] = text;
    c["delta"] = std::move(delta);
  } else {
    c["text"] = text;
  }
  j["choices"] = json::array({std::move(c)});
  if (include_usage) j["usage"] = nullptr;
  return j;
}

json usage_chunk(const ResponseHead& head, int prompt_tokens, int completion_tokens) {
  json j = envelope(head, true);
  j["choices"] = json::array();
  j["usage"] = usage(prompt_tokens, completion_tokens);
  return j;
}

std::string sse_data(const json& j) {
  // Invalid UTF-8 (a client's stop string cut mid-character) is replaced, not thrown on.
  return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

}  // namespace specdec::server
