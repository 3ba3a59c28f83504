// Properties of the ragged forward that must hold exactly: a sequence's logits do not depend on
// its neighbours in the batch, on how its tokens are split into forwards, or on KV that was
// rolled back; plus the errors for malformed requests (taps: test_forward_taps.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "cpu_features.h"
#include "model/model.h"
#include "model/weights.h"
#include "sampling/sampling.h"
#include "forward_util.h"
#include "test_device.h"

namespace specdec {
namespace {

using model_test::all_positions;
using model_test::model_dir;
using model_test::tokens_for;

bool cpu_has(const std::string& isa) {
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && specdec::test::cpu_has_f16c();
  if (isa == "avx2") return avx2;
  if (isa == "avx512-bf16") return cpu_has("avx512") && __builtin_cpu_supports("avx512bf16");
  if (isa == "amx") return cpu_has("avx512") && specdec::test::cpu_has_amx();
  if (isa == "avx512")
    return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  return true;
}

// new position, concatenated.
std::vector<float> run_chunked(Model& model, KvCache& cache, KvCache::SeqId seq, const std::vector<int32_t>& tokens,
                               size_t chunk) {
  if (chunk == 0) chunk = tokens.size();
  std::vector<float> logits;
  for (size_t begin = 0; begin < tokens.size(); begin += chunk) {
    const size_t n = std::min(chunk, tokens.size() - begin);
    EXPECT_TRUE(cache.reserve(seq, cache.length(seq) + static_cast<int>(n)));
    SequenceInput row{
        seq,
        {tokens.begin() + static_cast<std::ptrdiff_t>(begin), tokens.begin() + static_cast<std::ptrdiff_t>(begin + n)},
        all_positions(n)};
    const ForwardResult result = model.forward(ForwardRequest{{row}, {}}, cache);
    logits.insert(logits.end(), result.logits.begin(), result.logits.end());
  }
  return logits;
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Case {
  std::string model;
  std::string isa;
};

class ForwardInvariance : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (!cpu_has(GetParam().isa)) GTEST_SKIP() << "this CPU lacks " << GetParam().isa;
    if (testing::test_on_gpu() && GetParam().isa != "scalar") GTEST_SKIP() << "one GPU pass is enough";
    backend = make_backend(testing::reference_backend_options(GetParam().isa));
    model = Model::load(model_dir(GetParam().model), *backend);
    vocab = model->config().vocab_size;
  }
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  int vocab = 0;
};

TEST_P(ForwardInvariance, LogitsDoNotDependOnTheOtherRowsOfTheBatch) {
  const auto prompt = tokens_for(21, vocab, 1);
  const auto follow = tokens_for(3, vocab, 2);  // a verify window after the prompt
  auto cache = model->make_cache(64);

  // Alone: the prompt, then the window.
  const auto solo = cache->create();
  const auto solo_prompt = run_chunked(*model, *cache, solo, prompt, 0);
  const auto solo_window = run_chunked(*model, *cache, solo, follow, 0);

  // In a batch between rows of other lengths: a 37-token prefill before, a 5-token one after;
  // then the window together with a decode step and a 9-token prefill chunk.
  const auto a = cache->create(), s = cache->create(), b = cache->create();
  ASSERT_TRUE(cache->reserve(a, 37 + 1) && cache->reserve(s, 21 + 3) && cache->reserve(b, 5 + 9));
  ForwardRequest first{
      {{a, tokens_for(37, vocab, 3), {36, 0}}, {s, prompt, all_positions(21)}, {b, tokens_for(5, vocab, 4), {4}}}, {}};
  const ForwardResult r1 = model->forward(first, *cache);
  ASSERT_EQ(r1.row_offsets, (std::vector<int>{0, 2, 23, 24}));
  const std::vector<float> batched_prompt(r1.logits_row(2), r1.logits_row(23));
  EXPECT_TRUE(bit_equal(batched_prompt, solo_prompt));

  ForwardRequest second{{{b, tokens_for(9, vocab, 5), {8}}, {a, {7}, {0}}, {s, follow, all_positions(3)}}, {}};
  const ForwardResult r2 = model->forward(second, *cache);
  ASSERT_EQ(r2.row_offsets, (std::vector<int>{0, 1, 2, 5}));
  const std::vector<float> batched_window(r2.logits_row(2), r2.logits_row(5));
  EXPECT_TRUE(bit_equal(batched_window, solo_window));
  EXPECT_EQ(cache->length(a), 38);
  EXPECT_EQ(cache->length(s), 24);
  EXPECT_EQ(cache->length(b), 14);
}

TEST_P(ForwardInvariance, LogitsDoNotDependOnHowTokensAreSplitIntoForwards) {
  const auto tokens = tokens_for(20, vocab, 6);
  auto cache = model->make_cache(8);
  std::vector<std::vector<float>> runs;
  for (size_t chunk : {size_t{0}, size_t{1}, size_t{3}}) {
    const auto seq = cache->create();
    runs.push_back(run_chunked(*model, *cache, seq, tokens, chunk));
    cache->release(seq);
  }
  ASSERT_EQ(runs[0].size(), 20u * static_cast<size_t>(vocab));
  EXPECT_TRUE(bit_equal(runs[0], runs[1])) << "one forward vs one token at a time";
  EXPECT_TRUE(bit_equal(runs[0], runs[2])) << "one forward vs chunks of 3";
}

TEST_P(ForwardInvariance, RolledBackKvLeavesNoTrace) {
  const auto prefix = tokens_for(5, vocab, 7);
  const auto replacement = tokens_for(4, vocab, 8);
  auto cache = model->make_cache(8);

  const auto fresh = cache->create();
  run_chunked(*model, *cache, fresh, {prefix.begin(), prefix.begin() + 2}, 0);
  const auto want = run_chunked(*model, *cache, fresh, replacement, 0);

  const auto rolled = cache->create();
  run_chunked(*model, *cache, rolled, prefix, 0);
  cache->truncate(rolled, 2);  // drop 3 positions
  EXPECT_EQ(cache->length(rolled), 2);
  EXPECT_TRUE(bit_equal(run_chunked(*model, *cache, rolled, replacement, 0), want));

  // Across a block boundary: 20 positions, back to 14 (the second block is freed), then 6 new.
  const auto long_tokens = tokens_for(20, vocab, 9);
  const auto tail = tokens_for(6, vocab, 10);
  const auto a = cache->create();
  run_chunked(*model, *cache, a, {long_tokens.begin(), long_tokens.begin() + 14}, 0);
  const auto want_tail = run_chunked(*model, *cache, a, tail, 0);
  const auto b = cache->create();
  run_chunked(*model, *cache, b, long_tokens, 0);
  const int free_before = cache->free_blocks();
  cache->truncate(b, 14);
  EXPECT_EQ(cache->free_blocks(), free_before + 1);
  EXPECT_TRUE(bit_equal(run_chunked(*model, *cache, b, tail, 0), want_tail));
}

std::vector<Case> invariance_cases() {
  std::vector<Case> cases;
  for (const char* m : {"qwen3", "qwen2", "draft"})
    for (const char* isa : {"scalar", "avx2", "avx512"}) cases.push_back({m, isa});
  cases.push_back({"target", ""});  // wider matrices, fastest kernels only
  // Opt-in bf16 dot products and AMX tiles: not reference-exact, but invariance must still hold
  // exactly (the target's wider matrices take the tiles' staged path for misaligned rows too).
  cases.push_back({"draft", "avx512-bf16"});
  cases.push_back({"draft", "amx"});
  cases.push_back({"target", "amx"});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Models, ForwardInvariance, ::testing::ValuesIn(invariance_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.model + "_" +
                                  (info.param.isa.empty()            ? "best"
                                   : info.param.isa == "avx512-bf16" ? "avx512bf16"
                                                                     : info.param.isa);
                         });

// ---- taps and errors, on one tiny model ----

class ForwardApi : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> backend = make_backend(BackendOptions{});
  std::unique_ptr<Model> model = Model::load(model_dir("llama"), *backend);
};

