// Hidden taps: the hidden states behind the logits, taps at positions of their own (with or
// without logits there), bit-equal however the tokens are batched, and tapped decode steps that
// replay from a recording and still gather the rows each step names.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "forward_util.h"
#include "model/model.h"
#include "model/weights.h"
#include "test_device.h"

namespace specdec {
namespace {

using model_test::all_positions;
using model_test::model_dir;
using model_test::tokens_for;

class TapsApi : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> backend = make_backend(BackendOptions{});
  std::unique_ptr<Model> model = Model::load(model_dir("llama"), *backend);
};

// Tap j of a forward's result (a view in the backend's memory), copied to the host.
std::vector<float> host_tap(Backend& backend, const ForwardResult& result, size_t j) {
  const Tensor& t = result.taps.at(j);
  std::vector<float> v(static_cast<size_t>(t.numel()));
  if (!v.empty()) backend.copy(t, Tensor(v.data(), DType::f32, {t.numel()}));
  backend.synchronize();
  return v;
}

TEST_F(TapsApi, TapsAreTheHiddenStatesBehindTheLogits) {
  const ModelConfig& c = model->config();
  const int L = c.num_layers, H = c.hidden_size, V = c.vocab_size;
  auto cache = model->make_cache(4);
  const auto seq = cache->create();
  ASSERT_TRUE(cache->reserve(seq, 12));
  ForwardRequest request{{{seq, tokens_for(12, V, 11), {3, 11}, {3, 11}}}, {L, 0, L - 1}};
  const ForwardResult result = model->forward(request, *cache);
  ASSERT_EQ(result.taps.size(), 3u);
  EXPECT_EQ(result.tap_layers, (std::vector<int>{L, 0, L - 1}));
  EXPECT_EQ(result.tap_offsets, (std::vector<int>{0, 2}));
  std::vector<std::vector<float>> taps;
  for (size_t j = 0; j < 3; ++j) {
    ASSERT_EQ(result.taps[j].dim(0), 2);
    ASSERT_EQ(result.taps[j].dim(1), H);
    EXPECT_EQ(result.taps[j].device, backend->device());
    taps.push_back(host_tap(*backend, result, j));
  }

  auto weights = WeightStore::open(model_dir("llama"));
  const float* lm_head = weights.get("lm_head.weight").ptr<float>();
  const float* norm = weights.get("model.norm.weight").ptr<float>();
  for (int i = 0; i < 2; ++i) {
    const float* last = taps[2].data() + static_cast<size_t>(i) * static_cast<size_t>(H);
    const float* final_hidden = taps[0].data() + static_cast<size_t>(i) * static_cast<size_t>(H);
    // The final normed hidden is RMSNorm(residual after the last layer).
    double ms = 0;
    for (int k = 0; k < H; ++k) ms += static_cast<double>(last[k]) * last[k];
    const double inv = 1.0 / std::sqrt(ms / H + c.rms_norm_eps);
    for (int k = 0; k < H; ++k) EXPECT_NEAR(final_hidden[k], last[k] * inv * norm[k], 1e-4);
    // The logits are the LM head applied to it.
    for (int v = 0; v < V; ++v) {
      double dot = 0;
      for (int k = 0; k < H; ++k) dot += static_cast<double>(final_hidden[k]) * lm_head[static_cast<size_t>(v) * H + k];
      EXPECT_NEAR(result.logits_row(i)[v], dot, 1e-4);
    }
  }
  // Tap 0 (after the first layer) differs from the last layer's output.
  EXPECT_NE(taps[1], taps[2]);
}

TEST_F(TapsApi, TapsWithoutLogitsAtTheirOwnPositions) {
  // A prefill chunk tapped at every position, with no logits: the taps come back, no logits, and
  // each tapped row equals that position's tap in another forward of the same tokens (split
  // differently, beside another row, with logits): the kernels are batch and window invariant.
  const ModelConfig& c = model->config();
  const int L = c.num_layers, H = c.hidden_size, V = c.vocab_size;
  const std::vector<int32_t> tokens = tokens_for(12, V, 21);
  auto cache = model->make_cache(8);
  const auto a = cache->create(), b = cache->create(), other = cache->create();
  ASSERT_TRUE(cache->reserve(a, 12) && cache->reserve(b, 12) && cache->reserve(other, 5));
  const ForwardResult tapped =
      model->forward(ForwardRequest{{{a, tokens, {}, all_positions(12)}}, {0, L, L - 1}}, *cache);
  EXPECT_TRUE(tapped.logits.empty());
  EXPECT_EQ(tapped.row_offsets, (std::vector<int>{0, 0}));
  EXPECT_EQ(tapped.tap_offsets, (std::vector<int>{0, 12}));
  ASSERT_EQ(tapped.taps.size(), 3u);
  std::vector<std::vector<float>> whole;
  for (size_t j = 0; j < 3; ++j) whole.push_back(host_tap(*backend, tapped, j));

  // The same tokens in two forwards: 7 untapped, then 5 beside another row, tapped at 4 and 2.
  model->forward(ForwardRequest{{{b, {tokens.begin(), tokens.begin() + 7}, {}}}, {}}, *cache);
  const ForwardResult split = model->forward(
      ForwardRequest{{{other, tokens_for(5, V, 22), {4}, {1}}, {b, {tokens.begin() + 7, tokens.end()}, {0}, {4, 2}}},
                     {L - 1, 0, L}},
      *cache);
  EXPECT_EQ(split.logits.size(), 2u * static_cast<size_t>(V));
  EXPECT_EQ(split.tap_offsets, (std::vector<int>{0, 1, 3}));
  const std::vector<float> s_last = host_tap(*backend, split, 0), s_first = host_tap(*backend, split, 1),
                           s_final = host_tap(*backend, split, 2);
  const auto row = [H](const std::vector<float>& v, int i) {
    return std::vector<float>(v.begin() + i * H, v.begin() + (i + 1) * H);
  };
  for (const auto& [split_row, position] : {std::pair{1, 11}, std::pair{2, 9}}) {
    EXPECT_EQ(row(s_first, split_row), row(whole[0], position)) << position;
    EXPECT_EQ(row(s_final, split_row), row(whole[1], position)) << position;
    EXPECT_EQ(row(s_last, split_row), row(whole[2], position)) << position;
  }
  EXPECT_NE(row(whole[0], 3), row(whole[2], 3));
}

TEST(TapsReplay, ReplayedStepsTapTheRowsTheyAreToldOf) {
  // Decode steps with taps are replayable (recorded on their second run where the backend
  // records, replayed from the third): each replay gathers the rows this step names, uploaded
  // like the token ids (here alternating between two rows), and equals the same steps run call
  // by call (rows without logits: not a replayable shape).
  auto backend = make_backend(testing::reference_backend_options());
  auto model = Model::load(model_dir("llama"), *backend);
  const int L = model->config().num_layers, V = model->config().vocab_size, H = model->config().hidden_size;
  auto cache = model->make_cache(16);
  const auto a = cache->create(), b = cache->create(), ra = cache->create(), rb = cache->create();
  for (auto s : {a, b, ra, rb}) ASSERT_TRUE(cache->reserve(s, 32));
  const auto prompt = tokens_for(8, V, 5), steps = tokens_for(8, V, 6);
  model->forward(ForwardRequest{{{a, prompt, {}}, {b, prompt, {}}, {ra, prompt, {}}, {rb, prompt, {}}}, {}}, *cache);
  const std::vector<SampleRow> greedy(2);
  bool one_off = true;
  for (int step = 0; step < 6; ++step) {
    const int32_t ta = steps[static_cast<size_t>(step)], tb = steps[static_cast<size_t>(step) + 1];
    const bool on_b = step % 2 == 1;
    ForwardRequest request{{{a, {ta}, {0}, {}}, {b, {tb}, {0}, {}}}, {L, 0}, greedy};
    request.rows[on_b ? 1 : 0].taps_at = {0};
    const ForwardResult got = model->forward(request, *cache);
    one_off = got.one_off;
    EXPECT_EQ(got.tap_offsets, (on_b ? std::vector<int>{0, 0, 1} : std::vector<int>{0, 1, 1}));
    const std::vector<float> final_hidden = host_tap(*backend, got, 0), first = host_tap(*backend, got, 1);
    ASSERT_EQ(first.size(), static_cast<size_t>(H));

    const ForwardResult want =
        model->forward(ForwardRequest{{{ra, {ta}, {}, {0}}, {rb, {tb}, {}, {0}}}, {L, 0}}, *cache);
    const auto row = [&](size_t j) {
      const std::vector<float> all = host_tap(*backend, want, j);
      const auto from = all.begin() + (on_b ? H : 0);
      return std::vector<float>(from, from + H);
    };
    EXPECT_EQ(final_hidden, row(0)) << "step " << step;
    EXPECT_EQ(first, row(1)) << "step " << step;
  }
  EXPECT_FALSE(one_off) << "a tapped decode step repeated six times";
}

}  // namespace
}  // namespace specdec
