// Added tokens (special and not): the tokens tokenizer.json lists outside the model, matched in
// the raw input (or, for normalized=true tokens, in the normalised text) before pre-tokenisation.
// Matching is leftmost-longest, honouring single_word / lstrip / rstrip like the library.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tokenizer/regex.h"

namespace specdec {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool special = false;
};

// A run of input: either an added token (id >= 0) or text still to be tokenised.
struct Segment {
  size_t begin = 0;
  size_t end = 0;
  int32_t id = -1;
};

class AddedVocabulary {
  struct ContentHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };

 public:
  AddedVocabulary() = default;
  AddedVocabulary(const nlohmann::json& added_tokens, const std::string& where);

  const std::vector<AddedToken>& tokens() const { return tokens_; }
  const AddedToken* by_id(int32_t id) const;
  const AddedToken* by_content(std::string_view content) const;
  bool is_special_content(std::string_view content) const;
  bool has_normalized() const { return normalized_.root_count() > 0; }

  // Splits `text` into added tokens and the text between them. `normalized_pass` selects the
  // tokens with normalized=true (matched after normalisation) instead of the others.
  // Special tokens are matched only when `with_special`.
  std::vector<Segment> split(std::string_view text, bool normalized_pass, bool with_special) const;

 private:
  // A byte trie over token contents, for leftmost-longest matching.
  class Trie {
   public:
    void insert(std::string_view key, size_t token_index);
    // Token indices of all keys that are prefixes of text[pos..], shortest first.
    void prefixes(std::string_view text, size_t pos, std::vector<size_t>& out) const;
    size_t root_count() const { return count_; }

   private:
    std::unordered_map<uint64_t, int32_t> edges_;  // (node << 8 | byte) -> child node
    std::vector<int64_t> terminal_{-1};            // node -> token index or -1
    std::array<bool, 256> first_byte_{};           // bytes that start some key: a cheap pre-filter
    size_t count_ = 0;
  };

  std::vector<AddedToken> tokens_;
  std::unordered_map<int32_t, size_t> by_id_;
  std::unordered_map<std::string, size_t, ContentHash, std::equal_to<>> by_content_;
  Trie raw_;
  Trie normalized_;
  std::shared_ptr<const Regex> word_end_;    // \w$
  std::shared_ptr<const Regex> word_start_;  // ^\w
};

}  // namespace specdec
