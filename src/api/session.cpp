// Loading a target and its draft methods for the public Engine.
#include "api/session.h"

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "speculative/methods/dflash.h"
#include "speculative/methods/draft_model.h"
#include "speculative/methods/eagle3.h"
#include "speculative/methods/ngram_method.h"

namespace specdec {

namespace {

// One short forward before the first request, on a scratch KV cache: it maps the weights' pages,
// starts the CPU pool's threads and sizes the model's buffers, costs the first request would
// otherwise pay in its time to first token.
void warm_up(Model& model) {
  std::unique_ptr<KvCache> cache = model.make_cache(1);
  const KvCache::SeqId seq = cache->create();
  constexpr int kTokens = 8;
  SPECDEC_CHECK(cache->reserve(seq, kTokens), "warm-up: the scratch KV cache is too small");
  model.forward(ForwardRequest{{SequenceInput{seq, std::vector<int32_t>(kTokens, 0), {kTokens - 1}}}, {}}, *cache);
}

// Device memory the configured drafts take beside the target's KV cache when that cache is sized
// from free memory: each draft checkpoint's weights (its safetensors files) and its own KV cache
// and scratch, which the methods cap at 1 GiB (draft model) or less (hidden-state drafters).
size_t draft_reserve(const EngineConfig& c) {
  namespace fs = std::filesystem;
  size_t bytes = 0;
  for (const DraftSpec& d : c.drafts) {
    if (d.kind != DraftKind::model) continue;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(d.path, ec)) {
      if (entry.path().extension() == ".safetensors") bytes += entry.file_size(ec);
    }
    bytes += (size_t{5} << 30) / 4;
  }
  return bytes;
}

BackendOptions backend_options(const EngineConfig& c) {
  BackendOptions bo;
  const bool cuda = c.device == DeviceKind::cuda || (c.device == DeviceKind::automatic && cuda_available());
  bo.device = cuda ? Device::cuda : Device::cpu;
  bo.threads = static_cast<size_t>(c.threads);
  bo.cpu_isa = c.cpu_isa == CpuIsa::automatic ? std::string() : std::string(to_string(c.cpu_isa));
  bo.batch_invariant = c.batch_invariant;
  bo.memory_limit = static_cast<size_t>(c.gpu_memory_gb * (1ull << 30));
  bo.kv_dtype = c.kv_type == KvCacheType::f32 ? DType::f32 : c.kv_type == KvCacheType::f16 ? DType::f16 : DType::bf16;
  return bo;
}

// A draft that splits text into other tokens, even at the target's vocabulary size, proposes
// ids that mean something else to the target: nearly nothing is accepted, without a word.
void check_same_tokenizer(const Tokenizer& target, const std::string& draft_dir) {
  if (!std::filesystem::exists(std::filesystem::path(draft_dir) / "tokenizer.json")) return;
  const Tokenizer draft = Tokenizer::load(draft_dir);
  SPECDEC_CHECK(draft.vocab_size() == target.vocab_size(), "the draft model's tokenizer in ", draft_dir, " has ",
                draft.vocab_size(), " tokens but the target's has ", target.vocab_size(),
                ": a draft model must share the target's tokenizer");
  for (int32_t id = 0; id < target.vocab_size(); ++id) {
    const auto token = [id](const Tokenizer& t) {
      try {
        return t.id_to_token(id);
      } catch (const Error&) {
        return std::string();  // an id the vocabulary skips
      }
    };
    SPECDEC_CHECK(token(draft) == token(target), "the draft model's tokenizer in ", draft_dir, " gives id ", id,
                  " to '", token(draft), "' where the target's has '", token(target),
                  "': a draft model must share the target's tokenizer");
  }
}

}  // namespace

