// Pre-tokenisers: split normalised text into the words the model encodes one by one
// (ByteLevel, Split, Metaspace, Whitespace, WhitespaceSplit, Digits, Sequence).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace specdec {

// A span of normalised text on its way to the model.
struct Piece {
  std::string text;
  // True when the piece begins at offset 0 of the original input (Metaspace "first" needs it).
  bool at_start = false;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces every piece by its sub-pieces (possibly rewritten); empty pieces are dropped.
  virtual void pre_tokenize(std::vector<Piece>& pieces) const = 0;
};

// nullptr for JSON null. `where` names the file for error messages.
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& spec, const std::string& where);

}  // namespace specdec
