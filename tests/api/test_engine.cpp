// The public Engine from several threads: concurrent submits give exactly the solo (and the
// transformers) greedy tokens with every draft method, a cancel ends a request mid-stream, a bad
// request throws from submit and harms nobody, and destruction with requests in flight cancels
// them cleanly. Only specdec/specdec.h is included.
#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <future>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <thread>

#include "specdec/specdec.h"

namespace {

const std::string kRoot = SPECDEC_SOURCE_DIR;

struct Fixture {
  std::vector<std::string> prompts;
  std::vector<std::vector<int32_t>> greedy;  // transformers' greedy continuations
};

const Fixture& fixture() {
  static const Fixture f = [] {
    std::ifstream in(kRoot + "/tests/fixtures/bundled/greedy.json");
    const auto j = nlohmann::json::parse(in);
    Fixture f;
    for (size_t i = 0; i < 6; ++i) {
      f.prompts.push_back(j["prompts_text"][i]);
      f.greedy.push_back(j["target"]["greedy"][i].get<std::vector<int32_t>>());
    }
    return f;
  }();
  return f;
}

specdec::DraftSpec draft_model() { return specdec::DraftSpec::model(kRoot + "/models/draft", "draft"); }

specdec::EngineConfig config(std::vector<specdec::DraftSpec> drafts = {}) {
  specdec::EngineConfig c;
  c.model_dir = kRoot + "/models/target";
  c.device = specdec::DeviceKind::cpu;
  c.drafts = std::move(drafts);
  return c;
}

specdec::GenerationRequest greedy(const std::string& prompt, int max_tokens, const std::string& draft = "") {
  specdec::GenerationRequest r;
  r.prompt = prompt;
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  r.ignore_eos = true;
  r.speculative.draft = draft;
  return r;
}

constexpr int kTokens = 24;

std::vector<int32_t> first(const std::vector<int32_t>& v, size_t n) { return {v.begin(), v.begin() + n}; }

TEST(Engine, ConcurrentSubmitsGiveTheSoloTokens) {
  specdec::Engine engine(config({specdec::DraftSpec::ngram()}));
  const Fixture& fx = fixture();
  std::vector<std::vector<int32_t>> solo;
  for (const auto& p : fx.prompts) {
    specdec::GenerationResult r = engine.wait(engine.submit(greedy(p, kTokens)));
    EXPECT_EQ(r.tokens, first(fx.greedy[solo.size()], kTokens));
    solo.push_back(r.tokens);
  }
  // The draft model joins while other threads submit.
  std::thread adder([&] { engine.add_draft(draft_model()); });
  const std::vector<std::string> methods{"", "ngram", "draft"};
  std::mutex mu;
  std::vector<std::string> failures;
  std::vector<std::thread> clients;
  for (int c = 0; c < 4; ++c)
    clients.emplace_back([&, c] {
      for (size_t i = 0; i < fx.prompts.size(); ++i) {
        const std::string& method = methods[(i + static_cast<size_t>(c)) % methods.size()];
        while (!method.empty() && !engine.has_draft(method)) std::this_thread::yield();
        specdec::GenerationResult r = engine.wait(engine.submit(greedy(fx.prompts[i], kTokens, method)));
        std::lock_guard lock(mu);
        if (r.tokens != solo[i])
          failures.push_back("client " + std::to_string(c) + " prompt " + std::to_string(i) + " method '" + method +
                             "'");
        if (r.stats.speculative.has_value() != !method.empty()) failures.push_back("telemetry of '" + method + "'");
      }
    });
  adder.join();
  for (auto& t : clients) t.join();
  EXPECT_TRUE(failures.empty()) << failures.size() << " mismatches, first: " << failures.front();
}

TEST(Engine, SubmitAllStartsABatchWhoseTokensMatchSolo) {
  specdec::Engine engine(config({specdec::DraftSpec::ngram(), draft_model()}));
  const Fixture& fx = fixture();
  std::vector<specdec::GenerationRequest> batch;
  for (size_t i = 0; i < fx.prompts.size(); ++i) batch.push_back(greedy(fx.prompts[i], kTokens, i % 2 ? "draft" : ""));
  const std::vector<int64_t> ids = engine.submit_all(std::move(batch));
  ASSERT_EQ(ids.size(), fx.prompts.size());
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(engine.wait(ids[i]).tokens, first(fx.greedy[i], kTokens)) << i;
  // All or nothing: one bad request, and none of them runs.
  std::vector<specdec::GenerationRequest> bad{greedy(fx.prompts[0], kTokens), greedy(fx.prompts[1], 0)};
  EXPECT_THROW(engine.submit_all(std::move(bad)), std::runtime_error);
}

// Events of one request, gathered on the loop thread.
struct Stream {
  std::mutex mu;
  std::string text;
  int events = 0;
  specdec::Finish last = specdec::Finish::none;
  std::promise<void> started;
  bool signalled = false;

