// The tokenizer layer's public API: load a Hugging Face tokenizer.json (+ tokenizer_config.json)
// and encode/decode exactly as the `tokenizers` library does; stream-decode ids without ever
// emitting a broken UTF-8 sequence.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace specdec {

struct TokenizerState;

// Immutable once loaded; copies share the loaded state, so copying and moving are cheap and
// encode/decode may be called from several threads at once.
class Tokenizer {
 public:
  // `dir_or_json`: a folder holding tokenizer.json (and optionally tokenizer_config.json /
  // chat_template.jinja), or the tokenizer.json file itself (its folder is searched for the rest).
  // Throws specdec::Error naming the file and the unsupported or malformed part.
  static Tokenizer load(const std::filesystem::path& dir_or_json);

  // Like tokenizers' encode(text, add_special_tokens=False). With parse_special, special tokens
  // written in the text become their ids; without, they are tokenised as plain text (non-special
  // added tokens are still matched). `text` must be valid UTF-8.
  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;

  // Like tokenizers' decode(ids, skip_special_tokens). Ids outside the vocabulary are skipped.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  int32_t vocab_size() const;  // one past the largest id, added tokens included
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::string id_to_token(int32_t id) const;  // throws for an unknown id
  bool is_special(int32_t id) const;
  std::optional<int32_t> eos_id() const;  // from tokenizer_config.json eos_token
  std::optional<int32_t> bos_id() const;
  const std::string& chat_template() const;  // raw Jinja text, may be empty
  std::vector<int32_t> special_ids() const;  // ascending

 private:
  explicit Tokenizer(std::shared_ptr<const TokenizerState> state) : state_(std::move(state)) {}
  std::shared_ptr<const TokenizerState> state_;
};

// Streaming detokenizer. push() returns the text completed by one more id, holding back bytes of
// an unfinished UTF-8 character; flush() returns whatever is left and resets. The concatenation of
// all returned pieces equals tokenizer.decode(all ids, skip_special) whenever that text contains
// no U+FFFD. Decodes only a short window of recent ids per push.
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special = true);
  std::string push(int32_t id);
  std::string flush();
  size_t window() const { return ids_.size(); }  // ids a push decodes again (context and held ids)

 private:
  Tokenizer tokenizer_;  // shares the state; the decoder never dangles
  bool skip_special_;
  std::vector<int32_t> ids_;  // ids from the window start on
  size_t prefix_ = 0;         // window start within ids_ (its text is context, already emitted)
  size_t read_ = 0;           // ids before this are already emitted
};

}  // namespace specdec