TEST_F(ForwardApi, ReportsTheModelItLoaded) {
  const ModelConfig& c = model->config();
  EXPECT_EQ(c.num_layers, 2);
  EXPECT_EQ(&model->backend(), backend.get());
  // Per layer: q, k, v, o, gate, up, down and two norms.
  const auto layer_params = [](const ModelConfig& m) {
    const auto h = static_cast<size_t>(m.hidden_size), i = static_cast<size_t>(m.intermediate_size);
    const auto q = static_cast<size_t>(m.num_heads * m.head_dim), kv = static_cast<size_t>(m.num_kv_heads * m.head_dim);
    return h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h;
  };
  // embed + lm_head + final norm + the layers.
  const size_t H = 64, V = 512;
  const size_t per_layer = layer_params(c);
  EXPECT_EQ(model->parameter_count(), 2 * V * H + H + 2 * per_layer);
  EXPECT_EQ(model->weight_bytes(), model->parameter_count() * 4);  // f32 fixture
  // Untied: a step over 3 tokens reads 3 rows of the embedding table, not all V.
  ASSERT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(model->step_weight_bytes(3), model->weight_bytes() - (V - 3) * H * 4);
  EXPECT_EQ(model->step_weight_bytes(100000), model->weight_bytes());
  // A token multiplies the LM head, the final norm and every layer's weights, not the table.
  EXPECT_EQ(model->matmul_parameters(), V * H + H + 2 * per_layer);
  // Tied (qwen2, with q/k/v biases): the table is the LM head, multiplied by every token.
  const auto tied = Model::load(model_dir("qwen2"), *backend);
  ASSERT_TRUE(tied->config().tie_word_embeddings);
  const ModelConfig& t = tied->config();
  const auto tH = static_cast<size_t>(t.hidden_size), tV = static_cast<size_t>(t.vocab_size);
  const auto biases = static_cast<size_t>((t.num_heads + 2 * t.num_kv_heads) * t.head_dim);
  EXPECT_EQ(tied->matmul_parameters(), tV * tH + tH + static_cast<size_t>(t.num_layers) * (layer_params(t) + biases));
  EXPECT_EQ(tied->matmul_parameters(), tied->parameter_count());
  auto cache = model->make_cache(3);
  EXPECT_EQ(cache->total_blocks(), 3);
  EXPECT_EQ(cache->num_layers(), 2);
}

