// ServeFlags: `specdec serve`'s flags read with CLI11 and checked.
#include "cli/serve_options.h"

#include <filesystem>
#include <set>

#include "cli/common_flags.h"
#include "cli/require.h"

namespace specdec::cli {

struct ServeFlags::Values {
  CommonFlags common;
  server::ServerOptions server;
  std::vector<std::string> drafts;
  std::string spec_mode = "exact";
  bool no_adaptive = false, no_context_lookup = false;
};

ServeFlags::ServeFlags() : v_(std::make_unique<Values>()) {}
ServeFlags::~ServeFlags() = default;

CLI::App* ServeFlags::add(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("serve", "serve the model over an OpenAI-compatible HTTP API");
  add_common(*cmd, v_->common);
  server::ServerOptions& s = v_->server;
  cmd->add_option("--host", s.host, "address to listen on")->capture_default_str();
  cmd->add_option("--port", s.port, "port to listen on (0: any free port)")->capture_default_str();
  cmd->add_option("--api-key", s.api_key, "require 'Authorization: Bearer KEY' on the API routes");
  cmd->add_option("--served-model-name", s.served_model_name, "the model name clients use (default: the folder's)");
  cmd->add_option("--max-queue", s.max_queue, "requests waiting beyond --max-rows before a 429")->capture_default_str();
  cmd->add_option("--max-body-bytes", s.max_body_bytes, "largest request body (413 beyond)")->capture_default_str();
  cmd->add_option("--http-threads", s.http_threads, "connection threads (default: max-rows + max-queue + 8)");
  cmd->add_option("--draft", v_->drafts,
                  "speculative decoding: 'ngram', or a draft model, EAGLE-3 head or DFlash folder (repeatable; "
                  "requests use the first "
                  "unless they narrow it)");
  cmd->add_option("--num-draft-tokens", s.num_draft_tokens, "most draft tokens per round (default: the method's)");
  cmd->add_option("--spec-mode", v_->spec_mode, "exact (identical output) or rejection")->capture_default_str();
  cmd->add_flag("--no-adaptive", v_->no_adaptive, "always draft the maximum depth");
  cmd->add_flag("--no-context-lookup", v_->no_context_lookup, kNoContextLookupHelp);
  return cmd;
}

ServeCommand ServeFlags::command() const {
  ServeCommand c;
  c.engine = engine_config(v_->common);
  c.server = v_->server;
  server::ServerOptions& s = c.server;
  require(s.port >= 0 && s.port <= 65535, "--port must be from 0 to 65535, got ", s.port);
  require(s.max_queue >= 0, "--max-queue must not be negative, got ", s.max_queue);
  require(s.max_body_bytes >= 1024, "--max-body-bytes must be at least 1024, got ", s.max_body_bytes);
  require(s.http_threads >= 0, "--http-threads must not be negative, got ", s.http_threads);
  require(s.num_draft_tokens >= 0, "--num-draft-tokens must not be negative, got ", s.num_draft_tokens);
  s.spec_mode = spec_mode(v_->spec_mode);
  s.adaptive = !v_->no_adaptive;
  s.max_rows = c.engine.max_rows;
  c.engine.max_queue = s.max_queue;  // the engine bounds its waiting queue; the server answers 429
  c.engine.release_memory_when_idle = true;  // a server's memory settles between bursts
  std::set<std::string> seen;
  for (const std::string& d : v_->drafts) {
    require(seen.insert(d).second, "--draft ", d, " is given twice");
    c.engine.drafts.push_back(draft_spec(d, s.num_draft_tokens, !v_->no_context_lookup));
  }
  s.drafts = c.engine.drafts;
  if (s.served_model_name.empty())
    s.served_model_name = std::filesystem::path(c.engine.model_dir).lexically_normal().filename().string();
  if (s.served_model_name.empty())  // a folder given with a trailing slash
    s.served_model_name =
        std::filesystem::path(c.engine.model_dir).lexically_normal().parent_path().filename().string();
  return c;
}

}  // namespace specdec::cli
