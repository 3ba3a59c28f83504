// What `specdec serve` is started with beyond the engine's own config: where it listens, who may
// call it, how many requests it holds, the speculation a request gets unless it narrows it, and
// the chat renderer it turns messages into prompts with.
#pragma once

#include <cstddef>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "specdec/options.h"

namespace specdec::server {

// Renders OpenAI chat messages (an array of {"role", "content": string}) into the model's prompt
// text; add_generation_prompt opens the assistant's turn. Throws std::runtime_error for messages
// the template refuses (its message becomes the 400's). Empty: the chat endpoint answers 400.
using PromptRenderer = std::function<std::string(const nlohmann::json& messages, bool add_generation_prompt)>;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                // 0: an ephemeral port (HttpServer::bind returns it)
  std::string api_key;            // empty: no authentication
  std::string served_model_name;  // the `model` clients name; empty: the model folder's name
  int max_rows = 64;              // the engine's rows: requests beyond them wait
  int max_queue = 128;            // the engine's waiting queue beyond its free rows (429 when full)
  size_t max_body_bytes = 8u << 20;
  // The draft methods the engine was loaded with; a request speculates with the first unless its
  // `speculative` object narrows that (another loaded method, fewer drafts, or none).
  std::vector<DraftSpec> drafts;
  int num_draft_tokens = 0;  // the server's cap on drafts per round; 0 = each method's default
  bool adaptive = true;
  VerifyMode spec_mode = VerifyMode::exact;
  int http_threads = 0;  // connection threads; 0 = max_rows + max_queue + 8
};

}  // namespace specdec::server
