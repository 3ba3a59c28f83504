// The server in-process on an ephemeral loopback port, driven with httplib's client: greedy
// completions equal `specdec generate`, streamed chunks concatenate to the whole text, echo with
// logprobs and prompt_logprobs, n=2, stop strings, chat through a test renderer, error statuses with OpenAI's error
// JSON, the API key, a body over the limit, a disconnect that cancels, and concurrent clients that match solo runs.
#include <gtest/gtest.h>
#include <httplib.h>
#include <stdio.h>

#include <chrono>
#include <future>
#include <memory>
#include <thread>

#include "server/generation_plan.h"
#include "server/http_server.h"

namespace {

using nlohmann::json;
using specdec::server::HttpServer;
using specdec::server::ServerOptions;

const std::string kRoot = SPECDEC_SOURCE_DIR;
const std::string kPrompt = "The quick brown fox";

// The bundled model's ChatML, standing in for the real template.
std::string test_render(const json& messages, bool add_generation_prompt) {
  std::string out;
  for (const json& m : messages)
    out += "<|im_start|>" + m["role"].get<std::string>() + "\n" + m["content"].get<std::string>() + "<|im_end|>\n";
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

specdec::Engine& engine() {
  static specdec::Engine e = [] {
    specdec::EngineConfig c;
    c.model_dir = kRoot + "/models/target";
    c.device = specdec::DeviceKind::cpu;
    c.drafts.push_back(specdec::DraftSpec::ngram());
    return specdec::Engine(c);
  }();
  return e;
}

struct Served {
  explicit Served(ServerOptions o = {}, bool attach = true) {
    o.host = "127.0.0.1";
    o.port = 0;
    o.served_model_name = "target";
    o.drafts = {specdec::DraftSpec::ngram()};
    server = std::make_unique<HttpServer>(o, test_render);
    port = server->bind();
    if (attach) server->attach(engine());
    server->start();
    client = std::make_unique<httplib::Client>("127.0.0.1", port);
    client->set_read_timeout(60);
  }
  httplib::Result post(const std::string& path, const json& body) {
    return client->Post(path.c_str(), body.dump(), "application/json");
  }
  std::unique_ptr<HttpServer> server;
  int port = 0;
  std::unique_ptr<httplib::Client> client;
};

json greedy(int max_tokens = 24) {
  return {
      {"model", "target"}, {"prompt", kPrompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true}};
}

std::string generate_cli_text(int max_tokens) {
  const std::string cmd = std::string(SPECDEC_BINARY) + " generate --device cpu --json --temperature 0 --ignore-eos" +
                          " --max-tokens " + std::to_string(max_tokens) + " --prompt '" + kPrompt + "'";
  std::string out;
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, pipe.get())) out.append(buf, n);
  return json::parse(out)["text"];
}

// The `data:` payloads of an SSE body.
std::vector<std::string> sse_events(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    out.push_back(body.substr(pos + 6, end - pos - 6));
    pos = end;
  }
  return out;
}

void expect_error(const httplib::Result& res, int status, const std::string& param) {
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, status) << res->body;
  const json j = json::parse(res->body);
  ASSERT_TRUE(j.contains("error")) << res->body;
  for (const char* k : {"message", "type", "param", "code"}) EXPECT_TRUE(j["error"].contains(k)) << k;
  if (!param.empty()) {
    EXPECT_EQ(j["error"]["param"], param) << res->body;
  }
}

TEST(Http, GreedyCompletionEqualsGenerate) {
  Served s;
  auto res = s.post("/v1/completions", greedy());
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json j = json::parse(res->body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 24);
  EXPECT_EQ(j["choices"][0]["text"], generate_cli_text(24));
}

