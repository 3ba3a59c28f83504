// Added-token matching (see added_tokens.h). The library builds an Aho-Corasick automaton in
// leftmost-longest mode; a byte trie walked from each position gives the same matches.
#include "tokenizer/added_tokens.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/json_util.h"
#include "tokenizer/utf8.h"

namespace specdec {

void AddedVocabulary::Trie::insert(std::string_view key, size_t token_index) {
  if (!key.empty()) first_byte_[static_cast<unsigned char>(key[0])] = true;
  int32_t node = 0;
  for (char c : key) {
    const uint64_t edge = (static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(c);
    auto it = edges_.find(edge);
    if (it == edges_.end()) {
      const auto child = static_cast<int32_t>(terminal_.size());
      terminal_.push_back(-1);
      it = edges_.emplace(edge, child).first;
    }
    node = it->second;
  }
  // The first token listed with a given content wins, like the library's map.
  if (terminal_[static_cast<size_t>(node)] < 0) terminal_[static_cast<size_t>(node)] = static_cast<int64_t>(token_index);
  ++count_;
}

void AddedVocabulary::Trie::prefixes(std::string_view text, size_t pos, std::vector<size_t>& out) const {
  if (pos >= text.size() || !first_byte_[static_cast<unsigned char>(text[pos])]) return;
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    const uint64_t edge = (static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(text[i]);
    auto it = edges_.find(edge);
    if (it == edges_.end()) return;
    node = it->second;
    if (terminal_[static_cast<size_t>(node)] >= 0) out.push_back(static_cast<size_t>(terminal_[static_cast<size_t>(node)]));
  }
}

AddedVocabulary::AddedVocabulary(const nlohmann::json& added_tokens, const std::string& where) {
  word_end_ = std::make_shared<const Regex>(R"(\w$)", where);
  word_start_ = std::make_shared<const Regex>(R"(^\w)", where);
  if (added_tokens.is_null()) return;
  SPECDEC_CHECK(added_tokens.is_array(), where, ": added_tokens must be an array");
  for (const auto& t : added_tokens) {
    SPECDEC_CHECK(t.is_object(), where, ": added_tokens entries must be objects");
    AddedToken tok;
    const int64_t id = json_int(t, "id", where, -1);
    SPECDEC_CHECK(id >= 0 && id < INT32_MAX, where, ": added token without a valid \"id\"");
    tok.id = static_cast<int32_t>(id);
    tok.content = json_string(t, "content", where);
    SPECDEC_CHECK(!utf8::first_invalid(tok.content), where, ": added token ", id, " is not valid UTF-8");
    tok.single_word = json_bool(t, "single_word", where, false);
    tok.lstrip = json_bool(t, "lstrip", where, false);
    tok.rstrip = json_bool(t, "rstrip", where, false);
    tok.special = json_bool(t, "special", where, false);
    tok.normalized = json_bool(t, "normalized", where, !tok.special);
    if (tok.content.empty()) continue;  // the library ignores empty tokens
    const size_t index = tokens_.size();
    tokens_.push_back(tok);
    by_id_[tok.id] = index;
    by_content_.emplace(tok.content, index);
  }
  // The library lists special tokens before the others in its matcher; with leftmost-longest
  // matching the order only matters for identical contents, where the first listed wins.
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < tokens_.size(); ++i) {
      const AddedToken& t = tokens_[i];
      if (t.special != (pass == 0)) continue;
      (t.normalized ? normalized_ : raw_).insert(t.content, i);
    }
  }
}

const AddedToken* AddedVocabulary::by_id(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

const AddedToken* AddedVocabulary::by_content(std::string_view content) const {
  auto it = by_content_.find(content);
  return it == by_content_.end() ? nullptr : &tokens_[it->second];
}

bool AddedVocabulary::is_special_content(std::string_view content) const {
  const AddedToken* t = by_content(content);
  return t != nullptr && t->special;
}

std::vector<Segment> AddedVocabulary::split(std::string_view text, bool normalized_pass, bool with_special) const {
  const Trie& trie = normalized_pass ? normalized_ : raw_;
  std::vector<Segment> out;
  if (trie.root_count() == 0 || text.empty()) {
    if (!text.empty()) out.push_back({0, text.size(), -1});
    return out;
  }
  std::vector<size_t> candidates;
  size_t start_offset = 0;  // end of the previous match
  size_t pos = 0;
  while (pos < text.size()) {
    candidates.clear();
    trie.prefixes(text, pos, candidates);
    if (candidates.empty()) {
      ++pos;
      continue;
    }
    // Leftmost-longest. A match the caller excludes (a special token when special tokens are
    // not parsed) is still consumed as plain text, as in the library.
    const AddedToken* hit = &tokens_[candidates.back()];
    size_t start = pos;
    size_t stop = pos + hit->content.size();
    if (hit->special && !with_special) {
      pos = stop;
      continue;
    }
    if (hit->single_word) {
      const bool start_space = start == 0 || !word_end_->search(text.substr(0, start));
      const bool stop_space = stop == text.size() || !word_start_->search(text.substr(stop));
      if (!start_space || !stop_space) {
        // Not a whole word: the library drops this match and continues after it.
        pos = stop;
        continue;
      }
    }
    if (hit->lstrip) {
      size_t s = start;
      while (s > start_offset) {
        size_t b = s - 1;
        while (b > 0 && (static_cast<unsigned char>(text[b]) & 0xC0) == 0x80) --b;
        size_t len = 0;
        if (!utf8::is_whitespace(utf8::decode_at(text, b, &len))) break;
        s = b;
      }
      start = s;
    }
    if (hit->rstrip) {
      while (stop < text.size()) {
        size_t len = 0;
        if (!utf8::is_whitespace(utf8::decode_at(text, stop, &len))) break;
        stop += len;
      }
    }
    if (start_offset < start) out.push_back({start_offset, start, -1});
    out.push_back({start, stop, hit->id});
    start_offset = stop;
    pos = stop;
  }
  if (start_offset < text.size()) out.push_back({start_offset, text.size(), -1});
  return out;
}

}  // namespace specdec
