// WeightStore: a checkpoint folder (one safetensors file or an index of shards), and its check
// against a family's tensor list before any forward runs.
#include "model/weights.h"

#include <algorithm>
#include <charconv>
#include <set>

#include <sys/mman.h>
#include <unistd.h>

#include "core/error.h"
#include "model/config_json.h"

namespace specdec {

namespace {

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

bool same_shape(const Tensor& t, const std::vector<int64_t>& shape) {
  if (t.rank != static_cast<int>(shape.size())) return false;
  for (size_t i = 0; i < shape.size(); ++i)
    if (t.dims[i] != shape[i]) return false;
  return true;
}

// weight_map of model.safetensors.index.json: tensor name → shard file name (inside dir).
std::map<std::string, std::string> read_weight_map(const std::filesystem::path& index_path) {
  const std::string src = index_path.string();
  const config_json::Json j = config_json::read_file(index_path);
  auto it = j.is_object() ? j.find("weight_map") : j.end();
  SPECDEC_CHECK(j.is_object() && it != j.end() && it->is_object(), src,
                ": needs an object \"weight_map\" (tensor name -> shard file)");
  std::map<std::string, std::string> map;
  for (auto e = it->begin(); e != it->end(); ++e) {
    SPECDEC_CHECK(e.value().is_string(), src, ": weight_map entry for tensor \"", e.key(),
                  "\" must be a file name");
    const std::string shard = e.value().get<std::string>();
    // Shards live beside the index: a path that leaves the folder is refused.
    const std::filesystem::path p(shard);
    SPECDEC_CHECK(!shard.empty() && p.filename() == p && shard != "." && shard != "..", src,
                  ": weight_map entry for tensor \"", e.key(), "\" names \"", shard,
                  "\", not a file name in the same folder");
    map.emplace(e.key(), shard);
  }
  SPECDEC_CHECK(!map.empty(), src, ": weight_map is empty");
  return map;
}

}  // namespace

WeightStore WeightStore::open(const std::filesystem::path& dir) {
  SPECDEC_CHECK(std::filesystem::is_directory(dir), dir.string(), ": model folder not found");
  WeightStore store;
  store.dir_ = dir;
  auto add_file = [&](const std::filesystem::path& path) {
    std::shared_ptr<SafetensorsFile> file = SafetensorsFile::open(path);
    const size_t idx = store.files_.size();
    for (const auto& [name, tensor] : file->tensors()) {
      auto [pos, inserted] = store.index_.emplace(name, tensor);
      SPECDEC_CHECK(inserted, "tensor \"", name, "\" appears in both ",
                    store.files_[store.file_index_.at(name)]->path().string(), " and ", path.string());
      store.file_index_.emplace(name, idx);
    }
    store.files_.push_back(std::move(file));
  };

  // Same preference as transformers: a single file first, then the sharded index.
  const std::filesystem::path single = dir / "model.safetensors";
  const std::filesystem::path index = dir / "model.safetensors.index.json";
  if (std::filesystem::exists(single)) {
    add_file(single);
    return store;
  }
  SPECDEC_CHECK(std::filesystem::exists(index), dir.string(),
                ": no model.safetensors or model.safetensors.index.json in the model folder");
  const std::map<std::string, std::string> weight_map = read_weight_map(index);
  std::set<std::string> shards;
  for (const auto& [name, shard] : weight_map) shards.insert(shard);
  for (const std::string& shard : shards) {
    const std::filesystem::path path = dir / shard;
    SPECDEC_CHECK(std::filesystem::exists(path), index.string(), ": shard ", shard,
                  " is listed (e.g. for tensor \"",
                  std::find_if(weight_map.begin(), weight_map.end(),
                               [&](const auto& kv) { return kv.second == shard; })->first,
                  "\") but ", path.string(), " does not exist");
    add_file(path);
  }
  for (const auto& [name, shard] : weight_map) {
    auto it = store.file_index_.find(name);
    SPECDEC_CHECK(it != store.file_index_.end() && store.files_[it->second]->path().filename() == shard,
                  index.string(), ": tensor \"", name, "\" is listed in shard ", shard,
                  " but ", (dir / shard).string(), " does not contain it");
  }
  return store;
}

bool WeightStore::has(const std::string& name) const { return index_.count(name) != 0; }

const Tensor& WeightStore::get(const std::string& name) const {
  auto it = index_.find(name);
  SPECDEC_CHECK(it != index_.end(), dir_.string(), ": tensor \"", name, "\" is not in the checkpoint");
  return it->second;
}

void WeightStore::evict(const std::string& name) const {
  const Tensor& t = get(name);
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(t.data);
  const uintptr_t first = (begin + page - 1) / page * page, last = (begin + t.bytes()) / page * page;
  if (t.device == Device::cpu && first < last) {
    ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
  }
}

std::filesystem::path WeightStore::file_of(const std::string& name) const {
  auto it = file_index_.find(name);
  SPECDEC_CHECK(it != file_index_.end(), dir_.string(), ": tensor \"", name, "\" is not in the checkpoint");
  return files_[it->second]->path();
}

namespace {
// n for a tensor named "model.layers.<n>.…", else -1.
int layer_of(const std::string& name) {
  static const std::string kPrefix = "model.layers.";
  if (name.rfind(kPrefix, 0) != 0) return -1;
  int n = 0;
  const char* begin = name.data() + kPrefix.size();
  const auto [end, ec] = std::from_chars(begin, name.data() + name.size(), n);
  return ec == std::errc() && end != begin && *end == '.' ? n : -1;
}
}  // namespace

void WeightStore::validate(const std::vector<WeightSpec>& specs) const {
  // A config that names fewer layers than the checkpoint holds would run a truncated model
  // without a word: the layers it leaves out are refused by name.
  int layers = 0;
  for (const WeightSpec& spec : specs) layers = std::max(layers, layer_of(spec.name) + 1);
  for (const auto& [name, t] : index_) {
    SPECDEC_CHECK(layer_of(name) < layers, file_of(name).string(), ": tensor \"", name, "\" belongs to layer ",
                  layer_of(name), " but config.json's num_hidden_layers is ", layers);
  }
  for (const WeightSpec& spec : specs) {
    auto it = index_.find(spec.name);
    if (it == index_.end()) {
      SPECDEC_CHECK(!spec.required, dir_.string(), ": missing tensor \"", spec.name, "\" (expected shape ",
                    shape_str(spec.shape), ")");
      continue;
    }
    const Tensor& t = it->second;
    SPECDEC_CHECK(same_shape(t, spec.shape), file_of(spec.name).string(), ": tensor \"", spec.name,
                  "\" has shape ", t.shape_string(), " but the config expects ", shape_str(spec.shape));
    SPECDEC_CHECK(t.dtype != DType::i32, file_of(spec.name).string(), ": tensor \"", spec.name,
                  "\" has dtype i32; weights must be f32, bf16 or f16");
  }
}

size_t WeightStore::total_bytes() const {
  size_t n = 0;
  for (const auto& [name, t] : index_) n += t.bytes();
  return n;
}

size_t WeightStore::parameter_count() const {
  size_t n = 0;
  for (const auto& [name, t] : index_) n += static_cast<size_t>(t.numel());
  return n;
}

}  // namespace specdec
