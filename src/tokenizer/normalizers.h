// Normalisers: the text rewrites tokenizer.json applies to each non-added-token segment before
// pre-tokenisation (null, Sequence, Prepend, Replace, Lowercase, Strip, NFC/NFKC/NFD/NFKD).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

namespace specdec {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Rewrites `text` in place. Throws specdec::Error for input the normaliser cannot handle.
  virtual void normalize(std::string& text) const = 0;
};

// Builds the normaliser described by `spec` (the "normalizer" field); nullptr for JSON null.
// `where` names the file for error messages.
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& spec, const std::string& where);

}  // namespace specdec
