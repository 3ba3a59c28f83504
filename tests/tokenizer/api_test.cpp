// The Tokenizer's accessors and loading paths on the fixture and bundled tokenizers, and the
// errors for missing, malformed or unsupported files.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "synthetic_tokenizer.h"

namespace specdec::testing {
namespace {

std::string fixture_dir(const std::string& kind) {
  return std::string(SPECDEC_SOURCE_DIR) + "/tests/fixtures/tokenizers/" + kind;
}

// Runs `fn`, expecting a specdec::Error whose message contains every string in `needles`.
template <typename Fn>
void expect_error(Fn fn, const std::vector<std::string>& needles) {
  try {
    fn();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  }
}

TEST(TokenizerApi, ByteLevelFixtureAccessors) {
  const Tokenizer tok = Tokenizer::load(fixture_dir("bytelevel"));
  EXPECT_EQ(tok.vocab_size(), 8192);
  EXPECT_EQ(tok.eos_id(), std::optional<int32_t>(0));  // <|endoftext|>
  EXPECT_EQ(tok.bos_id(), std::nullopt);                // bos_token is null
  EXPECT_EQ(tok.token_to_id("<|im_start|>"), std::optional<int32_t>(1));
  EXPECT_EQ(tok.id_to_token(2), "<|im_end|>");
  EXPECT_EQ(tok.special_ids(), (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_TRUE(tok.is_special(3));
  EXPECT_FALSE(tok.is_special(4));
  EXPECT_NE(tok.chat_template().find("<|im_start|>"), std::string::npos);
  EXPECT_EQ(tok.token_to_id("no such token"), std::nullopt);
  // Every model id maps to a token and back.
  for (int32_t id = 0; id < tok.vocab_size(); ++id) EXPECT_EQ(tok.token_to_id(tok.id_to_token(id)), id);
  expect_error([&] { tok.id_to_token(tok.vocab_size()); }, {"8192"});
}

TEST(TokenizerApi, MetaspaceFixtureAccessors) {
  const Tokenizer tok = Tokenizer::load(fixture_dir("metaspace") + "/tokenizer.json");  // the file itself
  EXPECT_EQ(tok.vocab_size(), 6458);
  EXPECT_EQ(tok.bos_id(), std::optional<int32_t>(1));
  EXPECT_EQ(tok.eos_id(), std::optional<int32_t>(2));
  EXPECT_TRUE(tok.chat_template().empty());
  EXPECT_EQ(tok.special_ids().size(), 259u);  // <unk>, <s>, </s> and 256 byte tokens
  EXPECT_EQ(tok.token_to_id("<0x41>"), std::optional<int32_t>(68));
}

TEST(TokenizerApi, ParseSpecialControlsSpecialTokenMatching) {
  const Tokenizer tok = Tokenizer::load(fixture_dir("bytelevel"));
  EXPECT_EQ(tok.encode("a<|endoftext|>b", true), (std::vector<int32_t>{tok.encode("a")[0], 0, tok.encode("b")[0]}));
  const auto plain = tok.encode("<|endoftext|>", false);
  EXPECT_GT(plain.size(), 1u);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 0), 0);
  EXPECT_EQ(tok.decode(plain), "<|endoftext|>");
}

TEST(TokenizerApi, BundledModelsTokenizersLoadAndRoundTrip) {
  for (const char* model : {"target", "draft"}) {
    const Tokenizer tok = Tokenizer::load(std::string(SPECDEC_SOURCE_DIR) + "/models/" + model);
    const std::string code = "def add(a, b):\n    return a + b  # sum \xE2\x9C\x93\n";
    EXPECT_EQ(tok.decode(tok.encode(code)), code) << model;
    EXPECT_TRUE(tok.eos_id().has_value()) << model;
  }
}

TEST(TokenizerApi, CopiesShareStateAndStayValid) {
  std::optional<Tokenizer> copy;
  {
    const Tokenizer tok = Tokenizer::load(fixture_dir("bytelevel"));
    copy = tok;
  }
  EXPECT_EQ(copy->decode(copy->encode("hello world")), "hello world");
}

TEST(TokenizerApi, ConcurrentEncodesAgreeWithSerialOnes) {
  // encode() is const and shares a word cache; threads must see the same results as one thread.
  const Tokenizer tok = Tokenizer::load(fixture_dir("bytelevel"));
  std::vector<std::string> texts;
  for (int i = 0; i < 200; ++i) texts.push_back("word" + std::to_string(i * 7919) + " def f_" + std::to_string(i) + "(x):");
  std::vector<std::vector<int32_t>> serial;
  for (const auto& t : texts) serial.push_back(tok.encode(t));
  const Tokenizer fresh = Tokenizer::load(fixture_dir("bytelevel"));  // empty cache
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      for (size_t i = 0; i < texts.size(); ++i) {
        const size_t k = (i * 13 + static_cast<size_t>(w) * 51) % texts.size();
        if (fresh.encode(texts[k]) != serial[k]) ++mismatches[static_cast<size_t>(w)];
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
}

TEST(TokenizerApi, RejectsInvalidUtf8Input) {
  const Tokenizer tok = Tokenizer::load(fixture_dir("bytelevel"));
  expect_error([&] { tok.encode("ab\xFF"); }, {"UTF-8", "byte 2"});
}

TEST(TokenizerErrors, MissingFile) {
  TempDir dir;
  expect_error([&] { Tokenizer::load(dir.path()); }, {"not found", (dir.path() / "tokenizer.json").string()});
  expect_error([&] { Tokenizer::load(dir.path() / "nope.json"); }, {"nope.json"});
}

TEST(TokenizerErrors, InvalidJson) {
  TempDir dir;
  dir.write("tokenizer.json", "{\"model\": {");
  expect_error([&] { Tokenizer::load(dir.path()); }, {"tokenizer.json", "invalid JSON"});
}

TEST(TokenizerErrors, InvalidTokenizerConfig) {
  TempDir dir;
  dir.write("tokenizer.json", bpe_json({{"a", 0}}, nlohmann::json::array()).dump());
  dir.write("tokenizer_config.json", "not json");
  expect_error([&] { Tokenizer::load(dir.path()); }, {"tokenizer_config.json", "invalid JSON"});
  dir.write("tokenizer_config.json", R"({"eos_token": "</s>"})");
  expect_error([&] { Tokenizer::load(dir.path()); }, {"tokenizer_config.json", "eos_token", "</s>"});
}

TEST(TokenizerErrors, UnsupportedComponentsAreNamed) {
  struct Case {
    const char* field;
    nlohmann::json value;
    const char* name;
  };
  const std::vector<Case> cases = {
      {"normalizer", {{"type", "BertNormalizer"}}, "BertNormalizer"},
      {"pre_tokenizer", {{"type", "UnicodeScripts"}}, "UnicodeScripts"},
      {"decoder", {{"type", "WordPiece"}}, "WordPiece"},
      {"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "("}}}, {"behavior", "Isolated"}}, "regex"},
      {"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"String", "x"}}}, {"behavior", "Sideways"}}, "Sideways"},
  };
  for (const auto& c : cases) {
    TempDir dir;
    nlohmann::json j = bpe_json({{"a", 0}}, nlohmann::json::array());
    j[c.field] = c.value;
    dir.write("tokenizer.json", j.dump());
    expect_error([&] { Tokenizer::load(dir.path()); }, {"tokenizer.json", c.name});
  }
}

TEST(TokenizerErrors, UnsupportedModelAndBadMerges) {
  TempDir d1, d2, d3;
  nlohmann::json wordpiece = bpe_json({{"a", 0}}, nlohmann::json::array());
  wordpiece["model"]["type"] = "WordPiece";
  d1.write("tokenizer.json", wordpiece.dump());
  expect_error([&] { Tokenizer::load(d1.path()); }, {"tokenizer.json", "WordPiece"});
  d2.write("tokenizer.json", bpe_json({{"a", 0}}, {"a b"}).dump());
  expect_error([&] { Tokenizer::load(d2.path()); }, {"tokenizer.json", "merge 0", "'b'"});
  d3.write("tokenizer.json", bpe_json({{"a", 0}}, {"a a a"}).dump());
  expect_error([&] { Tokenizer::load(d3.path()); }, {"tokenizer.json", "merge 0"});
}

TEST(TokenizerErrors, IdsFarBeyondTheTokenCountAreRefused) {
  // A vocabulary of three tokens whose last id is 100,000,000 (a fuzzer's find: the id-to-token
  // table sized by it took 3.2 GB) is refused by name, and so is an added token numbered far past
  // the vocabulary; ids with ordinary gaps still load.
  TempDir d1, d2, d3;
  d1.write("tokenizer.json", bpe_json({{"a", 0}, {"b", 1}, {"c", 100000000}}, nlohmann::json::array()).dump());
  expect_error([&] { Tokenizer::load(d1.path()); }, {"tokenizer.json", "model.vocab has 3 tokens", "100000000"});
  nlohmann::json added = bpe_json({{"a", 0}, {"b", 1}}, nlohmann::json::array());
  added["added_tokens"] = {{{"id", 2000000000},
                            {"content", "<big>"},
                            {"single_word", false},
                            {"lstrip", false},
                            {"rstrip", false},
                            {"normalized", false},
                            {"special", true}}};
  d2.write("tokenizer.json", added.dump());
  expect_error([&] { Tokenizer::load(d2.path()); }, {"tokenizer.json", "<big>", "2000000000"});
  nlohmann::json gaps = bpe_json({{"a", 0}, {"b", 5}, {"c", 9}}, nlohmann::json::array());
  gaps["added_tokens"] = {{{"id", 40},
                           {"content", "<pad>"},
                           {"single_word", false},
                           {"lstrip", false},
                           {"rstrip", false},
                           {"normalized", false},
                           {"special", true}}};
  const Tokenizer t = load_json(d3, gaps);
  EXPECT_EQ(t.vocab_size(), 41);
  EXPECT_EQ(t.token_to_id("c"), std::optional<int32_t>(9));
}

}  // namespace
}  // namespace specdec::testing
