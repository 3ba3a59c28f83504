// Broken model folders, made in a temporary folder from links to the bundled and fixture models:
// loading one through the public API (an Engine, a draft, inspect_model) throws an error naming
// the file, the tensor or the field at fault.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "specdec/specdec.h"

namespace {

namespace fs = std::filesystem;

const std::string kSource = SPECDEC_SOURCE_DIR;
const std::string kTarget = kSource + "/models/target";
const std::string kTinyLlama = kSource + "/tests/fixtures/models/llama";

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A safetensors file as (header JSON, data bytes), for editing tiny fixtures.
struct Safetensors {
  nlohmann::json header;
  std::string data;

  static Safetensors read(const fs::path& p) {
    const std::string b = slurp(p);
    uint64_t n = 0;
    std::memcpy(&n, b.data(), 8);
    return {nlohmann::json::parse(b.substr(8, n)), b.substr(8 + n)};
  }
  std::string bytes() const {
    std::string h = header.dump();
    while (h.size() % 8 != 0) h += ' ';
    const uint64_t n = h.size();
    std::string b(8, '\0');
    std::memcpy(b.data(), &n, 8);
    return b + h + data;
  }
};

void expect_error(const std::function<void()>& load, const std::string& cause) {
  try {
    load();
    ADD_FAILURE() << "expected an error naming '" << cause << "'";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(cause), std::string::npos) << "expected '" << cause << "' in: " << e.what();
  }
}

specdec::EngineConfig on_cpu(const fs::path& dir) {
  specdec::EngineConfig c;
  c.model_dir = dir.string();
  c.device = specdec::DeviceKind::cpu;
  return c;
}

// Each test gets a fresh folder under /tmp, removed afterwards; the repository is never written.
class BrokenModel : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/specdec_models_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr) << std::strerror(errno);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  // A model folder whose files are links to `from`'s, except those the test then replaces (the
  // link is removed first, so that the original is never written through it).
  fs::path linked_copy(const std::string& from) {
    const fs::path to = dir_ / "m";
    fs::create_directories(to);
    for (const auto& e : fs::directory_iterator(from)) fs::create_symlink(e.path(), to / e.path().filename());
    return to;
  }
  void replace(const fs::path& file, const std::string& bytes) {
    fs::remove(file);
    std::ofstream(file, std::ios::binary) << bytes;
  }
  // Loading `m` as a target and describing it both fail naming `cause`.
  void expect_refused(const fs::path& m, const std::string& cause) {
    expect_error([&] { specdec::Engine engine(on_cpu(m)); }, cause);
    expect_error([&] { specdec::inspect_model(m.string()); }, cause);
  }

  fs::path dir_;
};

TEST_F(BrokenModel, MissingFolder) { expect_refused(dir_ / "no_such_model", "no_such_model"); }

TEST_F(BrokenModel, MissingConfig) {
  const fs::path m = linked_copy(kTarget);
  fs::remove(m / "config.json");
  expect_refused(m, "config.json");
}

TEST_F(BrokenModel, InvalidConfigJson) {
  const fs::path m = linked_copy(kTarget);
  replace(m / "config.json", "{\"vocab_size\": 8192, ");
  expect_refused(m, "config.json");
}

TEST_F(BrokenModel, UnknownArchitecture) {
  const fs::path m = linked_copy(kTarget);
  auto config = nlohmann::json::parse(slurp(kTarget + "/config.json"));
  config["architectures"] = {"FooForCausalLM"};
  config["model_type"] = "foo";
  replace(m / "config.json", config.dump(2));
  expect_refused(m, "FooForCausalLM");
}

TEST_F(BrokenModel, TruncatedHeader) {
  const fs::path m = linked_copy(kTarget);
  replace(m / "model.safetensors", slurp(kTarget + "/model.safetensors").substr(0, 1000));
  expect_refused(m, "model.safetensors");
}

