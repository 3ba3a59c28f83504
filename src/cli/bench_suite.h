// bench's prompt suite (bench/prompts.json: {"prompts": [{"name", "category", "prompt",
// "max_tokens"}, ...]}), read and checked before any model is loaded.
#pragma once

#include <string>
#include <vector>

namespace specdec::cli {

struct SuitePrompt {
  std::string name, category, text;
  int max_tokens = 0;
};

// Throws std::runtime_error naming the file, the prompt and the field at fault.
std::vector<SuitePrompt> load_suite(const std::string& path);
// Every prompt of the suite run together: the text synthetic prompts are cut from.
std::string suite_text(const std::vector<SuitePrompt>& suite);

}  // namespace specdec::cli
