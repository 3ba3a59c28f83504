// Tokenizer: loading tokenizer.json and the encode/decode pipelines. Encoding runs, in order,
// added-token extraction on the raw text, the normaliser, extraction of normalized added tokens,
// the pre-tokeniser and the BPE model; decoding maps ids to token strings and runs the decoder.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/json_util.h"
#include "tokenizer/tokenizer_state.h"
#include "tokenizer/utf8.h"

namespace specdec {
namespace {

std::unique_ptr<Bpe> make_model(const nlohmann::json& spec, const std::string& where) {
  SPECDEC_CHECK(spec.is_object(), where, ": field \"model\" must be an object");
  std::string type = "BPE";  // older files omit the type; only BPE has merges
  if (auto it = spec.find("type"); it != spec.end()) {
    SPECDEC_CHECK(it->is_string(), where, ": model.type must be a string");
    type = it->get<std::string>();
  } else {
    SPECDEC_CHECK(spec.contains("merges"), where, ": model has no \"type\" and is not a BPE model");
  }
  if (type != "BPE") fail(where, ": unsupported model type '", type, "' (only BPE is supported)");
  return std::make_unique<Bpe>(spec, where);
}

const nlohmann::json& field_or_null(const nlohmann::json& root, const char* key) {
  static const nlohmann::json null_value;
  auto it = root.find(key);
  return it == root.end() ? null_value : *it;
}

// Runs normaliser, pre-tokeniser and model on one segment of text between added tokens.
void encode_text(const TokenizerState& s, std::string_view text, bool at_start, bool parse_special,
                 std::vector<int32_t>& out) {
  std::string normalized(text);
  if (s.normalizer) s.normalizer->normalize(normalized);
  std::vector<Segment> parts;
  if (s.added.has_normalized()) {
    parts = s.added.split(normalized, /*normalized_pass=*/true, parse_special);
  } else if (!normalized.empty()) {
    parts.push_back({0, normalized.size(), -1});
  }
  std::vector<Piece> pieces;
  for (const Segment& part : parts) {
    if (part.id >= 0) {
      out.push_back(part.id);
      continue;
    }
    pieces.clear();
    pieces.push_back({normalized.substr(part.begin, part.end - part.begin), at_start && part.begin == 0});
    if (s.pre_tokenizer) s.pre_tokenizer->pre_tokenize(pieces);
    for (const Piece& p : pieces) s.model->tokenize(p.text, out);
  }
}

}  // namespace

Tokenizer Tokenizer::load(const std::filesystem::path& dir_or_json) {
  std::error_code ec;
  const bool is_dir = std::filesystem::is_directory(dir_or_json, ec);
  const auto json_path = is_dir ? dir_or_json / "tokenizer.json" : dir_or_json;
  const nlohmann::json root = read_json_file(json_path);
  const std::string where = json_path.string();
  SPECDEC_CHECK(root.is_object(), where, ": top level must be an object");

  auto state = std::make_shared<TokenizerState>();
  state->source = where;
  auto model = root.find("model");
  SPECDEC_CHECK(model != root.end(), where, ": missing field \"model\"");
  state->model = make_model(*model, where);
  state->normalizer = make_normalizer(field_or_null(root, "normalizer"), where);
  state->pre_tokenizer = make_pre_tokenizer(field_or_null(root, "pre_tokenizer"), where);
  state->decoder = make_decoder(field_or_null(root, "decoder"), where);
  state->added = AddedVocabulary(field_or_null(root, "added_tokens"), where);

  state->vocab_size = state->model->id_end();
  const int64_t bound = max_token_id(state->model->id_end() + static_cast<int64_t>(state->added.tokens().size()));
  for (const AddedToken& t : state->added.tokens()) {
    SPECDEC_CHECK(t.id <= bound, where, ": added token '", t.content, "' has id ", t.id, ", far beyond the ",
                  state->model->id_end(), " ids of the vocabulary and its ", state->added.tokens().size(),
                  " added tokens (at most ", bound, ")");
    state->vocab_size = std::max(state->vocab_size, t.id + 1);
    if (t.special) state->special_ids.push_back(t.id);
  }
  std::sort(state->special_ids.begin(), state->special_ids.end());
  state->special_ids.erase(std::unique(state->special_ids.begin(), state->special_ids.end()), state->special_ids.end());

  load_tokenizer_config(*state, json_path.parent_path());
  return Tokenizer(std::move(state));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  const TokenizerState& s = *state_;
  if (auto bad = utf8::first_invalid(text)) fail("tokenizer encode: input is not valid UTF-8 at byte ", *bad);
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  for (const Segment& seg : s.added.split(text, /*normalized_pass=*/false, parse_special)) {
    if (seg.id >= 0) {
      out.push_back(seg.id);
    } else {
      encode_text(s, text.substr(seg.begin, seg.end - seg.begin), seg.begin == 0, parse_special, out);
    }
  }
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  const TokenizerState& s = *state_;
  // The token strings to decode: unknown ids vanish, as in the library.
  const auto token_of = [&](int32_t id) -> const std::string* {
    const AddedToken* added = s.added.by_id(id);
    const std::string* token = added ? &added->content : s.model->id_to_token(id);
    return token && !(skip_special && s.added.is_special_content(*token)) ? token : nullptr;
  };
  // A decoder that only concatenates the tokens' bytes (ByteLevel) needs no list of strings: an
  // engine's stream decodes every new token this way, twice.
  if (s.decoder && s.decoder->concatenates_bytes()) {
    std::string bytes;
    for (int32_t id : ids)
      if (const std::string* token = token_of(id)) s.decoder->append_token_bytes(*token, bytes);
    return utf8::from_bytes_lossy(bytes);
  }
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids)
    if (const std::string* token = token_of(id)) tokens.push_back(*token);
  if (s.decoder) {
    s.decoder->decode_chain(tokens);
    std::string out;
    for (const auto& t : tokens) out += t;
    return out;
  }
  std::string out;  // no decoder: the library joins tokens with spaces
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i > 0) out.push_back(' ');
    out += tokens[i];
  }
  return out;
}

int32_t Tokenizer::vocab_size() const { return state_->vocab_size; }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (const AddedToken* t = state_->added.by_content(token)) return t->id;
  return state_->model->token_to_id(token);
}

std::string Tokenizer::id_to_token(int32_t id) const {
  if (const AddedToken* t = state_->added.by_id(id)) return t->content;
  if (const std::string* token = state_->model->id_to_token(id)) return *token;
  fail("tokenizer ", state_->source, ": id ", id, " is not in the vocabulary (size ", state_->vocab_size, ")");
}

bool Tokenizer::is_special(int32_t id) const {
  const AddedToken* t = state_->added.by_id(id);
  return t != nullptr && t->special;
}

std::optional<int32_t> Tokenizer::eos_id() const { return state_->eos_id; }
std::optional<int32_t> Tokenizer::bos_id() const { return state_->bos_id; }
const std::string& Tokenizer::chat_template() const { return state_->chat_template; }
std::vector<int32_t> Tokenizer::special_ids() const { return state_->special_ids; }

}  // namespace specdec