TEST_F(BrokenModel, TruncatedTensorData) {
  const fs::path m = linked_copy(kTinyLlama);
  const std::string whole = slurp(kTinyLlama + "/model.safetensors");
  replace(m / "model.safetensors", whole.substr(0, whole.size() / 2));
  expect_refused(m, "model.safetensors");
}

TEST_F(BrokenModel, TensorWithTheWrongShape) {
  const fs::path m = linked_copy(kTinyLlama);
  Safetensors st = Safetensors::read(kTinyLlama + "/model.safetensors");
  // Same number of elements, other shape: only the shape check can catch it.
  st.header["model.layers.0.self_attn.q_proj.weight"]["shape"] = {32, 128};
  replace(m / "model.safetensors", st.bytes());
  expect_refused(m, "model.layers.0.self_attn.q_proj.weight");
  // As a draft model, too, before its vocabulary is compared with the target's.
  specdec::EngineConfig c = on_cpu(kTarget);
  c.drafts.push_back(specdec::DraftSpec::model(m.string(), "d"));
  expect_error([&] { specdec::Engine engine(c); }, "model.layers.0.self_attn.q_proj.weight");
}

TEST_F(BrokenModel, MissingTensor) {
  const fs::path m = linked_copy(kTinyLlama);
  Safetensors st = Safetensors::read(kTinyLlama + "/model.safetensors");
  // model.norm.weight holds the last bytes, so dropping it leaves a consistent file.
  const auto end = st.header["model.norm.weight"]["data_offsets"][0].get<size_t>();
  ASSERT_EQ(st.header["model.norm.weight"]["data_offsets"][1].get<size_t>(), st.data.size());
  st.header.erase("model.norm.weight");
  st.data.resize(end);
  replace(m / "model.safetensors", st.bytes());
  expect_refused(m, "model.norm.weight");
}

TEST_F(BrokenModel, FewerLayersThanTheCheckpointHolds) {
  const fs::path m = linked_copy(kTarget);
  auto config = nlohmann::json::parse(slurp(kTarget + "/config.json"));
  const int layers = config["num_hidden_layers"].get<int>();
  config["num_hidden_layers"] = layers - 1;
  replace(m / "config.json", config.dump(2));
  expect_error([&] { specdec::Engine engine(on_cpu(m)); },
               "belongs to layer " + std::to_string(layers - 1) + " but config.json's num_hidden_layers is " +
                   std::to_string(layers - 1));
}

TEST_F(BrokenModel, EosOutsideTheVocabulary) {
  const fs::path m = linked_copy(kTarget);
  auto generation = nlohmann::json::parse(slurp(kTarget + "/generation_config.json"));
  generation["eos_token_id"] = 8192;
  replace(m / "generation_config.json", generation.dump(2));
  expect_error([&] { specdec::Engine engine(on_cpu(m)); },
               "eos_token_id 8192 (generation_config.json) is outside the vocabulary of 8192 tokens");
}

TEST_F(BrokenModel, DuplicateIdsInTheTokenizerVocabulary) {
  const fs::path m = linked_copy(kTarget);
  auto tokenizer = nlohmann::json::parse(slurp(kTarget + "/tokenizer.json"));
  auto& vocab = tokenizer["model"]["vocab"];
  const int32_t id = vocab.begin().value().get<int32_t>();
  (std::next(vocab.begin())).value() = id;
  replace(m / "tokenizer.json", tokenizer.dump());
  expect_error([&] { specdec::Engine engine(on_cpu(m)); }, "model.vocab gives id " + std::to_string(id) + " to both");
}

TEST_F(BrokenModel, ADraftWithAnotherTokenizerOfTheSameSize) {
  const fs::path m = linked_copy(kTarget);
  auto tokenizer = nlohmann::json::parse(slurp(kTarget + "/tokenizer.json"));
  auto& vocab = tokenizer["model"]["vocab"];
  // Two tokens trade ids: the same size, other meanings.
  auto a = std::next(vocab.begin(), 300), b = std::next(vocab.begin(), 301);
  const auto id = a.value();
  a.value() = b.value();
  b.value() = id;
  replace(m / "tokenizer.json", tokenizer.dump());
  specdec::Engine engine(on_cpu(kTarget));
  expect_error([&] { engine.add_draft(specdec::DraftSpec::model(m.string(), "d")); },
               "a draft model must share the target's tokenizer");
}

