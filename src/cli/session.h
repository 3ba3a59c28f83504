// What every subcommand needs: a backend, the target model and its tokenizer and sampling
// defaults, optional draft methods, and an engine over them, built from command-line options.
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"
#include "engine/engine.h"
#include "model/config.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace specdec::cli {

struct CommonOptions {
  std::string model_dir;
  std::string device;  // "", "cpu" or "cuda"
  std::string isa;     // CPU kernel path
  int threads = 0;
  bool fast_gpu = false;  // GPU: fast kernels instead of batch-invariant ones
  double kv_gb = 0;       // KV cache size in GiB; 0 = 1 GiB on the CPU, 16 GiB on a GPU
  int max_rows = 64;      // rows decoding at once
  int max_batch_tokens = 512;
  std::string kv_dtype = "bf16";  // GPU KV cache element type
};

struct Session {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
  GenerationDefaults defaults;
  std::vector<int32_t> eos_ids;
  EngineOptions engine;  // from the command line
};

Session open_session(const CommonOptions& options);
// Registers the method named by --draft ("ngram" or a checkpoint folder) with the engine;
// returns its name for SpecOptions::method.
std::string add_draft_method(Engine& engine, const Session& session, const std::string& draft, int depth);

std::string read_file(const std::string& path);

}  // namespace specdec::cli
