// parse_completion_request: the body's fields, one reader per concern (prompt, messages, sampling,
// stream, speculative, logit bias, logprobs), each naming the field it rejects.
#include "server/completion_request.h"

#include <algorithm>
#include <limits>

#include "server/api_error.h"
#include "server/request_fields.h"

namespace specdec::server {

namespace {

using nlohmann::json;

constexpr int kMaxChoices = 128;
constexpr int kMaxTopLogprobs = 20;  // OpenAI's limit on top_logprobs

std::vector<int32_t> token_ids(const json& a, const std::string& bad) {
  std::vector<int32_t> ids;
  for (const json& t : a) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > std::numeric_limits<int32_t>::max())
      throw invalid_field("prompt", bad);
    ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return ids;
}

// A string, an array of strings, an array of token ids, or an array of token id arrays.
std::vector<Prompt> read_prompts(const json& body) {
  const std::string bad =
      "'prompt' must be a string, an array of strings, an array of token ids or an array of token id arrays";
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) throw invalid_field("prompt", "'prompt' is required");
  std::vector<Prompt> prompts;
  if (it->is_string()) {
    prompts.push_back({it->get<std::string>(), {}});
  } else if (it->is_array() && !it->empty() && (*it)[0].is_number()) {
    prompts.push_back({{}, token_ids(*it, bad)});
  } else if (it->is_array()) {
    for (const json& p : *it) {
      if (p.is_string())
        prompts.push_back({p.get<std::string>(), {}});
      else if (p.is_array())
        prompts.push_back({{}, token_ids(p, bad)});
      else
        throw invalid_field("prompt", bad);
    }
  } else {
    throw invalid_field("prompt", bad);
  }
  if (prompts.empty()) throw invalid_field("prompt", "'prompt' must not be empty");
  for (const Prompt& p : prompts)
    if (p.text.empty() && p.tokens.empty()) throw invalid_field("prompt", "'prompt' must not be empty");
  return prompts;
}

// Content as a string, or an array of {"type": "text", "text": ...} parts joined.
std::string message_content(const json& content, const std::string& name) {
  if (content.is_string()) return content.get<std::string>();
  const std::string bad = "'" + name + "' must be a string or an array of text parts";
  if (!content.is_array()) throw invalid_field(name, bad);
  std::string text;
  for (const json& part : content) {
    // Each field's type is checked before it is read: json::value throws on a non-string "type".
    if (!part.is_object()) throw invalid_field(name, bad);
    const auto type = part.find("type");
    const auto value = part.find("text");
    if (type == part.end() || !type->is_string() || *type != "text" || value == part.end() || !value->is_string())
      throw invalid_field(name, bad);
    text += value->get<std::string>();
  }
  return text;
}

// The messages normalized for the renderer: role and content strings (plus any other fields).
json read_messages(const json& body) {
  auto it = body.find("messages");
  if (it == body.end() || it->is_null()) throw invalid_field("messages", "'messages' is required");
  if (!it->is_array() || it->empty()) throw invalid_field("messages", "'messages' must be a non-empty array");
  json messages = json::array();
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string name = "messages[" + std::to_string(i) + "]";
    if (!m.is_object() || !m.contains("role"))
      throw invalid_field(name, "'" + name + "' must be an object with a 'role'");
    const json& role = m["role"];
    static const std::vector<std::string> kRoles{"system", "user", "assistant", "tool", "developer"};
    if (!role.is_string() || std::find(kRoles.begin(), kRoles.end(), role.get<std::string>()) == kRoles.end())
      throw invalid_field(name + ".role",
                          "'" + name + ".role' must be one of system, user, assistant, tool, developer");
    json out = m;
    const bool absent = !m.contains("content") || m["content"].is_null();
    // An assistant turn may carry no content (a tool call); every other turn must say something.
    if (absent && role != "assistant") throw invalid_field(name + ".content", "'" + name + ".content' is required");
    out["content"] = absent ? std::string() : message_content(m["content"], name + ".content");
    messages.push_back(std::move(out));
  }
  return messages;
}