  void on(const specdec::GenerationEvent& ev) {
    std::lock_guard lock(mu);
    text += ev.text;
    ++events;
    if (ev.finish != specdec::Finish::none) last = ev.finish;
    if (!signalled && !ev.tokens.empty()) {
      signalled = true;
      started.set_value();
    }
  }
};

TEST(Engine, ReleasedResultsAreNotKept) {
  // A streaming client that never waits: after release its result is gone, so wait refuses it;
  // its events still arrive, and an unreleased request beside it keeps its result.
  specdec::Engine engine(config());
  std::promise<std::string> final_text;
  std::string streamed;
  specdec::GenerationRequest r = greedy(fixture().prompts[0], kTokens);
  r.on_event = [&](const specdec::GenerationEvent& ev) {
    streamed += ev.text;
    if (ev.finish != specdec::Finish::none) final_text.set_value(streamed);
  };
  const int64_t streaming = engine.submit(std::move(r));
  engine.release(streaming);
  const int64_t kept = engine.submit(greedy(fixture().prompts[1], kTokens));
  EXPECT_FALSE(final_text.get_future().get().empty());
  EXPECT_EQ(engine.wait(kept).tokens, first(fixture().greedy[1], kTokens));
  EXPECT_THROW(engine.wait(streaming), std::runtime_error);
  // Released after it finished: dropped at once.
  const int64_t done = engine.submit(greedy(fixture().prompts[2], 4));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  engine.release(done);
  EXPECT_THROW(engine.wait(done), std::runtime_error);
}

TEST(Engine, CancelEndsARequestMidStream) {
  specdec::Engine engine(config());
  Stream s;
  specdec::GenerationRequest r = greedy(fixture().prompts[0], 1500);
  r.on_event = [&s](const specdec::GenerationEvent& ev) { s.on(ev); };
  const int64_t id = engine.submit(std::move(r));
  s.started.get_future().wait();
  engine.cancel(id);
  const specdec::GenerationResult result = engine.wait(id);
  EXPECT_EQ(result.finish, specdec::Finish::cancelled);
  EXPECT_GT(result.tokens.size(), 0u);
  EXPECT_LT(result.tokens.size(), 1500u);
  std::lock_guard lock(s.mu);
  EXPECT_EQ(s.last, specdec::Finish::cancelled);
  EXPECT_EQ(s.text, result.text);
  // A second wait, and a wait for an id never submitted, are refused.
  EXPECT_THROW(engine.wait(id), std::runtime_error);
  EXPECT_THROW(engine.wait(id + 1000), std::runtime_error);
}

TEST(Engine, ACallbackMayCancelItsRequestAndAThrowingOneEndsOnlyItsOwn) {
  specdec::Engine engine(config());
  specdec::GenerationRequest a = greedy(fixture().prompts[0], 1500);
  a.on_event = [&](const specdec::GenerationEvent& ev) {
    if (ev.tokens.size() && ev.finish == specdec::Finish::none) engine.cancel(ev.request_id);
  };
  specdec::GenerationRequest b = greedy(fixture().prompts[1], 1500);
  b.on_event = [](const specdec::GenerationEvent&) { throw std::runtime_error("client went away"); };
  const int64_t ia = engine.submit(std::move(a));
  const int64_t ib = engine.submit(std::move(b));
  const int64_t ic = engine.submit(greedy(fixture().prompts[2], kTokens));
  EXPECT_EQ(engine.wait(ia).finish, specdec::Finish::cancelled);
  EXPECT_EQ(engine.wait(ib).finish, specdec::Finish::cancelled);
  const specdec::GenerationResult c = engine.wait(ic);
  EXPECT_EQ(c.finish, specdec::Finish::length);
  EXPECT_EQ(c.tokens, first(fixture().greedy[2], kTokens));
}

// Submits `make()` and expects submit to throw with `cause` in the message.
template <typename Make>
void expect_refused(specdec::Engine& engine, Make make, const std::string& cause) {
  try {
    engine.submit(make());
    ADD_FAILURE() << "expected a refusal naming '" << cause << "'";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(cause), std::string::npos) << e.what();
  }
}