TEST(Http, StreamedChunksConcatenateToTheWholeText) {
  Served s;
  const std::string whole = json::parse(s.post("/v1/completions", greedy())->body)["choices"][0]["text"];
  json body = greedy();
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  auto res = s.post("/v1/completions", body);
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200);
  const std::vector<std::string> events = sse_events(res->body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  const json usage = json::parse(events[events.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 24);
  std::string text;
  for (size_t i = 0; i + 2 < events.size(); ++i)
    text += json::parse(events[i])["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(text, whole);
}

// Echo with logprobs: the prompt's tokens first (the first one null), their pieces spelling the
// prompt, then the completion's own logprobs; vLLM's prompt_logprobs holds the same numbers; a
// stream sends the echo chunk with the prompt's logprobs before the tokens.
TEST(Http, EchoWithLogprobsAndPromptLogprobs) {
  Served s;
  json plain_body = greedy(6);
  plain_body["logprobs"] = 2;
  const json plain = json::parse(s.post("/v1/completions", plain_body)->body)["choices"][0];
  json body = plain_body;
  body["echo"] = true;
  body["prompt_logprobs"] = 1;
  auto res = s.post("/v1/completions", body);
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json j = json::parse(res->body);
  const json c = j["choices"][0];
  const int prompt_tokens = j["usage"]["prompt_tokens"];
  const json lp = c["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), static_cast<size_t>(prompt_tokens) + 6);
  EXPECT_EQ(c["text"], kPrompt + plain["text"].get<std::string>());
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  std::string spelled;
  for (size_t i = 0; i < lp["tokens"].size(); ++i) {
    EXPECT_EQ(lp["text_offset"][i], spelled.size());
    spelled += lp["tokens"][i].get<std::string>();
  }
  EXPECT_EQ(spelled, c["text"]);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(lp["tokens"][prompt_tokens + i], plain["logprobs"]["tokens"][i]);
    EXPECT_EQ(lp["token_logprobs"][prompt_tokens + i], plain["logprobs"]["token_logprobs"][i]);
  }
  const json pl = c["prompt_logprobs"];
  ASSERT_EQ(pl.size(), static_cast<size_t>(prompt_tokens));
  EXPECT_TRUE(pl[0].is_null());
  for (int i = 1; i < prompt_tokens; ++i) {
    SCOPED_TRACE(i);
    EXPECT_LE(lp["top_logprobs"][i].size(), 2u);
    bool own = false;
    for (const auto& [id, v] : pl[i].items()) {
      EXPECT_GE(v["rank"].get<int>(), 1);
      if (v["decoded_token"] == lp["tokens"][i]) {
        own = true;
        EXPECT_EQ(v["logprob"], lp["token_logprobs"][i]);
      }
    }
    EXPECT_TRUE(own);
  }
  body["stream"] = true;
  auto streamed = s.post("/v1/completions", body);
  ASSERT_TRUE(streamed);
  const std::vector<std::string> events = sse_events(streamed->body);
  ASSERT_GE(events.size(), 2u);
  const json first = json::parse(events[0])["choices"][0];
  EXPECT_EQ(first["text"], kPrompt);
  EXPECT_EQ(first["prompt_logprobs"], pl);
  json tokens = json::array();
  std::string text;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json e = json::parse(events[i])["choices"][0];
    text += e["text"].get<std::string>();
    if (!e["logprobs"].is_null())
      for (const json& t : e["logprobs"]["tokens"]) tokens.push_back(t);
  }
  EXPECT_EQ(text, c["text"]);
  EXPECT_EQ(tokens, lp["tokens"]);
}

TEST(Http, TwoChoicesAndStopStrings) {
  Served s;
  json body = greedy();
  body["n"] = 2;
  const json j = json::parse(s.post("/v1/completions", body)->body);
  ASSERT_EQ(j["choices"].size(), 2u);
  EXPECT_EQ(j["choices"][0]["text"], j["choices"][1]["text"]);
  EXPECT_EQ(j["choices"][1]["index"], 1);
  const std::string text = j["choices"][0]["text"];
  const std::string stop = text.substr(text.size() / 2, 3);
  body = greedy();
  body["stop"] = json::array({stop});
  const json cut = json::parse(s.post("/v1/completions", body)->body);
  EXPECT_EQ(cut["choices"][0]["text"], text.substr(0, text.find(stop)));
  EXPECT_EQ(cut["choices"][0]["finish_reason"], "stop");
}

TEST(Http, ChatUsesTheRendererAndStreams) {
  Served s;
  const json messages = json::array({{{"role", "user"}, {"content", "Hello"}}});
  json chat = {{"messages", messages}, {"max_tokens", 12}, {"temperature", 0}, {"ignore_eos", true}};
  const json j = json::parse(s.post("/v1/chat/completions", chat)->body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  json completion = greedy(12);
  completion["prompt"] = test_render(messages, true);
  EXPECT_EQ(j["choices"][0]["message"]["content"],
            json::parse(s.post("/v1/completions", completion)->body)["choices"][0]["text"]);
  chat["stream"] = true;
  const std::vector<std::string> events = sse_events(s.post("/v1/chat/completions", chat)->body);
  EXPECT_EQ(json::parse(events[0])["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  for (size_t i = 0; i + 1 < events.size(); ++i)
    text += json::parse(events[i])["choices"][0]["delta"].value("content", "");
  EXPECT_EQ(text, j["choices"][0]["message"]["content"]);
}

TEST(Http, ErrorsAreOpenAiJsonWithTheirStatus) {
  Served s;
  expect_error(s.client->Post("/v1/completions", "{not json", "application/json"), 400, "");
  // A number beyond double is a JSON error of its own kind (out of range), still the client's fault.
  expect_error(s.client->Post("/v1/completions", R"({"prompt": "x", "temperature": 1e999})", "application/json"), 400,
               "");
  expect_error(s.client->Post("/tokenize", R"({"content": "x", "n": 1e999})", "application/json"), 400, "");
  expect_error(s.post("/v1/completions", {{"prompt", "x"}, {"temperature", -1}}), 400, "temperature");
  expect_error(s.post("/v1/completions", {{"prompt", "x"}, {"model", "nope"}}), 404, "model");
  expect_error(s.post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 100000}}), 400, "max_tokens");
  expect_error(s.post("/v1/completions", {{"prompt", "x"}, {"logprobs", 30}}), 400, "logprobs");
  expect_error(s.post("/v1/completions", {{"prompt", "x"}, {"prompt_logprobs", -1}}), 400, "prompt_logprobs");
  expect_error(s.post("/v1/completions", {{"prompt", "x"}, {"prompt_logprobs", 21}}), 400, "prompt_logprobs");
  expect_error(s.post("/v1/completions", {{"prompt", "x"}, {"logit_bias", {{"99999999", 1}}}}), 400, "logit_bias");
  expect_error(s.post("/v1/completions", {{"prompt", "x"}, {"speculative", {{"method", "draft"}}}}), 400,
               "speculative.method");
  expect_error(s.client->Get("/v1/nothing"), 404, "");
}

TEST(Http, ApiKeyAndBodyLimit) {
  ServerOptions o;
  o.api_key = "sekret";
  o.max_body_bytes = 2048;
  Served s(o);
  expect_error(s.post("/v1/completions", greedy()), 401, "");
  EXPECT_EQ(s.client->Get("/health")->status, 200);
  s.client->set_bearer_token_auth("sekret");
  EXPECT_EQ(s.post("/v1/completions", greedy(2))->status, 200);
  json big = greedy(2);
  big["prompt"] = std::string(4096, 'a');
  expect_error(s.post("/v1/completions", big), 413, "");
}

TEST(Http, HealthModelsTokenizeMetrics) {
  Served loading(ServerOptions{}, false);
  expect_error(loading.client->Get("/health"), 503, "");
  Served s;
  EXPECT_EQ(s.client->Get("/health")->status, 200);
  EXPECT_EQ(json::parse(s.client->Get("/v1/models")->body)["data"][0]["id"], "target");
  const json tokens = json::parse(s.post("/tokenize", {{"content", kPrompt}})->body)["tokens"];
  EXPECT_EQ(tokens.get<std::vector<int32_t>>(), engine().encode(kPrompt));
  EXPECT_EQ(json::parse(s.post("/detokenize", {{"tokens", tokens}})->body)["content"], kPrompt);
  s.post("/v1/completions", greedy(4));
  const std::string m = s.client->Get("/metrics")->body;
  for (const char* name : {"specdec:num_requests_running", "specdec:generation_tokens_total",
                           "specdec:time_to_first_token_seconds_bucket", "specdec:spec_decode_num_draft_tokens_total"})
    EXPECT_NE(m.find(name), std::string::npos) << name;
  EXPECT_FALSE(json::parse(s.client->Get("/version")->body)["version"].get<std::string>().empty());
}

TEST(Http, DisconnectCancelsTheRequest) {
  Served s;
  json body = greedy(1500);
  body["stream"] = true;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  int chunks = 0;
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 3; };
  s.client->send(req);  // ends once the receiver refuses: the connection is closed
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (s.server->held_requests() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(s.server->held_requests(), 0);
  EXPECT_NE(s.client->Get("/metrics")->body.find("finished_reason=\"abort\"} 1"), std::string::npos);
}

TEST(Http, ConcurrentClientsMatchSoloOutputs) {
  Served s;
  const std::vector<std::string> prompts{"Once upon a time", "The capital of France", "1, 2, 3,", "def main():"};
  std::vector<std::string> solo;
  for (const std::string& p : prompts) {
    json b = greedy(16);
    b["prompt"] = p;
    solo.push_back(json::parse(s.post("/v1/completions", b)->body)["choices"][0]["text"]);
  }
  std::vector<std::future<std::string>> together;
  for (const std::string& p : prompts)
    together.push_back(std::async(std::launch::async, [&s, p] {
      httplib::Client c("127.0.0.1", s.port);
      c.set_read_timeout(60);
      json b = greedy(16);
      b["prompt"] = p;
      b["stream"] = true;
      std::string text;
      for (const std::string& e : sse_events(c.Post("/v1/completions", b.dump(), "application/json")->body))
        if (e != "[DONE]") text += json::parse(e)["choices"][0]["text"].get<std::string>();
      return text;
    }));
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(together[i].get(), solo[i]) << prompts[i];
}

}  // namespace