TEST_F(ForwardApi, RowsWithoutLogitsStillWriteTheirKv) {
  const int V = model->config().vocab_size;
  const auto tokens = tokens_for(10, V, 12);
  auto cache = model->make_cache(4);
  const auto a = cache->create(), b = cache->create();
  ASSERT_TRUE(cache->reserve(a, 10) && cache->reserve(b, 10));
  const ForwardResult silent =
      model->forward(ForwardRequest{{{a, {tokens.begin(), tokens.begin() + 9}, {}}}, {}}, *cache);
  EXPECT_TRUE(silent.logits.empty());
  EXPECT_EQ(silent.row_offsets, (std::vector<int>{0, 0}));
  EXPECT_EQ(cache->length(a), 9);
  const ForwardResult last = model->forward(ForwardRequest{{{a, {tokens[9]}, {0}}}, {}}, *cache);
  const ForwardResult whole = model->forward(ForwardRequest{{{b, tokens, {9}}}, {}}, *cache);
  EXPECT_TRUE(bit_equal(last.logits, whole.logits));
}

TEST_F(ForwardApi, GreedyRowsReturnTheArgmaxOfTheLogits) {
  const int V = model->config().vocab_size;
  const auto tokens = tokens_for(12, V, 21);
  auto cache = model->make_cache(4);
  const auto a = cache->create(), b = cache->create();
  ASSERT_TRUE(cache->reserve(a, 12) && cache->reserve(b, 12));
  ForwardRequest full{{{a, tokens, {3, 7, 11}}}, {}};
  ForwardRequest ids = full;
  ids.rows[0].seq = b;
  ids.sampling.assign(3, SampleRow{});  // temperature 0: greedy
  const ForwardResult logits = model->forward(full, *cache);
  const ForwardResult selected = model->forward(ids, *cache);
  EXPECT_TRUE(selected.logits.empty());
  EXPECT_TRUE(logits.tokens.empty());
  ASSERT_EQ(selected.tokens.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const float* row = logits.logits_row(i);
    EXPECT_EQ(selected.tokens[static_cast<size_t>(i)], std::max_element(row, row + V) - row) << "row " << i;
  }
  // One-token steps (replayed from a recording where the backend records) select the same way.
  const auto c = cache->create();
  ASSERT_TRUE(cache->reserve(c, 12));
  for (int t = 0; t < 12; ++t) {
    ForwardRequest step{{{c, {tokens[static_cast<size_t>(t)]}, {0}}}, {}};
    step.sampling = {SampleRow{}};
    const ForwardResult r = model->forward(step, *cache);
    const size_t out = t == 3 ? 0 : t == 7 ? 1 : t == 11 ? 2 : 3;
    if (out < 3) {
      EXPECT_EQ(r.tokens[0], selected.tokens[out]) << "step " << t;
    }
  }
}

