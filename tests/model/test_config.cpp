// config.json / generation_config.json parsing against the fixture files, RoPE frequencies
// against an independent double-precision derivation, and refusal of what we do not implement.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numbers>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/config.h"

namespace specdec {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

fs::path fixture_model(const std::string& name) {
  return fs::path(SPECDEC_SOURCE_DIR) / "tests/fixtures/models" / name;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected specdec::Error";
  return "";
}

// A valid llama config, edited by each refusal test.
nlohmann::json base_config() {
  return nlohmann::json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 512,
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6, "hidden_act": "silu", "rope_theta": 10000.0, "eos_token_id": 2})");
}

std::string parse_error(const nlohmann::json& j) {
  return error_of([&] { parse_model_config(j.dump(), "bad/config.json"); });
}

// Independent reference: transformers' formulas evaluated in double precision.
std::vector<double> reference_inv_freq(int dim, double theta) {
  std::vector<double> inv;
  for (int i = 0; i < dim; i += 2) inv.push_back(1.0 / std::pow(theta, double(i) / dim));
  return inv;
}

std::vector<double> reference_llama3(int dim, double theta, double factor, double low, double high,
                                     double old_len) {
  std::vector<double> out;
  for (double f : reference_inv_freq(dim, theta)) {
    const double wavelen = 2.0 * std::numbers::pi / f;
    if (wavelen < old_len / high) {
      out.push_back(f);
    } else if (wavelen > old_len / low) {
      out.push_back(f / factor);
    } else {
      const double s = (old_len / wavelen - low) / (high - low);
      out.push_back((1.0 - s) * f / factor + s * f);
    }
  }
  return out;
}

void expect_close(const std::vector<float>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-6 * std::abs(want[i])) << "index " << i;
}

TEST(ModelConfig, LlamaFixture) {
  const ModelConfig c = load_model_config(fixture_model("llama"));
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 128);
  EXPECT_EQ(c.num_layers, 2);
  EXPECT_EQ(c.num_heads, 4);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.max_position, 256);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-6f);
  EXPECT_EQ(c.rope.type, "default");
  EXPECT_DOUBLE_EQ(c.rope.theta, 10000.0);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.o_proj_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.dtype, DType::f32);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, std::vector<int32_t>{2});
  expect_close(rope_inv_freq(c), reference_inv_freq(16, 10000.0));
  EXPECT_EQ(rope_attention_scaling(c), 1.0f);
}

TEST(ModelConfig, Llama3RopeFixture) {
  const ModelConfig c = load_model_config(fixture_model("llama_tied_llama3rope"));
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.rope.type, "llama3");
  EXPECT_DOUBLE_EQ(c.rope.theta, 500000.0);
  EXPECT_DOUBLE_EQ(c.rope.factor, 8.0);
  EXPECT_DOUBLE_EQ(c.rope.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c.rope.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope.original_max_position, 16);
  expect_close(rope_inv_freq(c), reference_llama3(16, 500000.0, 8.0, 1.0, 4.0, 16.0));
}

TEST(ModelConfig, Llama3RopeAllThreeBands) {
  // Llama 3.1's published settings: high, medium and low frequency bands all occur.
  nlohmann::json j = base_config();
  j["hidden_size"] = 1024;
  j["num_attention_heads"] = 8;
  j["rope_theta"] = 500000.0;
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  const ModelConfig c = parse_model_config(j.dump(), "llama31/config.json");
  ASSERT_EQ(c.head_dim, 128);
  const std::vector<float> got = rope_inv_freq(c);
  const std::vector<double> plain = reference_inv_freq(128, 500000.0);
  const std::vector<double> want = reference_llama3(128, 500000.0, 8.0, 1.0, 4.0, 8192.0);
  expect_close(got, want);
  int kept = 0, divided = 0, blended = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i] == plain[i]) ++kept;
    else if (want[i] == plain[i] / 8.0) ++divided;
    else ++blended;
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(blended, 0);
}

