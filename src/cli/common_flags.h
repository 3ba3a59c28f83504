// The flags every model-loading subcommand takes (model, device, KV cache, scheduler limits),
// shared by the subcommands' option readers, and the draft flag's value as a DraftSpec.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "specdec/options.h"

namespace specdec::cli {

struct CommonFlags {
  std::string model = SPECDEC_DEFAULT_MODEL_DIR;
  std::string device, cpu_isa, kv_dtype = "bf16";
  int threads = 0;
  bool fast_gpu = false;
  double kv_memory = 0, gpu_memory = 0;
  int max_rows = 64, max_batch_tokens = 512;
  bool no_prefix_cache = false;
  bool no_overlap = false;
};

void add_common(CLI::App& cmd, CommonFlags& f);
// Checks the flags; throws std::runtime_error naming the first bad one.
EngineConfig engine_config(const CommonFlags& f);
// "ngram", or a draft model folder.
DraftSpec draft_spec(const std::string& draft, int num_draft, bool context_lookup = true);
// --spec-mode's value; throws std::runtime_error naming it when it is neither mode.
VerifyMode spec_mode(const std::string& name);
inline constexpr const char* kNoContextLookupHelp =
    "hidden-state drafters (DFlash, EAGLE-3): propose their own drafts only, never the request's text's "
    "continuation (in place of a DFlash row's token, or past the block or chain)";

}  // namespace specdec::cli