TEST(Engine, BadRequestsThrowAndLeaveOthersUnharmed) {
  specdec::Engine engine(config({specdec::DraftSpec::ngram()}));
  const Fixture& fx = fixture();
  const int64_t running = engine.submit(greedy(fx.prompts[3], 48, "ngram"));
  expect_refused(
      engine, [] { return greedy("", 8); }, "prompt is empty");
  expect_refused(
      engine, [&] { return greedy(fx.prompts[0], 8, "eagle"); }, "eagle");
  expect_refused(
      engine, [&] { return greedy(fx.prompts[0], 0); }, "max_tokens");
  expect_refused(
      engine,
      [&] {
        specdec::GenerationRequest r = greedy(fx.prompts[0], 8);
        r.sampling.top_p = 3;
        return r;
      },
      "top_p");
  expect_refused(
      engine,
      [&] {
        specdec::GenerationRequest r = greedy("", 8);
        r.prompt_tokens = {1, 2, 1 << 20};
        return r;
      },
      "vocabulary");
  expect_refused(
      engine,
      [&] {
        specdec::GenerationRequest r = greedy("", 8);
        r.prompt_tokens.assign(5000, 1);
        return r;
      },
      "context");
  expect_refused(
      engine,
      [&] {
        specdec::GenerationRequest r = greedy(fx.prompts[0], 8);
        r.stop = {""};
        return r;
      },
      "stop string");
  EXPECT_THROW(engine.add_draft(specdec::DraftSpec::ngram()), std::runtime_error);  // the id "ngram" is taken
  EXPECT_EQ(engine.wait(running).tokens, first(fx.greedy[3], 48));
  EXPECT_EQ(engine.wait(engine.submit(greedy(fx.prompts[4], kTokens))).tokens, first(fx.greedy[4], kTokens));
}

// A refusal found on the engine's thread (here a prompt token outside the vocabulary) is an
// exception made there and handed to the caller, who reads it and ends its life. Many in a row,
// from two callers at once, each arrive whole with their own message (CI also runs this under
// ThreadSanitizer, which checks the hand-off).
TEST(Engine, RefusalsFromTheEngineThreadReachEachCallerWhole) {
  specdec::Engine engine(config());
  auto refuse = [&engine](int32_t first_id, int n) {
    for (int32_t id = first_id; id < first_id + n; ++id) {
      specdec::GenerationRequest r = greedy("", 4);
      r.prompt_tokens = {1, 2, id};
      try {
        engine.submit(std::move(r));
        ADD_FAILURE() << "token " << id << " was accepted";
      } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find("prompt token id " + std::to_string(id) + " is outside the vocabulary"),
                  std::string::npos)
            << e.what();
      }
    }
  };
  std::thread other(refuse, 1 << 20, 200);
  refuse(1 << 21, 200);
  other.join();
  EXPECT_EQ(engine.wait(engine.submit(greedy(fixture().prompts[4], kTokens))).tokens,
            first(fixture().greedy[4], kTokens));
}

TEST(Engine, DestructionCancelsRequestsInFlight) {
  std::vector<std::unique_ptr<Stream>> streams;
  {
    specdec::Engine engine(config({draft_model()}));
    for (size_t i = 0; i < 4; ++i) {
      streams.push_back(std::make_unique<Stream>());
      specdec::GenerationRequest r = greedy(fixture().prompts[i], 1500, i % 2 ? "draft" : "");
      Stream* s = streams.back().get();
      r.on_event = [s](const specdec::GenerationEvent& ev) { s->on(ev); };
      engine.submit(std::move(r));
    }
    streams[0]->started.get_future().wait();
  }
  for (const auto& s : streams) {
    std::lock_guard lock(s->mu);
    EXPECT_EQ(s->last, specdec::Finish::cancelled);
    EXPECT_GE(s->events, 1);
  }
}

