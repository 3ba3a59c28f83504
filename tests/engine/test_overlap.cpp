// Decode steps launched before the previous step's tokens are committed (EngineOptions::overlap,
// Model::launch with from_previous) give every request what steps taken one after the other
// give: the same tokens, text and finish reason, on rows that join, stop, run out of budget and
// are cancelled while a step runs ahead of them, beside a speculating row that turns it off
// while it drafts (test_paused_taps.cpp has steps run ahead of a row its policy pauses).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "engine_fixture.h"

namespace specdec::testing {
namespace {

struct Outcome {
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason finish = FinishReason::none;
  bool operator==(const Outcome&) const = default;
};

struct Outcomes {
  std::vector<Outcome> outcomes;
  EngineCounters counters;
};

// Runs the requests on an engine of three rows (the rest wait and join as rows finish) with
// `batch_tokens` tokens a forward, and cancels request `cancel` after `cancel_after` iterations.
Outcomes run_all(Overlap overlap, int batch_tokens, const std::vector<Request>& requests, size_t cancel,
                 int cancel_after) {
  EngineOptions options;
  options.overlap = overlap;
  options.max_rows = 3;
  options.max_batch_tokens = batch_tokens;
  auto engine = make_engine(4, options);
  std::vector<int64_t> ids;
  for (const Request& r : requests) ids.push_back(engine->submit(r));
  int steps = 0;
  while (!engine->idle()) {
    engine->step();
    if (++steps == cancel_after) engine->cancel(ids[cancel]);
  }
  Outcomes run;
  for (int64_t id : ids) {
    auto res = engine->take_result(id);
    EXPECT_TRUE(res.has_value());
    if (res) run.outcomes.push_back(Outcome{res->tokens, res->text, res->finish});
  }
  run.counters = engine->stats();
  return run;
}

TEST(EngineOverlap, StepsLaunchedAheadGiveTheSequentialOutput) {
  const std::vector<std::string> texts = {"def fibonacci(n):", "The quick brown fox", "import numpy as np\n",
                                          "class Stack:\n    def __init__(self):", "Once upon a time"};
  // A stop string the greedy text of texts[0] reaches about halfway through its 40 tokens.
  const std::string reference = run_one(*make_engine(), make_request(encode(texts[0]), 40)).text;
  ASSERT_GT(reference.size(), 24u);
  const std::string stop = reference.substr(reference.size() / 2, 3);

  std::vector<Request> requests;
  requests.push_back(make_request(encode(texts[0]), 40));
  requests.back().stop.stop_strings = {stop};
  requests.push_back(make_request(encode(texts[1]), 36, 0.8f, 3));  // cancelled after 8 iterations
  requests.back().sampling.top_p = 0.9f;
  requests.push_back(make_request(encode(texts[2]), 5, 1.1f, 4));  // ends first, by its budget
  requests.push_back(make_request(encode(texts[3]), 30));          // joins when a row frees
  requests.push_back(make_request(encode(texts[4]), 24, 0.7f, 5));
  requests.back().stop.ignore_eos = false;
  requests.push_back(make_request(encode(texts[2]), 20));  // speculates: steps run ahead only while it pauses
  requests.back().spec.method = "ngram";

  // 512 tokens a forward: each prompt is one chunk. 8: prompts take several chunks beside the
  // decoding rows, so the chunks of rows still prefilling are launched ahead too.
  for (int batch_tokens : {512, 8}) {
    SCOPED_TRACE(batch_tokens);
    const Outcomes sequential = run_all(Overlap::off, batch_tokens, requests, 1, 8);
    const Outcomes ahead = run_all(Overlap::always, batch_tokens, requests, 1, 8);
    ASSERT_EQ(sequential.outcomes.size(), requests.size());
    ASSERT_EQ(ahead.outcomes.size(), requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_EQ(ahead.outcomes[i].tokens, sequential.outcomes[i].tokens) << "request " << i;
      EXPECT_EQ(ahead.outcomes[i].text, sequential.outcomes[i].text) << "request " << i;
      EXPECT_EQ(ahead.outcomes[i].finish, sequential.outcomes[i].finish) << "request " << i;
    }
    EXPECT_EQ(sequential.outcomes[0].finish, FinishReason::stop);
    EXPECT_EQ(sequential.outcomes[1].finish, FinishReason::cancelled);
    EXPECT_EQ(sequential.outcomes[2].tokens.size(), 5u);
    EXPECT_EQ(sequential.outcomes[5].tokens, run_one(*make_engine(), make_request(encode(texts[2]), 20)).tokens);
    EXPECT_EQ(sequential.counters.forwards_ahead, 0);
    EXPECT_GT(ahead.counters.forwards_ahead, 0);
    // Every row's KV went back (a step launched ahead of a row that ended holds none of it).
    EXPECT_EQ(ahead.counters.kv_blocks_used, sequential.counters.kv_blocks_used);
  }
}

// The same requests one at a time, greedy and sampled: every step after the first runs ahead.
TEST(EngineOverlap, OneRowRunsAheadEveryStep) {
  for (float temperature : {0.0f, 0.8f}) {
    EngineOptions off, always;
    off.overlap = Overlap::off;
    always.overlap = Overlap::always;
    const Request r = make_request(encode("def quicksort(xs):"), 32, temperature, 11);
    auto a = make_engine(0, off), b = make_engine(0, always);
    EXPECT_EQ(run_one(*b, r).tokens, run_one(*a, r).tokens) << "T " << temperature;
    // The prefill launches the first of the 32 decode steps, each but the last the next.
    EXPECT_EQ(b->stats().forwards_ahead, 32) << "T " << temperature;
  }
}

// A row that a stop string ends leaves the step launched ahead of it, and the other row's steps
// go on launching ahead: only the longer row's last step launches none (the prefill launches
// the first decode step).
TEST(EngineOverlap, ARowThatStopsLeavesTheOthersRunningAhead) {
  const std::vector<int32_t> prompt = encode("def fibonacci(n):");
  const std::string text = run_one(*make_engine(), make_request(prompt, 30)).text;
  ASSERT_GT(text.size(), 24u);
  Request stopping = make_request(prompt, 40);
  stopping.stop.stop_strings = {text.substr(text.size() / 3, 3)};
  const Request longer = make_request(encode("The quick brown fox"), 30, 0.8f, 9);
  std::vector<std::vector<int32_t>> outputs[2];
  int64_t ahead = 0;
  for (Overlap overlap : {Overlap::off, Overlap::always}) {
    EngineOptions options;
    options.overlap = overlap;
    auto engine = make_engine(0, options);
    const int64_t a = engine->submit(stopping), b = engine->submit(longer);
    engine->run();
    auto ra = engine->take_result(a), rb = engine->take_result(b);
    ASSERT_TRUE(ra && rb);
    EXPECT_EQ(ra->finish, FinishReason::stop);
    EXPECT_LT(ra->tokens.size(), 30u);
    outputs[overlap == Overlap::always] = {ra->tokens, rb->tokens};
    ahead = engine->stats().forwards_ahead;
  }
  EXPECT_EQ(outputs[1], outputs[0]);
  EXPECT_EQ(ahead, 30);
}

// A speculating request that arrives while a plain row runs ahead is admitted by the next
// planned iteration, not after the plain row finishes.
TEST(EngineOverlap, ASpeculatingRequestDoesNotWaitBehindPlainRows) {
  EngineOptions always;
  always.overlap = Overlap::always;
  auto engine = make_engine(4, always);
  const int64_t plain_id = engine->submit(make_request(encode("def quicksort(xs):"), 40));
  for (int i = 0; i < 4; ++i) engine->step();
  ASSERT_GT(engine->stats().forwards_ahead, 0);
  Request speculating = make_request(encode("The quick brown fox"), 12);
  speculating.spec.method = "ngram";
  const int64_t spec_id = engine->submit(speculating);
  for (int i = 0; i < 3; ++i) engine->step();
  EXPECT_EQ(engine->stats().running, 2);
  engine->run();
  EXPECT_EQ(engine->take_result(spec_id)->tokens,
            run_one(*make_engine(), make_request(encode("The quick brown fox"), 12)).tokens);
  EXPECT_EQ(engine->take_result(plain_id)->tokens.size(), 40u);
}

// An engine dropped while a step runs ahead leaves the target free for the next engine.
TEST(EngineOverlap, AnEngineDroppedMidRunLeavesNoForwardLaunched) {
  EngineOptions always;
  always.overlap = Overlap::always;
  const Request r = make_request(encode("def quicksort(xs):"), 16);
  {
    auto engine = make_engine(0, always);
    engine->submit(r);
    for (int i = 0; i < 4; ++i) engine->step();
    EXPECT_GT(engine->stats().forwards_ahead, 0);
  }
  auto engine = make_engine(0, always);
  EXPECT_EQ(run_one(*engine, r).tokens, run_one(*make_engine(), r).tokens);
}

// Model::launch: a decode step fed the previous forward's drawn tokens on the backend equals
// the step given those tokens; and the launch contract's misuses are refused.
TEST(ModelLaunch, TokensFromThePreviousForward) {
  Model& target = *Bundled::get().target;
  const std::vector<int32_t> prompt = encode("def fibonacci(n):");
  const auto make_cache = [&] {
    auto cache = target.make_cache(64);
    for (int s = 0; s < 2; ++s) {
      const auto seq = cache->create();
      EXPECT_TRUE(cache->reserve(seq, static_cast<int>(prompt.size()) + 2));
    }
    return cache;
  };
  const auto greedy = [](size_t n) { return std::vector<SampleRow>(n, sample_row(SamplingParams{}, 0)); };
  // Both rows prefill the prompt and draw its next token; then one decode step.
  ForwardRequest prefill;
  for (KvCache::SeqId s : {0, 1})
    prefill.rows.push_back(SequenceInput{s, prompt, {static_cast<int>(prompt.size()) - 1}});
  prefill.sampling = greedy(2);

  auto given_cache = make_cache();
  const ForwardResult first = target.forward(prefill, *given_cache);
  ForwardRequest given;
  for (KvCache::SeqId s : {0, 1}) given.rows.push_back(SequenceInput{s, {first.tokens[s]}, {0}});
  given.sampling = greedy(2);
  const ForwardResult want = target.forward(given, *given_cache);

  auto cache = make_cache();
  const Model::Ticket t1 = target.launch(prefill, *cache);
  ForwardRequest next;
  for (KvCache::SeqId s : {0, 1}) next.rows.push_back(SequenceInput{s, {0}, {0}});
  next.from_previous = {1, 0};  // row 0 takes row 1's token, and the reverse
  next.sampling = greedy(2);
  // Both sequences continue the same prompt, so the crossed inputs are the same tokens.
  const Model::Ticket t2 = target.launch(next, *cache);
  EXPECT_THROW(target.launch(next, *cache), Error);  // a third forward in flight
  EXPECT_THROW(target.wait(t2), Error);              // not the oldest
  EXPECT_EQ(target.wait(t1).tokens, first.tokens);
  EXPECT_EQ(target.wait(t2).tokens, want.tokens);
  EXPECT_EQ(cache->length(0), static_cast<int>(prompt.size()) + 1);

  // A forward that returned logits drew no tokens to take.
  auto logits_cache = make_cache();
  ForwardRequest logits = prefill;
  logits.sampling.clear();
  target.forward(logits, *logits_cache);
  EXPECT_THROW(target.launch(next, *logits_cache), Error);
  // An index past the previous forward's returned rows; a row of two tokens, or more indices
  // than rows.
  auto past_cache = make_cache();
  target.forward(prefill, *past_cache);
  ForwardRequest past = next;
  past.from_previous = {0, 2};
  EXPECT_THROW(target.launch(past, *past_cache), Error);
  ForwardRequest two = next;
  two.rows[0].tokens = {0, 0};
  EXPECT_THROW(target.launch(two, *past_cache), Error);
  ForwardRequest more = next;
  more.from_previous = {0, 1, 1};
  EXPECT_THROW(target.launch(more, *past_cache), Error);
  EXPECT_EQ(past_cache->length(0), static_cast<int>(prompt.size()));  // nothing was launched
}

}  // namespace
}  // namespace specdec::testing
