// The flags of `specdec serve`: the engine's (common_flags.h), the draft methods, and the HTTP
// server's (host, port, API key, queue bound), read into a ServeCommand.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include "server/server_options.h"
#include "specdec/options.h"

namespace specdec::cli {

struct ServeCommand {
  EngineConfig engine;  // engine.drafts: one method per --draft, in order
  server::ServerOptions server;
};

// The flags as given, then checked into a ServeCommand.
class ServeFlags {
 public:
  ServeFlags();
  ~ServeFlags();
  CLI::App* add(CLI::App& app);
  // Throws std::runtime_error naming the first bad flag.
  ServeCommand command() const;

 private:
  struct Values;
  std::unique_ptr<Values> v_;
};

}  // namespace specdec::cli
