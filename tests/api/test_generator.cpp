// The public API: a program that includes only specdec/specdec.h loads the bundled target and
// generates exactly the transformers greedy continuation, plainly and speculatively, streams
// text that adds up to the result, and gets a clear error for bad input.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "specdec/specdec.h"

namespace {

const std::string kRoot = SPECDEC_SOURCE_DIR;

TEST(Generator, GreedyMatchesTransformersPlainAndSpeculative) {
  std::ifstream in(kRoot + "/tests/fixtures/bundled/greedy.json");
  const auto fx = nlohmann::json::parse(in);
  specdec::ModelOptions mo;
  mo.model_dir = kRoot + "/models/target";
  specdec::Generator gen(mo);
  const std::string prompt = fx["prompts_text"][0];
  ASSERT_EQ(gen.encode(prompt), fx["prompts"][0].get<std::vector<int32_t>>());
  const auto want = fx["target"]["greedy"][0].get<std::vector<int32_t>>();
  for (const std::string& draft : std::vector<std::string>{"", "ngram", kRoot + "/models/draft"}) {
    specdec::GenerateOptions go;
    go.max_tokens = 64;
    go.temperature = 0;
    go.ignore_eos = true;
    go.draft = draft;
    std::string streamed;
    const specdec::Generation g = gen.generate(prompt, go, [&](std::string_view t) { streamed += t; });
    EXPECT_EQ(g.tokens, want) << "draft '" << draft << "'";
    EXPECT_EQ(streamed, g.text);
    EXPECT_EQ(g.text, gen.decode(g.tokens));
    EXPECT_EQ(g.finish_reason, "length");
    EXPECT_EQ(g.speculative_json.empty(), draft.empty());
  }
}

TEST(Generator, BadInputThrowsWithTheCause) {
  specdec::ModelOptions mo;
  mo.model_dir = kRoot + "/no/such/model";
  try {
    specdec::Generator gen(mo);
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("config.json"), std::string::npos) << e.what();
  }
  mo.model_dir = kRoot + "/models/target";
  specdec::Generator gen(mo);
  EXPECT_THROW(gen.generate("", {}), std::runtime_error);
  specdec::GenerateOptions go;
  go.top_p = 3;
  EXPECT_THROW(gen.generate("x", go), std::runtime_error);
  go = {};
  go.draft = kRoot + "/tests/fixtures/models/llama";  // another vocabulary
  EXPECT_THROW(gen.generate("x", go), std::runtime_error);
}

}  // namespace
