// Agreement with the `tokenizers` library on the reference fixtures: encode ids, decode with and
// without special tokens, decode of random id sequences (lossy UTF-8), and streaming decode.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tokenizer/normalizers.h"
#include "tokenizer/tokenizer.h"

namespace specdec {
namespace {

std::string fixture_dir(const std::string& kind) {
  return std::string(SPECDEC_SOURCE_DIR) + "/tests/fixtures/tokenizers/" + kind;  // a folder or a file
}

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::vector<nlohmann::json> rows;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) rows.push_back(nlohmann::json::parse(line));
  }
  return rows;
}

class FixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureTest, EncodeAndDecodeMatchReference) {
  const Tokenizer tok = Tokenizer::load(fixture_dir(GetParam()));
  const auto rows = read_jsonl(fixture_dir(GetParam()) + "/encode.jsonl");
  ASSERT_GE(rows.size(), 1000u);
  int ids_ok = 0, decoded_ok = 0, skip_ok = 0;
  size_t non_ascii = 0;
  for (const auto& row : rows) {
    const auto text = row["text"].get<std::string>();
    non_ascii += std::any_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) >= 0x80; });
    const auto want = row["ids"].get<std::vector<int32_t>>();
    const auto got = tok.encode(text);
    if (got == want) {
      ++ids_ok;
    } else {
      ADD_FAILURE() << "encode mismatch for " << nlohmann::json(text).dump() << "\n want " << nlohmann::json(want).dump()
                    << "\n got  " << nlohmann::json(got).dump();
    }
    const auto decoded = tok.decode(want, false);
    if (decoded == row["decoded"].get<std::string>()) {
      ++decoded_ok;
    } else {
      ADD_FAILURE() << "decode mismatch for " << nlohmann::json(text).dump() << ": got " << nlohmann::json(decoded).dump();
    }
    const auto skipped = tok.decode(want, true);
    if (skipped == row["decoded_skip_special"].get<std::string>()) {
      ++skip_ok;
    } else {
      ADD_FAILURE() << "decode(skip_special) mismatch for " << nlohmann::json(text).dump() << ": got "
                    << nlohmann::json(skipped).dump();
    }
  }
  std::printf("[%s] encode %d/%zu, decode %d/%zu, decode_skip_special %d/%zu\n", GetParam().c_str(), ids_ok,
              rows.size(), decoded_ok, rows.size(), skip_ok, rows.size());
  // The reference covers non-ASCII text in earnest (multilingual scripts, emoji, combining marks),
  // not just the ASCII of code.
  EXPECT_GE(non_ascii, 200u) << "strings with non-ASCII characters in " << GetParam() << "/encode.jsonl";
}

TEST_P(FixtureTest, DecodeRandomIdsMatchesReference) {
  const Tokenizer tok = Tokenizer::load(fixture_dir(GetParam()));
  const auto rows = read_jsonl(fixture_dir(GetParam()) + "/decode.jsonl");
  ASSERT_EQ(rows.size(), 100u);
  int ok = 0;
  for (const auto& row : rows) {
    const auto ids = row["ids"].get<std::vector<int32_t>>();
    const auto got = tok.decode(ids, false);
    if (got == row["decoded"].get<std::string>()) {
      ++ok;
    } else {
      ADD_FAILURE() << "decode mismatch for " << nlohmann::json(ids).dump() << ": got " << nlohmann::json(got).dump()
                    << " want " << row["decoded"].dump();
    }
  }
  std::printf("[%s] decode.jsonl %d/%zu\n", GetParam().c_str(), ok, rows.size());
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, FixtureTest, ::testing::Values("bytelevel", "metaspace", "bytelevel_nfc"));

// The library's NFC/NFD/NFKC/NFKD of every fixture string (multilingual text, combining marks,
// compatibility characters, Hangul, emoji sequences). One known difference: the library's tables
// predate Unicode 12.1, so it leaves U+32FF (SQUARE ERA NAME REIWA, new in 12.1) alone under
// NFKC/NFKD, where utf8proc (Unicode 15) decomposes it to its two ideographs as the standard says.
TEST(NormalizerFixture, UnicodeNormalFormsMatchReference) {
  const auto rows = read_jsonl(fixture_dir("normalizers.jsonl"));
  ASSERT_GE(rows.size(), 900u);
  const std::string reiwa = "\u32ff";
  for (const char* form : {"NFC", "NFD", "NFKC", "NFKD"}) {
    const auto normalizer = make_normalizer(nlohmann::json{{"type", form}}, "test");
    int ok = 0;
    for (const auto& row : rows) {
      std::string text = row["text"].get<std::string>();
      if (form[2] == 'K' && text.find(reiwa) != std::string::npos) {
        std::string want = row[form].get<std::string>();
        for (size_t at = want.find(reiwa); at != std::string::npos; at = want.find(reiwa, at))
          want.replace(at, reiwa.size(), "\u4ee4\u548c");
        normalizer->normalize(text);
        EXPECT_EQ(text, want) << form;
        ++ok;
        continue;
      }
      normalizer->normalize(text);
      if (text == row[form].get<std::string>()) {
        ++ok;
      } else {
        ADD_FAILURE() << form << " mismatch for " << row["text"].dump() << ": got " << nlohmann::json(text).dump()
                      << " want " << row[form].dump();
      }
    }
    std::printf("[%s] %d/%zu\n", form, ok, rows.size());
  }
}

}  // namespace
}  // namespace specdec
