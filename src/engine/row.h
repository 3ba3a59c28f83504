// A request while the engine runs it: what is known (prompt + generated tokens), where its
// target KV stands, and its stop conditions and stream. The scheduler moves rows between the
// waiting queue and the running set; the step appends what the verifier emitted.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/request.h"
#include "kv/kv_cache.h"
#include "speculative/coordinator.h"
#include "tokenizer/tokenizer.h"

namespace specdec {

using Clock = std::chrono::steady_clock;

struct Row {
  Row(int64_t id, Request request, const Tokenizer& tokenizer, int max_position);

  int64_t id = 0;
  Request req;
  std::vector<int32_t> tokens;  // prompt + generated: everything known
  size_t prompt_len = 0;
  int max_tokens = 0;           // the request's budget, cut to what the context leaves

  // Target KV. Prefill covers tokens[0, prefill_end) (all but the pending token, the tail split).
  bool has_seq = false;
  KvCache::SeqId seq = 0;
  int prefill_end = 0;
  int prefilled = 0;
  bool decoding = false;
  int32_t pending = 0;      // the last known token, not yet in the target's KV
  int64_t pending_pos = 0;  // its absolute position

  SpecRow spec;  // speculation state (spec.method empty: plain decoding)

  FinishReason finish = FinishReason::none;
  std::string error;
  std::vector<TokenLogprobs> logprobs;  // per generated token, when the request asked for them
  // Prompt tokens 1.. so far (Request::prompt_logprobs): position p's logits give token p + 1's.
  std::vector<TokenLogprobs> prompt_logprobs;
  Clock::time_point submitted, admitted, first_token;
  bool got_first = false;

  int generated() const { return static_cast<int>(tokens.size() - prompt_len); }
  bool running() const { return finish == FinishReason::none; }
  bool speculates() const { return !spec.method.empty(); }
  // The prompt logprobs still missing: the prefill must return logits from position
  // prompt_logprobs.size() up to the prompt's last but one (and may share no cached prefix).
  bool needs_prompt_logits() const { return req.prompt_logprobs >= 0 && prompt_logprobs.size() + 1 < prompt_len; }

  // Readies the row to (re)start on a fresh KV sequence: everything known but the last token
  // is prefill, the last token is pending.
  void start(KvCache::SeqId sequence);
  // Ends the row (the first reason given wins).
  void end(FinishReason reason, const std::string& message = {});
  // Takes the tokens the verifier emitted this round: EOS, the token budget, stop strings and
  // the context's end may cut the burst, and end the row. Returns the tokens kept, to stream.
  std::vector<int32_t> take(std::span<const int32_t> emitted, int max_position);
  // Sends the new text (minus what a stop string might still claim) and tokens to the client;
  // the final event (a finished row) flushes everything.
  void stream(std::vector<int32_t> new_tokens, std::vector<TokenLogprobs> new_logprobs = {});
  // The finished request's result and figures.
  RequestResult result() const;

 private:
  // Appends one token (an EOS ends the row instead) and checks the stop strings; true when the
  // row has finished.
  bool append(int32_t token, bool is_eos);

  std::vector<int32_t> end_ids_;  // EOS (unless ignored) and the request's stop tokens
  std::unique_ptr<IncrementalDecoder> detok_;
  std::string text_;
  size_t streamed_ = 0;  // bytes of text_ sent
  size_t holdback_ = 0;  // bytes a stop string could still claim

  bool sent_prompt_logprobs_ = false;  // the first event carried them
};

}  // namespace specdec
