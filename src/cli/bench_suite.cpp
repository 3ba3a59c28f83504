// Reading and checking bench's prompt suite.
#include "cli/bench_suite.h"

#include <nlohmann/json.hpp>

#include "cli/require.h"
#include "cli/text_file.h"

namespace specdec::cli {

std::vector<SuitePrompt> load_suite(const std::string& path) {
  nlohmann::json suite;
  try {
    suite = nlohmann::json::parse(read_text_file(path));
  } catch (const nlohmann::json::exception& e) {
    require(false, "bench suite ", path, " is not valid JSON: ", e.what());
  }
  require(suite.is_object() && suite.contains("prompts") && suite["prompts"].is_array() && !suite["prompts"].empty(),
          "bench suite ", path, " must be an object with a non-empty \"prompts\" array");
  std::vector<SuitePrompt> prompts;
  for (const auto& p : suite["prompts"]) {
    std::ostringstream at;
    at << "bench suite " << path << ": prompt " << prompts.size();
    require(p.is_object(), at.str(), " is not an object");
    for (const char* key : {"name", "category", "prompt"})
      require(p.contains(key) && p[key].is_string(), at.str(), " needs a string \"", key, "\"");
    require(p.contains("max_tokens") && p["max_tokens"].is_number_integer(), at.str(),
            " needs an integer \"max_tokens\"");
    SuitePrompt sp{p["name"], p["category"], p["prompt"], p["max_tokens"].get<int>()};
    require(!sp.text.empty(), at.str(), " (", sp.name, ") has an empty prompt");
    require(sp.max_tokens >= 2, at.str(), " (", sp.name, "): max_tokens must be at least 2, got ", sp.max_tokens);
    prompts.push_back(std::move(sp));
  }
  return prompts;
}

std::string suite_text(const std::vector<SuitePrompt>& suite) {
  std::string text;
  for (const auto& p : suite) text += p.text;
  return text;
}

}  // namespace specdec::cli
