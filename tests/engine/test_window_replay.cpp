// Batches of verify windows replayed from recordings (ReplayCache::padded_windows): the padded
// plan's layout, and an engine whose backend records as a GPU's does (recording_backend.h)
// giving every row its plain tokens while most of its batched windows are replays.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "engine_fixture.h"
#include "model/replay.h"
#include "recording_backend.h"

namespace specdec::testing {
namespace {

// Rows of 3, 1 and 2 new tokens, every token returning its row; the first and last rows tapped.
ForwardPlan three_row_windows() {
  ForwardPlan p;
  p.rows = 3;
  p.tokens = 6;
  p.outputs = 6;
  p.taps = 5;
  p.max_blocks = 2;
  p.max_row_len = 20;
  p.max_row_tokens = 3;
  p.ids = {10, 11, 12, 20, 30, 31};
  p.positions = {17, 18, 19, 5, 8, 9};
  p.slots = {101, 102, 103, 205, 308, 309};
  p.row_starts = {0, 3, 4, 6};
  p.row_lens = {20, 6, 10};
  p.block_table = {6, 7, 12, 0, 19, 0};
  p.out_index = {0, 1, 2, 3, 4, 5};
  p.row_offsets = {0, 3, 4, 6};
  p.tap_index = {0, 1, 2, 4, 5};
  p.tap_offsets = {0, 3, 3, 5};
  return p;
}

TEST(WindowReplay, PaddingKeepsTheGivenRowsFirstAndWritesNothing) {
  const ForwardPlan given = three_row_windows();
  ASSERT_TRUE(ReplayCache::batch_windows(given));
  const ForwardPlan p = ReplayCache::padded_windows(given);
  EXPECT_EQ(p.rows, 3);
  EXPECT_EQ(p.max_row_tokens, 4);  // the longest window, 3, rounded up to a power of two
  EXPECT_EQ(p.tokens, 12);
  EXPECT_EQ(p.row_starts, (std::vector<int32_t>{0, 4, 8, 12}));
  // A padding token repeats its row's last token at that token's position and writes no K/V.
  EXPECT_EQ(p.ids, (std::vector<int32_t>{10, 11, 12, 12, 20, 20, 20, 20, 30, 31, 31, 31}));
  EXPECT_EQ(p.positions, (std::vector<int32_t>{17, 18, 19, 19, 5, 5, 5, 5, 8, 9, 9, 9}));
  EXPECT_EQ(p.slots, (std::vector<int32_t>{101, 102, 103, -1, 205, -1, -1, -1, 308, 309, -1, -1}));
  EXPECT_EQ(p.row_lens, given.row_lens);
  EXPECT_EQ(p.block_table, given.block_table);
  // Every token returns its row, the given ones first and in the given order, so the given
  // row_offsets still index the first outputs.
  EXPECT_EQ(p.outputs, 12);
  EXPECT_EQ(p.out_index, (std::vector<int32_t>{0, 1, 2, 4, 8, 9, 3, 5, 6, 7, 10, 11}));
  EXPECT_EQ(p.row_offsets, given.row_offsets);
  // The tapped rows are tapped at their padding too (after every given tap); the other is not.
  EXPECT_EQ(p.taps, 8);
  EXPECT_EQ(p.tap_index, (std::vector<int32_t>{0, 1, 2, 8, 9, 3, 10, 11}));
  EXPECT_EQ(p.tap_offsets, given.tap_offsets);
}

TEST(WindowReplay, WindowsPastSixteenTokensKeepTheirWidth) {
  ForwardPlan given = three_row_windows();
  given.max_row_tokens = 17;  // as if the first row's window were 17 long: the width stays 17
  const ForwardPlan p = ReplayCache::padded_windows(given);
  EXPECT_EQ(p.max_row_tokens, 17);
  EXPECT_EQ(p.tokens, 51);
}

TEST(WindowReplay, OneRowsWindowIsPaddedToo) {
  // The first row of three_row_windows alone: three tokens, tapped, padded to four.
  ForwardPlan given;
  given.rows = 1;
  given.tokens = given.outputs = given.taps = 3;
  given.max_blocks = 2;
  given.max_row_len = 20;
  given.max_row_tokens = 3;
  given.ids = {10, 11, 12};
  given.positions = {17, 18, 19};
  given.slots = {101, 102, 103};
  given.row_starts = {0, 3};
  given.row_lens = {20};
  given.block_table = {6, 7};
  given.out_index = {0, 1, 2};
  given.row_offsets = {0, 3};
  given.tap_index = {0, 1, 2};
  given.tap_offsets = {0, 3};
  ASSERT_TRUE(ReplayCache::batch_windows(given));
  const ForwardPlan p = ReplayCache::padded_windows(given);
  EXPECT_EQ(p.tokens, 4);
  EXPECT_EQ(p.max_row_tokens, 4);
  EXPECT_EQ(p.ids, (std::vector<int32_t>{10, 11, 12, 12}));
  EXPECT_EQ(p.positions, (std::vector<int32_t>{17, 18, 19, 19}));
  EXPECT_EQ(p.slots, (std::vector<int32_t>{101, 102, 103, -1}));
  EXPECT_EQ(p.out_index, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(p.tap_index, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(p.row_offsets, given.row_offsets);
  EXPECT_EQ(p.tap_offsets, given.tap_offsets);
  // Windows of 5 to 8 tokens share the 8-wide shape; one token is a decode step, not a window.
  given.max_row_tokens = 5;
  EXPECT_EQ(ReplayCache::padded_windows(given).max_row_tokens, 8);
  ForwardPlan step = given;
  step.tokens = step.outputs = step.taps = 1;
  step.max_row_tokens = 1;
  step.row_starts = step.row_offsets = step.tap_offsets = {0, 1};
  step.out_index = step.tap_index = {0};
  EXPECT_FALSE(ReplayCache::batch_windows(step));
}

TEST(WindowReplay, OnlyWholeWindowsArePadded) {
  ForwardPlan steps = three_row_windows();
  steps.tokens = steps.rows;  // one token a row: a decode step
  steps.outputs = steps.rows;
  EXPECT_FALSE(ReplayCache::batch_windows(steps));
  ForwardPlan chunk = three_row_windows();
  chunk.outputs = 4;  // a token that returns nothing: a prefill chunk among the rows
  EXPECT_FALSE(ReplayCache::batch_windows(chunk));
  ForwardPlan wide = three_row_windows();
  wide.max_row_tokens = 16;  // three rows of 16 padded tokens: 48, padded
  EXPECT_TRUE(ReplayCache::batch_windows(wide));
  wide.max_row_tokens = 17;  // 51: still padded (to 17)
  EXPECT_TRUE(ReplayCache::batch_windows(wide));
  ForwardPlan many = three_row_windows();
  many.rows = 9;  // nine rows of 16 would be 144 tokens: more than the padding may add up to
  many.max_row_tokens = 9;
  many.row_starts = {0, 3, 4, 6, 7, 8, 9, 10, 11, 12};
  many.tokens = many.outputs = 12;
  many.tap_offsets.clear();
  many.tap_index.clear();
  many.taps = 0;
  EXPECT_FALSE(ReplayCache::batch_windows(many));
  many.max_row_tokens = 8;  // 72
  EXPECT_TRUE(ReplayCache::batch_windows(many));
  ForwardPlan partly_tapped = three_row_windows();
  partly_tapped.tap_offsets = {0, 2, 2, 4};  // the first row tapped at two of its three tokens
  partly_tapped.tap_index = {0, 1, 4, 5};
  partly_tapped.taps = 4;
  EXPECT_FALSE(ReplayCache::batch_windows(partly_tapped));
}

TEST(WindowReplay, TheShapeUsedLongestAgoMakesRoomForANewOne) {
  RecordingBackend backend(make_backend(BackendOptions{}));
  ReplayCache cache(backend);
  int ran = 0;
  const auto calls = [&] { ++ran; };
  const auto key = [](int rows) {
    ReplayKey k;
    k.rows = k.tokens = rows;
    return k;
  };
  // A decode shape runs call by call once, then records (and replays at once), then replays.
  EXPECT_TRUE(cache.replay_or_run(key(1), calls));
  EXPECT_TRUE(cache.replay_or_run(key(1), calls));
  EXPECT_FALSE(cache.replay_or_run(key(1), calls));
  EXPECT_EQ(backend.recordings(), 1);
  // Fill the cache with other shapes, using shape 1 now and then so that it stays recent.
  for (int rows = 2; rows <= static_cast<int>(ReplayCache::kMaxRecordings); ++rows) {
    cache.replay_or_run(key(rows), calls);
    if (rows % 50 == 0) {
      EXPECT_FALSE(cache.replay_or_run(key(1), calls));
    }
  }
  EXPECT_EQ(cache.size(), ReplayCache::kMaxRecordings);
  // One more shape drops the one used longest ago (shape 2), not the recorded, recent shape 1.
  cache.replay_or_run(key(1000), calls);
  EXPECT_EQ(cache.size(), ReplayCache::kMaxRecordings);
  const int recorded = backend.recordings();
  EXPECT_FALSE(cache.replay_or_run(key(1), calls));
  EXPECT_EQ(backend.recordings(), recorded);
  EXPECT_TRUE(cache.replay_or_run(key(2), calls));  // forgotten: its first run again, call by call
  EXPECT_GT(ran, 0);
}

// The bundled models on a backend that records like a GPU's, over the test backend.
struct Recorded {
  RecordingBackend* recorder = nullptr;
  Bundled models;

  static Recorded& get() {
    static Recorded r = [] {
      auto recorder = std::make_unique<RecordingBackend>(make_backend(test_backend_options()));
      Recorded x;
      x.recorder = recorder.get();
      x.models = Bundled::load(std::move(recorder));
      return x;
    }();
    return r;
  }
};

// n-gram and the draft model at depth 7, and the hidden-state drafters, over the recorded target.
std::unique_ptr<EngineCore> recorded_engine() {
  Bundled& m = Recorded::get().models;
  auto engine = make_engine(7, {}, m);
  // The hidden-state drafters read taps that the recorded forwards gather.
  static const std::shared_ptr<Eagle3Head> head = Eagle3Head::load(source_path("models/eagle3"), *m.backend);
  Eagle3Options e;
  e.kv_blocks = 1024;
  engine->add_method("eagle3",
                     std::make_shared<Eagle3Method>(head, "bundled-eagle3", m.target->config().num_layers, e));
  DflashOptions f;
  f.kv_blocks = 1024;
  engine->add_method("dflash",
                     std::make_shared<DflashMethod>(source_path("models/dflash"), *m.backend, "bundled-dflash", f));
  return engine;
}

struct Row {
  std::string prompt, method;
  int depth;
  float temperature;
};

// Submits the rows together, runs them and checks each against its solo plain run.
void expect_plain_tokens(EngineCore& engine, const std::vector<Row>& rows, int max_tokens) {
  std::vector<int64_t> ids;
  for (size_t i = 0; i < rows.size(); ++i) {
    Request r = make_request(encode(rows[i].prompt), max_tokens, rows[i].temperature, 40 + i);
    r.spec.method = rows[i].method;
    r.spec.max_depth = rows[i].depth;
    r.spec.adaptive = false;  // each speculating row drafts every round, at its own depth
    ids.push_back(engine.submit(std::move(r)));
  }
  engine.run();
  for (size_t i = 0; i < rows.size(); ++i) {
    auto res = engine.take_result(ids[i]);
    ASSERT_TRUE(res.has_value());
    const Row& w = rows[i];
    EXPECT_EQ(res->tokens, plain(encode(w.prompt), max_tokens, w.temperature, 40 + i))
        << "row " << i << " '" << w.method << "' depth " << w.depth << " T " << w.temperature;
    if (!w.method.empty()) {
      EXPECT_GT(res->stats.speculative.drafted, 0) << "row " << i;
    }
  }
}

const std::string kCopy = "def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n";
const std::string kLoop = "for i in range(10):\n    print(i)\nfor i in range(10):\n";
const std::string kClass =
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n";

TEST(WindowReplay, ReplayedBatchesOfNgramWindowsGiveThePlainTokens) {
  RecordingBackend& recorder = *Recorded::get().recorder;
  auto engine = recorded_engine();
  const int replays = recorder.replays();
  const int64_t forwards = engine->target_forwards();
  // Six rows of n-gram drafts at depths 1 to 7, greedy and sampled: windows of every length in
  // one batch, which the rows' changing matches make ragged from round to round.
  expect_plain_tokens(*engine,
                      {{kCopy, "ngram", 7, 0},
                       {kLoop, "ngram", 3, 0},
                       {kClass, "ngram", 5, 0.8f},
                       {kCopy, "ngram", 1, 0.8f},
                       {kLoop, "ngram", 6, 0},
                       {kClass, "ngram", 2, 0}},
                      64);
  // A forward's shape is its rows and its padded window width (and the history's bound), so
  // after a few calls by call nearly every forward of the batch is a replay.
  const int64_t ran = engine->target_forwards() - forwards;
  const int replayed = recorder.replays() - replays;
  report("window_replay.replayed_forwards", replayed);
  report("window_replay.forwards", static_cast<double>(ran));
  EXPECT_GE(replayed, ran / 2) << replayed << " of " << ran << " forwards replayed";
}

TEST(WindowReplay, OneRowsWindowsOfEveryDepthShareAFewRecordings) {
  // One row at a time at depths 1 to 7: its windows of 2 to 8 tokens take the padded widths 2, 4
  // and 8, so three window shapes are recorded, each once: not one per depth, and not again
  // when a wider window than any before would grow a buffer (which drops every recording). A
  // plain request first, so that the decode step is recorded before the count starts.
  RecordingBackend& recorder = *Recorded::get().recorder;
  auto engine = recorded_engine();
  expect_plain_tokens(*engine, {{kLoop, "", 0, 0}}, 12);
  const int recorded = recorder.recordings();
  for (int depth = 1; depth <= 7; ++depth) {
    expect_plain_tokens(*engine, {{depth % 2 ? kCopy : kLoop, "ngram", depth, 0}}, 40);
  }
  const int shapes = recorder.recordings() - recorded;
  report("window_replay.one_row_recordings", shapes);
  EXPECT_GT(shapes, 0);
  EXPECT_LE(shapes, 3) << shapes << " shapes recorded for one row's windows of seven depths";
}

TEST(WindowReplay, ReplayedMixedBatchesGiveThePlainTokens) {
  // The draft model (whose own forwards replay too), the hidden-state drafters (tapped rows
  // beside untapped ones), n-gram and plain rows side by side.
  auto engine = recorded_engine();
  expect_plain_tokens(*engine,
                      {{kClass, "draft", 4, 0},
                       {kCopy, "ngram", 7, 0.8f},
                       {kLoop, "", 0, 0},
                       {kCopy, "eagle3", 6, 0},
                       {kClass, "dflash", 7, 0.8f},
                       {kCopy, "draft", 7, 0.8f},
                       {kLoop, "eagle3", 3, 0.8f},
                       {kLoop, "ngram", 2, 0}},
                      32);
}

TEST(WindowReplay, ReplayedDflashBlocksGiveThePlainTokens) {
  // The DFlash drafter records its own catch-up pass and block forward per shape (padded
  // positions, rounded attention bounds) and replays them, greedy rows taking their tokens and
  // confidences from the device, sampled rows their logits.
  Bundled& m = Recorded::get().models;
  auto engine = make_engine(7, {}, m);
  DflashOptions f;
  f.kv_blocks = 1024;
  auto dflash = std::make_shared<DflashMethod>(source_path("models/dflash"), *m.backend, "bundled-dflash", f);
  engine->add_method("dflash", dflash);
  expect_plain_tokens(*engine, {{kClass, "dflash", 7, 0}}, 48);
  expect_plain_tokens(*engine, {{kCopy, "dflash", 7, 0}, {kLoop, "dflash", 4, 0.8f}, {kClass, "dflash", 6, 0}}, 48);
  const DflashStats st = dflash->stats();
  report("window_replay.dflash_forwards", static_cast<double>(st.forwards));
  report("window_replay.dflash_replayed", static_cast<double>(st.replayed));
  EXPECT_GT(st.forwards, 10);
  // A shape replays from its third run: in runs this short (and with timing-dependent cuts
  // changing which shapes come up) 30-50 % of the forwards replay, the fewest on a loaded
  // machine; none would without recordings.
  EXPECT_GE(st.replayed, st.forwards / 4) << st.replayed << " of " << st.forwards << " block forwards replayed";
}

TEST(WindowReplay, ReplayedEagle3ChainsGiveThePlainTokens) {
  // The EAGLE-3 head's rows chain their drafts on the device: step 0 (each row's fed positions
  // padded to one width) and the chained steps recorded together per shape and replayed, the
  // sampled rows' draws in the recording too.
  Bundled& m = Recorded::get().models;
  auto engine = make_engine(7, {}, m);
  const std::shared_ptr<Eagle3Head> head = Eagle3Head::load(source_path("models/eagle3"), *m.backend);
  Eagle3Options e;
  e.kv_blocks = 1024;
  engine->add_method("eagle3",
                     std::make_shared<Eagle3Method>(head, "bundled-eagle3", m.target->config().num_layers, e));
  expect_plain_tokens(*engine, {{kClass, "eagle3", 6, 0}}, 48);
  expect_plain_tokens(*engine, {{kCopy, "eagle3", 6, 0}, {kLoop, "eagle3", 3, 0}, {kClass, "eagle3", 6, 0}}, 48);
  expect_plain_tokens(*engine, {{kLoop, "eagle3", 1, 0}}, 24);
  expect_plain_tokens(*engine, {{kClass, "eagle3", 6, 0.8f}, {kCopy, "eagle3", 4, 0}}, 48);
  const Eagle3Head::ChainStats st = head->chain_stats();
  report("window_replay.eagle3_chains", static_cast<double>(st.chains));
  report("window_replay.eagle3_replayed", static_cast<double>(st.replayed));
  report("window_replay.eagle3_step0_replayed", static_cast<double>(st.step0_replayed));
  EXPECT_GT(st.chains, 10);
  // A shape replays from its third run; the rounds' fed positions (1 to 7 a row) come in widths
  // 1, 2, 4 and 8, so most chains after the first few of each shape are replays, step 0 with them.
  EXPECT_GE(st.step0_replayed, st.chains / 3) << st.step0_replayed << " of " << st.chains << " chains replayed";
}

TEST(WindowReplay, DraftModelFeedsOfSeveralTokensReplayAndDraftTheSame) {
  // A draft model call whose first step feeds several tokens (the last draft and the pending
  // token after a full accept; the tokens of rounds the row did not draft in) returns every
  // position where the model replays windows, so that the step replays as a window. Its drafts
  // are those of the same calls on a backend that records nothing (one returned position, call
  // by call), and once its shapes have come up a few times every forward of a call is a replay.
  RecordingBackend& recorder = *Recorded::get().recorder;
  static const std::unique_ptr<Backend> plain_backend = make_backend(test_backend_options());
  const auto plain_draft = std::shared_ptr<Model>(Model::load(source_path("models/draft"), *plain_backend));
  const auto open = [](const std::shared_ptr<Model>& model) {
    DraftModelMethod method(model, "test", DraftModelOptions{4, 256});
    TargetView view;
    view.vocab_size = model->config().vocab_size;
    std::unique_ptr<DraftRows> rows = method.open(view);
    const Checkpoint* none = nullptr;
    rows->prepare_append(std::span<const Checkpoint* const>(&none, 1)).commit();
    return rows;
  };
  std::unique_ptr<DraftRows> replayed = open(Recorded::get().models.draft);
  std::unique_ptr<DraftRows> reference = open(plain_draft);
  const std::vector<int32_t> prompt = encode(kClass);
  replayed->prefill(0, prompt, {});
  reference->prefill(0, prompt, {});
  SamplingParams greedy;
  greedy.temperature = 0;
  int32_t pending = prompt.back() + 1;
  int64_t position = static_cast<int64_t>(prompt.size());
  int late_calls = 0, late_whole = 0;
  for (int round = 0; round < 36; ++round) {
    // Every sixth and seventh round drafts nothing: the next call catches up three tokens.
    const bool drafts = round % 6 != 4 && round % 6 != 5;
    RowCommit commit;
    commit.pending = pending;
    if (drafts) {
      DraftRequestRow ask;
      ask.pending = pending;
      ask.depth = 3;
      ask.position = position;
      ask.sampling = &greedy;
      const int before = recorder.replays();
      const DraftProposal got = replayed->draft(std::span<const DraftRequestRow>(&ask, 1))[0];
      const int forwards_replayed = recorder.replays() - before;
      const DraftProposal want = reference->draft(std::span<const DraftRequestRow>(&ask, 1))[0];
      ASSERT_EQ(got.tokens, want.tokens) << "round " << round;
      ASSERT_EQ(got.tokens.size(), 3u);
      if (round >= 24) {
        ++late_calls;
        late_whole += forwards_replayed == 3 ? 1 : 0;  // the feeding step and both chained steps
      }
      commit.drafted = commit.accepted = 3;  // all accepted, then a token of the target's own
      commit.emitted = got.tokens;
    }
    commit.emitted.push_back(static_cast<int32_t>(100 + (round * 37) % 900));
    replayed->commit(std::span<const RowCommit>(&commit, 1));
    reference->commit(std::span<const RowCommit>(&commit, 1));
    position += static_cast<int64_t>(commit.emitted.size());
    pending = commit.emitted.back();
  }
  EXPECT_GT(late_calls, 0);
  EXPECT_EQ(late_whole, late_calls) << late_whole << " of " << late_calls << " late calls replayed whole";
}

}  // namespace
}  // namespace specdec::testing