TEST(ModelConfig, Qwen2LinearRopeAndBias) {
  const ModelConfig c = load_model_config(fixture_model("qwen2"));
  EXPECT_EQ(c.architecture, "Qwen2ForCausalLM");
  EXPECT_TRUE(c.attention_bias);
  EXPECT_FALSE(c.o_proj_bias);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.rope.type, "linear");
  EXPECT_DOUBLE_EQ(c.rope.factor, 2.0);
  EXPECT_DOUBLE_EQ(c.rope.theta, 1000000.0);
  std::vector<double> want = reference_inv_freq(16, 1000000.0);
  for (double& f : want) f /= 2.0;
  expect_close(rope_inv_freq(c), want);
}

TEST(ModelConfig, Qwen3HeadDimAndQkNorm) {
  const ModelConfig c = load_model_config(fixture_model("qwen3"));
  EXPECT_EQ(c.model_type, "qwen3");
  EXPECT_EQ(c.head_dim, 32);  // explicit, differs from hidden / heads = 16
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(rope_inv_freq(c).size(), 16u);
  expect_close(rope_inv_freq(c), reference_inv_freq(32, 1000000.0));
}

TEST(ModelConfig, MistralExplicitHeadDim) {
  const ModelConfig c = load_model_config(fixture_model("mistral"));
  EXPECT_EQ(c.architecture, "MistralForCausalLM");
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_DOUBLE_EQ(c.rope.theta, 1000000.0);
}

TEST(ModelConfig, Transformers5LayoutOfBundledModels) {
  const fs::path root = fs::path(SPECDEC_SOURCE_DIR) / "models";
  const ModelConfig t = load_model_config(root / "target");
  EXPECT_EQ(t.hidden_size, 512);
  EXPECT_EQ(t.num_layers, 8);
  EXPECT_EQ(t.num_heads, 8);
  EXPECT_EQ(t.num_kv_heads, 2);
  EXPECT_EQ(t.head_dim, 64);
  EXPECT_EQ(t.vocab_size, 8192);
  EXPECT_EQ(t.max_position, 2048);
  EXPECT_FLOAT_EQ(t.rms_norm_eps, 1e-5f);
  EXPECT_EQ(t.rope.type, "default");
  EXPECT_DOUBLE_EQ(t.rope.theta, 10000.0);
  EXPECT_TRUE(t.tie_word_embeddings);
  EXPECT_EQ(t.dtype, DType::bf16);
  EXPECT_EQ(t.eos_token_ids, std::vector<int32_t>{0});
  const ModelConfig d = load_model_config(root / "draft");
  EXPECT_EQ(d.hidden_size, 192);
  EXPECT_EQ(d.num_heads, 3);
  EXPECT_EQ(d.num_kv_heads, 1);
  EXPECT_EQ(d.head_dim, 64);
  expect_close(rope_inv_freq(d), reference_inv_freq(64, 10000.0));
}

TEST(ModelConfig, RopeParametersLlama3AndEosList) {
  nlohmann::json j = base_config();
  j.erase("rope_theta");
  j["eos_token_id"] = {2, 7};
  j["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 500000.0}, {"factor", 4.0},
                          {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                          {"original_max_position_embeddings", 64}};
  const ModelConfig c = parse_model_config(j.dump(), "t5/config.json");
  EXPECT_EQ(c.rope.type, "llama3");
  EXPECT_DOUBLE_EQ(c.rope.theta, 500000.0);
  EXPECT_EQ(c.rope.original_max_position, 64);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{2, 7}));
  expect_close(rope_inv_freq(c), reference_llama3(16, 500000.0, 4.0, 1.0, 4.0, 64.0));
}

TEST(ModelConfig, ClassicTypeKeyAndDefaults) {
  nlohmann::json j = base_config();
  j.erase("num_key_value_heads");
  j.erase("rms_norm_eps");
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};
  j["attention_bias"] = true;
  const ModelConfig c = parse_model_config(j.dump(), "x/config.json");
  EXPECT_EQ(c.num_kv_heads, 4);  // absent: multi-head attention
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-6f);
  EXPECT_EQ(c.rope.type, "linear");
  EXPECT_DOUBLE_EQ(c.rope.factor, 4.0);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_TRUE(c.o_proj_bias);  // llama's attention_bias covers o_proj too
}

