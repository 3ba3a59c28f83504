// The Generator: a program that includes only specdec/specdec.h loads the bundled target and
// generates exactly the transformers greedy continuation, plainly and speculatively, streams
// text that adds up to the result, and gets a clear error for bad input.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "specdec/specdec.h"

namespace {

const std::string kRoot = SPECDEC_SOURCE_DIR;

specdec::DraftSpec draft_model(const std::string& path) { return specdec::DraftSpec::model(path, "draft"); }

TEST(Generator, GreedyMatchesTransformersPlainAndSpeculative) {
  std::ifstream in(kRoot + "/tests/fixtures/bundled/greedy.json");
  const auto fx = nlohmann::json::parse(in);
  specdec::EngineConfig config;
  config.model_dir = kRoot + "/models/target";
  config.drafts = {specdec::DraftSpec::ngram(), draft_model(kRoot + "/models/draft")};
  specdec::Generator gen(config);
  const std::string prompt = fx["prompts_text"][0];
  ASSERT_EQ(gen.encode(prompt), fx["prompts"][0].get<std::vector<int32_t>>());
  const auto want = fx["target"]["greedy"][0].get<std::vector<int32_t>>();
  // Twice each: the Generator keeps its engine, and a second request on it changes nothing.
  for (const std::string draft : {"", "ngram", "draft", "", "ngram", "draft"}) {
    specdec::GenerateOptions go;
    go.max_tokens = 64;
    go.sampling.temperature = 0;
    go.ignore_eos = true;
    go.speculative.draft = draft;
    std::string streamed;
    const specdec::Generation g = gen.generate(prompt, go, [&](std::string_view t) { streamed += t; });
    EXPECT_EQ(g.tokens, want) << "draft '" << draft << "'";
    EXPECT_EQ(streamed, g.text);
    EXPECT_EQ(g.text, gen.decode(g.tokens));
    EXPECT_EQ(g.finish_reason, "length");
    ASSERT_EQ(g.stats.speculative.has_value(), !draft.empty());
    if (!draft.empty()) {
      EXPECT_EQ(g.stats.speculative->draft, draft);
      // How much is drafted is the adaptive policy's call (it may pause where drafts do not pay);
      // the counters' invariants hold whatever it decides.
      const specdec::SpeculativeStats& sp = *g.stats.speculative;
      EXPECT_LE(sp.accepted, sp.drafted);
      EXPECT_EQ(sp.emitted, sp.accepted + sp.rounds);
      EXPECT_NE(g.stats.speculative->to_json().find("\"drafted\""), std::string::npos);
    }
  }
}

TEST(Generator, BadInputThrowsWithTheCause) {
  specdec::EngineConfig config;
  config.model_dir = kRoot + "/no/such/model";
  try {
    specdec::Generator gen(config);
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("config.json"), std::string::npos) << e.what();
  }
  config.model_dir = kRoot + "/models/target";
  specdec::Generator gen(config);
  EXPECT_THROW(gen.generate("", {}), std::runtime_error);
  specdec::GenerateOptions go;
  go.sampling.top_p = 3;
  EXPECT_THROW(gen.generate("x", go), std::runtime_error);
  go = {};
  go.speculative.draft = "ngram";  // not loaded
  EXPECT_THROW(gen.generate("x", go), std::runtime_error);
  // A draft with another vocabulary is refused when it is added.
  EXPECT_THROW(gen.engine().add_draft(draft_model(kRoot + "/tests/fixtures/models/llama")), std::runtime_error);
  EXPECT_FALSE(gen.engine().has_draft("draft"));
  go = {};
  go.max_tokens = 4;
  EXPECT_EQ(gen.generate("x", go).tokens.size(), 4u);
}

}  // namespace