// A NaN in the final norm makes every logit NaN: greedy decoding reports it, naming the model
// that produced it, instead of emitting token 0.
TEST_F(BrokenModel, NaNLogitsAreAnErrorNamingTheModel) {
  const fs::path m = linked_copy(kTarget);
  Safetensors st = Safetensors::read(kTarget + "/model.safetensors");
  ASSERT_EQ(st.header["model.norm.weight"]["dtype"], "BF16");
  const auto begin = st.header["model.norm.weight"]["data_offsets"][0].get<size_t>();
  const auto end = st.header["model.norm.weight"]["data_offsets"][1].get<size_t>();
  for (size_t i = begin; i < end; i += 2) st.data.replace(i, 2, "\xc0\x7f", 2);  // bf16 quiet NaN
  replace(m / "model.safetensors", st.bytes());
  specdec::GenerationRequest r;
  r.prompt = "def f(x):";
  r.max_tokens = 4;
  r.sampling.temperature = 0.0f;
  for (const float temperature : {0.0f, 0.8f}) {
    r.sampling.temperature = temperature;
    specdec::Engine target(on_cpu(m));
    const specdec::GenerationResult res = target.wait(target.submit(r));
    EXPECT_EQ(res.finish, specdec::Finish::error) << temperature;
    EXPECT_NE(res.error.find("target model"), std::string::npos) << res.error;
    EXPECT_NE(res.error.find("NaN"), std::string::npos) << res.error;
  }
  specdec::EngineConfig c = on_cpu(kTarget);
  c.drafts.push_back(specdec::DraftSpec::model(m.string(), "nan-draft", 2));
  specdec::Engine engine(c);
  r.sampling.temperature = 0.0f;
  r.speculative.draft = "nan-draft";
  r.speculative.adaptive = false;
  const specdec::GenerationResult res = engine.wait(engine.submit(r));
  EXPECT_EQ(res.finish, specdec::Finish::error);
  EXPECT_NE(res.error.find("draft model " + m.string()), std::string::npos) << res.error;  // its folder
  EXPECT_NE(res.error.find("NaN"), std::string::npos) << res.error;
}

// Generation that reaches the end of the context stops there with finish "length" and says so.
TEST_F(BrokenModel, TheContextEndIsReported) {
  const fs::path m = linked_copy(kTarget);
  auto config = nlohmann::json::parse(slurp(kTarget + "/config.json"));
  config["max_position_embeddings"] = 32;
  replace(m / "config.json", config.dump(2));
  specdec::Engine engine(on_cpu(m));
  specdec::GenerationRequest r;
  r.prompt = "def f(x):";
  r.max_tokens = 100;
  r.ignore_eos = true;
  const specdec::GenerationResult cut = engine.wait(engine.submit(r));
  EXPECT_EQ(cut.finish, specdec::Finish::length);
  EXPECT_LT(cut.tokens.size(), 32u);
  EXPECT_TRUE(cut.stats.context_full);
  r.max_tokens = 4;
  const specdec::GenerationResult whole = engine.wait(engine.submit(r));
  EXPECT_EQ(whole.finish, specdec::Finish::length);
  EXPECT_FALSE(whole.stats.context_full);
}

// One field edited in one file of the bundled model, and the one line that names it.
struct BadField {
  const char* file;
  std::function<void(nlohmann::json&)> edit;
  std::string message;
};