Prompt chat_prompt(const json& body, const PromptRenderer& render) {
  json messages = read_messages(body);
  if (!render) throw ApiError(400, "this model has no chat template", "invalid_request_error", "messages");
  try {
    return {render(messages, true), {}};
  } catch (const std::exception& e) {
    throw invalid_field("messages", std::string("the chat template failed: ") + e.what());
  }
}

void read_sampling(const json& body, CompletionRequest& r) {
  SamplingOptions& s = r.sampling;
  if (auto v = read_number(body, "temperature", 0, 2)) s.temperature = static_cast<float>(*v);
  if (auto v = read_number(body, "top_p", 0, 1)) {
    if (*v <= 0) throw invalid_field("top_p", "'top_p' must be greater than 0, got " + body["top_p"].dump());
    s.top_p = static_cast<float>(*v);
  }
  // vLLM's extensions: top_k -1 (or 0) is off.
  if (auto v = read_int(body, "top_k", -1, std::numeric_limits<int32_t>::max())) s.top_k = *v < 0 ? 0 : int(*v);
  if (auto v = read_number(body, "min_p", 0, 1)) s.min_p = static_cast<float>(*v);
  if (auto v = read_number(body, "repetition_penalty", 0, 100)) {
    if (*v <= 0)
      throw invalid_field("repetition_penalty",
                          "'repetition_penalty' must be greater than 0, got " + body["repetition_penalty"].dump());
    s.repetition_penalty = static_cast<float>(*v);
  }
  if (auto v = read_number(body, "presence_penalty", -2, 2)) s.presence_penalty = static_cast<float>(*v);
  if (auto v = read_number(body, "frequency_penalty", -2, 2)) s.frequency_penalty = static_cast<float>(*v);
  if (auto v = read_int(body, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max())) {
    s.seed = static_cast<uint64_t>(*v);  // a negative seed keeps its bits: any int64 is a seed
    r.seeded = true;
  }
}

void read_stream(const json& body, CompletionRequest& r) {
  r.stream = read_bool(body, "stream").value_or(false);
  auto it = body.find("stream_options");
  if (it == body.end() || it->is_null()) return;
  if (!r.stream) throw invalid_field("stream_options", "'stream_options' is only allowed when 'stream' is true");
  if (!it->is_object()) throw invalid_field("stream_options", "'stream_options' must be an object");
  auto u = it->find("include_usage");
  if (u == it->end() || u->is_null()) return;
  if (!u->is_boolean())
    throw invalid_field("stream_options.include_usage", "'stream_options.include_usage' must be a boolean");
  r.include_usage = u->get<bool>();
}

void read_speculative(const json& body, CompletionRequest& r) {
  auto it = body.find("speculative");
  if (it == body.end() || it->is_null()) return;
  if (!it->is_object()) throw invalid_field("speculative", "'speculative' must be an object");
  auto m = it->find("method");
  if (m != it->end() && !m->is_null()) {
    if (!m->is_string() || (*m != "none" && *m != "ngram" && *m != "draft"))
      throw invalid_field("speculative.method", "'speculative.method' must be one of none, ngram, draft");
    r.spec_method = m->get<std::string>();
  }
  auto k = it->find("num_draft_tokens");
  if (k != it->end() && !k->is_null()) {
    if (!k->is_number_integer() || k->get<int64_t>() < 1 || k->get<int64_t>() > 64)
      throw invalid_field("speculative.num_draft_tokens",
                          "'speculative.num_draft_tokens' must be an integer between 1 and 64");
    r.num_draft_tokens = k->get<int>();
  }
}

