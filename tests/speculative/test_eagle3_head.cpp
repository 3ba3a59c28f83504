// The EAGLE-3 head format: a tiny random head in the published layout (tools/fixtures/
// make_eagle3_fixture.py) read and run by specdec matches PyTorch's forward within 1e-4, for a
// prompt block and for a chained step fed its own output hidden; malformed heads (a missing
// tensor, a wrong shape, d2t outside the target vocabulary or not one-to-one, t2d contradicting
// d2t, an unsupported config) are refused with errors that name the folder and what is wrong.
// Context rows: a target LM head's rows (f32, bf16, f16) for tokens outside the draft
// vocabulary give the logits an independent computation gives, and the least recently seen
// token gives way.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/error.h"
#include "sampling/sampling.h"
#include "speculative/methods/eagle3_head.h"
#include "test_device.h"

namespace specdec::testing {
namespace {

namespace fs = std::filesystem;

fs::path fixture_dir() { return fs::path(SPECDEC_SOURCE_DIR) / "tests/fixtures/eagle3"; }

nlohmann::json reference() {
  std::ifstream in(fixture_dir() / "reference.json");
  return nlohmann::json::parse(in);
}

Backend& backend() {
  static std::unique_ptr<Backend> b = make_backend(reference_backend_options());
  return *b;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, static_cast<double>(std::fabs(got[i] - want[i])));
  EXPECT_LT(worst, 1e-4) << what << ": largest difference " << worst;
}

TEST(Eagle3Head, ConfigAsTheLoadersReadIt) {
  const Eagle3Config c = load_eagle3_config(fixture_dir() / "head");
  EXPECT_TRUE(is_eagle3_dir(fixture_dir() / "head"));
  EXPECT_FALSE(is_eagle3_dir(fs::path(SPECDEC_SOURCE_DIR) / "models/target"));
  EXPECT_EQ(c.layer.hidden_size, 32);
  EXPECT_EQ(c.layer.num_layers, 1);
  EXPECT_EQ(c.draft_vocab, 40);
  EXPECT_EQ(c.target_hidden, 24);
  // Explicit ids are the outputs of those target layers.
  EXPECT_EQ(c.tap_layers(8), (std::vector<int>{1, 3, 5}));
  // Without them: the inputs of layers 2, L/2 and L-3 (the outputs of the layers before).
  Eagle3Config d = c;
  d.aux_layer_ids.clear();
  EXPECT_EQ(d.tap_layers(8), (std::vector<int>{1, 3, 4}));
  EXPECT_EQ(d.tap_layers(32), (std::vector<int>{1, 15, 28}));
}

TEST(Eagle3Head, MatchesPyTorchForward) {
  const auto ref = reference();
  auto head = Eagle3Head::load(fixture_dir() / "head", backend());
  ASSERT_TRUE(head->has_embedding());
  const auto d2t = ref["draft_to_target"].get<std::vector<int32_t>>();
  EXPECT_EQ(std::vector<int32_t>(head->draft_to_target().begin(), head->draft_to_target().end()), d2t);

  const auto tokens = ref["tokens"].get<std::vector<int32_t>>();
  const auto fused = ref["fused"].get<std::vector<float>>();
  const int T = static_cast<int>(tokens.size());
  auto cache = head->make_cache(4);
  const auto seq = cache->create();
  ASSERT_TRUE(cache->reserve(seq, T + 1));
  Eagle3Head::Row row{seq, tokens, {}};
  for (int t = 0; t < T; ++t) row.outputs_at.push_back(t);
  const auto out = head->forward(std::span(&row, 1), fused, true, nullptr, *cache);
  expect_close(out.logits, ref["logits"].get<std::vector<float>>(), "prompt logits");
  expect_close(out.hidden, ref["hidden"].get<std::vector<float>>(), "prompt hidden");
  EXPECT_EQ(cache->length(seq), T);

  // The chained step reads the head's own last output hidden at the next position.
  const int H = head->config().layer.hidden_size;
  const std::vector<float> last(out.hidden.end() - H, out.hidden.end());
  Eagle3Head::Row step{seq, {ref["next_token"].get<int32_t>()}, {0}};
  const auto next = head->forward(std::span(&step, 1), last, false, nullptr, *cache);
  expect_close(next.logits, ref["step_logits"].get<std::vector<float>>(), "chained step logits");
  expect_close(next.hidden, ref["step_hidden"].get<std::vector<float>>(), "chained step hidden");
}

TEST(Eagle3Head, BatchedRowsMatchSoloRows) {
  // Two rows in one forward give each row's solo result (the head's KV is per row).
  const auto ref = reference();
  auto head = Eagle3Head::load(fixture_dir() / "head", backend());
  const auto tokens = ref["tokens"].get<std::vector<int32_t>>();
  const auto fused = ref["fused"].get<std::vector<float>>();
  const size_t width = fused.size() / tokens.size();
  auto cache = head->make_cache(8);
  const auto a = cache->create(), b = cache->create();
  ASSERT_TRUE(cache->reserve(a, 8) && cache->reserve(b, 8));
  std::vector<Eagle3Head::Row> rows = {{a, tokens, {6}}, {b, {tokens.begin(), tokens.begin() + 3}, {2}}};
  std::vector<float> inputs = fused;
  inputs.insert(inputs.end(), fused.begin(), fused.begin() + static_cast<std::ptrdiff_t>(3 * width));
  const auto both = head->forward(rows, inputs, true, nullptr, *cache);
  const auto want = ref["logits"].get<std::vector<float>>();
  const size_t vd = 40;
  expect_close(std::vector<float>(both.logits.begin(), both.logits.begin() + vd),
               std::vector<float>(want.begin() + 6 * vd, want.begin() + 7 * vd), "row a");
  expect_close(std::vector<float>(both.logits.begin() + vd, both.logits.end()),
               std::vector<float>(want.begin() + 2 * vd, want.begin() + 3 * vd), "row b (causal prefix)");
}

// The f32 tensor `name` of the fixture head's file, read here from its bytes.
std::vector<float> fixture_tensor(const std::string& name) {
  std::ifstream in(fixture_dir() / "head/model.safetensors", std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const auto header = nlohmann::json::parse(std::string(bytes.data() + 8, n));
  const size_t begin = header[name]["data_offsets"][0].get<size_t>(), end = header[name]["data_offsets"][1];
  std::vector<float> out((end - begin) / 4);
  std::memcpy(out.data(), bytes.data() + 8 + n + begin, end - begin);
  return out;
}

class ContextRows : public ::testing::TestWithParam<DType> {};

TEST_P(ContextRows, TokensOutsideTheDraftVocabularyTakeTheTargetsRows) {
  // A target LM head [96, 32] of random rows, stored as the parameter's type; three target ids
  // outside the head's 40.
  const auto ref = reference();
  auto head = Eagle3Head::load(fixture_dir() / "head", backend());
  const int V = head->config().layer.vocab_size, H = head->config().layer.hidden_size;
  const int Vd = head->config().draft_vocab;
  const auto d2t = ref["draft_to_target"].get<std::vector<int32_t>>();
  std::vector<int32_t> outside;
  for (int32_t t = 0; t < V && outside.size() < 3; ++t)
    if (std::find(d2t.begin(), d2t.end(), t) == d2t.end()) outside.push_back(t);
  ASSERT_EQ(outside.size(), 3u);
  const DType dt = GetParam();
  std::vector<float> table(static_cast<size_t>(V * H));
  std::vector<uint16_t> stored(table.size());
  uint64_t seed = 7;
  for (size_t i = 0; i < table.size(); ++i) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    const float x = static_cast<float>(static_cast<int64_t>(seed >> 40) % 2001 - 1000) * 1e-4f;
    // What the stored type keeps of x is what the expected values below read.
    stored[i] = dt == DType::bf16 ? f32_to_bf16(x) : f32_to_f16(x);
    table[i] = dt == DType::f32 ? x : dt == DType::bf16 ? bf16_to_f32(stored[i]) : f16_to_f32(stored[i]);
  }
  Buffer buffer = backend().allocate(table.size() * dtype_size(dt));
  const Tensor device_table = buffer.view(dt, {V, H});
  backend().copy(
      Tensor(dt == DType::f32 ? static_cast<void*>(table.data()) : static_cast<void*>(stored.data()), dt, {V, H}),
      device_table);
  const Weight lm_head(device_table);

  // The scale: the head's row norms over the target rows of the same tokens.
  const std::vector<float> own = fixture_tensor("lm_head.weight"), norm = fixture_tensor("norm.weight");
  const auto row_norm = [&](const float* row) {
    double sum = 0;
    for (int k = 0; k < H; ++k) sum += static_cast<double>(row[k]) * row[k];
    return std::sqrt(sum);
  };
  double head_sum = 0, target_sum = 0;
  for (int i = 0; i < Vd; ++i) {
    head_sum += row_norm(own.data() + i * H);
    target_sum += row_norm(table.data() + static_cast<size_t>(d2t[static_cast<size_t>(i)]) * H);
  }
  ASSERT_EQ(head->logit_columns(), Vd);
  head->use_target_rows(lm_head, 2);
  EXPECT_NEAR(head->context_scale(), head_sum / target_sum, 1e-5 * head_sum / target_sum);
  ASSERT_EQ(head->logit_columns(), Vd + 2);

  // Logits of the prompt block: the draft columns as before; column c of a context row is the
  // scaled target row against the head's normed output.
  const auto tokens = ref["tokens"].get<std::vector<int32_t>>();
  const auto fused = ref["fused"].get<std::vector<float>>();
  const int T = static_cast<int>(tokens.size());
  const auto run = [&] {
    auto cache = head->make_cache(4);
    const auto seq = cache->create();
    EXPECT_TRUE(cache->reserve(seq, T));
    Eagle3Head::Row row{seq, tokens, {}};
    for (int t = 0; t < T; ++t) row.outputs_at.push_back(t);
    return head->forward(std::span(&row, 1), fused, true, nullptr, *cache);
  };
  const auto want = ref["logits"].get<std::vector<float>>();
  const auto expect_columns = [&](const Eagle3Head::Output& out) {
    const int C = head->logit_columns();
    ASSERT_EQ(out.logits.size(), static_cast<size_t>(T * C));
    for (int t = 0; t < T; ++t) {
      const float* h = out.hidden.data() + t * H;
      double ms = 0;
      for (int k = 0; k < H; ++k) ms += static_cast<double>(h[k]) * h[k];
      const double inv = 1.0 / std::sqrt(ms / H + head->config().layer.rms_norm_eps);
      for (int c = 0; c < C; ++c) {
        const float got = out.logits[static_cast<size_t>(t * C + c)];
        if (c < Vd) {
          EXPECT_NEAR(got, want[static_cast<size_t>(t * Vd + c)], 1e-4) << "draft column " << c;
          continue;
        }
        const int32_t id = head->draft_to_target()[static_cast<size_t>(c)];
        const float* row = c - Vd < head->context_rows_used() ? table.data() + static_cast<size_t>(id) * H : nullptr;
        double dot = 0;
        for (int k = 0; k < H; ++k)
          dot += (row ? head->context_scale() * row[k] : own[static_cast<size_t>(k)]) * h[k] * inv *
                 norm[static_cast<size_t>(k)];
        EXPECT_NEAR(got, dot, 1e-4) << "context column " << c << " (target id " << id << ")";
      }
    }
  };
  // Before any context token: the columns repeat draft id 0's row and token.
  expect_columns(run());
  EXPECT_EQ(head->draft_to_target()[static_cast<size_t>(Vd)], d2t[0]);
  // Tokens inside the draft vocabulary take no row; a token seen again is refreshed, and a third
  // outside token replaces the least recently seen.
  head->note_context(std::vector<int32_t>{d2t[3], outside[0], outside[1], d2t[5], outside[0]}, lm_head);
  EXPECT_EQ(head->context_rows_used(), 2);
  EXPECT_EQ(head->draft_to_target()[static_cast<size_t>(Vd)], outside[0]);
  EXPECT_EQ(head->draft_to_target()[static_cast<size_t>(Vd + 1)], outside[1]);
  head->note_context(std::vector<int32_t>{outside[2]}, lm_head);
  EXPECT_EQ(head->draft_to_target()[static_cast<size_t>(Vd)], outside[0]);
  EXPECT_EQ(head->draft_to_target()[static_cast<size_t>(Vd + 1)], outside[2]);
  expect_columns(run());
}

INSTANTIATE_TEST_SUITE_P(TargetTypes, ContextRows, ::testing::Values(DType::f32, DType::bf16, DType::f16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(Eagle3Head, ChainedDrawsAreTheHostsDraws) {
  // A chain drawn on the backend (Backend::sample over the target vocabulary, the tokens no logit
  // column holds at zero probability) proposes what drawing each step's copied logits on the
  // host proposes at the same keys: two sampled rows and a greedy one beside them, with context
  // rows holding target tokens outside the draft vocabulary.
  const auto ref = reference();
  auto head = Eagle3Head::load(fixture_dir() / "head", backend());
  const int V = head->config().layer.vocab_size, H = head->config().layer.hidden_size;
  const auto d2t = ref["draft_to_target"].get<std::vector<int32_t>>();
  std::vector<float> table(static_cast<size_t>(V * H));
  uint64_t seed = 3;
  for (float& x : table) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<float>(static_cast<int64_t>(seed >> 40) % 2001 - 1000) * 1e-3f;
  }
  Buffer buffer = backend().allocate(table.size() * sizeof(float));
  const Tensor device_table = buffer.view(DType::f32, {V, H});
  backend().copy(Tensor(table.data(), DType::f32, {V, H}), device_table);
  const Weight lm_head(device_table);
  head->use_target_rows(lm_head, 4);
  std::vector<int32_t> outside;
  for (int32_t t = 0; t < V && outside.size() < 3; ++t)
    if (std::find(d2t.begin(), d2t.end(), t) == d2t.end()) outside.push_back(t);
  head->note_context(outside, lm_head);
  ASSERT_EQ(head->context_rows_used(), 3);

  const auto tokens = ref["tokens"].get<std::vector<int32_t>>();
  const auto fused = ref["fused"].get<std::vector<float>>();
  const size_t width = fused.size() / tokens.size();
  const std::vector<size_t> lengths = {tokens.size(), 3, 5};
  const int R = static_cast<int>(lengths.size()), depth = 5;
  std::vector<SampleRow> draws(static_cast<size_t>(depth * R));
  for (int k = 0; k < depth; ++k)
    for (int j = 0; j < R; ++j) {
      SampleRow& d = draws[static_cast<size_t>(k * R + j)];
      d.temperature = j == 0 ? 0.8f : j == 1 ? 1.5f : 0.0f;
      d.top_p = j == 1 ? 0.9f : 1.0f;
      d.seed = 11 + static_cast<uint64_t>(j);
      d.position = 100 * static_cast<uint64_t>(j) + static_cast<uint64_t>(k);
    }
  const auto make_rows = [&](KvCache& cache) {
    std::vector<Eagle3Head::Row> rows;
    for (const size_t n : lengths) {
      const auto seq = cache.create();
      EXPECT_TRUE(cache.reserve(seq, static_cast<int>(n) + depth));
      rows.push_back(
          {seq, {tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(n)}, {static_cast<int32_t>(n) - 1}});
    }
    return rows;
  };
  // Each row's fused taps, one after another, or padded to the chain's step-0 width (the last
  // position repeated) where the backend records step 0 with the chain.
  const auto inputs_of = [&](size_t pad) {
    std::vector<float> in;
    for (const size_t n : lengths)
      for (size_t t = 0; t < std::max(n, pad); ++t) {
        const auto from = fused.begin() + static_cast<std::ptrdiff_t>(std::min(t, n - 1) * width);
        in.insert(in.end(), from, from + static_cast<std::ptrdiff_t>(width));
      }
    return in;
  };

  auto chain_cache = head->make_cache(16);
  const std::vector<Eagle3Head::Row> chain_rows = make_rows(*chain_cache);
  std::vector<float> padded = inputs_of(static_cast<size_t>(head->step0_width(chain_rows)));
  const Tensor padded_inputs(padded.data(), DType::f32,
                             {static_cast<int64_t>(padded.size() / width), static_cast<int64_t>(width)});
  const Eagle3Head::Drafts chained = head->draft_chain(chain_rows, padded_inputs, depth, nullptr, *chain_cache, draws);

  auto host_cache = head->make_cache(16);
  std::vector<Eagle3Head::Row> rows = make_rows(*host_cache);
  Eagle3Head::Output out = head->forward(rows, inputs_of(0), true, nullptr, *host_cache);
  std::vector<int32_t> drawn;
  int left_argmax = 0;  // sampled draws that are not the step's argmax
  const std::span<const int32_t> columns = head->draft_to_target();
  for (int k = 0; k < depth; ++k) {
    for (int j = 0; j < R; ++j) {
      std::vector<float> full(static_cast<size_t>(V), -std::numeric_limits<float>::infinity());
      for (size_t c = 0; c < columns.size(); ++c)
        full[static_cast<size_t>(columns[c])] = out.logits[j * columns.size() + c];
      drawn.push_back(sample(full, draws[static_cast<size_t>(k * R + j)]));
      left_argmax += drawn.back() != argmax(full);
      rows[static_cast<size_t>(j)].tokens = {drawn.back()};
      rows[static_cast<size_t>(j)].outputs_at = {0};
    }
    if (k + 1 < depth) out = head->forward(rows, out.hidden, false, nullptr, *host_cache);
  }
  ASSERT_EQ(chained.ids.size(), drawn.size());
  // On a GPU the chain's logits come from the fast kernels and its draws from the device sampler,
  // whose sums round otherwise: a draw within rounding of a boundary may go the other way.
  int same = 0;
  for (size_t i = 0; i < drawn.size(); ++i) {
    same += chained.ids[i] == drawn[i];
    if (!test_on_gpu()) {
      EXPECT_EQ(chained.ids[i], drawn[i]) << "draft " << i / R << " of row " << i % R;
    }
  }
  EXPECT_GE(same, static_cast<int>(drawn.size()) * 4 / 5);
  // The sampled rows are no greedy chains in disguise.
  EXPECT_GT(left_argmax, 0);
}

// A copy of the fixture head in a temporary folder, its safetensors header and bytes editable.
class BrokenHead : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("specdec-eagle3-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    fs::copy_file(fixture_dir() / "head/config.json", dir_ / "config.json", fs::copy_options::overwrite_existing);
    std::ifstream in(fixture_dir() / "head/model.safetensors", std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    header_ = nlohmann::json::parse(std::string(bytes.data() + 8, n));
    data_.assign(bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n), bytes.end());
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write() {
    const std::string h = header_.dump();
    const uint64_t n = h.size();
    std::ofstream out(dir_ / "model.safetensors", std::ios::binary);
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(h.data(), static_cast<std::streamsize>(n));
    out.write(data_.data(), static_cast<std::streamsize>(data_.size()));
  }
  void edit_config(const std::function<void(nlohmann::json&)>& edit) {
    std::ifstream in(dir_ / "config.json");
    auto j = nlohmann::json::parse(in);
    edit(j);
    std::ofstream(dir_ / "config.json") << j.dump();
  }
  void set_d2t(int64_t index, int64_t value) {
    const size_t at = header_["d2t"]["data_offsets"][0].get<size_t>() + static_cast<size_t>(index) * 8;
    std::memcpy(data_.data() + at, &value, 8);
  }
  int64_t d2t(int64_t index) const {
    int64_t v = 0;
    std::memcpy(&v, data_.data() + header_["d2t"]["data_offsets"][0].get<size_t>() + static_cast<size_t>(index) * 8, 8);
    return v;
  }
  std::string load_error() {
    write();
    try {
      Eagle3Head::load(dir_, backend());
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }

  fs::path dir_;
  nlohmann::json header_;
  std::vector<char> data_;
};

TEST_F(BrokenHead, IntactCopyLoads) { EXPECT_EQ(load_error(), ""); }

TEST_F(BrokenHead, MissingTensor) {
  header_.erase("midlayer.mlp.up_proj.weight");
  const std::string e = load_error();
  EXPECT_NE(e.find("no tensor \"midlayer.mlp.up_proj.weight\""), std::string::npos) << e;
  EXPECT_NE(e.find(dir_.string()), std::string::npos) << e;
}

TEST_F(BrokenHead, WrongShape) {
  header_["norm.weight"]["shape"] = {16, 2};  // same bytes, wrong shape
  const std::string e = load_error();
  EXPECT_NE(e.find("\"norm.weight\" has shape [16, 2], expected [32]"), std::string::npos) << e;
}

TEST_F(BrokenHead, FcNotThreeTargetTaps) {
  edit_config([](nlohmann::json& j) { j["target_hidden_size"] = 20; });
  const std::string e = load_error();
  EXPECT_NE(e.find("\"fc.weight\" has shape [32, 72], expected [32, 60]"), std::string::npos) << e;
}

TEST_F(BrokenHead, D2tOutsideTheTargetVocabulary) {
  set_d2t(39, 1000);
  const std::string e = load_error();
  EXPECT_NE(e.find("d2t maps draft id 39 to target id 1039, outside the target vocabulary of 96"), std::string::npos)
      << e;
  set_d2t(39, -100);
  EXPECT_NE(load_error().find("outside the target vocabulary"), std::string::npos);
}

TEST_F(BrokenHead, D2tNotOneToOne) {
  set_d2t(1, d2t(0) - 1);  // draft id 1 onto draft id 0's target
  EXPECT_NE(load_error().find("d2t maps two draft ids to target id"), std::string::npos);
}

TEST_F(BrokenHead, T2dContradictsD2t) {
  const size_t at = header_["t2d"]["data_offsets"][0].get<size_t>();
  size_t first_in = 0;
  while (data_[at + first_in] == 0) ++first_in;
  data_[at + first_in] = 0;
  EXPECT_NE(load_error().find("t2d marks target id"), std::string::npos);
}

TEST_F(BrokenHead, ReducedVocabularyWithoutD2t) {
  header_.erase("d2t");
  header_.erase("t2d");
  EXPECT_NE(load_error().find("no \"d2t\" tensor"), std::string::npos);
}

TEST_F(BrokenHead, UnsupportedConfig) {
  edit_config([](nlohmann::json& j) { j["num_hidden_layers"] = 2; });
  EXPECT_NE(load_error().find("num_hidden_layers = 2 is not supported"), std::string::npos);
  edit_config([](nlohmann::json& j) {
    j["num_hidden_layers"] = 1;
    j["draft_vocab_size"] = 500;
  });
  EXPECT_NE(load_error().find("draft_vocab_size = 500 must lie in [1, vocab_size = 96]"), std::string::npos);
  edit_config([](nlohmann::json& j) {
    j["draft_vocab_size"] = 40;
    j["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = {1, 2};
  });
  EXPECT_NE(load_error().find("must list three target layers"), std::string::npos);
}

}  // namespace
}  // namespace specdec::testing
