// Safetensors checkpoints: memory-mapped files (single or sharded through
// model.safetensors.index.json), validated headers, and their check against a list of specs.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace specdec {

// One memory-mapped .safetensors file. Its header is validated on open: JSON well formed,
// known dtypes (F32, BF16, F16, I32), shape × dtype size == byte span, spans inside the data
// section and not overlapping. Errors name the file and the tensor.
class SafetensorsFile {
  // Only open() can make one (passkey: the constructor is public for make_unique only).
  struct Key {
    explicit Key() = default;
  };

 public:
  static std::unique_ptr<SafetensorsFile> open(const std::filesystem::path& path);
  explicit SafetensorsFile(Key) {}
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // Host views into the mapping (zero copy), by tensor name.
  const std::map<std::string, Tensor>& tensors() const { return tensors_; }

 private:
  SafetensorsFile() = default;
  std::filesystem::path path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  std::map<std::string, Tensor> tensors_;
};

// One tensor a model reads (name as in Hugging Face checkpoints, e.g.
// "model.layers.3.self_attn.q_proj.weight") and its shape; each family lists its own (family.h).
struct WeightSpec {
  std::string name;
  std::vector<int64_t> shape;
  bool required = true;
};

// All tensors of a checkpoint folder: model.safetensors, or the shards listed by
// model.safetensors.index.json (every shard named there must exist and hold what it lists).
class WeightStore {
 public:
  static WeightStore open(const std::filesystem::path& dir);

  bool has(const std::string& name) const;
  // Throws naming the tensor (and the folder) when absent.
  const Tensor& get(const std::string& name) const;
  // Gives back the process's mapped pages of a tensor that is read from a copy of its own now (a
  // packed linear weight): a later read of the view maps them again from the file, so the view
  // stays valid. The pages a neighbouring tensor shares are kept. A hint: errors are ignored.
  void evict(const std::string& name) const;
  // The file a tensor came from, for messages.
  std::filesystem::path file_of(const std::string& name) const;
  // Checks every spec: present when required, shape as expected. Errors name the file, the
  // tensor, the expected and the actual shape.
  void validate(const std::vector<WeightSpec>& specs) const;
  size_t total_bytes() const;
  size_t parameter_count() const;
  const std::map<std::string, Tensor>& all() const { return index_; }

 private:
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, Tensor> index_;
  std::map<std::string, size_t> file_index_;
  std::filesystem::path dir_;
};

}  // namespace specdec
