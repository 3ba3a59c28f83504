// The DFlash drafter against PyTorch (tests/fixtures/dflash: a tiny random drafter in the
// published layout and its reference block logits from tools/fixtures/make_dflash_fixture.py),
// its context kept across prefill and commits, the DSpark cut, and clear errors for checkpoints
// it cannot run.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/error.h"
#include "model/weights.h"
#include "speculative/methods/block_repeats.h"
#include "speculative/methods/context_lookup.h"
#include "speculative/methods/dflash.h"
#include "speculative/methods/dspark.h"
#include "test_device.h"

namespace specdec::testing {
namespace {

namespace fs = std::filesystem;

std::string fixture_dir() { return std::string(SPECDEC_SOURCE_DIR) + "/tests/fixtures/dflash"; }

// reference.safetensors, by tensor name (host views of the mapping).
struct Reference {
  std::unique_ptr<SafetensorsFile> file = SafetensorsFile::open(fixture_dir() + "/reference.safetensors");
  const Tensor& get(const std::string& name) const { return file->tensors().at(name); }
};

// Backend copies of host tensors, alive as long as the fixture.
struct Uploads {
  Backend& backend;
  std::vector<Buffer> buffers;
  Tensor put(const Tensor& host) {
    buffers.push_back(backend.allocate(host.bytes()));
    Tensor t = host;
    t.data = buffers.back().data();
    t.device = backend.device();
    backend.copy(host, t);
    backend.synchronize();
    return t;
  }
};

struct Fixture {
  std::unique_ptr<Backend> backend = make_backend(reference_backend_options());
  Uploads up{*backend, {}};
  Reference ref;
  nlohmann::json meta;
  Tensor embedding;
  Weight lm_head;
  std::vector<std::vector<float>> host_split;  // per-tap host copies of a case's features

  Fixture() {
    std::ifstream in(fixture_dir() + "/reference.json");
    meta = nlohmann::json::parse(in);
    embedding = up.put(ref.get("embedding"));
    lm_head = Weight(up.put(ref.get("lm_head")));
  }

  TargetView view(int max_rows = 2) {
    TargetView v;
    v.vocab_size = static_cast<int>(embedding.dim(0));
    v.hidden_size = static_cast<int>(embedding.dim(1));
    v.num_layers = 4;
    v.max_rows = max_rows;
    v.taps = true;
    v.embedding = &embedding;
    v.lm_head = &lm_head;
    return v;
  }

