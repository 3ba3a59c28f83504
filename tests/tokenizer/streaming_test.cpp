// The incremental detokenizer against full decodes of the reference fixtures: pieces are always
// valid UTF-8, and their concatenation equals decode(all ids) whenever that has no U+FFFD.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace specdec {
namespace {

std::string fixture_dir(const std::string& kind) {
  return std::string(SPECDEC_SOURCE_DIR) + "/tests/fixtures/tokenizers/" + kind;
}

std::vector<std::vector<int32_t>> fixture_id_lists(const std::string& kind) {
  std::vector<std::vector<int32_t>> lists;
  for (const char* file : {"/encode.jsonl", "/decode.jsonl"}) {
    std::ifstream in(fixture_dir(kind) + file);
    EXPECT_TRUE(in.good()) << kind << file;
    std::string line;
    while (std::getline(in, line)) {
      if (!line.empty()) lists.push_back(nlohmann::json::parse(line)["ids"].get<std::vector<int32_t>>());
    }
  }
  return lists;
}

class StreamingTest : public ::testing::TestWithParam<std::string> {};

TEST_P(StreamingTest, ConcatenatedPiecesEqualFullDecode) {
  const Tokenizer tok = Tokenizer::load(fixture_dir(GetParam()));
  const auto lists = fixture_id_lists(GetParam());
  ASSERT_GT(lists.size(), 700u);
  int compared = 0, agreed = 0;
  for (bool skip : {false, true}) {
    for (const auto& ids : lists) {
      IncrementalDecoder stream(tok, skip);
      std::string joined;
      for (int32_t id : ids) {
        const std::string piece = stream.push(id);
        ASSERT_FALSE(utf8::first_invalid(piece)) << "broken UTF-8 piece";
        joined += piece;
      }
      joined += stream.flush();
      const std::string full = tok.decode(ids, skip);
      if (full.find(utf8::kReplacement) != std::string::npos) continue;  // contract covers clean text only
      ++compared;
      if (joined == full) {
        ++agreed;
      } else {
        ADD_FAILURE() << "stream " << nlohmann::json(joined).dump() << " != decode " << nlohmann::json(full).dump()
                      << " for ids " << nlohmann::json(ids).dump() << " skip_special=" << skip;
      }
    }
  }
  EXPECT_GT(compared, 1000);
  std::printf("[%s] streaming agreed %d/%d\n", GetParam().c_str(), agreed, compared);
}

TEST_P(StreamingTest, HoldsBackUnfinishedCharacters) {
  const Tokenizer tok = Tokenizer::load(fixture_dir(GetParam()));
  // An emoji is split over several byte tokens by both fixtures' tokenizers.
  const std::string emoji = "\xF0\x9F\x98\x80";
  const auto ids = tok.encode("x" + emoji);
  ASSERT_GE(ids.size(), 3u);
  IncrementalDecoder stream(tok);
  std::string joined;
  for (size_t i = 0; i + 1 < ids.size(); ++i) {
    const std::string piece = stream.push(ids[i]);
    EXPECT_EQ(piece.find(emoji), std::string::npos) << "emoji emitted before its last byte";
    EXPECT_FALSE(utf8::first_invalid(piece));
    joined += piece;
  }
  joined += stream.push(ids.back());
  joined += stream.flush();
  EXPECT_EQ(joined, tok.decode(ids, true));
  EXPECT_NE(joined.find(emoji), std::string::npos);
}

TEST_P(StreamingTest, FlushReturnsHeldBytesAndResets) {
  const Tokenizer tok = Tokenizer::load(fixture_dir(GetParam()));
  const auto ids = tok.encode("\xF0\x9F\x98\x80");
  ASSERT_GE(ids.size(), 2u);
  IncrementalDecoder stream(tok);
  EXPECT_EQ(stream.push(ids[0]), "");  // first byte of four: nothing can be shown yet
  EXPECT_EQ(stream.flush(), tok.decode(std::vector<int32_t>{ids[0]}, true));
  // After a flush the decoder starts afresh.
  std::string again;
  for (int32_t id : tok.encode("ok")) again += stream.push(id);
  again += stream.flush();
  EXPECT_EQ(again, "ok");
}

TEST_P(StreamingTest, IdsWithoutTextAreNotDecodedAgain) {
  // A model that emits a long run of special tokens (skipped from the text) must not make every
  // later push decode the whole run again.
  const Tokenizer tok = Tokenizer::load(fixture_dir(GetParam()));
  const std::vector<int32_t> specials = tok.special_ids();
  ASSERT_FALSE(specials.empty());
  std::vector<int32_t> ids = tok.encode("a = 1");
  for (int i = 0; i < 2000; ++i) ids.push_back(specials[static_cast<size_t>(i) % specials.size()]);
  for (int32_t id : tok.encode(" + 2")) ids.push_back(id);
  IncrementalDecoder stream(tok, true);
  std::string joined;
  size_t widest = 0;
  for (int32_t id : ids) {
    joined += stream.push(id);
    widest = std::max(widest, stream.window());
  }
  joined += stream.flush();
  EXPECT_EQ(joined, tok.decode(ids, true));
  EXPECT_LE(widest, 8u) << "the decoder kept the skipped ids";
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, StreamingTest, ::testing::Values("bytelevel", "metaspace"));

}  // namespace
}  // namespace specdec