// Backend sampling through the model, on the test device: each returned row's token is what the
// host sampler draws from that row's logits with that row's key (on the GPU too: the device
// draws the host's token from the same logits), for one forward of several rows and for decode
// steps, whose recordings must read the new keys written before each replay.
TEST(ForwardSampling, TokensAreDrawnFromTheLogitsWithEachRowsKey) {
  auto backend = make_backend(testing::reference_backend_options());
  auto model = Model::load(model_dir("llama"), *backend);
  const int V = model->config().vocab_size;
  const auto expect_drawn = [&](const float* logits, const SampleRow& row, int32_t got, const std::string& what) {
    const std::span<const float> l(logits, static_cast<size_t>(V));
    EXPECT_EQ(got, sample(l, row)) << what;
  };

  const auto tokens = tokens_for(12, V, 33);
  auto cache = model->make_cache(8);
  const auto a = cache->create(), b = cache->create();
  ASSERT_TRUE(cache->reserve(a, 12) && cache->reserve(b, 12));
  ForwardRequest full{{{a, tokens, {3, 7, 11}}}, {}};
  ForwardRequest drawn = full;
  drawn.rows[0].seq = b;
  drawn.sampling = {SampleRow{0.0f, 0, 1.0f, 0.0f, 0, 4}, SampleRow{0.8f, 20, 1.0f, 0.0f, 5, 8},
                    SampleRow{1.2f, 0, 0.9f, 0.05f, 6, 12}};
  const ForwardResult logits = model->forward(full, *cache);
  const ForwardResult selected = model->forward(drawn, *cache);
  ASSERT_EQ(selected.tokens.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    expect_drawn(logits.logits_row(static_cast<int>(i)), drawn.sampling[i], selected.tokens[i],
                 "row " + std::to_string(i));
  }

  // Decode steps, one sequence returning logits and one its tokens, each step at a new position.
  const auto c = cache->create(), d = cache->create();
  ASSERT_TRUE(cache->reserve(c, 12) && cache->reserve(d, 12));
  std::vector<int32_t> draws;
  for (int t = 0; t < 12; ++t) {
    const int32_t id = tokens[static_cast<size_t>(t)];
    const ForwardResult l = model->forward(ForwardRequest{{{c, {id}, {0}}}, {}}, *cache);
    ForwardRequest step{{{d, {id}, {0}}}, {}};
    step.sampling = {SampleRow{0.9f, 0, 0.95f, 0.0f, 7, static_cast<uint64_t>(t + 1)}};
    const ForwardResult r = model->forward(step, *cache);
    ASSERT_EQ(r.tokens.size(), 1u);
    expect_drawn(l.logits_row(0), step.sampling[0], r.tokens[0], "step " + std::to_string(t));
    draws.push_back(r.tokens[0]);
  }
  // The keys differ from step to step: the draws do too (a recording stuck on one key would
  // repeat the logits' most likely token far more often).
  EXPECT_GT(std::set<int32_t>(draws.begin(), draws.end()).size(), 3u);
}

