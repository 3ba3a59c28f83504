// A loaded target: backend, model, tokenizer, sampling defaults and engine options, built from
// the public ModelOptions. The Generator and the command's subcommands build on it.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "engine/engine_core.h"
#include "model/config.h"
#include "model/model.h"
#include "specdec/specdec.h"
#include "tokenizer/tokenizer.h"

namespace specdec {

struct Session {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
  GenerationDefaults defaults;
  std::vector<int32_t> eos_ids;
  EngineOptions engine;  // from the command line
  std::map<std::string, std::shared_ptr<Model>> draft_models;  // loaded draft folders, by path
};

Session open_session(const ModelOptions& options);
// Registers the method named by --draft ("ngram" or a checkpoint folder) with the engine;
// returns its id for SpecOptions::method ("ngram", "draft", or "ngram#2", ... for a second instance).
std::string add_draft_method(EngineCore& engine, Session& session, const std::string& draft, int depth);

std::string read_file(const std::string& path);

}  // namespace specdec
