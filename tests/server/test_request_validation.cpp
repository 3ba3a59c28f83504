// parse_completion_request, table-driven: each bad field gets a 400 naming it with an exact
// message; good bodies come out as typed options. No engine and no sockets.
#include <gtest/gtest.h>

#include "server/api_error.h"
#include "server/completion_request.h"

namespace {

using nlohmann::json;
using specdec::server::ApiError;
using specdec::server::Endpoint;
using specdec::server::parse_completion_request;

struct Bad {
  const char* body;
  const char* param;
  const char* message;
};

const Bad kBad[] = {
    {R"({})", "prompt", "'prompt' is required"},
    {R"({"prompt": 3})", "prompt",
     "'prompt' must be a string, an array of strings, an array of token ids or an array of token id arrays"},
    {R"({"prompt": ""})", "prompt", "'prompt' must not be empty"},
    {R"({"prompt": "a", "max_tokens": 0})", "max_tokens", "'max_tokens' must be at least 1, got 0"},
    {R"({"prompt": "a", "max_tokens": "5"})", "max_tokens", "'max_tokens' must be an integer"},
    {R"({"prompt": "a", "temperature": 3})", "temperature", "'temperature' must be between 0 and 2, got 3"},
    {R"({"prompt": "a", "top_p": 0})", "top_p", "'top_p' must be greater than 0, got 0"},
    {R"({"prompt": "a", "n": 0})", "n", "'n' must be at least 1, got 0"},
    {R"({"prompt": "a", "stop": [1]})", "stop", "'stop' must be a string or an array of strings"},
    {R"({"prompt": "a", "stop": ""})", "stop", "'stop' must not contain an empty string"},
    {R"({"prompt": "a", "presence_penalty": 2.5})", "presence_penalty",
     "'presence_penalty' must be between -2 and 2, got 2.5"},
    {R"({"prompt": "a", "logprobs": 21})", "logprobs", "'logprobs' must be at most 20, got 21"},
    {R"({"prompt": "a", "prompt_logprobs": -1})", "prompt_logprobs", "'prompt_logprobs' must be at least 0, got -1"},
    {R"({"prompt": "a", "prompt_logprobs": 21})", "prompt_logprobs", "'prompt_logprobs' must be at most 20, got 21"},
    {R"({"prompt": "a", "prompt_logprobs": true})", "prompt_logprobs", "'prompt_logprobs' must be an integer"},
    {R"({"prompt": "a", "logit_bias": [1]})", "logit_bias", "'logit_bias' must be an object of token id: bias"},
    {R"({"prompt": "a", "logit_bias": {"x5": 1}})", "logit_bias", "'logit_bias' keys must be token ids, got 'x5'"},
    {R"({"prompt": "a", "logit_bias": {"5": 101}})", "logit_bias",
     "'logit_bias' values must be numbers from -100 to 100, got 101 for token 5"},
    {R"({"prompt": "a", "stop_token_ids": [-1]})", "stop_token_ids", "'stop_token_ids' must be an array of token ids"},
    {R"({"prompt": "a", "stream_options": {"include_usage": true}})", "stream_options",
     "'stream_options' is only allowed when 'stream' is true"},
    {R"({"prompt": "a", "speculative": {"method": "eagle"}})", "speculative.method",
     "'speculative.method' must be one of none, ngram, draft"},
    {R"({"prompt": "a", "speculative": {"num_draft_tokens": 0}})", "speculative.num_draft_tokens",
     "'speculative.num_draft_tokens' must be an integer between 1 and 64"},
    {R"({"prompt": "a", "seed": 1.5})", "seed", "'seed' must be an integer"},
    {R"({"prompt": "a", "user": 7})", "user", "'user' must be a string"},
};

TEST(RequestValidation, EachBadFieldIsNamed) {
  for (const Bad& b : kBad) {
    SCOPED_TRACE(b.body);
    try {
      parse_completion_request(json::parse(b.body), Endpoint::completions, {});
      ADD_FAILURE() << "accepted";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400);
      EXPECT_EQ(e.body()["error"]["param"], b.param);
      EXPECT_EQ(e.body()["error"]["message"], b.message);
      EXPECT_EQ(e.body()["error"]["type"], "invalid_request_error");
    }
  }
}