// {"token id": bias}: OpenAI's shape, keys are token ids written as strings.
void read_logit_bias(const json& body, CompletionRequest& r) {
  auto it = body.find("logit_bias");
  if (it == body.end() || it->is_null()) return;
  if (!it->is_object()) throw invalid_field("logit_bias", "'logit_bias' must be an object of token id: bias");
  for (const auto& [key, value] : it->items()) {
    int64_t id = -1;
    try {
      size_t used = 0;
      id = std::stoll(key, &used);
      if (used != key.size()) id = -1;
    } catch (const std::exception&) {
      id = -1;
    }
    if (id < 0 || id > std::numeric_limits<int32_t>::max())
      throw invalid_field("logit_bias", "'logit_bias' keys must be token ids, got '" + key + "'");
    if (!value.is_number() || !(value.get<double>() >= -100 && value.get<double>() <= 100))
      throw invalid_field("logit_bias", "'logit_bias' values must be numbers from -100 to 100, got " + value.dump() +
                                            " for token " + key);
    r.sampling.logit_bias.emplace_back(static_cast<int32_t>(id), value.get<float>());
  }
}

// Chat: logprobs (bool) + top_logprobs (0..20); completions: logprobs (0..20), with echo also the
// prompt's, and vLLM's prompt_logprobs (0..20).
void read_logprobs(const json& body, CompletionRequest& r) {
  if (r.endpoint == Endpoint::chat) {
    if (auto it = body.find("prompt_logprobs"); it != body.end() && !it->is_null())
      throw invalid_field("prompt_logprobs", "'prompt_logprobs' is supported on /v1/completions only");
    const bool on = read_bool(body, "logprobs").value_or(false);
    const std::optional<int64_t> top = read_int(body, "top_logprobs", 0, kMaxTopLogprobs);
    if (top && !on) throw invalid_field("top_logprobs", "'top_logprobs' needs 'logprobs' set to true");
    if (on) r.logprobs = static_cast<int>(top.value_or(0));
    return;
  }
  if (auto v = read_int(body, "logprobs", 0, kMaxTopLogprobs)) r.logprobs = static_cast<int>(*v);
  if (auto v = read_int(body, "prompt_logprobs", 0, kMaxTopLogprobs)) r.prompt_logprobs = static_cast<int>(*v);
}

std::vector<int32_t> read_stop_token_ids(const json& body) {
  auto it = body.find("stop_token_ids");
  if (it == body.end() || it->is_null()) return {};
  const std::string bad = "'stop_token_ids' must be an array of token ids";
  if (!it->is_array()) throw invalid_field("stop_token_ids", bad);
  std::vector<int32_t> ids;
  for (const json& t : *it) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > std::numeric_limits<int32_t>::max())
      throw invalid_field("stop_token_ids", bad);
    ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return ids;
}

}  // namespace

CompletionRequest parse_completion_request(const json& body, Endpoint endpoint, const PromptRenderer& render) {
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object", "invalid_request_error");
  CompletionRequest r;
  r.endpoint = endpoint;
  r.model = read_string(body, "model").value_or("");
  r.prompts = endpoint == Endpoint::chat ? std::vector<Prompt>{chat_prompt(body, render)} : read_prompts(body);
  r.n = static_cast<int>(read_int(body, "n", 1, kMaxChoices).value_or(1));
  read_stream(body, r);
  if (endpoint == Endpoint::completions) r.echo = read_bool(body, "echo").value_or(false);
  const int64_t kMaxInt = std::numeric_limits<int32_t>::max();
  if (auto v = read_int(body, "max_tokens", 1, kMaxInt)) r.max_tokens = static_cast<int>(*v);
  if (auto v = read_int(body, "max_completion_tokens", 1, kMaxInt)) r.max_tokens = static_cast<int>(*v);
  read_sampling(body, r);
  r.stop = read_stop(body, "stop");
  r.stop_token_ids = read_stop_token_ids(body);
  r.ignore_eos = read_bool(body, "ignore_eos").value_or(false);
  read_speculative(body, r);
  read_logit_bias(body, r);
  read_logprobs(body, r);
  read_string(body, "user");  // accepted and ignored, but it must be a string
  return r;
}

}  // namespace specdec::server