  // Positions [begin, begin + n) of case i's features, split into the three tapped layers.
  TargetContext context(int i, int64_t begin, int64_t n) {
    const Tensor f = ref.get(str_cat("features_", i));
    const int64_t H = f.dim(1) / 3;
    TargetContext c;
    for (int64_t j = 0; j < 3; ++j) {
      std::vector<float> part(static_cast<size_t>(n * H));
      for (int64_t p = 0; p < n; ++p)
        for (int64_t h = 0; h < H; ++h)
          part[static_cast<size_t>(p * H + h)] = f.ptr<float>()[(begin + p) * 3 * H + j * H + h];
      host_split.push_back(std::move(part));
      c.taps.push_back(up.put(Tensor(host_split.back().data(), DType::f32, {n, H})));
    }
    return c;
  }
};

class DflashParity : public ::testing::Test {};

// log q from a draft at temperature 1 against the reference logits' log-softmax: the logits up to
// their common shift, so a 1e-4 match of the logits shows here as a 2e-4 match.
void expect_matches(const std::vector<float>& q, const float* logits, int64_t V, const std::string& what) {
  double top = -1e30, sum = 0;
  for (int64_t v = 0; v < V; ++v) top = std::max(top, static_cast<double>(logits[v]));
  for (int64_t v = 0; v < V; ++v) sum += std::exp(logits[v] - top);
  double worst = 0;
  for (int64_t v = 0; v < V; ++v) {
    if (q[static_cast<size_t>(v)] < 1e-12f) continue;
    const double want = logits[v] - top - std::log(sum);
    worst = std::max(worst, std::abs(std::log(static_cast<double>(q[static_cast<size_t>(v)])) - want));
  }
  EXPECT_LE(worst, logit_tolerance(2e-4)) << what;
}

DraftRequestRow ask(int row, int32_t pending, int depth, int64_t position, const SamplingParams* params) {
  DraftRequestRow a;
  a.row = row;
  a.pending = pending;
  a.depth = depth;
  a.position = position;
  a.sampling = params;
  a.want_q = true;
  return a;
}

TEST_F(DflashParity, BlockLogitsMatchPyTorch) {
  Fixture fx;
  DflashOptions o;
  o.confidence_cut = false;
  DflashMethod method(fixture_dir(), *fx.backend, "fixture", o);
  EXPECT_EQ(method.needs().tap_layers, (std::vector<int>{0, 2, 4}));  // id 3 of 4 layers: the final hidden
  EXPECT_EQ(method.default_depth(), kLookupWindow - 1);               // the block, then the text's continuation
  DflashOptions own_only = o;
  own_only.context_lookup = false;
  EXPECT_EQ(DflashMethod(fixture_dir(), *fx.backend, "fixture", own_only).default_depth(), 7);
  auto rows = method.open(fx.view(3));
  std::vector<const Checkpoint*> fresh(3, nullptr);
  rows->prepare_append(fresh).commit();
  SamplingParams t1;
  t1.temperature = 1.0f;
  std::vector<DraftRequestRow> asks;
  const auto& cases = fx.meta["cases"];
  for (int i = 0; i < 3; ++i) {
    const int ctx = cases[i]["context"];
    rows->prefill(i, std::vector<int32_t>(static_cast<size_t>(ctx), 7), fx.context(i, 0, ctx));
    asks.push_back(ask(i, cases[i]["anchor"].get<int32_t>(), 7, ctx, &t1));
  }
  // All three rows in one call (a batch of different context lengths), then each alone.
  const auto together = rows->draft(asks);
  for (int i = 0; i < 3; ++i) {
    const auto alone = rows->draft(std::span<const DraftRequestRow>(&asks[static_cast<size_t>(i)], 1));
    const Tensor want = fx.ref.get(str_cat("logits_", i));
    ASSERT_EQ(together[static_cast<size_t>(i)].q.size(), 7u);
    for (int k = 0; k < 7; ++k) {
      expect_matches(together[static_cast<size_t>(i)].q[static_cast<size_t>(k)], want.ptr<float>() + k * want.dim(1),
                     want.dim(1), str_cat("case ", i, " row ", k + 1));
      EXPECT_EQ(alone[0].q[static_cast<size_t>(k)], together[static_cast<size_t>(i)].q[static_cast<size_t>(k)])
          << "batch invariance, case " << i;
    }
  }
}

TEST_F(DflashParity, ContextAppendedByCommitsAndRestoredFromCheckpoint) {
  Fixture fx;
  DflashOptions o;
  o.confidence_cut = false;
  DflashMethod method(fixture_dir(), *fx.backend, "fixture", o);
  auto rows = method.open(fx.view());
  std::vector<const Checkpoint*> fresh(1, nullptr);
  rows->prepare_append(fresh).commit();
  // Case 0's 9 context positions as a prefill of 5 and a round that accepted 3 drafts (4 positions).
  rows->prefill(0, std::vector<int32_t>(5, 7), fx.context(0, 0, 5));
  RowCommit c;
  c.row = 0;
  c.pending = 7;
  c.accepted = 3;
  c.drafted = 4;
  c.emitted = {7, 7, 7, 9};
  c.context = fx.context(0, 5, 4);
  rows->commit(std::span<const RowCommit>(&c, 1));
  SamplingParams t1;
  t1.temperature = 1.0f;
  const int32_t anchor = fx.meta["cases"][0]["anchor"];
  const auto a = ask(0, anchor, 7, 9, &t1);
  const auto got = rows->draft(std::span<const DraftRequestRow>(&a, 1));
  const Tensor want = fx.ref.get("logits_0");
  ASSERT_EQ(got[0].q.size(), 7u);
  for (int k = 0; k < 7; ++k)
    expect_matches(got[0].q[static_cast<size_t>(k)], want.ptr<float>() + k * want.dim(1), want.dim(1),
                   str_cat("row ", k + 1));

  // A captured row restored into a fresh group drafts the same.
  const Checkpoint cp = rows->capture(0);
  EXPECT_EQ(cp.processed_tokens, 9);
  auto other = method.open(fx.view());
  std::vector<const Checkpoint*> restored = {&cp};
  other->prepare_append(restored).commit();
  const auto again = other->draft(std::span<const DraftRequestRow>(&a, 1));
  ASSERT_EQ(again[0].q.size(), 7u);
  for (int k = 0; k < 7; ++k) {
    for (size_t v = 0; v < again[0].q[0].size(); ++v)
      ASSERT_NEAR(again[0].q[static_cast<size_t>(k)][v], got[0].q[static_cast<size_t>(k)][v], 1e-6) << k;
  }
  // A draft at a position that does not follow the context is declined, not misplaced.
  const auto off = ask(0, anchor, 7, 12, &t1);
  EXPECT_TRUE(rows->draft(std::span<const DraftRequestRow>(&off, 1))[0].tokens.empty());
}

TEST_F(DflashParity, TextThatRepeatsCarriesARoundPastTheBlock) {
  Fixture fx;
  DflashOptions o;
  o.confidence_cut = false;
  DflashOptions own_only = o;
  own_only.context_lookup = false;
  DflashMethod method(fixture_dir(), *fx.backend, "fixture", o), plain(fixture_dir(), *fx.backend, "plain", own_only);
  // A text of period 4 (3 4 5 6 ...): after its pending 4, it goes on 5 6 3 4 5 6 ...
  const std::vector<int32_t> known = {3, 4, 5, 6, 3, 4, 5, 6, 3};
  std::vector<int32_t> text;
  for (int k = 0; k < 15; ++k) text.push_back(known[static_cast<size_t>(2 + k % 4)]);
  SamplingParams greedy;
  for (DflashMethod* m : {&method, &plain}) {
    auto rows = m->open(fx.view());
    std::vector<const Checkpoint*> fresh(1, nullptr);
    rows->prepare_append(fresh).commit();
    rows->prefill(0, known, fx.context(0, 0, 9));
    for (const int depth : {15, 10, 7, 4}) {
      DraftRequestRow a = ask(0, 4, depth, 9, &greedy);
      a.want_q = false;
      a.adaptive = true;
      const std::vector<int32_t> got = rows->draft(std::span<const DraftRequestRow>(&a, 1))[0].tokens;
      if (m == &method) {
        // Every block row takes the text's token (the rule starts out following the text), and
        // the round goes on past the block's 7 rows to the depth asked.
        EXPECT_EQ(got, std::vector<int32_t>(text.begin(), text.begin() + depth)) << "depth " << depth;
      } else {
        // The drafter's own tokens: never more than its block's rows.
        EXPECT_EQ(got.size(), static_cast<size_t>(std::min(depth, 7))) << "depth " << depth;
      }
    }
  }
  EXPECT_EQ(method.stats().lookup.extended, 8 + 3);
  EXPECT_EQ(plain.stats().lookup.extended, 0);
}

TEST_F(DflashParity, ConfidenceCutFollowsTheCalibratedSurvival) {
  Fixture fx;
  DflashMethod method(fixture_dir(), *fx.backend, "fixture");
  ASSERT_TRUE(method.cuts());
  const DsparkHead& head = *method.config().dspark;
  auto rows = method.open(fx.view());
  std::vector<const Checkpoint*> fresh(1, nullptr);
  rows->prepare_append(fresh).commit();
  rows->prefill(0, std::vector<int32_t>(9, 7), fx.context(0, 0, 9));
  // The survival the cut must see, from the reference confidence scores and logits.
  const Tensor conf = fx.ref.get("confidence_0"), logits = fx.ref.get("logits_0");
  std::vector<double> survival;
  double alive = 1;
  for (int k = 0; k < 7; ++k) {
    const float* row = logits.ptr<float>() + k * logits.dim(1);
    double top = -1e30, sum = 0;
    for (int64_t v = 0; v < logits.dim(1); ++v) top = std::max(top, static_cast<double>(row[v]));
    for (int64_t v = 0; v < logits.dim(1); ++v) sum += std::exp(row[v] - top);
    alive *= dspark_row_probability(head, k + 1, conf.ptr<float>()[k], -std::log(sum));
    survival.push_back(alive);
  }
  SamplingParams greedy;
  const int32_t anchor = fx.meta["cases"][0]["anchor"];
  // Windows priced from cheap (every draft pays) to dear (none does), and in between.
  for (const double slope : {0.0, 0.05, 0.3, 0.8, 5.0}) {
    DraftRequestRow a = ask(0, anchor, 7, 9, &greedy);
    a.want_q = false;
    for (int w = 1; w <= 8; ++w) a.window_seconds.push_back(1.0 + slope * (w - 1));
    a.draft_seconds = 0.2;
    const int want = dspark_cut(survival, a.window_seconds, a.draft_seconds);
    const auto got = rows->draft(std::span<const DraftRequestRow>(&a, 1));
    EXPECT_EQ(static_cast<int>(got[0].tokens.size()), want) << "slope " << slope;
  }
  // Without prices the policy's depth stands.
  const DraftRequestRow bare = ask(0, anchor, 5, 9, &greedy);
  EXPECT_EQ(rows->draft(std::span<const DraftRequestRow>(&bare, 1))[0].tokens.size(), 5u);
}

TEST(Dspark, CutMaximisesTokensPerSecond) {
  const std::vector<double> survival = {0.9, 0.8, 0.3, 0.05};
  // Free windows: all four. A window of k+1 tokens costing 1 + k: expected (1, 1.9, 2.7, 3.0,
  // 3.05) over (1.1, 2.1, 3.1, 4.1, 5.1): the rates fall from k = 0 on.
  EXPECT_EQ(dspark_cut(survival, std::vector<double>(5, 1.0), 0.1), 4);
  EXPECT_EQ(dspark_cut(survival, std::vector<double>{1, 2, 3, 4, 5}, 0.1), 0);
  // Windows of up to three tokens at the price of one (weight-bound), then dear.
  EXPECT_EQ(dspark_cut(survival, std::vector<double>{1, 1.02, 1.04, 2.5, 3}, 0.1), 2);
  // No prices, or too few: keep everything.
  EXPECT_EQ(dspark_cut(survival, {}, 0.1), 4);
  EXPECT_EQ(dspark_cut(survival, std::vector<double>{1, 1}, 0.1), 4);
  DsparkHead head;
  head.calibration = {{2.0, 0.5, -1.0}};
  EXPECT_NEAR(dspark_row_probability(head, 1, 1.0, -2.0), 1 / (1 + std::exp(-(2.0 - 1.0 - 1.0))), 1e-12);
  EXPECT_THROW(dspark_row_probability(head, 2, 0, 0), Error);
}

TEST(Dspark, CalibrationFollowsTheOutcomesItIsShown) {
  CutCalibration cal;
  const auto sigmoid = [](double z) { return 1 / (1 + std::exp(-z)); };
  // Nothing seen: the shipped calibration as it is.
  EXPECT_DOUBLE_EQ(cal.probability(1, -1.0), sigmoid(-1.0));
  EXPECT_DOUBLE_EQ(cal.probability(5, 0.5), sigmoid(0.5));
  // Row 1 calibrated at 27 % (logit -1) but accepted three times in five, row 2 at 50 % (logit
  // 0) and accepted one time in ten.
  for (int i = 0; i < 400; ++i) {
    cal.observe(1, -1.0, i % 5 < 3);
    cal.observe(2, 0.0, i % 10 == 0);
  }
  EXPECT_NEAR(cal.probability(1, -1.0), 0.6, 0.06);
  EXPECT_NEAR(cal.probability(2, 0.0), 0.1, 0.04);
  // A row never verified borrows the offset of the row before it.
  EXPECT_DOUBLE_EQ(cal.offset(3), cal.offset(2));
  EXPECT_DOUBLE_EQ(cal.offset(7), cal.offset(2));
  // A few outcomes of its own move a row only part of the way from what it borrowed.
  for (int i = 0; i < 5; ++i) cal.observe(3, 0.0, true);
  EXPECT_LT(cal.offset(3), cal.offset(2) + 0.1);
  // A request's own correction moves within the request's few dozen rounds: a block row that
  // the calibration puts at 50 % and that this request's text has accepted 30 times running.
  CutCalibration engine_wide, request(0.2);
  for (int i = 0; i < 30; ++i) {
    engine_wide.observe(4, 0.0, true);
    request.observe(4, 0.0, true);
  }
  EXPECT_GT(request.probability(4, 0.0), 0.8);
  EXPECT_LT(engine_wide.probability(4, 0.0), 0.75);
  // An offset is bounded: a row's score still counts however long the stream of surprises.
  CutCalibration bounded;
  for (int i = 0; i < 5000; ++i) bounded.observe(1, -10.0, true);
  EXPECT_LE(bounded.offset(1), 4.0);
  EXPECT_LT(bounded.probability(1, -10.0), 0.01);
}

// A copy of the fixture with config.json edited by `edit`, under the temporary folder; the checks
// below remove it when they are done with it.
fs::path edited(const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
  const fs::path dir = fs::temp_directory_path() / ("specdec-dflash-" + name);
  fs::create_directories(dir);
  fs::copy_file(fs::path(fixture_dir()) / "model.safetensors", dir / "model.safetensors",
                fs::copy_options::overwrite_existing);
  std::ifstream in(fixture_dir() + "/config.json");
  auto j = nlohmann::json::parse(in);
  edit(j);
  std::ofstream(dir / "config.json") << j.dump(1);
  return dir;
}

void expect_refused(const fs::path& dir, const std::string& needle) {
  auto backend = make_backend(reference_backend_options());
  try {
    DflashMethod m(dir, *backend, "bad");
    ADD_FAILURE() << "loaded " << dir << ", expected an error with '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(BlockRepeats, AlternativeWhileItIsRightAtLeastAsOften) {
  SwapScore c(0.5);
  EXPECT_TRUE(c.swap());  // before any outcome
  // Text on which the argmax is right and the alternative wrong, a few times over.
  int turned = 0;
  for (int i = 0; i < 4 && c.swap(); ++i, ++turned) c.observe(true, false);
  EXPECT_FALSE(c.swap());
  EXPECT_EQ(turned, 1);  // the head start is half an outcome
  // The text changes: the alternative right from now on wins back once its faded count is ahead.
  int back = 0;
  for (; back < 10 && !c.swap(); ++back) c.observe(false, true);
  EXPECT_TRUE(c.swap());
  EXPECT_GE(back, 1);
  // Neither right moves neither ahead of the other's fading.
  SwapScore d(0.5);
  for (int i = 0; i < 50; ++i) d.observe(false, false);
  EXPECT_TRUE(d.swap());
  // Both right: the head start fades and the alternative stays level, so it is still followed.
  SwapScore e(0.5);
  for (int i = 0; i < 50; ++i) e.observe(true, true);
  EXPECT_TRUE(e.swap());
  // Without a head start the argmax wins its first outcome.
  SwapScore f(0.0);
  EXPECT_EQ(f.other_rate(), 0.0);
  f.observe(true, false);
  EXPECT_FALSE(f.swap());
}

TEST(BlockRepeats, TheAlternativesRateOverFadedOutcomes) {
  SwapScore s(0.5);
  EXPECT_DOUBLE_EQ(s.other_rate(), 1.0);  // the head start: half an outcome, right
  s.observe(true, false);
  EXPECT_NEAR(s.other_rate(), 0.49 / 1.49, 1e-12);
  // Right from now on: the rate climbs toward one, the old miss fading.
  double last = s.other_rate();
  for (int i = 0; i < 100; ++i) {
    s.observe(false, true);
    EXPECT_GT(s.other_rate(), last);
    last = s.other_rate();
  }
  EXPECT_GT(last, 0.95);
  EXPECT_LE(last, 1.0);
}

TEST(ContextLookup, ProposesTheLatestContinuationAndScoresIt) {
  // 5 1 2 3 7 1 2 | pending 3: the trailing 1 2 3 occurred at 1, followed by 7.
  const std::vector<int32_t> known = {5, 1, 2, 3, 7, 1, 2};
  ContextLookup lookup;
  LookupStats stats;
  lookup.begin(known, 3);
  const ContextLookup::Choice first = lookup.choose(0, 9, stats);
  EXPECT_EQ(first.token, 7);  // differs from the drafter's 9: the head start follows the text
  EXPECT_FALSE(first.agreed);
  const ContextLookup::Choice second = lookup.choose(1, 1, stats);
  EXPECT_EQ(second.token, 1);  // ... 3 7 continues with 1, the drafter's own token
  EXPECT_TRUE(second.agreed);
  lookup.end();
  EXPECT_EQ(stats.looked_up, 1);
  // The target wrote 7 then 1: draft 0 was reached and the text's token was right.
  RowCommit c;
  c.accepted = 2;
  c.drafted = 2;
  c.emitted = {7, 1, 4};
  lookup.commit(c, stats);
  EXPECT_EQ(stats.scored, 1);
  EXPECT_EQ(stats.context_right, 1);
  EXPECT_EQ(stats.own_right, 0);
  EXPECT_GT(lookup.rate(), 0.9);
  // A call that fails half way (no end()) leaves no drafts behind for the next one.
  const std::vector<int32_t> other = {4, 9, 2, 6, 5, 1, 2, 3, 7, 1};
  ContextLookup fresh;
  fresh.begin(other, 4);
  EXPECT_EQ(fresh.choose(0, 8, stats).token, 8);  // 7 1 4 occurred nowhere before: no continuation
  std::vector<int32_t> longer = other;
  longer.insert(longer.end(), {4, 9});  // the target wrote 4 9, not the 4 8 drafted
  fresh.begin(longer, 2);               // ... 4 9 | 2: 4 9 2 occurred at 0, followed by 6
  EXPECT_EQ(fresh.choose(0, 5, stats).token, 6);
}

TEST(BlockRepeats, RunnerUpOfALogitRow) {
  const std::vector<float> row = {0.5f, 3.0f, 2.0f, 2.0f, -1.0f};
  EXPECT_EQ(runner_up(row, 1), 2);  // the first of equal ones
  EXPECT_EQ(runner_up(row, 2), 1);
  EXPECT_EQ(runner_up(std::vector<float>{4.0f}, 0), -1);
  EXPECT_EQ(runner_up(std::vector<float>{4.0f, std::nanf("")}, 0), -1);
}

TEST(DflashFormat, RecognisedFromConfig) {
  EXPECT_TRUE(is_dflash_checkpoint(fixture_dir()));
  EXPECT_TRUE(is_dflash_checkpoint(std::string(SPECDEC_SOURCE_DIR) + "/models/dflash"));
  EXPECT_FALSE(is_dflash_checkpoint(std::string(SPECDEC_SOURCE_DIR) + "/models/draft"));
  EXPECT_FALSE(is_dflash_checkpoint("/nonexistent"));
}

TEST(DflashFormat, ClearErrors) {
  expect_refused(edited("no-layers", [](auto& j) { j["dflash_config"].erase("target_layer_ids"); }),
                 "target_layer_ids");
  expect_refused(edited("no-mask", [](auto& j) { j["dflash_config"].erase("mask_token_id"); }), "mask_token_id");
  expect_refused(edited("dflash2", [](auto& j) { j["architectures"] = {"DFlash2DraftModel"}; }), "DFlash2");
  expect_refused(edited("sliding",
                        [](auto& j) {
                          j["layer_types"] = {"sliding_attention", "full_attention"};
                        }),
                 "sliding_attention");
  expect_refused(edited("causal", [](auto& j) { j["is_causal"] = true; }), "is_causal");
  expect_refused(edited("twice", [](auto& j) { j["dflash_config"]["target_layer_ids"] = {0, 2, 2}; }), "twice");
  expect_refused(edited("past",
                        [](auto& j) {
                          j["dflash_config"]["target_layer_ids"] = {0, 2, 4};
                        }),
                 "past num_target_layers");
  // Five layers' features do not divide fc's 96 columns.
  expect_refused(edited("five",
                        [](auto& j) {
                          j["num_target_layers"] = 8;
                          j["dflash_config"]["target_layer_ids"] = {0, 1, 2, 3, 4};
                        }),
                 "fc.weight");
  expect_refused(edited("calib", [](auto& j) { j["dspark"]["calibration"].erase(0); }), "calibration");
  expect_refused(edited("heads", [](auto& j) { j["num_attention_heads"] = 8; }), "q_proj");
  // A drafter for another target is refused when the engine opens it.
  Fixture fx;
  const auto refused_at_open = [&](const fs::path& dir, const std::string& needle) {
    {
      DflashMethod m(dir, *fx.backend, "other");
      try {
        m.open(fx.view());
        ADD_FAILURE() << "opened " << dir;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      }
    }
    fs::remove_all(dir);
  };
  refused_at_open(edited("vocab", [](auto& j) { j["vocab_size"] = 999; }), "vocabulary");
  refused_at_open(edited("layers", [](auto& j) { j["num_target_layers"] = 6; }), "6-layer target");
  // Two taps over fc's 96 columns: 48-wide target hidden states, not this target's 32.
  refused_at_open(edited("width",
                         [](auto& j) {
                           j["dflash_config"]["target_layer_ids"] = {0, 2};
                         }),
                  "hidden states of 48");
}

}  // namespace
}  // namespace specdec::testing