// Expects forward to throw an Error whose message contains `needle`, leaving lengths unchanged.
void expect_rejected(Model& model, KvCache& cache, const ForwardRequest& request, const std::string& needle) {
  std::vector<int> before;
  for (const auto& row : request.rows) before.push_back(cache.contains(row.seq) ? cache.length(row.seq) : -1);
  try {
    model.forward(request, cache);
    ADD_FAILURE() << "no error; expected one mentioning \"" << needle << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  for (size_t r = 0; r < request.rows.size(); ++r) {
    if (before[r] >= 0) {
      EXPECT_EQ(cache.length(request.rows[r].seq), before[r]);
    }
  }
}

TEST_F(ForwardApi, RejectsMalformedRequestsWithoutTouchingTheCache) {
  const ModelConfig& c = model->config();
  auto cache = model->make_cache(40);
  const auto s = cache->create(), t = cache->create();
  ASSERT_TRUE(cache->reserve(s, 8) && cache->reserve(t, 8));
  expect_rejected(*model, *cache, ForwardRequest{}, "no rows");
  expect_rejected(*model, *cache, ForwardRequest{{{s, {}, {}}}, {}}, "no tokens");
  expect_rejected(*model, *cache, ForwardRequest{{{s, {1, 2}, {1}}, {t, {}, {}}}, {}}, "no tokens");
  expect_rejected(*model, *cache, ForwardRequest{{{s, {1, c.vocab_size}, {1}}}, {}}, "outside the vocabulary");
  expect_rejected(*model, *cache, ForwardRequest{{{s, {-1}, {0}}}, {}}, "outside the vocabulary");
  expect_rejected(*model, *cache, ForwardRequest{{{s, {1}, {0}}, {s, {2}, {0}}}, {}}, "twice");
  expect_rejected(*model, *cache, ForwardRequest{{{s, {1, 2}, {2}}}, {}}, "logits_at");
  expect_rejected(*model, *cache, ForwardRequest{{{s, {1}, {0}}}, {c.num_layers + 1}}, "tap layer");
  expect_rejected(*model, *cache, ForwardRequest{{{s, {1, 2}, {}, {2}}}, {0}}, "taps_at");
  expect_rejected(*model, *cache, ForwardRequest{{{s, {1, 2}, {}, {-1}}}, {0}}, "taps_at");
  expect_rejected(*model, *cache, ForwardRequest{{{s, {1, 2}, {}, {0}}}, {}}, "no tap layers");
  expect_rejected(*model, *cache, ForwardRequest{{{999, {1}, {0}}}, {}}, "unknown");
  ForwardRequest two_rows_for_one{{{s, {1, 2}, {1}}}, {}};
  two_rows_for_one.sampling.assign(2, SampleRow{});
  expect_rejected(*model, *cache, two_rows_for_one, "sampling rows");
  ForwardRequest bad_row{{{s, {1, 2}, {1}}}, {}};
  bad_row.sampling = {SampleRow{0.7f, 0, 2.0f, 0.0f, 0, 0}};
  expect_rejected(*model, *cache, bad_row, "top_p");
  // KV not reserved: 17 positions need a second block.
  expect_rejected(*model, *cache, ForwardRequest{{{s, std::vector<int32_t>(17, 1), {0}}}, {}}, "reserve");

  // Longer than the context: fill to max_position - 2, then ask for 3 more.
  const auto long_seq = cache->create();
  const int max_pos = c.max_position;
  ASSERT_TRUE(cache->reserve(long_seq, max_pos + 16));
  model->forward(ForwardRequest{{{long_seq, std::vector<int32_t>(static_cast<size_t>(max_pos - 2), 5), {}}}, {}},
                 *cache);
  expect_rejected(*model, *cache, ForwardRequest{{{long_seq, {1, 2, 3}, {2}}}, {}}, "longer than the context");
  try {
    model->forward(ForwardRequest{{{long_seq, {1, 2, 3}, {2}}}, {}}, *cache);
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(std::to_string(max_pos + 1)), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(max_pos)), std::string::npos) << msg;
  }
  // Exactly at the limit is fine.
  model->forward(ForwardRequest{{{long_seq, {1, 2}, {1}}}, {}}, *cache);
  EXPECT_EQ(cache->length(long_seq), max_pos);

  // A cache shaped for another model.
  KvCache other(*backend, c.num_layers + 1, c.num_kv_heads, c.head_dim, 2);
  const auto o = other.create();
  ASSERT_TRUE(other.reserve(o, 1));
  expect_rejected(*model, other, ForwardRequest{{{o, {1}, {0}}}, {}}, "KV cache shaped");

  // After all that, the sequences still work and lengths never moved.
  EXPECT_EQ(cache->length(s), 0);
  model->forward(ForwardRequest{{{s, {1, 2}, {1}}}, {}}, *cache);
  EXPECT_EQ(cache->length(s), 2);
}

