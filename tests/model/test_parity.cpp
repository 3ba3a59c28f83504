// Parity of the forward with independent references (transformers, float32, eager attention):
// every tiny fixture architecture on every CPU kernel path, and the bundled target and draft
// models (greedy continuations and logits at recorded positions).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "cpu_features.h"
#include "model/model.h"
#include "model/weights.h"
#include "test_device.h"

namespace specdec {
namespace {

const std::string kFixtures = std::string(SPECDEC_SOURCE_DIR) + "/tests/fixtures";

bool cpu_has(const std::string& isa) {
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && specdec::test::cpu_has_f16c();
  if (isa == "avx2") return avx2;
  if (isa == "avx512")
    return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  return true;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << path;
  return nlohmann::json::parse(in);
}

// max |a - b| / max |b| over one row of n values.
double relative_error(const float* a, const float* b, size_t n) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < n; ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
  }
  return diff / std::max(scale, 1e-30);
}

int32_t argmax(const float* row, int n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);  // first maximum
}

// Greedy continuations of several prompts decoded together: one ragged prefill, then one
// forward per step with every sequence's single new token.
std::vector<std::vector<int32_t>> greedy_batch(Model& model, const std::vector<std::vector<int32_t>>& prompts,
                                               int new_tokens) {
  int blocks = 0;
  for (const auto& p : prompts) blocks += (static_cast<int>(p.size()) + new_tokens + 15) / 16;
  auto cache = model.make_cache(blocks);
  ForwardRequest request;
  for (const auto& p : prompts) {
    const auto seq = cache->create();
    EXPECT_TRUE(cache->reserve(seq, static_cast<int>(p.size()) + new_tokens));
    request.rows.push_back({seq, p, {static_cast<int32_t>(p.size()) - 1}});
  }
  std::vector<std::vector<int32_t>> out(prompts.size());
  for (int step = 0; step < new_tokens; ++step) {
    const ForwardResult result = model.forward(request, *cache);
    for (size_t r = 0; r < prompts.size(); ++r) {
      const int32_t next = argmax(result.logits_row(result.row_offsets[r]), result.vocab);
      out[r].push_back(next);
      request.rows[r].tokens = {next};
      request.rows[r].logits_at = {0};
    }
  }
  return out;
}

struct FixtureCase {
  std::string model;
  std::string isa;
};

class FixtureParity : public ::testing::TestWithParam<FixtureCase> {
 protected:
  void SetUp() override {
    if (!cpu_has(GetParam().isa)) GTEST_SKIP() << "this CPU lacks " << GetParam().isa;
    if (testing::test_on_gpu() && GetParam().isa != "scalar") GTEST_SKIP() << "one GPU pass is enough";
    backend = make_backend(testing::reference_backend_options(GetParam().isa));
    dir = kFixtures + "/models/" + GetParam().model;
    model = Model::load(dir, *backend);
    reference = read_json(dir + "/reference.json");
  }
  std::unique_ptr<Backend> backend;
  std::string dir;
  std::unique_ptr<Model> model;
  nlohmann::json reference;
};

TEST_P(FixtureParity, PromptLogitsMatchTheReference) {
  auto logits_file = SafetensorsFile::open(dir + "/reference.safetensors");
  const auto prompts = reference.at("prompts").get<std::vector<std::vector<int32_t>>>();
  ASSERT_EQ(prompts.size(), 3u);
  const int vocab = model->config().vocab_size;
  double worst = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const int n = static_cast<int>(prompts[i].size());
    auto cache = model->make_cache((n + 15) / 16);
    const auto seq = cache->create();
    ASSERT_TRUE(cache->reserve(seq, n));
    SequenceInput row{seq, prompts[i], {}};
    for (int t = 0; t < n; ++t) row.logits_at.push_back(t);
    const ForwardResult result = model->forward(ForwardRequest{{row}, {}}, *cache);
    EXPECT_EQ(cache->length(seq), n);
    ASSERT_EQ(result.vocab, vocab);
    ASSERT_EQ(result.logits.size(), static_cast<size_t>(n) * static_cast<size_t>(vocab));
    ASSERT_EQ(result.row_offsets, (std::vector<int>{0, n}));
    const Tensor& want = logits_file->tensors().at("logits_" + std::to_string(i));
    ASSERT_EQ(want.dim(0), n);
    ASSERT_EQ(want.dim(1), vocab);
    for (int t = 0; t < n; ++t) {
      const float* expected = want.ptr<float>() + static_cast<size_t>(t) * static_cast<size_t>(vocab);
      const double err = relative_error(result.logits_row(t), expected, static_cast<size_t>(vocab));
      worst = std::max(worst, err);
      EXPECT_LE(err, testing::logit_tolerance(1e-4)) << "prompt " << i << " position " << t;
    }
  }
  testing::report("max relative logit error " + GetParam().model, worst);
}

