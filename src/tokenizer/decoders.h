// Decoders: turn the token strings of a decode call back into text (ByteLevel, Metaspace,
// Replace, ByteFallback, Fuse, Strip, Sequence), chained as in the `tokenizers` library.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace specdec {

class Decoder {
 public:
  virtual ~Decoder() = default;
  // Rewrites the list of token strings; the decoded text is the concatenation of the result.
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
  // Whether decode_chain is each token's bytes (append_token_bytes) concatenated and then read as
  // UTF-8, invalid sequences replaced (ByteLevel): a decode may then skip the list of strings.
  virtual bool concatenates_bytes() const { return false; }
  virtual void append_token_bytes(std::string_view /*token*/, std::string& /*bytes*/) const {}
};

// nullptr for JSON null. `where` names the file for error messages.
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& spec, const std::string& where);

}  // namespace specdec