TEST(Engine, DescribesItsModel) {
  specdec::Engine engine(config());
  const specdec::ModelInfo& m = engine.model_info();
  const specdec::ModelInfo folder = specdec::inspect_model(kRoot + "/models/target");
  EXPECT_EQ(m.architecture, "LlamaForCausalLM");
  EXPECT_EQ(m.parameter_count, 22028800u);
  EXPECT_EQ(m.parameter_count, folder.parameter_count);
  EXPECT_EQ(m.weight_bytes, folder.weight_bytes);
  EXPECT_EQ(m.vocab_size, 8192);
  EXPECT_EQ(m.tokenizer_vocab_size, folder.tokenizer_vocab_size);
  EXPECT_EQ(engine.device(), specdec::DeviceKind::cpu);
  // K and V of every layer's KV heads: bf16 where the CPU runs the amx kernels, else f32.
  const bool amx = engine.device_name().rfind("cpu-amx", 0) == 0;
  EXPECT_EQ(engine.kv_bytes_per_token(), size_t(2) * m.num_layers * m.num_kv_heads * m.head_dim * (amx ? 2 : 4));
  EXPECT_GT(engine.step_weight_bytes(1), 0u);
  EXPECT_LE(engine.step_weight_bytes(1), m.weight_bytes);
  EXPECT_EQ(engine.decode(engine.encode("def f(x):", false)), "def f(x):");
}

TEST(Engine, ReplaysThePolicyAgainstTheBestSchedule) {
  specdec::Engine engine(config({specdec::DraftSpec::ngram(), draft_model()}));
  specdec::ReplayRequest request;
  request.prompts.push_back(
      {"copy", engine.encode("def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n", false), 24});
  request.context = engine.encode(fixture().prompts[1] + fixture().prompts[2], false);
  request.drafts = {"ngram", "draft"};
  request.timing_repeats = 1;
  // Forwards far dearer than any draft call, and nearly as cheap wide as narrow: drafting pays
  // wherever a draft is accepted. Widths past the list go on at its last step.
  request.forward_ms = {1000, 1000.5, 1000.75};
  const specdec::ReplayReport r = engine.replay(request);
  ASSERT_EQ(r.forward_ms.size(), 17u);
  EXPECT_NEAR(r.forward_ms[0], 1000, 1e-9);
  EXPECT_NEAR(r.forward_ms[2], 1000.75, 1e-9);
  EXPECT_NEAR(r.forward_ms[16], 1000.75 + 14 * 0.25, 1e-9);
  ASSERT_EQ(r.methods.size(), 2u);
  for (const specdec::ReplayMethodReport& m : r.methods) {
    ASSERT_EQ(m.prompts.size(), 1u) << m.draft;
    const specdec::ReplayPromptReport& p = m.prompts[0];
    EXPECT_GE(p.best_schedule.decode_speedup + 1e-9, p.policy.decode_speedup) << m.draft;
    EXPECT_GE(p.best_schedule.decode_speedup + 1e-9, p.best_fixed.decode_speedup) << m.draft;
    EXPECT_LE(p.policy.accepted, p.policy.drafted) << m.draft;
    EXPECT_GT(p.best_schedule.accepted, 0) << m.draft;  // the copy is found, the draft model agrees
    EXPECT_GT(p.best_schedule.decode_speedup, 1.0) << m.draft;
  }
  EXPECT_FALSE(r.methods[0].timed_draft_calls);
  EXPECT_TRUE(r.methods[1].timed_draft_calls);
  request.drafts = {"eagle"};
  EXPECT_THROW(engine.replay(request), std::runtime_error);
}