TEST_P(FixtureParity, GreedyContinuationsMatchTheReference) {
  const auto prompts = reference.at("prompts").get<std::vector<std::vector<int32_t>>>();
  const auto greedy = reference.at("greedy").get<std::vector<std::vector<int32_t>>>();
  const int new_tokens = reference.at("greedy_new_tokens").get<int>();
  // Each prompt alone, decoded step by step through the KV cache.
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(greedy_batch(*model, {prompts[i]}, new_tokens)[0], greedy[i]) << "prompt " << i;
  // All prompts decoded together.
  EXPECT_EQ(greedy_batch(*model, prompts, new_tokens), greedy);
}

std::vector<FixtureCase> fixture_cases() {
  std::vector<FixtureCase> cases;
  for (const char* m : {"llama", "llama_tied_llama3rope", "mistral", "qwen2", "qwen3"})
    for (const char* isa : {"scalar", "avx2", "avx512"}) cases.push_back({m, isa});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Models, FixtureParity, ::testing::ValuesIn(fixture_cases()),
                         [](const ::testing::TestParamInfo<FixtureCase>& info) {
                           return info.param.model + "_" + info.param.isa;
                         });

// ---- the bundled models (bf16 weights; references computed with the weights upcast to f32) ----

class BundledParity : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    backend = make_backend(testing::reference_backend_options());  // the fastest kernels this CPU has
    model = Model::load(std::string(SPECDEC_SOURCE_DIR) + "/models/" + GetParam(), *backend);
  }
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
};

TEST_P(BundledParity, GreedyContinuationsMatchTheFixture) {
  const nlohmann::json fixture = read_json(kFixtures + "/bundled/greedy.json");
  const auto prompts = fixture.at("prompts").get<std::vector<std::vector<int32_t>>>();
  const auto greedy = fixture.at(GetParam()).at("greedy").get<std::vector<std::vector<int32_t>>>();
  const int new_tokens = fixture.at("new_tokens").get<int>();
  ASSERT_EQ(prompts.size(), 12u);
  const auto got = greedy_batch(*model, prompts, new_tokens);
  int same = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(got[i], greedy[i]) << "prompt " << i;
    same += got[i] == greedy[i];
  }
  testing::report("greedy continuations equal to the fixture " + GetParam(), same);
}

TEST_P(BundledParity, LogitsAtRecordedPositionsMatchTheFixture) {
  auto file = SafetensorsFile::open(kFixtures + "/bundled/" + GetParam() + "_logits.safetensors");
  const auto& tensors = file->tensors();
  const int vocab = model->config().vocab_size;
  for (int i = 0; i < 2; ++i) {
    const Tensor& tokens = tensors.at("tokens_" + std::to_string(i));
    const Tensor& positions = tensors.at("positions_" + std::to_string(i));
    const Tensor& want = tensors.at("logits_" + std::to_string(i));
    const int n = static_cast<int>(tokens.dim(0));
    auto cache = model->make_cache((n + 15) / 16);
    const auto seq = cache->create();
    ASSERT_TRUE(cache->reserve(seq, n));
    SequenceInput row{seq, std::vector<int32_t>(tokens.ptr<int32_t>(), tokens.ptr<int32_t>() + n), {}};
    row.logits_at.assign(positions.ptr<int32_t>(), positions.ptr<int32_t>() + positions.dim(0));
    const ForwardResult result = model->forward(ForwardRequest{{row}, {}}, *cache);
    ASSERT_EQ(result.row_offsets.back(), static_cast<int>(positions.dim(0)));
    for (int j = 0; j < positions.dim(0); ++j) {
      const float* expected = want.ptr<float>() + static_cast<size_t>(j) * static_cast<size_t>(vocab);
      double max_abs = 0;
      for (int v = 0; v < vocab; ++v)
        max_abs = std::max(max_abs, static_cast<double>(std::fabs(result.logits_row(j)[v] - expected[v])));
      testing::report("max |logit difference| vs reference " + GetParam(), max_abs);
      EXPECT_LE(relative_error(result.logits_row(j), expected, static_cast<size_t>(vocab)), testing::logit_tolerance(1e-3))
          << "sequence " << i << " position " << row.logits_at[static_cast<size_t>(j)];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Bundled, BundledParity, ::testing::Values("target", "draft"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace specdec