TEST(ForwardCosts, FirstForwardsOfAShapeAreMarkedOneOff) {
  // The depth policy prices forwards by their timings; those that grew the model's buffers, or
  // ran a replayable shape call by call or recorded it, say so, and a repeat of the same shape
  // does not (a replayed decode step is recorded on its second run, replayed from its third; a
  // window shape recorded on its third, replayed from its fourth).
  auto backend = make_backend(testing::reference_backend_options());
  auto model = Model::load(model_dir("llama"), *backend);
  const int V = model->config().vocab_size;
  auto cache = model->make_cache(16);
  const auto seq = cache->create();
  ASSERT_TRUE(cache->reserve(seq, 64));
  const std::vector<SampleRow> greedy(1);
  EXPECT_TRUE(model->forward(ForwardRequest{{{seq, tokens_for(8, V, 3), {7}}}, {}, greedy}, *cache).one_off);
  bool last = true;
  for (int step = 0; step < 4; ++step)
    last = model->forward(ForwardRequest{{{seq, {5}, {0}}}, {}, greedy}, *cache).one_off;
  EXPECT_FALSE(last) << "a decode step repeated four times";
  // A window wider than any forward before grows the buffers; the same window repeated does not.
  const std::vector<SampleRow> window(16);
  const int at = cache->length(seq);
  EXPECT_TRUE(
      model->forward(ForwardRequest{{{seq, tokens_for(16, V, 4), all_positions(16)}}, {}, window}, *cache).one_off);
  for (int repeat = 0; repeat < 4; ++repeat) {
    cache->truncate(seq, at);
    ASSERT_TRUE(cache->reserve(seq, 64));
    last = model->forward(ForwardRequest{{{seq, tokens_for(16, V, 4), all_positions(16)}}, {}, window}, *cache).one_off;
  }
  EXPECT_FALSE(last) << "a verify window repeated four times";
}

TEST(ModelLoad, NamesWhatIsMissing) {
  auto backend = make_backend(BackendOptions{});
  EXPECT_THROW(Model::load(std::string(SPECDEC_SOURCE_DIR) + "/tests/fixtures/no_such_model", *backend), Error);
}

}  // namespace
}  // namespace specdec
