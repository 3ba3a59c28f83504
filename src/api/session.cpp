// Session building shared by the Generator and the command.
#include "api/session.h"

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "speculative/methods/draft_model.h"
#include "speculative/methods/ngram_method.h"

namespace specdec {

namespace {

// One short forward before the first request, on a scratch KV cache: it maps the weights' pages,
// starts the CPU pool's threads and sizes the model's buffers, costs the first request would
// otherwise pay in its time to first token (a fresh process's first forward took 25-32 ms for the
// bundled target and 20-31 ms for the draft model on a CPU, against ~1 ms warm).
void warm_up(Model& model) {
  std::unique_ptr<KvCache> cache = model.make_cache(1);
  const KvCache::SeqId seq = cache->create();
  constexpr int kTokens = 8;
  SPECDEC_CHECK(cache->reserve(seq, kTokens), "warm-up: the scratch KV cache is too small");
  model.forward(ForwardRequest{{SequenceInput{seq, std::vector<int32_t>(kTokens, 0), {kTokens - 1}}}, {}}, *cache);
}

}  // namespace

Session open_session(const ModelOptions& options) {
  Session s;
  BackendOptions bo;
  if (options.device == "cuda" || (options.device.empty() && cuda_available())) {
    bo.device = Device::cuda;
  } else {
    SPECDEC_CHECK(options.device.empty() || options.device == "cpu", "unknown device '", options.device,
                  "' (expected cpu or cuda)");
  }
  bo.threads = static_cast<size_t>(std::max(0, options.threads));
  bo.cpu_isa = options.cpu_isa;
  bo.batch_invariant = options.batch_invariant;
  SPECDEC_CHECK(options.gpu_memory_gb >= 0, "--gpu-memory must not be negative");
  bo.memory_limit = static_cast<size_t>(options.gpu_memory_gb * (1ull << 30));
  SPECDEC_CHECK(options.kv_dtype == "bf16" || options.kv_dtype == "f16" || options.kv_dtype == "f32",
                "unknown --kv-dtype '", options.kv_dtype, "' (expected bf16, f16 or f32)");
  bo.kv_dtype = options.kv_dtype == "f32" ? DType::f32 : options.kv_dtype == "f16" ? DType::f16 : DType::bf16;
  s.backend = make_backend(bo);
  s.model = Model::load(options.model_dir, *s.backend);
  warm_up(*s.model);
  s.tokenizer = std::make_unique<Tokenizer>(Tokenizer::load(options.model_dir));
  SPECDEC_CHECK(s.tokenizer->vocab_size() <= s.model->config().vocab_size, "the tokenizer in ", options.model_dir,
                " has ", s.tokenizer->vocab_size(), " tokens but the model's vocabulary is ",
                s.model->config().vocab_size);
  s.defaults = load_generation_config(options.model_dir);
  s.eos_ids = !s.defaults.eos_token_ids.empty() ? s.defaults.eos_token_ids : s.model->config().eos_token_ids;
  if (s.eos_ids.empty() && s.tokenizer->eos_id()) s.eos_ids.push_back(*s.tokenizer->eos_id());
  SPECDEC_CHECK(options.kv_memory_gb >= 0, "--kv-memory must not be negative");
  SPECDEC_CHECK(options.max_rows >= 1, "--max-rows must be at least 1");
  SPECDEC_CHECK(options.max_batch_tokens >= 16, "--max-batch-tokens must be at least 16");
  const double gb = options.kv_memory_gb > 0 ? options.kv_memory_gb : (bo.device == Device::cuda ? 16.0 : 1.0);
  s.engine.kv_memory = static_cast<size_t>(gb * (1ull << 30));
  s.engine.max_rows = options.max_rows;
  s.engine.max_batch_tokens = options.max_batch_tokens;
  return s;
}

namespace {

// `base`, or `base#2`, `base#3`, ... when the engine already has a method under that id.
std::string free_method_id(const EngineCore& engine, const std::string& base) {
  std::string id = base;
  for (int n = 2; engine.has_method(id); ++n) id = str_cat(base, "#", n);
  return id;
}

}  // namespace

std::string add_draft_method(EngineCore& engine, Session& session, const std::string& draft, int depth) {
  if (draft == "ngram") {
    NgramOptions o;
    if (depth > 0) o.num_draft = depth;
    const std::string id = free_method_id(engine, "ngram");
    engine.add_method(id, std::make_shared<NgramMethod>(o));
    return id;
  }
  std::shared_ptr<Model>& model = session.draft_models[draft];
  if (!model) {
    model = Model::load(draft, session.model->backend());
    warm_up(*model);
  }
  DraftModelOptions o;
  if (depth > 0) o.num_draft = depth;
  const std::string id = free_method_id(engine, "draft");
  engine.add_method(id, std::make_shared<DraftModelMethod>(model, draft, o));
  return id;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  SPECDEC_CHECK(in.good(), "cannot read ", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace specdec
