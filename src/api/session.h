// A loaded target: backend, model, tokenizer, sampling defaults and the internal engine's
// options, built from the public EngineConfig; and the draft methods built from DraftSpecs (a
// draft folder named twice is loaded once).
#pragma once

#include <map>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "engine/engine_core.h"
#include "model/config.h"
#include "model/model.h"
#include "speculative/methods/eagle3_head.h"
#include "specdec/options.h"
#include "tokenizer/tokenizer.h"

namespace specdec {

struct Session {
  std::string model_dir;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
  GenerationDefaults defaults;
  std::vector<int32_t> eos_ids;
  EngineOptions engine;
  size_t host_threads = 0;                                     // EngineConfig::threads (0 = all)
  std::map<std::string, std::shared_ptr<Model>> draft_models;  // loaded draft folders, by path
  std::map<std::string, std::shared_ptr<Eagle3Head>> eagle3_heads;  // loaded EAGLE-3 heads, by path
};

// Checks the config, loads and warms the target up; throws specdec::Error naming the cause.
Session open_session(const EngineConfig& config);
// The method a spec describes, its draft model loaded (and warmed up) on first use.
std::shared_ptr<DraftMethod> make_draft_method(Session& session, const DraftSpec& spec);

}  // namespace specdec