TEST(ModelConfig, AttentionBiasPerFamily) {
  // transformers: qwen2 always biases q/k/v (never o); llama and qwen3 bias all four when
  // attention_bias; mistral never has biases.
  const auto parse = [](const char* arch, const char* type, std::optional<bool> bias) {
    nlohmann::json j = base_config();
    j["architectures"] = {arch};
    j["model_type"] = type;
    if (bias) j["attention_bias"] = *bias;
    return parse_model_config(j.dump(), "x/config.json");
  };
  const ModelConfig q2 = parse("Qwen2ForCausalLM", "qwen2", std::nullopt);
  EXPECT_TRUE(q2.attention_bias);
  EXPECT_FALSE(q2.o_proj_bias);
  EXPECT_FALSE(q2.qk_norm);
  const ModelConfig q3 = parse("Qwen3ForCausalLM", "qwen3", true);
  EXPECT_TRUE(q3.attention_bias);
  EXPECT_TRUE(q3.o_proj_bias);
  EXPECT_TRUE(q3.qk_norm);
  const ModelConfig q3_plain = parse("Qwen3ForCausalLM", "qwen3", std::nullopt);
  EXPECT_FALSE(q3_plain.attention_bias);
  const ModelConfig m = parse("MistralForCausalLM", "mistral", true);
  EXPECT_FALSE(m.attention_bias);
  EXPECT_FALSE(m.o_proj_bias);
}

TEST(ModelConfig, RefusesWhatIsNotImplemented) {
  struct Case {
    const char* what;
    std::function<void(nlohmann::json&)> edit;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {"unknown architecture", [](auto& j) { j["architectures"] = {"GPT2LMHeadModel"}; },
       {"GPT2LMHeadModel", "unsupported architecture"}},
      {"unknown model_type", [](auto& j) { j.erase("architectures"); j["model_type"] = "gemma"; },
       {"gemma", "unsupported model_type"}},
      {"architecture/type mismatch", [](auto& j) { j["model_type"] = "qwen2"; },
       {"LlamaForCausalLM", "qwen2"}},
      {"mistral sliding window",
       [](auto& j) {
         j["architectures"] = {"MistralForCausalLM"};
         j["model_type"] = "mistral";
         j["sliding_window"] = 64;
       },
       {"sliding_window", "64"}},
      {"qwen sliding window",
       [](auto& j) {
         j["architectures"] = {"Qwen2ForCausalLM"};
         j["model_type"] = "qwen2";
         j["use_sliding_window"] = true;
       },
       {"use_sliding_window"}},
      {"yarn rope", [](auto& j) { j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}}; },
       {"yarn", "not supported"}},
      {"dynamic rope (rope_parameters)",
       [](auto& j) { j["rope_parameters"] = {{"rope_type", "dynamic"}, {"rope_theta", 1e4}, {"factor", 2.0}}; },
       {"dynamic", "rope_parameters"}},
      {"llama3 rope without factors",
       [](auto& j) { j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}}; },
       {"low_freq_factor"}},
      {"gelu", [](auto& j) { j["hidden_act"] = "gelu"; }, {"hidden_act", "gelu"}},
      {"mlp_bias", [](auto& j) { j["mlp_bias"] = true; }, {"mlp_bias"}},
      {"heads not a multiple", [](auto& j) { j["num_key_value_heads"] = 3; },
       {"num_attention_heads", "num_key_value_heads"}},
      {"missing field", [](auto& j) { j.erase("hidden_size"); }, {"hidden_size", "missing"}},
      {"zero size", [](auto& j) { j["intermediate_size"] = 0; }, {"intermediate_size", "positive"}},
      {"negative size", [](auto& j) { j["num_hidden_layers"] = -2; }, {"num_hidden_layers"}},
      {"huge rms_norm_eps", [](auto& j) { j["rms_norm_eps"] = 1e300; }, {"rms_norm_eps", "must be in (0, 1]"}},
      {"wrong type", [](auto& j) { j["vocab_size"] = "512"; }, {"vocab_size", "integer"}},
      {"quantized", [](auto& j) { j["quantization_config"] = {{"quant_method", "gptq"}}; },
       {"quantization_config"}},
  };
  for (const Case& c : cases) {
    nlohmann::json j = base_config();
    c.edit(j);
    const std::string msg = parse_error(j);
    EXPECT_THAT(msg, HasSubstr("bad/config.json")) << c.what;
    for (const std::string& s : c.expect) EXPECT_THAT(msg, HasSubstr(s)) << c.what;
  }
}

