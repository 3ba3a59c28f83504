// What every route shares: the options, the chat renderer, the engine once loaded, the metrics
// and the admission bound. Internal to src/server.
#pragma once

#include <atomic>
#include <string>

#include "server/metrics.h"
#include "server/server_options.h"
#include "server/submission.h"
#include "specdec/engine.h"

namespace specdec::server {

struct ServerState {
  ServerState(ServerOptions o, PromptRenderer r)
      : options(std::move(o)), render(std::move(r)), metrics(options.served_model_name), admission() {}

  // The engine, or throws 503 while the model loads.
  Engine& loaded_engine() const;
  // Throws 404 for a model name other than the one served.
  void check_model(const std::string& requested) const;

  ServerOptions options;
  PromptRenderer render;
  std::atomic<Engine*> engine{nullptr};  // not owned: the caller of attach keeps it alive
  std::vector<int32_t> end_of_turn;      // the chat template's end-of-turn tokens; set before `engine`
  Metrics metrics;
  Admission admission;
};

}  // namespace specdec::server
