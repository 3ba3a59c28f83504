// Conversions between the public request/result types and the internal engine's.
#include "api/convert.h"

#include <cmath>

namespace specdec {

namespace {

Finish public_finish(FinishReason f) {
  switch (f) {
    case FinishReason::length:
      return Finish::length;
    case FinishReason::stop:
      return Finish::stop;
    case FinishReason::eos:
      return Finish::eos;
    case FinishReason::cancelled:
      return Finish::cancelled;
    case FinishReason::error:
      return Finish::error;
    case FinishReason::none:
      break;
  }
  return Finish::none;
}

}  // namespace

SamplingParams sampling_params(const SamplingOptions& o, const GenerationDefaults& d) {
  SamplingParams p;
  p.temperature = o.temperature.value_or(d.do_sample ? d.temperature : 0.0f);
  p.top_p = o.top_p.value_or(d.do_sample ? d.top_p : 1.0f);
  p.top_k = o.top_k.value_or(d.do_sample ? d.top_k : 0);
  p.min_p = o.min_p.value_or(d.do_sample ? d.min_p : 0.0f);
  p.repetition_penalty = o.repetition_penalty.value_or(d.repetition_penalty);
  p.presence_penalty = o.presence_penalty;
  p.frequency_penalty = o.frequency_penalty;
  p.logit_bias = o.logit_bias;
  p.seed = o.seed;
  return p;
}

Request internal_request(GenerationRequest&& r, std::vector<int32_t> prompt, const GenerationDefaults& defaults,
                         const std::vector<int32_t>& eos_ids) {
  Request req;
  req.prompt = std::move(prompt);
  req.sampling = sampling_params(r.sampling, defaults);
  req.stop.max_tokens = r.max_tokens;
  req.stop.eos_ids = eos_ids;
  req.stop.ignore_eos = r.ignore_eos;
  req.stop.stop_ids = std::move(r.stop_token_ids);
  req.stop.stop_strings = std::move(r.stop);
  req.logprobs = r.logprobs.value_or(-1);
  req.prompt_logprobs = r.prompt_logprobs.value_or(-1);
  req.spec.method = r.speculative.draft;
  req.spec.max_depth = r.speculative.num_draft_tokens;
  req.spec.adaptive = r.speculative.adaptive;
  req.spec.mode = r.speculative.mode == VerifyMode::rejection ? SpecMode::rejection : SpecMode::exact;
  if (r.on_event)
    req.on_event = [on_event = std::move(r.on_event)](const StreamEvent& ev) { on_event(public_event(ev)); };
  return req;
}

std::vector<TokenLogprob> public_logprobs(const std::vector<TokenLogprobs>& in) {
  std::vector<TokenLogprob> out;
  out.reserve(in.size());
  for (const TokenLogprobs& t : in) out.push_back(TokenLogprob{t.token, t.logprob, t.top, t.rank});
  return out;
}

GenerationEvent public_event(const StreamEvent& ev) {
  return GenerationEvent{ev.id,
                         ev.text,
                         ev.tokens,
                         public_finish(ev.finish),
                         public_logprobs(ev.logprobs),
                         public_logprobs(ev.prompt_logprobs)};
}

SpeculativeStats public_stats(const SpecTelemetry& t) {
  SpeculativeStats s;
  s.draft = t.method;
  s.drafted = t.drafted;
  s.accepted = t.accepted;
  s.rounds = t.rounds;
  s.emitted = t.emitted;
  s.target_forwards = t.target_forwards;
  s.drafted_at = t.drafted_at;
  s.accepted_at = t.accepted_at;
  s.draft_seconds = static_cast<double>(t.draft_ns) * 1e-9;
  s.verify_seconds = static_cast<double>(t.verify_ns) * 1e-9;
  return s;
}

SpecTelemetry internal_telemetry(const SpeculativeStats& s) {
  SpecTelemetry t;
  t.method = s.draft;
  t.drafted = s.drafted;
  t.accepted = s.accepted;
  t.rounds = s.rounds;
  t.emitted = s.emitted;
  t.target_forwards = s.target_forwards;
  t.drafted_at = s.drafted_at;
  t.accepted_at = s.accepted_at;
  t.draft_ns = std::llround(s.draft_seconds * 1e9);
  t.verify_ns = std::llround(s.verify_seconds * 1e9);
  return t;
}

GenerationResult public_result(RequestResult&& r) {
  GenerationResult g;
  g.request_id = r.id;
  g.text = std::move(r.text);
  g.tokens = std::move(r.tokens);
  g.logprobs = public_logprobs(r.logprobs);
  g.prompt_logprobs = public_logprobs(r.prompt_logprobs);
  g.finish = public_finish(r.finish);
  g.error = std::move(r.error);
  GenerationStats& s = g.stats;
  s.prompt_tokens = r.stats.prompt_tokens;
  s.generated_tokens = r.stats.generated_tokens;
  s.context_full = r.stats.context_full;
  s.queue_seconds = r.stats.queue_seconds;
  s.prefill_seconds = r.stats.prefill_seconds;
  s.decode_seconds = r.stats.decode_seconds;
  s.ttft_seconds = r.stats.ttft_seconds;
  if (!r.stats.speculative.method.empty()) s.speculative = public_stats(r.stats.speculative);
  return g;
}

double SpeculativeStats::acceptance_rate() const { return internal_telemetry(*this).acceptance_rate(); }

double SpeculativeStats::mean_accepted_length() const { return internal_telemetry(*this).mean_accepted_length(); }

std::string SpeculativeStats::to_json() const { return internal_telemetry(*this).to_json().dump(); }

double GenerationStats::prefill_tokens_per_s() const {
  return prefill_seconds > 0 ? prompt_tokens / prefill_seconds : 0;
}

double GenerationStats::decode_tokens_per_s() const {
  return decode_seconds > 0 && generated_tokens > 1 ? (generated_tokens - 1) / decode_seconds : 0;
}

}  // namespace specdec