namespace {

TEST(Http, ChatStopsAtTheTemplatesEndOfTurn) {
  const std::vector<int32_t> im_end = engine().encode("<|im_end|>");
  ASSERT_EQ(im_end.size(), 1u);
  EXPECT_EQ(specdec::server::end_of_turn_tokens(test_render, engine()), im_end);
  // A template that closes turns with plain text has no end-of-turn token.
  const specdec::server::PromptRenderer plain = [](const json& messages, bool) {
    std::string out;
    for (const json& m : messages) out += m["content"].get<std::string>() + "\n\n";
    return out;
  };
  EXPECT_TRUE(specdec::server::end_of_turn_tokens(plain, engine()).empty());
  EXPECT_TRUE(specdec::server::end_of_turn_tokens({}, engine()).empty());

  // With <|im_end|> all but certain, a chat reply ends at once; a completion does not stop there.
  Served s;
  const json bias = {{std::to_string(im_end[0]), 100}};
  const json chat = {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})},
                     {"max_tokens", 8},
                     {"temperature", 0},
                     {"logit_bias", bias}};
  httplib::Result res = s.post("/v1/chat/completions", chat);
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  json j = json::parse(res->body);
  EXPECT_EQ(j["choices"][0]["message"]["content"], "");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["usage"]["completion_tokens"], 0);
  res = s.post("/v1/completions", {{"prompt", kPrompt}, {"max_tokens", 4}, {"temperature", 0}, {"logit_bias", bias}});
  ASSERT_TRUE(res);
  j = json::parse(res->body);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 4);
}

