// Fuzz target: the body of POST /v1/completions or /v1/chat/completions (the first byte picks the
// endpoint), read by the server's request parser exactly as the HTTP handler calls it. A bad body
// is an ApiError (400); nothing else may escape.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "fuzz_util.h"
#include "server/api_error.h"
#include "server/completion_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto endpoint = (data[0] & 1) ? specdec::server::Endpoint::chat : specdec::server::Endpoint::completions;
  const nlohmann::json body = nlohmann::json::parse(data + 1, data + size, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return 0;  // the handler answers 400 before the parser runs
  const specdec::server::PromptRenderer render = [](const nlohmann::json& messages, bool add_generation_prompt) {
    std::string out;
    for (const auto& m : messages) out += m.dump() + "\n";
    return add_generation_prompt ? out + "assistant:" : out;
  };
  try {
    (void)specdec::server::parse_completion_request(body, endpoint, render);
  } catch (const specdec::server::ApiError&) {
  }
  return 0;
}