TEST(RequestValidation, ChatMessagesAreChecked) {
  const Bad bad[] = {
      {R"({"messages": []})", "messages", "'messages' must be a non-empty array"},
      {R"({"messages": [{"role": "robot", "content": "x"}]})", "messages[0].role",
       "'messages[0].role' must be one of system, user, assistant, tool, developer"},
      {R"({"messages": [{"role": "user"}]})", "messages[0].content", "'messages[0].content' is required"},
      {R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content",
       "'messages[0].content' must be a string or an array of text parts"},
      // A part whose "type" or "text" is not a string (found by fuzzing: it escaped as a json type_error).
      {R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": false, "text": "b"}]}]})",
       "messages[0].content", "'messages[0].content' must be a string or an array of text parts"},
      {R"({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]})", "messages[0].content",
       "'messages[0].content' must be a string or an array of text parts"},
  };
  auto render = [](const json&, bool) { return std::string("x"); };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.body);
    try {
      parse_completion_request(json::parse(b.body), Endpoint::chat, render);
      ADD_FAILURE() << "accepted";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.body()["error"]["param"], b.param);
      EXPECT_EQ(e.body()["error"]["message"], b.message);
    }
  }
}

TEST(RequestValidation, GoodBodyIsRead) {
  const auto r = parse_completion_request(
      json::parse(R"({"prompt": ["a", [1, 2]], "n": 2, "stream": true, "stream_options": {"include_usage": true},
        "max_completion_tokens": 9, "temperature": 0.5, "top_k": -1, "stop": "x", "seed": -1, "ignore_eos": true,
        "logprobs": null, "logit_bias": {}, "user": "u", "speculative": {"method": "none"}})"),
      Endpoint::completions, {});
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.prompts[1].tokens, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(r.n, 2);
  EXPECT_TRUE(r.stream && r.include_usage && r.ignore_eos && r.seeded);
  EXPECT_EQ(r.max_tokens, 9);
  EXPECT_EQ(r.sampling.top_k, 0);
  EXPECT_EQ(r.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(r.spec_method, "none");
  EXPECT_FALSE(r.logprobs.has_value());
}

TEST(RequestValidation, LogprobsLogitBiasAndStopTokenIdsAreRead) {
  const auto c = parse_completion_request(
      json::parse(R"({"prompt": "a", "logprobs": 3, "logit_bias": {"7": -100, "12": 2.5}, "stop_token_ids": [4, 9]})"),
      Endpoint::completions, {});
  EXPECT_EQ(c.logprobs, 3);
  EXPECT_EQ(c.sampling.logit_bias, (std::vector<std::pair<int32_t, float>>{{12, 2.5f}, {7, -100.0f}}));
  EXPECT_EQ(c.stop_token_ids, (std::vector<int32_t>{4, 9}));
  auto render = [](const json&, bool) { return std::string("x"); };
  const json messages = json::array({{{"role", "user"}, {"content", "hi"}}});
  EXPECT_EQ(parse_completion_request({{"messages", messages}, {"logprobs", true}}, Endpoint::chat, render).logprobs, 0);
  EXPECT_EQ(parse_completion_request({{"messages", messages}, {"logprobs", true}, {"top_logprobs", 5}}, Endpoint::chat,
                                     render)
                .logprobs,
            5);
  EXPECT_FALSE(parse_completion_request({{"messages", messages}, {"logprobs", false}}, Endpoint::chat, render)
                   .logprobs.has_value());
  try {
    parse_completion_request({{"messages", messages}, {"top_logprobs", 2}}, Endpoint::chat, render);
    ADD_FAILURE() << "top_logprobs without logprobs was accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.body()["error"]["param"], "top_logprobs");
  }
  // Completions: echo with logprobs scores the prompt too; prompt_logprobs is vLLM's own field.
  const auto echoed = parse_completion_request(
      json::parse(R"({"prompt": "a", "echo": true, "logprobs": 2, "prompt_logprobs": 0})"), Endpoint::completions, {});
  EXPECT_TRUE(echoed.echo);
  EXPECT_EQ(echoed.logprobs, 2);
  EXPECT_EQ(echoed.prompt_logprobs, 0);
  try {
    parse_completion_request({{"messages", messages}, {"prompt_logprobs", 1}}, Endpoint::chat, render);
    ADD_FAILURE() << "prompt_logprobs on chat was accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.body()["error"]["param"], "prompt_logprobs");
  }
}

TEST(RequestValidation, ChatContentPartsAreJoinedForTheRenderer) {
  json seen;
  auto render = [&](const json& m, bool add) {
    seen = m;
    EXPECT_TRUE(add);
    return std::string("P");
  };
  const auto r =
      parse_completion_request(json::parse(R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                 {"type": "text", "text": "b"}]}]})"),
                               Endpoint::chat, render);
  EXPECT_EQ(r.prompts[0].text, "P");
  EXPECT_EQ(seen[0]["content"], "ab");
}

}  // namespace
