// Fuzz target: an arbitrary tokenizer.json loaded, then used to encode and decode a fixed
// multilingual text. Refusals (bad JSON, unsupported components, bad regexes) are Errors.
#include <cstdint>
#include <stdexcept>

#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = specdec::fuzz::write_scratch("tokenizer.json", specdec::fuzz::as_text(data, size));
  try {
    const specdec::Tokenizer tok = specdec::Tokenizer::load(path);
    const auto ids = tok.encode("Hello wörld 東京 e\u0301 <s> 123  \n\t😀", true);
    (void)tok.decode(ids, false);
    (void)tok.decode(ids, true);
  } catch (const std::runtime_error&) {
  }
  return 0;
}
