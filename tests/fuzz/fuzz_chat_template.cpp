// Fuzz target: an arbitrary chat template parsed and rendered over a fixed conversation (with a
// tool call and a system turn). Bad syntax and runtime errors in the template are exceptions.
#include <cstdint>
#include <ctime>
#include <exception>
#include <nlohmann/json.hpp>
#include <string>

#include "fuzz_util.h"
#include "specdec/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi <b>there</b> 東京"},
    {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
      "function": {"name": "f", "arguments": {"x": 1, "y": [true, null, 2.5]}}}]},
    {"role": "tool", "content": "42"},
    {"role": "user", "content": "again"}])");
  specdec::ChatRenderOptions options;
  options.bos_token = "<s>";
  options.eos_token = "</s>";
  options.now = std::tm{};
  try {
    const auto tmpl = specdec::ChatTemplate::from_source(std::string(specdec::fuzz::as_text(data, size)), "fuzz");
    (void)tmpl.render(messages, options);
  } catch (const std::exception&) {
  }
  return 0;
}
