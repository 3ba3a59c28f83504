// Row: a running request's stop conditions (EOS, token budget, stop strings, context end), its
// incremental text and stream, and its result.
#include "engine/row.h"

#include <algorithm>

#include "speculative/verifier.h"

namespace specdec {

namespace {
double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
}  // namespace

Row::Row(int64_t row_id, Request request, const Tokenizer& tokenizer, int max_position)
    : id(row_id),
      req(std::move(request)),
      tokens(req.prompt),
      prompt_len(req.prompt.size()),
      max_tokens(std::min<int>(req.stop.max_tokens, max_position - static_cast<int>(req.prompt.size()))),
      submitted(Clock::now()),
      detok_(std::make_unique<IncrementalDecoder>(tokenizer, true)) {
  if (!req.stop.ignore_eos) end_ids_ = req.stop.eos_ids;
  end_ids_.insert(end_ids_.end(), req.stop.stop_ids.begin(), req.stop.stop_ids.end());
  for (const auto& s : req.stop.stop_strings) holdback_ = std::max(holdback_, s.size() - 1);
  spec.id = id;
  spec.method = req.spec.method;
  spec.mode = req.spec.mode;
  spec.telemetry.method = req.spec.method;
}

void Row::start(KvCache::SeqId sequence) {
  seq = sequence;
  has_seq = true;
  prefill_end = static_cast<int>(tokens.size()) - 1;
  prefilled = 0;
  decoding = prefill_end == 0;
  pending = tokens.back();
  pending_pos = prefill_end;
}

void Row::end(FinishReason reason, const std::string& message) {
  if (finish != FinishReason::none) return;
  finish = reason;
  error = message;
}

std::vector<int32_t> Row::take(std::span<const int32_t> emitted, int max_position) {
  const BurstCut cut = cut_burst(emitted, end_ids_, static_cast<size_t>(max_tokens - generated()));
  std::vector<int32_t> kept;
  bool done = false;
  for (size_t i = 0; i < cut.kept && !done; ++i) {
    kept.push_back(emitted[i]);
    done = append(emitted[i], cut.eos && i + 1 == cut.kept);
  }
  if (!done && cut.length) end(FinishReason::length);
  if (running() && pending_pos + 1 > max_position) end(FinishReason::length);
  return kept;
}

bool Row::append(int32_t token, bool is_eos) {
  if (!got_first) {
    got_first = true;
    first_token = Clock::now();
  }
  if (is_eos) {  // ends the request; not part of its tokens or text
    end(FinishReason::eos);
    return true;
  }
  tokens.push_back(token);
  const size_t before = text_.size();
  text_ += detok_->push(token);
  for (const auto& s : req.stop.stop_strings) {
    const size_t from = before >= s.size() ? before - s.size() + 1 : 0;
    const size_t at = text_.find(s, from);
    if (at != std::string::npos) {
      text_.resize(at);
      end(FinishReason::stop);
      return true;
    }
  }
  return false;
}

void Row::stream(std::vector<int32_t> new_tokens, std::vector<TokenLogprobs> new_logprobs) {
  const bool final = !running();
  if (final && finish != FinishReason::stop && finish != FinishReason::error) text_ += detok_->flush();
  const size_t hold = final ? 0 : holdback_;
  const size_t upto = text_.size() > hold ? text_.size() - hold : 0;
  StreamEvent ev;
  ev.id = id;
  if (upto > streamed_) {
    ev.text = text_.substr(streamed_, upto - streamed_);
    streamed_ = upto;
  }
  ev.tokens = std::move(new_tokens);
  ev.logprobs = std::move(new_logprobs);
  ev.finish = finish;
  if (!req.on_event || (ev.text.empty() && ev.tokens.empty() && !final)) return;
  // The prefill has computed them all before the first token streams.
  if (req.prompt_logprobs >= 0 && !sent_prompt_logprobs_) {
    ev.prompt_logprobs = prompt_logprobs;
    sent_prompt_logprobs_ = true;
  }
  req.on_event(ev);
}

RequestResult Row::result() const {
  RequestResult res;
  res.id = id;
  res.tokens.assign(tokens.begin() + static_cast<std::ptrdiff_t>(prompt_len), tokens.end());
  res.logprobs = logprobs;
  res.prompt_logprobs = prompt_logprobs;
  res.text = text_;
  res.finish = finish;
  res.error = error;
  res.stats.prompt_tokens = static_cast<int>(prompt_len);
  res.stats.generated_tokens = generated();
  // Only the context can end a row at "length" short of the tokens its request asked for.
  res.stats.context_full = finish == FinishReason::length && generated() < req.stop.max_tokens;
  const auto now = Clock::now();
  res.stats.queue_seconds = seconds(submitted, admitted);
  if (got_first) {
    res.stats.prefill_seconds = seconds(admitted, first_token);
    res.stats.ttft_seconds = seconds(submitted, first_token);
    res.stats.decode_seconds = seconds(first_token, now);
  }
  res.stats.speculative = spec.telemetry;
  return res;
}

}  // namespace specdec
