// Safetensors loading: every fixture and bundled checkpoint opens and matches its config's tensor
// list; tensor views read the file's bytes; corrupted files and folders give errors that name the
// file, the tensor and the cause.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/config.h"
#include "model/family.h"
#include "backend/backend.h"
#include "cpu_features.h"
#include "model/bound_weights.h"
#include "model/weights.h"

namespace specdec {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

const fs::path kRoot = fs::path(SPECDEC_SOURCE_DIR);

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected specdec::Error";
  return "";
}

class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() / (std::string("specdec_weights_test_") + info->test_suite_name() +
                                         "_" + info->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// Writes a safetensors file: 8-byte little-endian header length, header, data bytes.
void write_raw(const fs::path& path, const std::string& header, size_t data_bytes,
               std::optional<uint64_t> header_len = std::nullopt) {
  const uint64_t len = header_len.value_or(header.size());
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((len >> (8 * i)) & 0xff);
  out += header;
  for (size_t i = 0; i < data_bytes; ++i) out.push_back(static_cast<char>(i % 251));
  std::ofstream(path, std::ios::binary) << out;
}

struct Entry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
};

size_t elem_size(const std::string& dtype) { return dtype == "F32" || dtype == "I32" ? 4 : 2; }

// Lays the entries out back to back and writes a valid file.
void write_packed(const fs::path& path, const std::vector<Entry>& entries) {
  nlohmann::json header = {{"__metadata__", {{"format", "pt"}}}};
  uint64_t offset = 0;
  for (const Entry& e : entries) {
    uint64_t n = elem_size(e.dtype);
    for (int64_t d : e.shape) n *= static_cast<uint64_t>(d);
    header[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  write_raw(path, header.dump(), offset);
}

// A two-tensor header with explicit spans, for the span and size checks.
std::string two_tensors(uint64_t a0, uint64_t a1, uint64_t b0, uint64_t b1, const std::string& b_dtype = "F32") {
  nlohmann::json h;
  h["alpha.weight"] = {{"dtype", "F32"}, {"shape", {2, 2}}, {"data_offsets", {a0, a1}}};
  h["beta.weight"] = {{"dtype", b_dtype}, {"shape", {4}}, {"data_offsets", {b0, b1}}};
  return h.dump();
}

std::string open_error(const fs::path& path) {
  return error_of([&] { SafetensorsFile::open(path); });
}

// A tiny llama config and a checkpoint with exactly its tensors, in dir.
ModelConfig tiny_config() {
  return parse_model_config(R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
      "vocab_size": 8, "hidden_size": 4, "intermediate_size": 6, "num_hidden_layers": 1,
      "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 16})",
                            "tiny/config.json");
}

std::vector<Entry> entries_for(const std::vector<WeightSpec>& specs) {
  std::vector<Entry> out;
  for (const WeightSpec& s : specs)
    if (s.required) out.push_back({s.name, "F32", s.shape});
  return out;
}

TEST(WeightStore, EveryBundledCheckpointLoadsAndValidates) {
  const std::vector<fs::path> dirs = {
      kRoot / "tests/fixtures/models/llama", kRoot / "tests/fixtures/models/llama_tied_llama3rope",
      kRoot / "tests/fixtures/models/mistral", kRoot / "tests/fixtures/models/qwen2",
      kRoot / "tests/fixtures/models/qwen3", kRoot / "models/target", kRoot / "models/draft"};
  for (const fs::path& dir : dirs) {
    SCOPED_TRACE(dir.string());
    const ModelConfig config = load_model_config(dir);
    const WeightStore store = WeightStore::open(dir);
    const std::vector<WeightSpec> specs = weight_specs(config);
    ASSERT_NO_THROW(store.validate(specs));
    // The checkpoint holds nothing the specs do not name (no tensor silently ignored).
    std::set<std::string> named;
    for (const WeightSpec& s : specs) named.insert(s.name);
    size_t params = 0;
    for (const auto& [name, t] : store.all()) {
      EXPECT_TRUE(named.count(name)) << "unexpected tensor " << name;
      EXPECT_EQ(t.device, Device::cpu);
      params += static_cast<size_t>(t.numel());
    }
    EXPECT_EQ(store.parameter_count(), params);
    EXPECT_EQ(store.has("lm_head.weight"), !config.tie_word_embeddings);
  }
}

TEST(WeightStore, SpecsFollowTheArchitecture) {
  const auto names = [](const fs::path& dir) {
    std::set<std::string> s;
    for (const WeightSpec& w : weight_specs(load_model_config(dir))) s.insert(w.name);
    return s;
  };
  const auto qwen2 = names(kRoot / "tests/fixtures/models/qwen2");
  EXPECT_TRUE(qwen2.count("model.layers.1.self_attn.k_proj.bias"));
  EXPECT_FALSE(qwen2.count("model.layers.1.self_attn.o_proj.bias"));
  const auto qwen3 = names(kRoot / "tests/fixtures/models/qwen3");
  EXPECT_TRUE(qwen3.count("model.layers.0.self_attn.q_norm.weight"));
  EXPECT_FALSE(qwen3.count("model.layers.0.self_attn.q_proj.bias"));
  const WeightStore q3 = WeightStore::open(kRoot / "tests/fixtures/models/qwen3");
  const Tensor& q = q3.get("model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(q.dim(0), 4 * 32);  // heads × explicit head_dim
  EXPECT_EQ(q.dim(1), 64);
  EXPECT_EQ(q3.get("model.layers.0.self_attn.k_norm.weight").dim(0), 32);
}

TEST(WeightStore, ShardedMistralFollowsItsIndex) {
  const fs::path dir = kRoot / "tests/fixtures/models/mistral";
  const WeightStore store = WeightStore::open(dir);
  const nlohmann::json index = nlohmann::json::parse(std::ifstream(dir / "model.safetensors.index.json"));
  std::set<fs::path> files;
  for (const auto& [name, shard] : index["weight_map"].items()) {
    EXPECT_EQ(store.file_of(name), dir / shard.get<std::string>()) << name;
    files.insert(store.file_of(name));
  }
  EXPECT_EQ(files.size(), 9u);
  EXPECT_EQ(store.all().size(), index["weight_map"].size());
  EXPECT_EQ(store.total_bytes(), index["metadata"]["total_size"].get<size_t>());
}

TEST(SafetensorsFile, ViewsReadTheFileBytes) {
  // Reference: the header and the bytes read with plain file I/O, not through the mapping.
  const fs::path path = kRoot / "tests/fixtures/models/llama/model.safetensors";
  std::ifstream in(path, std::ios::binary);
  uint64_t len = 0;
  unsigned char lenbuf[8];
  in.read(reinterpret_cast<char*>(lenbuf), 8);
  for (int i = 7; i >= 0; --i) len = (len << 8) | lenbuf[i];
  std::string header(len, '\0');
  in.read(header.data(), static_cast<std::streamsize>(len));
  const nlohmann::json h = nlohmann::json::parse(header);
  const auto file = SafetensorsFile::open(path);
  size_t seen = 0;
  for (const auto& [name, entry] : h.items()) {
    if (name == "__metadata__") continue;
    ++seen;
    const Tensor& t = file->tensors().at(name);
    const auto begin = entry["data_offsets"][0].get<uint64_t>();
    const auto end = entry["data_offsets"][1].get<uint64_t>();
    ASSERT_EQ(t.bytes(), end - begin) << name;
    ASSERT_EQ(t.rank, static_cast<int>(entry["shape"].size())) << name;
    std::string bytes(end - begin, '\0');
    in.seekg(static_cast<std::streamoff>(8 + len + begin));
    in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    EXPECT_EQ(std::memcmp(bytes.data(), t.data, bytes.size()), 0) << name;
  }
  EXPECT_EQ(file->tensors().size(), seen);
}

TEST(SafetensorsFile, CorruptedFilesAreRefusedWithFileTensorAndCause) {
  TempDir dir;
  const fs::path p = dir.path() / "bad.safetensors";
  struct Case {
    const char* what;
    std::function<void()> write;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {"shorter than the length field", [&] { std::ofstream(p, std::ios::binary) << "abc"; }, {"truncated"}},
      {"header length beyond file", [&] { write_raw(p, two_tensors(0, 16, 16, 32), 32, 100000); },
       {"header length 100000", "beyond the file"}},
      {"truncated data", [&] { write_raw(p, two_tensors(0, 16, 16, 32), 20); },
       {"beta.weight", "beyond the data section"}},
      {"invalid header JSON", [&] { write_raw(p, "{\"alpha.weight\": {\"dtype\": ", 0); },
       {"invalid header JSON"}},
      {"unknown dtype", [&] { write_raw(p, two_tensors(0, 16, 16, 48, "F64"), 48); },
       {"beta.weight", "F64", "not supported"}},
      {"size mismatch", [&] { write_raw(p, two_tensors(0, 16, 16, 30), 32); },
       {"beta.weight", "size mismatch", "16 bytes"}},
      {"overlapping spans", [&] { write_raw(p, two_tensors(0, 16, 8, 24), 32); },
       {"alpha.weight", "beta.weight", "overlap"}},
      {"offsets beyond data", [&] { write_raw(p, two_tensors(0, 16, 64, 80), 32); },
       {"beta.weight", "beyond the data section"}},
      {"reversed offsets", [&] { write_raw(p, two_tensors(16, 0, 16, 32), 32); },
       {"alpha.weight", "reversed"}},
  };
  for (const Case& c : cases) {
    c.write();
    const std::string msg = open_error(p);
    EXPECT_THAT(msg, HasSubstr(p.string())) << c.what;
    for (const std::string& s : c.expect) EXPECT_THAT(msg, HasSubstr(s)) << c.what << ": " << msg;
  }
  // Cut a real checkpoint in half: the tensors past the cut are refused.
  const fs::path real = kRoot / "tests/fixtures/models/llama/model.safetensors";
  const fs::path cut = dir.path() / "cut.safetensors";
  fs::copy_file(real, cut);
  fs::resize_file(cut, fs::file_size(real) / 2);
  EXPECT_THAT(open_error(cut), HasSubstr("beyond the data section"));
}

TEST(SafetensorsFile, AcceptsMetadataScalarsAndEmptyTensors) {
  TempDir dir;
  const fs::path p = dir.path() / "ok.safetensors";
  write_packed(p, {{"scalar", "BF16", {}}, {"empty", "F16", {0, 3}}, {"ids", "I32", {3}}, {"w", "F32", {2, 3}}});
  const auto f = SafetensorsFile::open(p);
  ASSERT_EQ(f->tensors().size(), 4u);
  EXPECT_EQ(f->tensors().at("scalar").numel(), 1);
  EXPECT_EQ(f->tensors().at("empty").bytes(), 0u);
  EXPECT_EQ(f->tensors().at("ids").dtype, DType::i32);
  EXPECT_EQ(f->tensors().at("w").shape_string(), "f32[2, 3]");
}

TEST(WeightStore, MissingAndMisshapenTensorsNameFileTensorAndShapes) {
  TempDir dir;
  const ModelConfig config = tiny_config();
  std::vector<Entry> entries = entries_for(weight_specs(config));
  // Missing tensor.
  std::vector<Entry> missing = entries;
  std::erase_if(missing, [](const Entry& e) { return e.name == "model.layers.0.mlp.up_proj.weight"; });
  write_packed(dir.path() / "model.safetensors", missing);
  std::string msg = error_of([&] { WeightStore::open(dir.path()).validate(weight_specs(config)); });
  EXPECT_THAT(msg, HasSubstr("model.layers.0.mlp.up_proj.weight"));
  EXPECT_THAT(msg, HasSubstr("missing"));
  EXPECT_THAT(msg, HasSubstr(dir.path().string()));
  // Wrong shape.
  std::vector<Entry> wrong = entries;
  for (Entry& e : wrong)
    if (e.name == "model.layers.0.self_attn.k_proj.weight") e.shape = {4, 4};
  write_packed(dir.path() / "model.safetensors", wrong);
  msg = error_of([&] { WeightStore::open(dir.path()).validate(weight_specs(config)); });
  EXPECT_THAT(msg, HasSubstr((dir.path() / "model.safetensors").string()));
  EXPECT_THAT(msg, HasSubstr("model.layers.0.self_attn.k_proj.weight"));
  EXPECT_THAT(msg, HasSubstr("f32[4, 4]"));
  EXPECT_THAT(msg, HasSubstr("[2, 4]"));  // kv heads × head_dim, hidden
  // The exact set validates, and get() of an absent name names it.
  write_packed(dir.path() / "model.safetensors", entries);
  const WeightStore store = WeightStore::open(dir.path());
  EXPECT_NO_THROW(store.validate(weight_specs(config)));
  EXPECT_THAT(error_of([&] { store.get("lm_head.bias"); }), HasSubstr("lm_head.bias"));
}

TEST(WeightStore, TiedModelsMayStillCarryAnLmHeadOfTheRightShape) {
  TempDir dir;
  ModelConfig config = tiny_config();
  config.tie_word_embeddings = true;
  std::vector<Entry> entries = entries_for(weight_specs(config));
  entries.push_back({"lm_head.weight", "F32", {8, 4}});
  write_packed(dir.path() / "model.safetensors", entries);
  EXPECT_NO_THROW(WeightStore::open(dir.path()).validate(weight_specs(config)));
  entries.back().shape = {8, 5};
  write_packed(dir.path() / "model.safetensors", entries);
  EXPECT_THAT(error_of([&] { WeightStore::open(dir.path()).validate(weight_specs(config)); }),
              HasSubstr("lm_head.weight"));
}

// Two shards and an index; `edit` breaks something before opening.
std::string sharded_error(const std::function<void(const fs::path&, nlohmann::json&)>& edit) {
  TempDir dir;
  write_packed(dir.path() / "a.safetensors", {{"x.weight", "F32", {2}}, {"y.weight", "F32", {2}}});
  write_packed(dir.path() / "b.safetensors", {{"z.weight", "BF16", {3}}});
  nlohmann::json index = {{"metadata", {{"total_size", 22}}},
                          {"weight_map", {{"x.weight", "a.safetensors"}, {"y.weight", "a.safetensors"},
                                          {"z.weight", "b.safetensors"}}}};
  edit(dir.path(), index);
  std::ofstream(dir.path() / "model.safetensors.index.json") << index.dump();
  return error_of([&] { WeightStore::open(dir.path()); });
}

TEST(WeightStore, ShardingErrorsNameShardAndTensor) {
  std::string msg = sharded_error([](const fs::path& d, nlohmann::json&) { fs::remove(d / "b.safetensors"); });
  EXPECT_THAT(msg, HasSubstr("b.safetensors"));
  EXPECT_THAT(msg, HasSubstr("z.weight"));
  EXPECT_THAT(msg, HasSubstr("does not exist"));

  msg = sharded_error([](const fs::path&, nlohmann::json& j) { j["weight_map"]["w.weight"] = "b.safetensors"; });
  EXPECT_THAT(msg, HasSubstr("w.weight"));
  EXPECT_THAT(msg, HasSubstr("b.safetensors"));
  EXPECT_THAT(msg, HasSubstr("does not contain it"));

  msg = sharded_error([](const fs::path& d, nlohmann::json&) {
    write_packed(d / "b.safetensors", {{"z.weight", "BF16", {3}}, {"x.weight", "F32", {2}}});
  });
  EXPECT_THAT(msg, HasSubstr("x.weight"));
  EXPECT_THAT(msg, HasSubstr("a.safetensors"));
  EXPECT_THAT(msg, HasSubstr("b.safetensors"));

  msg = sharded_error([](const fs::path&, nlohmann::json& j) { j["weight_map"]["z.weight"] = "../b.safetensors"; });
  EXPECT_THAT(msg, HasSubstr("../b.safetensors"));

}

TEST(WeightStore, ShardedGoodCaseAndIndexErrors) {
  TempDir dir;
  write_packed(dir.path() / "a.safetensors", {{"x.weight", "F32", {2}}});
  std::ofstream(dir.path() / "model.safetensors.index.json") << R"({"weight_map": {"x.weight": "a.safetensors"}})";
  const WeightStore store = WeightStore::open(dir.path());
  EXPECT_EQ(store.get("x.weight").dim(0), 2);
  EXPECT_EQ(store.file_of("x.weight"), dir.path() / "a.safetensors");
  std::ofstream(dir.path() / "model.safetensors.index.json") << R"({"weight_map": [)";
  const std::string msg = error_of([&] { WeightStore::open(dir.path()); });
  EXPECT_THAT(msg, HasSubstr("model.safetensors.index.json"));
  EXPECT_THAT(msg, HasSubstr("invalid JSON"));
}

TEST(WeightStore, FoldersWithoutWeights) {
  TempDir dir;
  EXPECT_THAT(error_of([&] { WeightStore::open(dir.path() / "nowhere"); }), HasSubstr("not found"));
  std::string msg = error_of([&] { WeightStore::open(dir.path()); });
  EXPECT_THAT(msg, HasSubstr(dir.path().string()));
  EXPECT_THAT(msg, HasSubstr("no model.safetensors"));
}

// The CPU backend reads a checkpoint's tensors in place, except where its kernels want them on a
// boundary the file does not give (safetensors aligns to 8 bytes; the AMX linear's tile rows want
// 64): those are copied, bytes unchanged, and every other tensor stays a view of the file.
TEST(BoundWeights, CopiesOnlyTensorsOffTheBackendsAlignment) {
  for (const std::string isa : {"best", "amx"}) {
    if (isa == "amx" && !test::cpu_has_amx()) continue;
    BackendOptions o;
    o.cpu_isa = isa;
    o.threads = 1;
    const auto backend = make_backend(o);
    WeightStore store = WeightStore::open(kRoot / "models/target");
    std::map<std::string, const void*> in_file;
    std::map<std::string, std::vector<uint8_t>> bytes;
    for (const auto& [name, t] : store.all()) {
      in_file[name] = t.data;
      const auto* p = static_cast<const uint8_t*>(t.data);
      bytes[name].assign(p, p + t.bytes());
    }
    BoundWeights bound(std::move(store), *backend);
    const size_t align = backend->weight_alignment();
    EXPECT_EQ(align, isa == "amx" ? 64u : 0u);
    int copied = 0;
    for (const auto& [name, file_data] : in_file) {
      const Tensor t = bound.tensor(name);
      const bool off = align != 0 && reinterpret_cast<uintptr_t>(file_data) % align != 0;
      EXPECT_EQ(t.data != file_data, off) << isa << " " << name;
      if (align != 0) {
        EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % align, 0u) << name;
      }
      EXPECT_EQ(std::memcmp(t.data, bytes[name].data(), bytes[name].size()), 0) << name;
      copied += off ? 1 : 0;
    }
    // The bundled checkpoint's data starts 8 bytes past a 64-byte boundary: its tensors are off.
    if (isa == "amx") {
      EXPECT_GT(copied, 0);
    }
  }
}

// Where the backend packs a linear weight (avx512-bf16), weight() keeps the checkpoint's view in
// Weight::data and the packed layout beside it, and gives back the view's mapped pages: read
// again, the view still holds the file's bytes. Elsewhere nothing is packed.
TEST(BoundWeights, PackedWeightsKeepTheirViewOfTheFile) {
  for (const std::string isa : {"best", "avx512-bf16"}) {
    if (isa == "avx512-bf16" && !__builtin_cpu_supports("avx512bf16")) continue;
    BackendOptions o;
    o.cpu_isa = isa;
    o.threads = 1;
    const auto backend = make_backend(o);
    WeightStore store = WeightStore::open(kRoot / "models/target");
    const std::string name = "model.layers.0.mlp.down_proj.weight";
    const Tensor& file = store.get(name);
    const void* in_file = file.data;
    const auto* p = static_cast<const uint8_t*>(file.data);
    const std::vector<uint8_t> bytes(p, p + file.bytes());
    BoundWeights bound(std::move(store), *backend);
    const Weight w = bound.weight(name);
    EXPECT_EQ(w.data.data, in_file) << isa;
    EXPECT_EQ(std::memcmp(w.data.data, bytes.data(), bytes.size()), 0) << isa;
    if (isa == "best") {
      EXPECT_TRUE(w.packed.empty());
      continue;
    }
    ASSERT_FALSE(w.packed.empty());
    EXPECT_EQ(w.packed.dim(0), w.data.dim(0));  // 512 rows: whole groups of four
    EXPECT_EQ(w.packed.dim(1), w.data.dim(1));
    // Row 5's first chunk: the second row of the second group, 32 elements into the group's first chunk.
    const auto* packed = w.packed.ptr<uint16_t>();
    const auto* rows = static_cast<const uint16_t*>(static_cast<const void*>(bytes.data()));
    const int64_t K = w.data.dim(1);
    EXPECT_EQ(std::memcmp(packed + 4 * K + 32, rows + 5 * K, 64), 0);
    // The tied LM head is the embedding table itself, packed beside it.
    EXPECT_EQ(bound.weight_of(bound.tensor("model.embed_tokens.weight")).packed.empty(), false);
  }
}

}  // namespace
}  // namespace specdec
