// Prompt logprobs under KV pressure: rows preempted (some mid-prefill, having scored part of
// their prompt) re-prefill and score only what they had not, and every row ends with the prompt
// logprobs and tokens of its solo run.
#include <gtest/gtest.h>

#include "engine_fixture.h"

namespace specdec::testing {
namespace {

std::vector<int32_t> long_prompt(int i) {
  static const std::vector<std::string> parts = {
      "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
      "import os\nimport sys\n\n\ndef main():\n    args = sys.argv[1:]\n    for a in args:\n        print(a)\n",
      "def read_file(path):\n    with open(path) as f:\n        return f.read()\n\n\ndef write_file(path, text):\n",
      "#include <stdio.h>\n#include <stdlib.h>\n\nint main(int argc, char** argv) {\n    int n = atoi(argv[1]);\n",
  };
  return encode(parts[static_cast<size_t>(i) % parts.size()] + parts[static_cast<size_t>(i + 1) % parts.size()]);
}

Request scoring_request(const std::vector<int32_t>& prompt, const std::string& method) {
  Request r = make_request(prompt, 30);
  r.prompt_logprobs = 2;
  r.logprobs = 2;
  r.spec.method = method;
  return r;
}

TEST(PromptLogprobs, PreemptedRowsScoreTheirPromptsAsAlone) {
  std::vector<RequestResult> solo;
  {
    EngineOptions roomy;
    roomy.max_batch_tokens = 16;
    auto engine = make_engine(4, roomy);
    for (int i = 0; i < 4; ++i) solo.push_back(run_one(*engine, scoring_request(long_prompt(i), "")));
  }
  // 8 blocks of 16 tokens: one row (50 to 62 prompt + 30 new tokens) fits, four do not. With
  // one 16-token chunk a forward, the older rows' growth preempts younger rows mid-prefill, with
  // part of their prompt scored.
  EngineOptions tight;
  tight.kv_blocks = 8;
  tight.max_batch_tokens = 16;
  auto engine = make_engine(4, tight);
  std::vector<int64_t> ids;
  for (int i = 0; i < 4; ++i) ids.push_back(engine->submit(scoring_request(long_prompt(i), i % 2 ? "draft" : "ngram")));
  engine->run();
  EXPECT_GT(engine->stats().preemptions, 0);
  for (size_t i = 0; i < ids.size(); ++i) {
    SCOPED_TRACE(i);
    auto res = engine->take_result(ids[i]);
    ASSERT_TRUE(res.has_value());
    EXPECT_EQ(res->tokens, solo[i].tokens);
    ASSERT_EQ(res->prompt_logprobs.size(), long_prompt(static_cast<int>(i)).size() - 1);
    ASSERT_EQ(res->prompt_logprobs.size(), solo[i].prompt_logprobs.size());
    for (size_t k = 0; k < res->prompt_logprobs.size(); ++k) {
      const TokenLogprobs& a = res->prompt_logprobs[k];
      const TokenLogprobs& b = solo[i].prompt_logprobs[k];
      EXPECT_EQ(a.token, long_prompt(static_cast<int>(i))[k + 1]);
      EXPECT_EQ(a.token, b.token);
      EXPECT_NEAR(a.logprob, b.logprob, 1e-4) << "prompt token " << k + 1;
      ASSERT_EQ(a.top.size(), b.top.size());
      for (size_t j = 0; j < a.top.size(); ++j) {
        EXPECT_EQ(a.top[j].first, b.top[j].first);
        EXPECT_NEAR(a.top[j].second, b.top[j].second, 1e-4);
      }
    }
  }
  EXPECT_EQ(engine->kv().free_blocks(), engine->kv().total_blocks());
}

}  // namespace
}  // namespace specdec::testing
