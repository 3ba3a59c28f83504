// The family registry: each model_type the config parser accepts has exactly one family, found
// by type and by architecture; a config whose model_type no family implements gets no specs and
// no decoder, but an error naming it and what is supported.
#include "model/family.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "core/error.h"

namespace specdec {
namespace {

using ::testing::HasSubstr;

TEST(ModelFamily, RegistryHoldsTheLlamaFamilyOnceEach) {
  std::set<std::string> types;
  for (const ModelFamily& f : model_families()) {
    EXPECT_TRUE(types.insert(std::string(f.model_type)).second) << f.model_type;
    EXPECT_EQ(find_family_by_type(f.model_type), &f);
    EXPECT_EQ(find_family_by_architecture(f.architecture), &f);
    EXPECT_TRUE(f.read_config && f.weight_specs && f.make_decoder) << f.model_type;
  }
  EXPECT_EQ(types, (std::set<std::string>{"llama", "mistral", "qwen2", "qwen3"}));
  EXPECT_EQ(find_family_by_type("gemma"), nullptr);
  EXPECT_EQ(find_family_by_architecture("GPT2LMHeadModel"), nullptr);
}

TEST(ModelFamily, UnknownModelTypeIsRefusedByName) {
  ModelConfig config;
  config.model_type = "gemma";
  try {
    weight_specs(config);
    FAIL() << "weight_specs accepted model_type gemma";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("gemma"));
    EXPECT_THAT(e.what(), HasSubstr("LlamaForCausalLM (llama)"));
  }
}

}  // namespace
}  // namespace specdec
