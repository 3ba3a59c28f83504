// Behaviour of individual pipeline components on hand-written tokenizers, with expectations
// worked out by hand from the `tokenizers` library's documented rules.
#include <gtest/gtest.h>

#include "tokenizer/pre_tokenizers.h"
#include "synthetic_tokenizer.h"

namespace specdec::testing {

namespace {

using Ids = std::vector<int32_t>;

TEST(TokenizerComponents, MergesAsStringsOrPairsAndRankOrder) {
  // "abc" with merges (b c) ranked before (a b): "bc" forms first and blocks "ab".
  const nlohmann::json vocab = {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"bc", 4}, {"abc", 5}};
  TempDir d1, d2;
  const Tokenizer pairs = load_json(d1, bpe_json(vocab, nlohmann::json::array({nlohmann::json::array({"b", "c"}),
                                                                             nlohmann::json::array({"a", "b"})})));
  const Tokenizer strings = load_json(d2, bpe_json(vocab, {"b c", "a b"}));
  EXPECT_EQ(pairs.encode("abc"), (Ids{0, 4}));
  EXPECT_EQ(strings.encode("abc"), (Ids{0, 4}));
  TempDir d3;
  const Tokenizer both = load_json(d3, bpe_json(vocab, {"a b", "b c", "ab c"}));
  EXPECT_EQ(both.encode("abc"), (Ids{5}));
  EXPECT_EQ(both.encode("abab"), (Ids{3, 3}));
  // No decoder: the library joins token strings with spaces.
  EXPECT_EQ(both.decode(Ids{3, 2}), "ab c");
}

TEST(TokenizerComponents, LeftmostPairWinsAmongEqualRanks) {
  // "aaa" with the single merge (a a): the leftmost pair merges first -> [aa, a].
  TempDir d;
  const Tokenizer t = load_json(d, bpe_json({{"a", 0}, {"aa", 1}}, {"a a"}));
  EXPECT_EQ(t.encode("aaa"), (Ids{1, 0}));
  EXPECT_EQ(t.encode("aaaa"), (Ids{1, 1}));
}

TEST(TokenizerComponents, UnknownTokenFusedOrNot) {
  nlohmann::json j = bpe_json({{"<unk>", 0}, {"a", 1}, {"b", 2}}, nlohmann::json::array());
  j["model"]["unk_token"] = "<unk>";
  TempDir d1, d2;
  const Tokenizer plain = load_json(d1, j);
  EXPECT_EQ(plain.encode("accb"), (Ids{1, 0, 0, 2}));
  j["model"]["fuse_unk"] = true;
  const Tokenizer fused = load_json(d2, j);
  EXPECT_EQ(fused.encode("accb"), (Ids{1, 0, 2}));
}

TEST(TokenizerComponents, ByteFallbackAndItsDecoder) {
  nlohmann::json vocab = {{"<unk>", 0}, {"a", 1}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = 2 + b;
  }
  nlohmann::json j = bpe_json(vocab, nlohmann::json::array());
  j["model"]["unk_token"] = "<unk>";
  j["model"]["byte_fallback"] = true;
  j["decoder"] = {{"type", "Sequence"}, {"decoders", {{{"type", "ByteFallback"}}, {{"type", "Fuse"}}}}};
  TempDir d;
  const Tokenizer t = load_json(d, j);
  // "é" is C3 A9.
  EXPECT_EQ(t.encode("a\xC3\xA9"), (Ids{1, 2 + 0xC3, 2 + 0xA9}));
  EXPECT_EQ(t.decode(Ids{1, 2 + 0xC3, 2 + 0xA9}), "a\xC3\xA9");
  // An invalid byte run becomes one U+FFFD per byte (unlike the lossy ByteLevel rule).
  EXPECT_EQ(t.decode(Ids{2 + 0xC3, 1}), "\xEF\xBF\xBD" "a");
  EXPECT_EQ(t.decode(Ids{2 + 0xE6, 2 + 0x97}), "\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(TokenizerComponents, ByteLevelRegexSplitsWords) {
  // Merge (o, Ġ) can only apply when "o" and " o" are not split apart.
  const auto vocab = byte_level_vocab({"o\xC4\xA0"});  // "oĠ"
  nlohmann::json j = bpe_json(vocab, {"o \xC4\xA0"});
  j["decoder"] = {{"type", "ByteLevel"}};
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  TempDir d1, d2, d3;
  const Tokenizer no_regex = load_json(d1, j);
  EXPECT_EQ(no_regex.encode("o o"), (Ids{256, 'o'}));
  j["pre_tokenizer"]["use_regex"] = true;
  const Tokenizer with_regex = load_json(d2, j);
  const Ids ids = with_regex.encode("o o");
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids[0], 'o');
  EXPECT_EQ(ids[1], ' ');  // byte 0x20 is id 32 in this vocabulary
  EXPECT_EQ(ids[2], 'o');
  EXPECT_EQ(with_regex.decode(ids), "o o");
  j["pre_tokenizer"]["add_prefix_space"] = true;
  const Tokenizer prefixed = load_json(d3, j);
  EXPECT_EQ(prefixed.encode("o"), (Ids{' ', 'o'}));
  EXPECT_EQ(prefixed.encode(" o"), (Ids{' ', 'o'}));  // no second space
}

TEST(TokenizerComponents, ByteLevelDecodeIsLossyLikeRust) {
  nlohmann::json j = bpe_json(byte_level_vocab({}), nlohmann::json::array());
  j["decoder"] = {{"type", "ByteLevel"}};
  TempDir d;
  const Tokenizer t = load_json(d, j);
  // E6 97 is a truncated 3-byte sequence: one U+FFFD for the maximal subpart, then 'a'.
  EXPECT_EQ(t.decode(Ids{0xE6, 0x97, 'a'}), "\xEF\xBF\xBD" "a");
  // ED A0 80 (a surrogate): ED cannot be followed by A0, so three replacements.
  EXPECT_EQ(t.decode(Ids{0xED, 0xA0, 0x80}), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  // F0 9F 98 80 is U+1F600.
  EXPECT_EQ(t.decode(Ids{0xF0, 0x9F, 0x98, 0x80}), "\xF0\x9F\x98\x80");
  EXPECT_EQ(t.decode(Ids{0xFF, 0xF0, 0x9F}), "\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(TokenizerComponents, ByteLevelDecodeEqualsItsStringListForm) {
  // ByteLevel alone decodes by appending each token's bytes; inside a Sequence it rewrites the
  // list of token strings. Both must read the same bytes the same way, broken sequences included.
  nlohmann::json j = bpe_json(byte_level_vocab({}), nlohmann::json::array());
  j["decoder"] = {{"type", "ByteLevel"}};
  TempDir d1, d2;
  const Tokenizer direct = load_json(d1, j);
  j["decoder"] = {{"type", "Sequence"}, {"decoders", {{{"type", "ByteLevel"}}}}};
  const Tokenizer listed = load_json(d2, j);
  const Ids bytes = {'a', ' ', 0x7F, 0x80, 0xBF, 0xC3, 0xA9, 0xE6, 0x97, 0xA5, 0xED, 0xA0, 0xF0, 0x9F, 0x98, 0xFF};
  uint32_t state = 12345;
  for (int n = 0; n < 2000; ++n) {
    Ids ids;
    for (int k = 0; k < 1 + n % 6; ++k) {
      state = state * 1664525u + 1013904223u;
      ids.push_back(bytes[(state >> 16) % bytes.size()]);
    }
    ASSERT_EQ(direct.decode(ids), listed.decode(ids)) << "sequence " << n;
  }
}

TEST(TokenizerComponents, SplitBehaviours) {
  // With ignore_merges and no merges, a piece found whole in the vocabulary becomes one token and
  // any other piece one token per character, so the ids show where the pieces were cut.
  const nlohmann::json vocab = {{"a", 0}, {"-", 1}, {"a-", 2}, {"-a", 3}, {"--", 4}, {"a--", 5}, {"--a", 6}};
  auto make = [&](const TempDir& d, const char* behavior, bool invert) {
    nlohmann::json j = bpe_json(vocab, nlohmann::json::array());
    j["model"]["ignore_merges"] = true;
    j["pre_tokenizer"] = {{"type", "Split"},
                          {"pattern", {{"String", "-"}}},
                          {"behavior", behavior},
                          {"invert", invert}};
    return load_json(d, j);
  };
  TempDir d1, d2, d3, d4, d5, d6;
  EXPECT_EQ(make(d1, "Isolated", false).encode("a--a"), (Ids{0, 1, 1, 0}));
  EXPECT_EQ(make(d2, "Removed", false).encode("a--a"), (Ids{0, 0}));
  EXPECT_EQ(make(d3, "MergedWithPrevious", false).encode("a--a"), (Ids{2, 1, 0}));
  EXPECT_EQ(make(d4, "MergedWithNext", false).encode("a--a"), (Ids{0, 1, 3}));
  EXPECT_EQ(make(d5, "Contiguous", false).encode("a--a"), (Ids{0, 4, 0}));
  // Inverted: the "a"s become the removed delimiters; each "-" match stays its own piece.
  EXPECT_EQ(make(d6, "Removed", true).encode("a--a"), (Ids{1, 1}));
}

TEST(TokenizerComponents, MetaspacePrependSchemesAndSplit) {
  const std::string sp = "\xE2\x96\x81";  // ▁
  const nlohmann::json vocab = {{sp, 0}, {"a", 1}, {"b", 2}, {sp + "a", 3}, {sp + "b", 4}, {"<s>", 5}};
  auto make = [&](const TempDir& d, const char* scheme, bool split) {
    nlohmann::json j = bpe_json(vocab, {sp + " a", sp + " b"});
    j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", sp}, {"prepend_scheme", scheme}, {"split", split}};
    j["decoder"] = {{"type", "Metaspace"}, {"replacement", sp}, {"prepend_scheme", scheme}, {"split", split}};
    j["added_tokens"] = {{{"id", 5}, {"content", "<s>"}, {"single_word", false}, {"lstrip", false},
                          {"rstrip", false}, {"normalized", false}, {"special", true}}};
    return load_json(d, j);
  };
  TempDir d1, d2, d3, d4;
  const Tokenizer first = make(d1, "first", true);
  EXPECT_EQ(first.encode("a b"), (Ids{3, 4}));
  EXPECT_EQ(first.encode("<s>a b"), (Ids{5, 1, 4}));  // not at the start of the input: no prepend
  EXPECT_EQ(first.decode(Ids{3, 4}), "a b");           // first token's ▁ dropped
  const Tokenizer always = make(d2, "always", true);
  EXPECT_EQ(always.encode("<s>a b"), (Ids{5, 3, 4}));
  const Tokenizer never = make(d3, "never", true);
  EXPECT_EQ(never.encode("a b"), (Ids{1, 4}));
  EXPECT_EQ(never.decode(Ids{3, 4}), " a b");
  const Tokenizer unsplit = make(d4, "first", false);
  EXPECT_EQ(unsplit.encode("a b"), (Ids{3, 4}));
}

TEST(TokenizerComponents, NormalizersRewriteText) {
  const nlohmann::json vocab = {{"a", 0}, {"b", 1}, {"_", 2}, {"x", 3}};
  auto make = [&](const TempDir& d, const nlohmann::json& normalizer) {
    nlohmann::json j = bpe_json(vocab, nlohmann::json::array());
    j["normalizer"] = normalizer;
    return load_json(d, j);
  };
  TempDir d1, d2, d3, d4;
  const Tokenizer seq = make(d1, {{"type", "Sequence"},
                                  {"normalizers",
                                   {{{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}},
                                    {{"type", "Lowercase"}},
                                    {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "_"}},
                                    {{"type", "Prepend"}, {"prepend", "x"}}}}});
  EXPECT_EQ(seq.encode("  A B\t"), (Ids{3, 0, 2, 1}));
  EXPECT_EQ(seq.encode(""), Ids{});  // Prepend leaves empty text alone
  const Tokenizer regex = make(d2, {{"type", "Replace"}, {"pattern", {{"Regex", "b+"}}}, {"content", "x"}});
  EXPECT_EQ(regex.encode("abbba"), (Ids{0, 3, 0}));
  const Tokenizer nfc = make(d3, {{"type", "NFC"}});
  EXPECT_EQ(nfc.encode("ab"), (Ids{0, 1}));
  const Tokenizer lower = make(d4, {{"type", "Lowercase"}});
  EXPECT_EQ(lower.encode("AB"), (Ids{0, 1}));
}

// The four Unicode normal forms on text where they differ (the standard's own examples:
// e + U+0301 composes to U+00E9; the ligature U+FB01 has only a compatibility decomposition).
TEST(TokenizerComponents, UnicodeNormalForms) {
  const nlohmann::json vocab = {{"\u00e9", 0}, {"e", 1}, {"\u0301", 2}, {"\ufb01", 3}, {"f", 4}, {"i", 5}};
  auto make = [&](const TempDir& d, const char* form) {
    nlohmann::json j = bpe_json(vocab, nlohmann::json::array());
    j["normalizer"] = {{"type", form}};
    return load_json(d, j);
  };
  TempDir d1, d2, d3, d4;
  const Tokenizer nfc = make(d1, "NFC"), nfd = make(d2, "NFD"), nfkc = make(d3, "NFKC"), nfkd = make(d4, "NFKD");
  const std::string composed = "\u00e9", decomposed = "e\u0301", ligature = "\ufb01";
  EXPECT_EQ(nfc.encode(decomposed), Ids{0});
  EXPECT_EQ(nfc.encode(composed), Ids{0});
  EXPECT_EQ(nfc.encode(ligature), Ids{3});
  EXPECT_EQ(nfd.encode(composed), (Ids{1, 2}));
  EXPECT_EQ(nfd.encode(ligature), Ids{3});
  EXPECT_EQ(nfkc.encode(ligature + decomposed), (Ids{4, 5, 0}));
  EXPECT_EQ(nfkd.encode(ligature + composed), (Ids{4, 5, 1, 2}));
  EXPECT_EQ(nfkd.encode("ef"), (Ids{1, 4}));  // ASCII is its own normal form
}

TEST(TokenizerComponents, WhitespaceAndDigitsPreTokenizers) {
  const nlohmann::json vocab = {{"1", 0}, {"2", 1}, {"12", 2}, {"a", 3}, {"!", 4}, {"a!", 5}};
  auto make = [&](const TempDir& d, const nlohmann::json& pre) {
    nlohmann::json j = bpe_json(vocab, {"1 2", "a !"});
    j["pre_tokenizer"] = pre;
    return load_json(d, j);
  };
  TempDir d1, d2, d3;
  EXPECT_EQ(make(d1, {{"type", "Whitespace"}}).encode("a! a !"), (Ids{3, 4, 3, 4}));
  EXPECT_EQ(make(d2, {{"type", "Digits"}, {"individual_digits", true}}).encode("12a"), (Ids{0, 1, 3}));
  EXPECT_EQ(make(d3, {{"type", "Digits"}, {"individual_digits", false}}).encode("12a"), (Ids{2, 3}));
}

TEST(TokenizerComponents, AddedTokenFlags) {
  const nlohmann::json vocab = {{"a", 0}, {" ", 1}, {"<m>", 2}, {"b", 3}};
  nlohmann::json j = bpe_json(vocab, nlohmann::json::array());
  j["added_tokens"] = {{{"id", 2}, {"content", "<m>"}, {"single_word", false}, {"lstrip", true},
                        {"rstrip", true}, {"normalized", false}, {"special", false}}};
  TempDir d1, d2;
  const Tokenizer strip = load_json(d1, j);
  EXPECT_EQ(strip.encode("a <m> b"), (Ids{0, 2, 3}));
  j["added_tokens"][0]["lstrip"] = false;
  j["added_tokens"][0]["rstrip"] = false;
  j["added_tokens"][0]["single_word"] = true;
  const Tokenizer word = load_json(d2, j);
  EXPECT_EQ(word.encode("a <m> b"), (Ids{0, 1, 2, 1, 3}));
  // Glued to a word, "<m>" is not matched; its characters are outside the vocabulary and, with no
  // unknown token, the model drops them.
  EXPECT_EQ(word.encode("a<m> b"), (Ids{0, 1, 3}));
}

TEST(TokenizerComponents, RegexWhitespaceIsUnicodeWhiteSpace) {
  // Patterns are written for Oniguruma, whose \s is exactly Unicode White_Space: U+180E (a
  // format character) is not whitespace there, while U+2003 (em space) is.
  const auto pre = make_pre_tokenizer(
      {{"type", "Split"}, {"pattern", {{"Regex", R"(\s+|\S+)"}}}, {"behavior", "Isolated"}, {"invert", false}},
      "test");
  std::vector<Piece> pieces{{"a\xE1\xA0\x8E" "b\xE2\x80\x83" "c", true}};
  pre->pre_tokenize(pieces);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].text, "a\xE1\xA0\x8E" "b");
  EXPECT_EQ(pieces[1].text, "\xE2\x80\x83");
  EXPECT_EQ(pieces[2].text, "c");
  EXPECT_TRUE(pieces[0].at_start);
  EXPECT_FALSE(pieces[2].at_start);
}

}  // namespace
}  // namespace specdec::testing
