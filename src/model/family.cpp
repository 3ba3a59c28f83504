// The family registry: one table of every model_type this build implements, built at first use
// from each family's entries and checked for duplicates; lookups by model_type and architecture.
#include "model/family.h"

#include <algorithm>

#include "core/error.h"
#include "model/families/llama.h"

namespace specdec {

std::span<const ModelFamily> model_families() {
  static const std::vector<ModelFamily> table = [] {
    // One entry per family file.
    const std::span<const ModelFamily> sources[] = {llama_families()};
    std::vector<ModelFamily> t;
    for (const std::span<const ModelFamily> entries : sources) t.insert(t.end(), entries.begin(), entries.end());
    for (size_t i = 0; i < t.size(); ++i) {
      for (size_t j = 0; j < i; ++j) {
        SPECDEC_CHECK(t[i].model_type != t[j].model_type && t[i].architecture != t[j].architecture, "model families ",
                      t[j].model_type, " and ", t[i].model_type, " share a model_type or an architecture");
      }
    }
    return t;
  }();
  return table;
}

const ModelFamily* find_family_by_type(std::string_view model_type) {
  const auto all = model_families();
  const auto it =
      std::find_if(all.begin(), all.end(), [&](const ModelFamily& f) { return f.model_type == model_type; });
  return it == all.end() ? nullptr : &*it;
}

const ModelFamily* find_family_by_architecture(std::string_view architecture) {
  const auto all = model_families();
  const auto it =
      std::find_if(all.begin(), all.end(), [&](const ModelFamily& f) { return f.architecture == architecture; });
  return it == all.end() ? nullptr : &*it;
}

const ModelFamily& model_family(const ModelConfig& config) {
  const ModelFamily* family = find_family_by_type(config.model_type);
  SPECDEC_CHECK(family, "unsupported model_type \"", config.model_type, "\" (supported: ", supported_families(), ")");
  return *family;
}

std::string supported_families() {
  std::string s;
  for (const ModelFamily& f : model_families())
    s += str_cat(s.empty() ? "" : ", ", f.architecture, " (", f.model_type, ")");
  return s;
}

std::vector<WeightSpec> weight_specs(const ModelConfig& config) { return model_family(config).weight_specs(config); }

}  // namespace specdec