TEST(ModelConfig, InactiveSlidingWindowsAreAccepted) {
  nlohmann::json j = base_config();
  j["architectures"] = {"MistralForCausalLM"};
  j["model_type"] = "mistral";
  j["sliding_window"] = 4096;  // longer than max_position_embeddings = 256: never limits anything
  EXPECT_NO_THROW(parse_model_config(j.dump(), "m/config.json"));
}

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("specdec_config_test_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name, std::ios::binary) << text;
  }

 private:
  fs::path path_;
};

TEST(ModelConfig, InvalidJsonNamesFileAndPosition) {
  TempDir dir;
  dir.write("config.json", "{\"vocab_size\": 512,\n \"hidden_size\": }");
  const std::string msg = error_of([&] { load_model_config(dir.path()); });
  EXPECT_THAT(msg, HasSubstr((dir.path() / "config.json").string()));
  EXPECT_THAT(msg, HasSubstr("invalid JSON"));
  EXPECT_THAT(msg, HasSubstr("line 2"));
}

TEST(ModelConfig, MissingConfigNamesFile) {
  TempDir dir;
  const std::string msg = error_of([&] { load_model_config(dir.path()); });
  EXPECT_THAT(msg, HasSubstr("config.json"));
  EXPECT_THAT(msg, HasSubstr("not found"));
}

TEST(GenerationConfig, BundledTarget) {
  const GenerationDefaults g = load_generation_config(fs::path(SPECDEC_SOURCE_DIR) / "models/target");
  EXPECT_TRUE(g.do_sample);
  EXPECT_FLOAT_EQ(g.temperature, 0.8f);
  EXPECT_FLOAT_EQ(g.top_p, 0.95f);
  EXPECT_EQ(g.top_k, 40);
  EXPECT_FLOAT_EQ(g.min_p, 0.0f);
  EXPECT_FLOAT_EQ(g.repetition_penalty, 1.0f);
  EXPECT_EQ(g.eos_token_ids, std::vector<int32_t>{0});
}

TEST(GenerationConfig, AbsentFileAndFieldsGiveDefaults) {
  const GenerationDefaults none = load_generation_config(fixture_model("llama"));
  EXPECT_FALSE(none.do_sample);
  EXPECT_FLOAT_EQ(none.temperature, 1.0f);
  EXPECT_FLOAT_EQ(none.top_p, 1.0f);
  EXPECT_EQ(none.top_k, 0);
  EXPECT_TRUE(none.eos_token_ids.empty());

  TempDir dir;
  dir.write("generation_config.json", R"({"temperature": 0.6, "eos_token_id": [5, 9], "min_p": 0.05,
                                          "repetition_penalty": 1.1})");
  const GenerationDefaults g = load_generation_config(dir.path());
  EXPECT_FALSE(g.do_sample);
  EXPECT_EQ(g.top_k, 0);  // absent stays off
  EXPECT_FLOAT_EQ(g.temperature, 0.6f);
  EXPECT_FLOAT_EQ(g.min_p, 0.05f);
  EXPECT_FLOAT_EQ(g.repetition_penalty, 1.1f);
  EXPECT_EQ(g.eos_token_ids, (std::vector<int32_t>{5, 9}));
}

TEST(GenerationConfig, InvalidJsonNamesFile) {
  TempDir dir;
  dir.write("generation_config.json", "{\"top_k\": 40,,}");
  const std::string msg = error_of([&] { load_generation_config(dir.path()); });
  EXPECT_THAT(msg, HasSubstr("generation_config.json"));
  EXPECT_THAT(msg, HasSubstr("invalid JSON"));
}

}  // namespace
}  // namespace specdec