TEST_F(BrokenModel, BadFieldsGiveOneClearLine) {
  const std::vector<BadField> table = {
      {"config.json", [](nlohmann::json& j) { j["max_position_embeddings"] = 4; },
       "config.json: max_position_embeddings = 4 is below the 8 positions specdec needs as a context"},
      {"config.json", [](nlohmann::json& j) { j["max_position_embeddings"] = 7; },
       "config.json: max_position_embeddings = 7 is below the 8 positions specdec needs as a context"},
      // Found by fuzzing: a float beyond int64 was converted before its range was checked.
      {"config.json", [](nlohmann::json& j) { j["head_dim"] = 3.2e85; },
       "config.json: field \"head_dim\" = 3.2e+85 is out of range"},
      {"config.json", [](nlohmann::json& j) { j["num_hidden_layers"] = -1e19; },
       "config.json: field \"num_hidden_layers\" = -1e+19 is out of range"},
      {"tokenizer.json",
       [](nlohmann::json& j) {
         j["model"]["vocab"] = nlohmann::json::object();
         j["model"]["merges"] = nlohmann::json::array();
       },
       "tokenizer.json: model.vocab is empty (a tokenizer needs at least one token)"},
      {"generation_config.json",
       [](nlohmann::json& j) {
         j["do_sample"] = true;
         j["temperature"] = 1e-38;
       },
       "generation_config.json: temperature = 1e-38 is too small to sample at (the logits divided by it overflow): "
       "use 0 for greedy decoding or at least 1e-06"},
  };
  for (const BadField& row : table) {
    SCOPED_TRACE(row.message);
    fs::remove_all(dir_ / "m");
    const fs::path m = linked_copy(kTarget);
    nlohmann::json j = fs::exists(kTarget + "/" + row.file) ? nlohmann::json::parse(slurp(kTarget + "/" + row.file))
                                                            : nlohmann::json::object();
    row.edit(j);
    replace(m / row.file, j.dump(1));
    expect_error([&] { specdec::Engine engine(on_cpu(m)); }, row.message);
  }
}

// A number beyond double's range (found by fuzzing: the JSON library throws a different exception
// for it than for bad syntax, which escaped without the file's name).
TEST_F(BrokenModel, NumbersBeyondDoubleAreInvalidJsonNamingTheFile) {
  {
    const fs::path m = linked_copy(kTarget);
    replace(m / "config.json", R"({"vocab_size": 1e606})");
    expect_refused(m, "config.json: invalid JSON: number overflow parsing '1e606'");
  }
  {
    fs::remove_all(dir_ / "m");
    const fs::path m = linked_copy(kTarget);
    const std::string tokenizer = slurp(kTarget + "/tokenizer.json");
    replace(m / "tokenizer.json", "[1e606, " + tokenizer + "]");
    expect_error([&] { specdec::Engine engine(on_cpu(m)); }, "tokenizer.json: invalid JSON: ");
  }
  {
    fs::remove_all(dir_ / "m");
    const fs::path m = linked_copy(kTarget);
    std::string header = R"({"w": {"dtype": "F32", "shape": [1e606], "data_offsets": [0, 4]}})";
    while (header.size() % 8 != 0) header += ' ';
    std::string bytes(8, '\0');
    const uint64_t n = header.size();
    std::memcpy(bytes.data(), &n, 8);
    replace(m / "model.safetensors", bytes + header + std::string(4, '\0'));
    expect_refused(m, "model.safetensors: invalid header JSON: number overflow parsing '1e606'");
  }
}

TEST(DraftModel, AnotherVocabularyIsRefusedAndTheEngineServesOn) {
  specdec::Engine engine(on_cpu(kTarget));
  expect_error([&] { engine.add_draft(specdec::DraftSpec::model(kTinyLlama, "tiny")); }, "vocab");
  EXPECT_FALSE(engine.has_draft("tiny"));
  specdec::GenerationRequest r;
  r.prompt = "def f(x):";
  r.max_tokens = 4;
  r.ignore_eos = true;
  EXPECT_EQ(engine.wait(engine.submit(r)).tokens.size(), 4u);
  r.prompt.clear();
  for (int i = 0; i < 3000; ++i) r.prompt += "x = 1\n";
  expect_error([&] { engine.submit(r); }, "2048");
}

}  // namespace
