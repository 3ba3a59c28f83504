// specdec::Engine: the public front of the internal engine. Requests are tokenised and checked
// on the caller's thread, then handed to the loop thread (engine_loop.h), which owns the
// EngineCore and everything that touches the device.
#include "specdec/engine.h"

#include <map>
#include <mutex>
#include <set>

#include "api/bandwidth.h"
#include "api/convert.h"
#include "api/describe_model.h"
#include "api/engine_loop.h"
#include "api/replay_run.h"
#include "api/session.h"
#include "core/error.h"

namespace specdec {

struct Engine::Impl {
  Session session;
  ModelInfo info;
  DeviceKind device = DeviceKind::cpu;
  mutable std::mutex drafts_mutex;
  std::set<std::string> drafts;
  std::map<std::string, ReplayMethod> methods;  // by id; loop thread only
  KvCapacity kv;                                // the target's cache, fixed at start
  std::unique_ptr<EngineLoop> loop;             // last: stopped before the session it uses goes
};

Engine::Engine(const EngineConfig& config) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.session = open_session(config);
  const Session& s = m.session;
  m.info = describe_model(config.model_dir, s.model->config(), WeightStore::open(config.model_dir), *s.tokenizer);
  m.info.parameter_count = s.model->parameter_count();
  m.info.weight_bytes = s.model->weight_bytes();
  m.device = s.backend->device() == Device::cuda ? DeviceKind::cuda : DeviceKind::cpu;
  auto core = std::make_unique<EngineCore>(*s.model, *s.tokenizer, s.engine);
  m.kv = KvCapacity{core->kv().total_blocks(), core->kv().block_size(),
                    int64_t{core->kv().total_blocks()} * core->kv().block_size(), 0};
  m.loop = std::make_unique<EngineLoop>(std::move(core), config.release_memory_when_idle);
  m.kv.bytes = static_cast<size_t>(m.kv.tokens) * kv_bytes_per_token();
  for (const DraftSpec& spec : config.drafts) add_draft(spec);
}

Engine::~Engine() = default;

void Engine::add_draft(const DraftSpec& spec) {
  const std::string id = draft_id(spec);
  impl_->loop->call([&](EngineCore& core) {
    SPECDEC_CHECK(!core.has_method(id), "a draft method with id '", id, "' is already registered");
    std::shared_ptr<DraftMethod> method = make_draft_method(impl_->session, spec);
    core.add_method(id, method);
    impl_->methods[id] = ReplayMethod{id, spec.kind, std::move(method)};
  });
  std::lock_guard lock(impl_->drafts_mutex);
  impl_->drafts.insert(id);
}

bool Engine::has_draft(const std::string& id) const {
  std::lock_guard lock(impl_->drafts_mutex);
  return impl_->drafts.count(id) > 0;
}

namespace {

Request checked_request(const Session& s, EngineLoop& loop, GenerationRequest&& request) {
  SPECDEC_CHECK(request.prompt.empty() || request.prompt_tokens.empty(),
                "give the prompt as text or as token ids, not both");
  SPECDEC_CHECK(request.speculative.num_draft_tokens >= 0, "num_draft_tokens must not be negative, got ",
                request.speculative.num_draft_tokens);
  // Set means asked for: -1 would read as "none" inside the engine.
  SPECDEC_CHECK(!request.logprobs || *request.logprobs >= 0, "logprobs must be from 0 to ", kMaxTopLogprobs, ", got ",
                *request.logprobs);
  SPECDEC_CHECK(!request.prompt_logprobs || *request.prompt_logprobs >= 0, "prompt_logprobs must be from 0 to ",
                kMaxTopLogprobs, ", got ", *request.prompt_logprobs);
  std::vector<int32_t> prompt =
      request.prompt.empty() ? std::move(request.prompt_tokens) : s.tokenizer->encode(request.prompt, true);
  SPECDEC_CHECK(!prompt.empty(), "the prompt is empty");
  Request r = internal_request(std::move(request), std::move(prompt), s.defaults, s.eos_ids);
  // A callback that throws must not unwind through the engine's iteration (which would fail every
  // request): its own request ends as cancelled instead.
  if (r.on_event)
    r.on_event = [inner = std::move(r.on_event), &loop](const StreamEvent& ev) {
      try {
        inner(ev);
      } catch (...) {
        if (ev.finish == FinishReason::none) loop.post([id = ev.id](EngineCore& core) { core.cancel(id); });
      }
    };
  return r;
}

}  // namespace

