// Fuzz target: arbitrary text encoded by the fixture tokenizers (byte-level, metaspace, and the
// NFC byte-level one), and the ids decoded back. Invalid UTF-8 must be refused with an Error;
// valid text must round-trip through the byte-level tokenizer unchanged (it has no normaliser
// and every byte is in its alphabet), and the ids must lie in the vocabulary.
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"

namespace {

const std::vector<specdec::Tokenizer>& tokenizers() {
  static const std::vector<specdec::Tokenizer> all = [] {
    std::vector<specdec::Tokenizer> t;
    for (const char* kind : {"bytelevel", "metaspace", "bytelevel_nfc"})
      t.push_back(specdec::Tokenizer::load(specdec::fuzz::fixture(std::string("tests/fixtures/tokenizers/") + kind)));
    return t;
  }();
  return all;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(specdec::fuzz::as_text(data, size));
  const auto& all = tokenizers();
  for (size_t k = 0; k < all.size(); ++k) {
    std::vector<int32_t> ids;
    try {
      ids = all[k].encode(text, /*parse_special=*/true);
    } catch (const std::runtime_error&) {
      continue;  // invalid UTF-8
    }
    for (int32_t id : ids) {
      if (id < 0 || id >= all[k].vocab_size()) std::abort();
    }
    const std::string back = all[k].decode(ids, false);
    if (k == 0 && back != text) std::abort();
  }
  return 0;
}
