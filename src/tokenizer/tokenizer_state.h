// The loaded, immutable state behind a Tokenizer: the pipeline components and the ids read from
// tokenizer_config.json. Internal to the tokenizer layer.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoders.h"
#include "tokenizer/normalizers.h"
#include "tokenizer/pre_tokenizers.h"

namespace specdec {

struct TokenizerState {
  std::string source;  // path of tokenizer.json, for error messages
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<Bpe> model;
  std::unique_ptr<Decoder> decoder;
  AddedVocabulary added;
  int32_t vocab_size = 0;
  std::vector<int32_t> special_ids;
  std::optional<int32_t> eos_id;
  std::optional<int32_t> bos_id;
  std::string chat_template;
};

// Fills eos_id, bos_id and chat_template from tokenizer_config.json / chat_template.jinja in
// `dir`, when present.
void load_tokenizer_config(TokenizerState& state, const std::filesystem::path& dir);

// Reads and parses a JSON file; throws specdec::Error naming the file when missing or invalid.
nlohmann::json read_json_file(const std::filesystem::path& path);

}  // namespace specdec