int64_t Engine::submit(GenerationRequest request) {
  std::vector<GenerationRequest> one;
  one.push_back(std::move(request));
  return submit_all(std::move(one)).front();
}

std::vector<int64_t> Engine::submit_all(std::vector<GenerationRequest> requests) {
  std::vector<Request> checked;
  for (GenerationRequest& r : requests) checked.push_back(checked_request(impl_->session, *impl_->loop, std::move(r)));
  try {
    return impl_->loop->submit_all(std::move(checked));
  } catch (const QueueFullError& e) {
    throw QueueFull(e.what());  // the public type, so that a caller can tell "busy" from "bad"
  }
}

EngineStats Engine::stats() const {
  const EngineCounters c = impl_->loop->counters();
  EngineStats s;
  s.running = c.running;
  s.waiting = c.waiting;
  s.kv_blocks_used = c.kv_blocks_used;
  s.kv_blocks_total = c.kv_blocks_total;
  s.kv_touched_bytes = c.kv_touched_bytes;
  s.kv_block_size = c.kv_block_size;
  s.prefix_cache_queries = c.prefix_queried_tokens;
  s.prefix_cache_hits = c.prefix_hit_tokens;
  s.preemptions = c.preemptions;
  s.iterations = c.forwards;
  s.iterations_ahead = c.forwards_ahead;
  s.decode_iterations = c.decode_iterations;
  s.decode_iteration_seconds = c.decode_iteration_seconds;
  s.decode_device_seconds = c.decode_device_seconds;
  s.one_off_iterations = c.one_off_iterations;
  s.one_off_seconds = c.one_off_seconds;
  for (const auto& [id, t] : c.speculation)
    s.speculation[id] = DraftMethodStats{t.drafted, t.accepted, t.emitted, t.rounds, t.accepted_at};
  return s;
}

void Engine::cancel(int64_t request_id) {
  impl_->loop->post([request_id](EngineCore& core) { core.cancel(request_id); });
}

GenerationResult Engine::wait(int64_t request_id) { return impl_->loop->wait(request_id); }

void Engine::release(int64_t request_id) { impl_->loop->release(request_id); }

std::vector<int32_t> Engine::encode(std::string_view text, bool parse_special) const {
  return impl_->session.tokenizer->encode(text, parse_special);
}

std::string Engine::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  return impl_->session.tokenizer->decode(ids, skip_special);
}

const ModelInfo& Engine::model_info() const { return impl_->info; }

DeviceKind Engine::device() const { return impl_->device; }

std::string Engine::device_name() const { return impl_->session.backend->name(); }

size_t Engine::step_weight_bytes(int tokens) const { return impl_->session.model->step_weight_bytes(tokens); }
size_t Engine::matmul_parameters() const { return impl_->session.model->matmul_parameters(); }

size_t Engine::kv_bytes_per_token() const {
  const ModelConfig& c = impl_->session.model->config();
  return 2 * static_cast<size_t>(c.num_layers) * static_cast<size_t>(c.num_kv_heads) * static_cast<size_t>(c.head_dim) *
         dtype_size(impl_->session.backend->kv_dtype());
}

KvCapacity Engine::kv_capacity() const { return impl_->kv; }

MemoryBandwidth Engine::measure_memory_bandwidth() {
  Session& s = impl_->session;
  return impl_->loop->call([&s](EngineCore&) { return specdec::measure_memory_bandwidth(*s.backend, s.host_threads); });
}

ReplayReport Engine::replay(const ReplayRequest& request) {
  for (const std::string& id : request.drafts) SPECDEC_CHECK(has_draft(id), "unknown draft method '", id, "'");
  // The requests' tokens: plain decoding, which speculative decoding in exact mode reproduces.
  std::vector<std::vector<int32_t>> generated;
  for (const ReplayPrompt& p : request.prompts) {
    GenerationRequest r;
    r.prompt_tokens = p.tokens;
    r.max_tokens = p.max_tokens;
    r.sampling = request.sampling;
    r.ignore_eos = true;
    GenerationResult g = wait(submit(std::move(r)));
    SPECDEC_CHECK(g.finish != Finish::error, g.error);
    generated.push_back(std::move(g.tokens));
  }
  return impl_->loop->call([&](EngineCore&) {
    std::vector<ReplayMethod> methods;
    for (const std::string& id : request.drafts) methods.push_back(impl_->methods.at(id));
    return run_replay(*impl_->session.model, methods, request, generated,
                      sampling_params(request.sampling, impl_->session.defaults));
  });
}

}  // namespace specdec