TEST(Http, QueueFullIs429AndMetricsShowTheEngine) {
  specdec::EngineConfig c;
  c.model_dir = kRoot + "/models/target";
  c.device = specdec::DeviceKind::cpu;
  c.max_rows = 1;
  c.max_queue = 0;
  specdec::Engine busy(c);
  ServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.served_model_name = "target";
  HttpServer server(o, test_render);
  const int port = server.bind();
  server.attach(busy);
  server.start();
  // A long request holds the one row (its stream is open once the first chunk is read).
  httplib::Client streaming("127.0.0.1", port);
  std::promise<void> started, checked;
  std::shared_future<void> checked_future = checked.get_future().share();
  std::thread holder([&] {
    json body = greedy(300);
    body["stream"] = true;
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
      started.set_value();
      checked_future.wait();  // the stream stays open until the 429 has been seen
      return false;           // then hang up
    };
    streaming.send(req);
  });
  started.get_future().wait();
  httplib::Client client("127.0.0.1", port);
  expect_error(client.Post("/v1/completions", greedy(2).dump(), "application/json"), 429, "");
  checked.set_value();
  holder.join();
  // The hang-up frees the row: requests are taken again, and /metrics shows the engine drained.
  int status = 0;
  for (int i = 0; i < 200 && status != 200; ++i) {
    const httplib::Result r = client.Post("/v1/completions", greedy(2).dump(), "application/json");
    status = r ? r->status : 0;
    if (status != 200) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(status, 200);
  std::string metrics;
  for (int i = 0; i < 100; ++i) {
    metrics = client.Get("/metrics")->body;
    if (metrics.find("specdec:num_requests_running{model_name=\"target\"} 0") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (const char* line : {"specdec:num_requests_running{model_name=\"target\"} 0",
                           "specdec:num_requests_waiting{model_name=\"target\"} 0",
                           "specdec:kv_cache_blocks_used{model_name=\"target\"} 0", "specdec:prefix_cache_hits_total",
                           "specdec:num_preemptions_total{model_name=\"target\"} 0",
                           "specdec:one_off_iterations_total{model_name=\"target\"} ", "specdec:one_off_seconds_total",
                           // The CPU's calls run as they come: no iteration is launched ahead there.
                           "specdec:iterations_ahead_total{model_name=\"target\"} 0",
                           "specdec:kv_cache_touched_bytes{model_name=\"target\"} "})
    EXPECT_NE(metrics.find(line), std::string::npos) << line << "\n" << metrics;
}

}  // namespace