// A seeded sampled request's tokens are as fixed as greedy ones (each draw a function of the seed
// and the position), and so is what the draft model proposes along them: the replay of a fixed
// depth accepts what the engine's run at that depth accepts. The two count a request's ends
// alike to within one round (the engine's figures count the prefill's token as a round), as for
// greedy requests; drafts drawn any other way than with the target's keys would accept far fewer.
TEST(Engine, ReplaysASampledRequestAsTheEngineRunsIt) {
  specdec::Engine engine(config({draft_model()}));
  specdec::ReplayRequest request;
  const std::string prompt = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n";
  request.prompts.push_back({"sampled", engine.encode(prompt, false), 96});
  request.context = engine.encode(fixture().prompts[1], false);
  request.drafts = {"draft"};
  request.timing_repeats = 1;
  request.forward_ms = {1.0, 1.1, 1.2};
  request.draft_ms = {0.3, 0.2};  // given, as the forwards are: the replay's choices do not depend on timing
  request.sampling = specdec::SamplingOptions{0.8f, 1.0f, 0, 0.0f, 1.0f};
  request.sampling.seed = 11;
  for (int depth : {1, 3}) {
    request.num_draft_tokens = depth;
    const specdec::ReplayReport r = engine.replay(request);
    ASSERT_EQ(r.methods.size(), 1u);
    EXPECT_DOUBLE_EQ(r.methods[0].draft_fixed_ms, 0.3);
    EXPECT_DOUBLE_EQ(r.methods[0].draft_step_ms, 0.2);
    const specdec::ReplayPromptReport& p = r.methods[0].prompts.at(0);
    specdec::GenerationRequest g;
    g.prompt_tokens = request.prompts[0].tokens;
    g.max_tokens = request.prompts[0].max_tokens;
    g.ignore_eos = true;
    g.sampling = request.sampling;
    g.speculative.draft = "draft";
    g.speculative.num_draft_tokens = p.best_fixed_depth;
    g.speculative.adaptive = false;
    const specdec::GenerationResult run = engine.wait(engine.submit(std::move(g)));
    ASSERT_TRUE(run.stats.speculative.has_value());
    const specdec::SpeculativeStats& s = *run.stats.speculative;
    EXPECT_GT(s.accepted, 3) << "depth " << p.best_fixed_depth;  // sampled drafts are accepted too
    EXPECT_NEAR(s.accepted, p.best_fixed.accepted, 1) << "depth " << p.best_fixed_depth;
    EXPECT_NEAR(s.rounds, p.best_fixed.rounds, 1) << "depth " << p.best_fixed_depth;
  }
}

// A seeded rejection-mode request gives the same tokens on every run, alone or among other rows
// of any mix (plain, exact, rejection with other seeds), on either draft method: its depths may
// depend on nothing that timing or the batch decides. One test per method, so that a parallel
// run (the sanitizer builds' above all) takes the two side by side.
void expect_seeded_rejection_reproduces(const std::string& method) {
  specdec::Engine engine(config({specdec::DraftSpec::ngram(), draft_model()}));
  specdec::GenerationRequest probe = greedy(fixture().prompts[0], 32, method);
  probe.sampling.temperature = 0.9f;
  probe.sampling.seed = 1234;
  probe.speculative.mode = specdec::VerifyMode::rejection;
  const std::vector<int32_t> alone = engine.wait(engine.submit(probe)).tokens;
  ASSERT_EQ(alone.size(), 32u);
  for (int run = 0; run < 8; ++run) {
    std::vector<int64_t> others;
    const int64_t first = run % 2 ? engine.submit(probe) : -1;  // before the others, or after them
    for (int i = 0; i < run; ++i) {                             // 0 to 7 other rows, of every kind
      specdec::GenerationRequest other = greedy(fixture().prompts[1 + i % 5], 16 + 8 * (i % 3), i % 3 ? method : "");
      other.sampling.temperature = i % 2 ? 0.7f : 0.0f;
      other.sampling.seed = static_cast<uint64_t>(run * 10 + i);
      if (i % 3 == 2) other.speculative.mode = specdec::VerifyMode::rejection;
      others.push_back(engine.submit(other));
    }
    const int64_t id = run % 2 ? first : engine.submit(probe);
    const std::vector<int32_t> tokens = engine.wait(id).tokens;
    for (int64_t o : others) engine.wait(o);
    EXPECT_EQ(tokens, alone) << method << ", run " << run;
  }
}

TEST(Engine, SeededRejectionModeReproducesUnderAnyLoadWithNgram) { expect_seeded_rejection_reproduces("ngram"); }

TEST(Engine, SeededRejectionModeReproducesUnderAnyLoadWithTheDraftModel) {
  expect_seeded_rejection_reproduces("draft");
}

}  // namespace
