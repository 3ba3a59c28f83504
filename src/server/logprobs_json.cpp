// Logprobs JSON: one token's text and bytes, then the two response shapes built from them.
#include "server/logprobs_json.h"

#include <algorithm>
#include <cstdio>
#include <string>

namespace specdec::server {

namespace {

using nlohmann::json;

bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t j = 1; j < n; ++j)
      if ((static_cast<unsigned char>(s[i + j]) >> 6) != 0x2) return false;
    i += n;
  }
  return true;
}

struct Piece {
  std::string text;  // what `token` says
  json bytes;        // the raw bytes, as integers
  size_t size = 0;   // bytes the token adds to the text
};

Piece piece(const Engine& engine, int32_t id) {
  const std::string raw = engine.decode({id}, false);
  Piece p;
  p.bytes = json::array();
  for (char c : raw) p.bytes.push_back(static_cast<unsigned char>(c));
  p.size = raw.size();
  if (valid_utf8(raw)) {
    p.text = raw;
    return p;
  }
  p.text = "bytes:";
  for (char c : raw) {
    char hex[5];
    std::snprintf(hex, sizeof hex, "\\x%02x", static_cast<unsigned char>(c));
    p.text += hex;
  }
  return p;
}

}  // namespace

json chat_logprobs(const Engine& engine, const std::vector<TokenLogprob>& tokens) {
  json content = json::array();
  for (const TokenLogprob& t : tokens) {
    const Piece p = piece(engine, t.token);
    json top = json::array();
    for (const auto& [id, logprob] : t.top) {
      const Piece alt = piece(engine, id);
      top.push_back({{"token", alt.text}, {"logprob", logprob}, {"bytes", alt.bytes}});
    }
    content.push_back({{"token", p.text}, {"logprob", t.logprob}, {"bytes", p.bytes}, {"top_logprobs", top}});
  }
  return {{"content", content}, {"refusal", nullptr}};
}

json completion_logprobs(const Engine& engine, const std::vector<TokenLogprob>& tokens, size_t& offset) {
  json out = {{"tokens", json::array()},
              {"token_logprobs", json::array()},
              {"top_logprobs", json::array()},
              {"text_offset", json::array()}};
  for (const TokenLogprob& t : tokens) {
    const Piece p = piece(engine, t.token);
    out["tokens"].push_back(p.text);
    out["token_logprobs"].push_back(t.logprob);
    json top = json::object();
    for (const auto& [id, logprob] : t.top) top[piece(engine, id).text] = logprob;
    out["top_logprobs"].push_back(top);
    out["text_offset"].push_back(offset);
    offset += p.size;
  }
  return out;
}

json echo_logprobs(const Engine& engine, int32_t first_token, const std::vector<TokenLogprob>& scored, int top) {
  size_t offset = 0;
  const Piece first = piece(engine, first_token);
  json out = {{"tokens", json::array({first.text})},
              {"token_logprobs", json::array({nullptr})},
              {"top_logprobs", json::array({nullptr})},
              {"text_offset", json::array({offset})}};
  offset += first.size;
  std::vector<TokenLogprob> cut = scored;
  for (TokenLogprob& t : cut) t.top.resize(std::min(t.top.size(), static_cast<size_t>(std::max(top, 0))));
  append_logprobs(out, completion_logprobs(engine, cut, offset));
  return out;
}

void append_logprobs(json& into, const json& more) {
  for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
    for (const json& v : more.at(key)) into.at(key).push_back(v);
}

json vllm_prompt_logprobs(const Engine& engine, const std::vector<TokenLogprob>& scored, int top) {
  json out = json::array({nullptr});
  for (const TokenLogprob& t : scored) {
    json entry = json::object();
    const size_t k = std::min(t.top.size(), static_cast<size_t>(std::max(top, 0)));
    for (size_t i = 0; i < k; ++i) {
      const auto& [id, logprob] = t.top[i];
      entry[std::to_string(id)] = {
          {"logprob", logprob}, {"rank", static_cast<int>(i) + 1}, {"decoded_token", piece(engine, id).text}};
    }
    entry[std::to_string(t.token)] = {
        {"logprob", t.logprob}, {"rank", t.rank}, {"decoded_token", piece(engine, t.token).text}};
    out.push_back(std::move(entry));
  }
  return out;
}

}  // namespace specdec::server
