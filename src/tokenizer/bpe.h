// The BPE model: vocabulary, merge ranks and the merge loop that turns one pre-tokenised word
// into ids. Supports byte fallback (<0xXX> tokens), an unknown token (optionally fused), the
// continuing-subword prefix / end-of-word suffix, and ignore_merges. Words are cached.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace specdec {

// Hash for heterogeneous lookup of std::string keys by string_view.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// The largest id that a vocabulary of `tokens` tokens may use. Ids number the tokens from 0;
// real files leave gaps (removed tokens, ids kept for added ones), but never of more than the
// vocabulary's own size.
inline int64_t max_token_id(int64_t tokens) { return 2 * tokens + 65536; }

class Bpe {
 public:
  // `model` is the "model" object of tokenizer.json; `where` names the file for errors.
  Bpe(const nlohmann::json& model, const std::string& where);

  // Appends the ids of `word` (non-empty, valid UTF-8) to `out`.
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  // nullptr when `id` is not in the vocabulary.
  const std::string* id_to_token(int32_t id) const;
  // One past the largest id of the vocabulary.
  int32_t id_end() const { return static_cast<int32_t>(vocab_r_.size()); }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;
  const Merge* find_merge(int32_t left, int32_t right) const;

  StringIdMap vocab_;
  std::vector<std::string> vocab_r_;
  std::vector<bool> has_id_;
  std::unordered_map<uint64_t, Merge> merges_;
  std::array<int32_t, 256> byte_ids_{};  // id of "<0xXX>", -1 if absent
  std::optional<int32_t> unk_id_;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;

  // Cache of whole-word results; bounded, cleared when full. Guarded by cache_mutex_ because
  // encode() is const and may run on several threads.
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace specdec
