// Generator: the public API's text-in, text-out path over one engine request.
#include <stdexcept>

#include "api/session.h"
#include "core/error.h"
#include "specdec/specdec.h"

namespace specdec {

struct Generator::Impl {
  Session session;
};

namespace {

SamplingParams sampling_from(const GenerateOptions& o, const GenerationDefaults& d) {
  SamplingParams p;
  p.temperature = o.temperature >= 0 ? o.temperature : (d.do_sample ? d.temperature : 0.0f);
  p.top_p = o.top_p >= 0 ? o.top_p : (d.do_sample ? d.top_p : 1.0f);
  p.top_k = o.top_k >= 0 ? o.top_k : (d.do_sample ? d.top_k : 0);
  p.min_p = o.min_p >= 0 ? o.min_p : (d.do_sample ? d.min_p : 0.0f);
  p.repetition_penalty = o.repetition_penalty >= 0 ? o.repetition_penalty : d.repetition_penalty;
  p.presence_penalty = o.presence_penalty;
  p.frequency_penalty = o.frequency_penalty;
  p.seed = o.seed;
  return p;
}

}  // namespace

Generator::Generator(const ModelOptions& options) : impl_(std::make_unique<Impl>(Impl{open_session(options)})) {}

Generator::~Generator() = default;

Generation Generator::generate(const std::string& prompt, const GenerateOptions& o,
                               const std::function<void(std::string_view)>& on_text) {
  Session& s = impl_->session;
  SPECDEC_CHECK(!prompt.empty(), "the prompt is empty");
  SPECDEC_CHECK(o.num_draft_tokens >= 0, "--num-draft-tokens must not be negative, got ", o.num_draft_tokens);
  EngineCore engine(*s.model, *s.tokenizer, s.engine);
  Request req;
  req.prompt = s.tokenizer->encode(prompt, true);
  req.sampling = sampling_from(o, s.defaults);
  req.stop.max_tokens = o.max_tokens;
  req.stop.eos_ids = s.eos_ids;
  req.stop.ignore_eos = o.ignore_eos;
  req.stop.stop_strings = o.stop;
  if (!o.draft.empty()) {
    req.spec.method = add_draft_method(engine, s, o.draft, o.num_draft_tokens);
    req.spec.max_depth = o.num_draft_tokens;
    req.spec.adaptive = o.adaptive;
    req.spec.mode = o.rejection ? SpecMode::rejection : SpecMode::exact;
  }
  if (on_text) req.on_event = [&on_text](const StreamEvent& ev) {
    if (!ev.text.empty()) on_text(ev.text);
  };
  const int64_t id = engine.submit(std::move(req));
  engine.run();
  RequestResult r = *engine.take_result(id);
  SPECDEC_CHECK(r.finish != FinishReason::error, r.error);
  Generation g;
  g.text = r.text;
  g.tokens = r.tokens;
  g.finish_reason = finish_reason_name(r.finish);
  g.prompt_tokens = r.stats.prompt_tokens;
  g.prefill_tokens_per_s = r.stats.prefill_seconds > 0 ? r.stats.prompt_tokens / r.stats.prefill_seconds : 0;
  g.decode_tokens_per_s = r.stats.decode_seconds > 0 && r.stats.generated_tokens > 1
                              ? (r.stats.generated_tokens - 1) / r.stats.decode_seconds
                              : 0;
  g.ttft_s = r.stats.ttft_seconds;
  if (!o.draft.empty()) {
    g.speculative_json = r.stats.speculative.to_json().dump();
    g.acceptance_rate = r.stats.speculative.acceptance_rate();
    g.mean_accepted_length = r.stats.speculative.mean_accepted_length();
  }
  return g;
}

std::vector<int32_t> Generator::encode(const std::string& text) const { return impl_->session.tokenizer->encode(text, true); }

std::string Generator::decode(const std::vector<int32_t>& ids) const { return impl_->session.tokenizer->decode(ids, true); }

std::string Generator::device_name() const { return impl_->session.backend->name(); }

}  // namespace specdec