Session open_session(const EngineConfig& config) {
  config.validate();
  const BackendOptions bo = backend_options(config);
  Session s;
  s.model_dir = config.model_dir;
  s.host_threads = bo.threads;
  s.backend = make_backend(bo);
  s.model = Model::load(config.model_dir, *s.backend);
  warm_up(*s.model);
  s.tokenizer = std::make_unique<Tokenizer>(Tokenizer::load(config.model_dir));
  SPECDEC_CHECK(s.tokenizer->vocab_size() <= s.model->config().vocab_size, "the tokenizer in ", config.model_dir,
                " has ", s.tokenizer->vocab_size(), " tokens but the model's vocabulary is ",
                s.model->config().vocab_size);
  s.defaults = load_generation_config(config.model_dir);
  s.eos_ids = !s.defaults.eos_token_ids.empty() ? s.defaults.eos_token_ids : s.model->config().eos_token_ids;
  if (s.eos_ids.empty() && s.tokenizer->eos_id()) s.eos_ids.push_back(*s.tokenizer->eos_id());
  for (const int32_t id : s.eos_ids) {
    SPECDEC_CHECK(id >= 0 && id < s.model->config().vocab_size, config.model_dir, ": eos_token_id ", id, " (",
                  s.defaults.eos_token_ids.empty() ? "config.json" : "generation_config.json",
                  ") is outside the vocabulary of ", s.model->config().vocab_size, " tokens");
  }
  // Without --kv-memory: 1 GiB on the host; on a GPU, what is free after the weights (as vLLM
  // does), so that a server holds as many rows and as much prefix cache as the device allows.
  if (config.kv_memory_gb > 0) {
    s.engine.kv_memory = static_cast<size_t>(config.kv_memory_gb * (1ull << 30));
  } else if (bo.device == Device::cuda) {
    s.engine.kv_memory = 0;
    s.engine.kv_reserve = draft_reserve(config);
  } else {
    s.engine.kv_memory = size_t{1} << 30;
  }
  s.engine.max_rows = config.max_rows;
  s.engine.max_batch_tokens = config.max_batch_tokens;
  s.engine.max_queue = config.max_queue;
  s.engine.prefix_cache = config.prefix_cache;
  s.engine.overlap = config.overlap ? Overlap::automatic : Overlap::off;
  return s;
}

std::shared_ptr<DraftMethod> make_draft_method(Session& session, const DraftSpec& spec) {
  SPECDEC_CHECK(spec.num_draft_tokens >= 0, "--num-draft-tokens must not be negative, got ", spec.num_draft_tokens);
  if (spec.kind == DraftKind::ngram) {
    NgramOptions o;
    if (spec.num_draft_tokens > 0) o.num_draft = spec.num_draft_tokens;
    return std::make_shared<NgramMethod>(o);
  }
  SPECDEC_CHECK(!spec.path.empty(), "a draft model needs the folder of its checkpoint");
  if (is_eagle3_dir(spec.path)) {
    // An EAGLE-3 head (config.json names LlamaForCausalLMEagle3) drafts from the target's taps.
    std::shared_ptr<Eagle3Head>& head = session.eagle3_heads[spec.path];
    if (!head) {
      try {
        head = Eagle3Head::load(spec.path, session.model->backend());
      } catch (...) {
        session.eagle3_heads.erase(spec.path);
        throw;
      }
    }
    Eagle3Options o;
    if (spec.num_draft_tokens > 0) o.num_draft = spec.num_draft_tokens;
    o.context_lookup = spec.context_lookup;
    return std::make_shared<Eagle3Method>(head, spec.path, session.model->config().num_layers, o);
  }
  // A block drafter that reads the target's hidden states (its config.json says DFlash).
  if (is_dflash_checkpoint(spec.path)) {
    DflashOptions o;
    if (spec.num_draft_tokens > 0) o.num_draft = spec.num_draft_tokens;
    o.context_lookup = spec.context_lookup;
    return std::make_shared<DflashMethod>(spec.path, session.model->backend(), spec.path, o);
  }
  std::shared_ptr<Model>& model = session.draft_models[spec.path];
  if (!model) {
    try {
      model = Model::load(spec.path, session.model->backend());
      check_same_tokenizer(*session.tokenizer, spec.path);
      warm_up(*model);
    } catch (...) {
      session.draft_models.erase(spec.path);  // a later spec may retry a fixed folder
      throw;
    }
  }
  DraftModelOptions o;
  if (spec.num_draft_tokens > 0) o.num_draft = spec.num_draft_tokens;
  return std::make_shared<DraftModelMethod>(model, spec.path, o);
}

}  // namespace specdec
