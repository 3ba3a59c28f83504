// EngineCore: request validation, and the iteration schedule → propose → forward → verify →
// commit. Admission and planning live in the scheduler, draft groups in the coordinator, stop
// conditions and streaming in the row. See engine_core.h for the contract.
#include "engine/engine_core.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <numeric>
#include <set>
#include <utility>

#include "core/error.h"
#include "speculative/verifier.h"

namespace specdec {

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::unique_ptr<KvCache> make_target_cache(const Model& target, const EngineOptions& options) {
  const ModelConfig& c = target.config();
  int blocks = options.kv_blocks;
  if (blocks <= 0) {
    const int per_row = (c.max_position + 15) / 16 + 1;
    const DType kv_dtype = target.backend().kv_dtype();
    size_t bytes = options.kv_memory;
    if (bytes == 0) {
      const size_t available = target.backend().memory_available();
      SPECDEC_CHECK(available > 0, "the KV cache's size cannot be taken from the ", target.backend().name(),
                    " backend's free memory (it sets no bound); give --kv-memory");
      bytes = auto_kv_memory(available, c, options, kv_dtype);
    }
    const int by_memory = KvCache::blocks_for_memory(bytes, c.num_layers, c.num_kv_heads, c.head_dim, kv_dtype);
    blocks = std::max(1, std::min(per_row * options.max_rows, by_memory));
  }
  return target.make_cache(blocks);
}

}  // namespace

size_t auto_kv_memory(size_t available, const ModelConfig& c, const EngineOptions& options, DType kv_dtype) {
  // One forward's f32 activations per token: the residual stream and its normed copy, q/k/v and
  // the attention output, the MLP's gate, up and product; and the logits of every position that
  // can be verified at once (each row's window of up to 16 tokens, or the whole token budget).
  const size_t head_dim = static_cast<size_t>(c.head_dim);
  const size_t per_token = sizeof(float) * (3 * static_cast<size_t>(c.hidden_size) +
                                            head_dim * (2 * c.num_heads + 2 * c.num_kv_heads) +
                                            3 * static_cast<size_t>(c.intermediate_size));
  const size_t tokens = static_cast<size_t>(options.max_batch_tokens) + 16 * static_cast<size_t>(options.max_rows);
  const size_t logit_rows = std::min(tokens, 16 * static_cast<size_t>(options.max_rows));
  const size_t activations = 2 * (tokens * per_token + logit_rows * sizeof(float) * static_cast<size_t>(c.vocab_size));
  const size_t margin = size_t{1} << 30;
  const size_t needed = activations + options.kv_reserve + margin;
  const size_t per_block = static_cast<size_t>(2) * c.num_layers * 16 * c.num_kv_heads * head_dim * dtype_size(kv_dtype);
  const size_t left = available > needed ? (available - needed) / 10 * 9 : 0;
  SPECDEC_CHECK(left >= per_block, "the device has ", available >> 20, " MiB free after the weights, and the forwards' ",
                "activations (", activations >> 20, " MiB at --max-batch-tokens ", options.max_batch_tokens,
                " and --max-rows ", options.max_rows, "), the draft methods (", options.kv_reserve >> 20,
                " MiB) and a 1 GiB margin leave no room for the KV cache; lower those, or give --kv-memory");
  return left;
}

namespace {

TargetView target_view(const Model& target, const EngineOptions& options) {
  TargetView view;
  view.model = &target;
  view.vocab_size = target.config().vocab_size;
  view.hidden_size = target.config().hidden_size;
  view.num_layers = target.config().num_layers;
  view.max_rows = options.max_rows;
  view.taps = true;
  view.embedding = &target.embedding();
  view.lm_head = &target.lm_head();
  return view;
}

// Row r's tapped positions [0, count) of the forward, in the layers (and order) its method
// declared: slices of the forward's views, which tapped the union of its rows' layers.
TargetContext tap_context(const ForwardResult& out, std::span<const int> layers, size_t r, int count) {
  TargetContext context;
  for (int layer : layers) {
    const auto j = std::find(out.tap_layers.begin(), out.tap_layers.end(), layer) - out.tap_layers.begin();
    SPECDEC_CHECK(j < std::ssize(out.tap_layers), "the target forward did not tap layer ", layer);
    context.taps.push_back(out.taps[static_cast<size_t>(j)].rows(out.tap_offsets[r], count));
  }
  return context;
}

}  // namespace

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::none:
      return "none";
    case FinishReason::length:
      return "length";
    case FinishReason::stop:
    case FinishReason::eos:
      return "stop";
    case FinishReason::cancelled:
      return "cancelled";
    case FinishReason::error:
      return "error";
  }
  return "none";
}

EngineCore::EngineCore(Model& target, const Tokenizer& tokenizer, EngineOptions options)
    : target_(target),
      tokenizer_(tokenizer),
      options_(options),
      kv_(make_target_cache(target, options)),
      coordinator_(target_view(target, options)),
      scheduler_(*kv_, coordinator_, SchedulerOptions{options.max_rows, options.max_batch_tokens, options.prefix_cache}) {
  overlap_ =
      options.overlap == Overlap::always || (options.overlap == Overlap::automatic && target.backend().queues_calls());
  SPECDEC_CHECK(options.max_queue >= -1, "max_queue must be -1 (unbounded) or at least 0, got ", options.max_queue);
}

EngineCore::~EngineCore() {
  // The target may serve another engine next: no forward of this one stays launched on it.
  if (!ahead_) return;
  try {
    target_.wait(ahead_->ticket);
  } catch (const std::exception&) {
    // Its results are dropped either way; a destructor cannot pass the error on.
  }
}

void EngineCore::add_method(const std::string& id, std::shared_ptr<DraftMethod> method) {
  coordinator_.add_method(id, std::move(method));
}

int64_t EngineCore::submit(Request request) {
  const ModelConfig& c = target_.config();
  SPECDEC_CHECK(!request.prompt.empty(), "the prompt is empty: at least one token is needed");
  SPECDEC_CHECK(static_cast<int>(request.prompt.size()) < c.max_position, "the prompt has ", request.prompt.size(),
                " tokens, longer than the model's context of ", c.max_position,
                " (one position must remain to generate)");
  for (int32_t t : request.prompt)
    SPECDEC_CHECK(t >= 0 && t < c.vocab_size, "prompt token id ", t, " is outside the vocabulary of ", c.vocab_size);
  SPECDEC_CHECK(request.stop.max_tokens >= 1, "max_tokens must be at least 1, got ", request.stop.max_tokens);
  request.sampling.validate(c.vocab_size);
  const int prompt_blocks = (static_cast<int>(request.prompt.size()) + kv_->block_size()) / kv_->block_size();
  SPECDEC_CHECK(prompt_blocks <= kv_->total_blocks(), "the prompt needs ", prompt_blocks,
                " KV blocks but the cache has only ", kv_->total_blocks());
  const std::string& method = request.spec.method;
  if (!method.empty()) SPECDEC_CHECK(has_method(method), "unknown draft method '", method, "'");
  for (const auto& s : request.stop.stop_strings) SPECDEC_CHECK(!s.empty(), "a stop string is empty");
  for (int32_t t : request.stop.stop_ids)
    SPECDEC_CHECK(t >= 0 && t < c.vocab_size, "stop token id ", t, " is outside the vocabulary of ", c.vocab_size);
  SPECDEC_CHECK(request.logprobs >= -1 && request.logprobs <= kMaxTopLogprobs, "logprobs must be from 0 to ",
                kMaxTopLogprobs, ", got ", request.logprobs);
  SPECDEC_CHECK(request.prompt_logprobs >= -1 && request.prompt_logprobs <= kMaxTopLogprobs,
                "prompt_logprobs must be from 0 to ", kMaxTopLogprobs, ", got ", request.prompt_logprobs);
  // The queue counts requests beyond the rows that are free now (they are admitted at the next
  // iteration without waiting for anyone).
  const int free_rows = std::max(0, options_.max_rows - static_cast<int>(scheduler_.running().size()));
  if (options_.max_queue >= 0 && scheduler_.waiting() + 1 > options_.max_queue + free_rows)
    throw QueueFullError(str_cat("the waiting queue is full (", options_.max_queue, " requests beyond the ",
                                 options_.max_rows, " rows)"));

  auto row = std::make_unique<Row>(next_id_++, std::move(request), tokenizer_, c.max_position);
  if (row->speculates()) {
    const int depth = row->req.spec.max_depth > 0 ? row->req.spec.max_depth : coordinator_.default_depth(row->spec.method);
    // In exact mode the depth never changes the output, so it may follow measured costs. In
    // rejection mode a position's token depends on whether it was drafted, so a depth chosen by
    // timing (or by the batch's other rows) would make a seeded request differ from run to run:
    // such a row's policy prices depths at fixed figures instead (Coordinator::fixed_costs_),
    // from its own rounds' outcomes alone.
    row->spec.policy.emplace(std::min(depth, coordinator_.own_depth(row->spec.method)), row->req.spec.adaptive);
    row->spec.reach = depth;
  }
  const int64_t id = row->id;
  scheduler_.add(std::move(row));
  return id;
}

void EngineCore::cancel(int64_t id) {
  scheduler_.cancel(id);
  retire();
}

bool EngineCore::step() {
  const auto started = Clock::now();
  std::optional<Launch> launched = std::exchange(ahead_, std::nullopt);
  if (!launched) {
    launched = launch_scheduled();
    if (!launched) return !idle();
  }
  Launch& now = *launched;
  // From here until its results are on the host, `now` keeps the device working (it was
  // launched above, or during the previous iteration).
  const auto in_flight = now.ahead ? started : now.launched_at;
  if (overlap_) ahead_ = launch_ahead(now);
  ForwardResult out = with_context("target model", [&] { return target_.wait(now.ticket); });
  const double forward_secs = seconds_since(in_flight);
  ++forwards_;
  // The depth policy prices verify windows: a forward with prefill chunks would skew the fit,
  // and so would one that paid one-off costs (first pages, recording a replay), which a policy
  // that stops choosing that width would never measure again. A forward launched ahead was
  // timed with the previous iteration's host work (and no row of it drafts).
  if (now.decode_only && !out.one_off && !now.ahead) costs_.observe_forward(now.tokens, forward_secs);
  const auto committing = Clock::now();
  verify_and_commit(now.batch, out, now.on_backend, forward_secs);
  retire();
  const double iteration = seconds_since(started);
  // The device works through the commit too when the next forward was launched before it.
  const double device = seconds_since(in_flight) - (ahead_ ? 0.0 : seconds_since(committing));
  if (now.decode_only) coordinator_.observe_iteration(iteration);
  if (now.decode_only && !out.one_off) {
    ++decode_iterations_;
    decode_iteration_seconds_ += iteration;
    decode_device_seconds_ += device;
  } else if (now.decode_only) {
    ++one_off_iterations_;
    one_off_seconds_ += iteration;
  }
  return true;
}

std::optional<EngineCore::Launch> EngineCore::launch_scheduled() {
  scheduler_.admit();
  if (scheduler_.running().empty()) return std::nullopt;
  propose();
  Launch now;
  now.batch = scheduler_.schedule();
  if (now.batch.empty()) {
    retire();
    return std::nullopt;
  }
  now.on_backend = draws_on_backend(now.batch);
  now.decode_only = std::all_of(now.batch.begin(), now.batch.end(), [](const ScheduledRow& s) { return s.decode; });
  const ForwardRequest request = build_forward(now.batch, now.on_backend);
  for (const SequenceInput& in : request.rows) now.tokens += static_cast<int>(in.tokens.size());
  now.launched_at = Clock::now();
  now.ticket = with_context("target model", [&] { return target_.launch(request, *kv_); });
  return now;
}

std::optional<EngineCore::Launch> EngineCore::launch_ahead(const Launch& now) {
  if (!now.on_backend) return std::nullopt;
  const int max_position = target_.config().max_position;
  // The next step's rows as they will stand after now's commit: first the rows whose input is
  // the token now draws, then rows whose prefill now completes (their pending token is known),
  // then the prefill chunks of rows still prefilling and of rows admitted here.
  struct Next {
    Row* row;
    int from = -1;  // now's returned row that holds the input token
    int chunk = 0;  // prefill tokens; 0 for a decode step
    int kv = 0;     // the KV length the step needs
  };
  std::vector<Next> takes, decodes, chunks;
  size_t live = 0;
  int returned = 0;  // now's returned rows so far (a decode row returns one, a chunk none)
  // A row that drafts or is tapped, in now or in the next step, needs now's results on the host
  // first; a speculating row whose policy pauses it through both does not.
  if (coordinator_.asked()) return std::nullopt;
  for (const ScheduledRow& s : now.batch) {
    Row* row = s.row;
    const int index = s.decode ? returned++ : -1;
    if (row == nullptr) continue;  // ended since now was launched
    ++live;
    if (!row->running() || !coordinator_.forward_taps(row->spec).empty()) return std::nullopt;
    if (row->speculates() && (!s.decode || !coordinator_.quiet_next(row->spec))) return std::nullopt;
    if (s.decode) {
      if (!row->spec.proposal.tokens.empty()) return std::nullopt;
      // now's token ends the row by its budget or the context: no next step.
      if (row->generated() + 1 >= row->max_tokens || row->pending_pos + 2 > max_position) continue;
      takes.push_back(Next{row, index, 0, static_cast<int>(row->pending_pos) + 2});
    } else if (row->prefilled + s.chunk == row->prefill_end) {
      decodes.push_back(Next{row, -1, 0, static_cast<int>(row->pending_pos) + 1});
    } else {
      chunks.push_back(Next{row, -1, row->prefill_end - row->prefilled - s.chunk, 0});
    }
  }
  // Every running row is in now (none left out by the token budget or admitted since).
  if (live != scheduler_.running().size()) return std::nullopt;
  // Plain requests waiting for a free row start their prefill in the next step. A speculating
  // one first in line is admitted by the next planned iteration instead (its drafter joins
  // there), which must not wait behind the plain rows.
  const size_t before = scheduler_.running().size();
  if (scheduler_.admit(/*plain_only=*/true)) return std::nullopt;
  for (size_t i = before; i < scheduler_.running().size(); ++i) {
    Row* row = scheduler_.running()[i].get();
    if (row->decoding) {
      decodes.push_back(Next{row, -1, 0, static_cast<int>(row->pending_pos) + 1});
    } else {
      chunks.push_back(Next{row, -1, row->prefill_end - row->prefilled, 0});
    }
  }
  // Decode steps first, then the chunks in the token budget, as Scheduler::schedule plans.
  int budget = options_.max_batch_tokens - static_cast<int>(takes.size() + decodes.size());
  for (Next& c : chunks) {
    c.chunk = std::clamp(c.chunk, 0, std::max(budget, 0));
    budget -= c.chunk;
    c.kv = kv_->length(c.row->seq) + c.chunk;
  }
  std::erase_if(chunks, [](const Next& c) { return c.chunk == 0; });
  if (takes.empty() && decodes.empty() && chunks.empty()) return std::nullopt;

  Launch ahead;
  ForwardRequest request;
  for (const std::vector<Next>* part : {&takes, &decodes, &chunks}) {
    for (const Next& n : *part) {
      // Only KV that is free: the next iteration planned as usual preempts where it must.
      if (!kv_->reserve(n.row->seq, n.kv)) return std::nullopt;
      SequenceInput in;
      in.seq = n.row->seq;
      if (n.chunk > 0) {
        const auto from = n.row->tokens.begin() + kv_->length(n.row->seq);
        in.tokens.assign(from, from + n.chunk);
      } else {
        in.tokens = {n.from >= 0 ? 0 : n.row->pending};
        in.logits_at = {0};
        // The token drawn here follows the step's input: one position past the row's pending
        // token when the input is now's token.
        const int64_t input_pos = n.row->pending_pos + (n.from >= 0 ? 1 : 0);
        request.sampling.push_back(sample_row(n.row->req.sampling, static_cast<uint64_t>(input_pos) + 1));
      }
      if (n.from >= 0) request.from_previous.push_back(n.from);
      request.rows.push_back(std::move(in));
      ahead.batch.push_back(ScheduledRow{n.row, n.chunk == 0, n.chunk});
    }
  }
  // Where the next step's tokens are drawn must be where now's were: on the backend.
  if (!draws_on_backend(ahead.batch)) return std::nullopt;
  // The next iteration's proposals, made now: its speculating rows are all paused (quiet_next),
  // so none drafts, none is tapped, and what the call changes is the policies' and groups' count
  // of rounds, which the next iteration (launched here) does not make again.
  std::vector<DraftAsk> asks;
  for (const Next& n : takes)
    if (n.row->spec.joined) asks.push_back(draft_ask(*n.row, 1));
  if (!asks.empty()) {
    coordinator_.propose(asks, costs_, static_cast<int>(takes.size() + decodes.size()));
    for (const DraftAsk& a : asks)
      SPECDEC_CHECK(a.row->proposal.tokens.empty() && coordinator_.forward_taps(*a.row).empty(),
                    "a row paused for the next round drafted or was tapped in it");
  }
  ahead.on_backend = ahead.ahead = true;
  ahead.decode_only = chunks.empty();
  for (const SequenceInput& in : request.rows) ahead.tokens += static_cast<int>(in.tokens.size());
  ahead.ticket = with_context("target model", [&] { return target_.launch(request, *kv_); });
  ++forwards_ahead_;
  return ahead;
}

void EngineCore::propose() {
  std::vector<DraftAsk> asks;
  for (const auto& r : scheduler_.running()) {
    Row& row = *r;
    if (!row.decoding || !row.running() || !row.spec.joined) continue;
    asks.push_back(draft_ask(row, 0));
  }
  if (!asks.empty()) coordinator_.propose(asks, costs_, scheduler_.decoding());
}

DraftAsk EngineCore::draft_ask(Row& row, int later) const {
  // The round `later` steps on has its pending token that many positions further, and that many
  // tokens fewer left to generate (a step emits one).
  const int64_t position = row.pending_pos + later;
  const int limit = std::min(row.max_tokens - row.generated() - 1 - later,
                             target_.config().max_position - static_cast<int>(position) - 1);
  return DraftAsk{&row.spec, row.pending, position, limit, &row.req.sampling};
}

ForwardRequest EngineCore::build_forward(const std::vector<ScheduledRow>& batch, bool on_backend) const {
  ForwardRequest request;
  std::set<int> tap_layers;
  for (const ScheduledRow& s : batch) {
    const Row& row = *s.row;
    SequenceInput in;
    in.seq = row.seq;
    if (s.decode) {
      in.tokens.push_back(row.pending);
      const auto& drafts = row.spec.proposal.tokens;
      in.tokens.insert(in.tokens.end(), drafts.begin(), drafts.end());
      for (int j = 0; j < static_cast<int>(in.tokens.size()); ++j) in.logits_at.push_back(j);
    } else {
      const auto from = row.tokens.begin() + row.prefilled;
      in.tokens.assign(from, from + s.chunk);
      // Prompt logprobs: logits at the chunk's positions whose next token is a prompt token not
      // yet scored (a row re-prefilling after preemption scored some already). At most the
      // chunk's logits exist at once: the token budget bounds them as it bounds verify windows.
      if (row.needs_prompt_logits()) {
        const int from_pos = std::max(row.prefilled, static_cast<int>(row.prompt_logprobs.size()));
        const int to_pos = std::min(row.prefilled + s.chunk, static_cast<int>(row.prompt_len) - 1);
        for (int p = from_pos; p < to_pos; ++p) in.logits_at.push_back(p - row.prefilled);
      }
    }
    // A row whose method reads the target's hidden states is tapped at every new position (the
    // prefill chunk, or the window, of which commit hands over the verified part); the forward
    // taps the union of its rows' layers. Other rows cost no taps, nor does a row whose depth
    // policy keeps it from drafting for a while (Coordinator::forward_taps).
    const std::span<const int> layers = coordinator_.forward_taps(row.spec);
    if (!layers.empty()) {
      in.taps_at.resize(in.tokens.size());
      std::iota(in.taps_at.begin(), in.taps_at.end(), 0);
      tap_layers.insert(layers.begin(), layers.end());
    }
    request.rows.push_back(std::move(in));
  }
  request.tap_layers.assign(tap_layers.begin(), tap_layers.end());
  if (!on_backend) return request;
  for (size_t r = 0; r < batch.size(); ++r) {
    if (!batch[r].decode) continue;
    const Row& row = *batch[r].row;
    for (size_t j = 0; j < request.rows[r].logits_at.size(); ++j)
      request.sampling.push_back(sample_row(row.req.sampling, static_cast<uint64_t>(row.pending_pos + 1) + j));
  }
  return request;
}

bool EngineCore::draws_on_backend(const std::vector<ScheduledRow>& batch) const {
  return options_.sample_on_backend && std::all_of(batch.begin(), batch.end(), [](const ScheduledRow& s) {
           // A chunk that returns prompt logits needs them on the host (and draws no token).
           if (!s.decode) return !s.row->needs_prompt_logits();
           const Row& row = *s.row;
           // Rejection mode weighs p against q, unless there are no drafts or it is greedy
           // (where it is exact matching).
           const bool weighs = row.spec.mode == SpecMode::rejection && !row.spec.proposal.tokens.empty() &&
                               !row.req.sampling.greedy();
           // Logprobs read the whole distribution of every window position.
           return row.req.logprobs < 0 && specdec::draws_on_backend(row.req.sampling, weighs);
         });
}

void EngineCore::verify_and_commit(const std::vector<ScheduledRow>& batch, const ForwardResult& out,
                                   bool on_backend, double forward_secs) {
  std::vector<RoundOutcome> rounds;
  std::vector<std::vector<int32_t>> emitted(batch.size());  // backs the rounds' spans
  for (size_t r = 0; r < batch.size(); ++r) {
    if (batch[r].row == nullptr) continue;  // ended while its forward ran
    Row& row = *batch[r].row;
    const std::span<const int> tap_layers = coordinator_.forward_taps(row.spec);
    if (!batch[r].decode) {
      score_prompt(row, out, r);
      const std::span<const int32_t> chunk(row.tokens.data() + row.prefilled, static_cast<size_t>(batch[r].chunk));
      coordinator_.prefill(row.spec, chunk, tap_context(out, tap_layers, r, batch[r].chunk));
      row.prefilled += batch[r].chunk;
      row.decoding = row.prefilled == row.prefill_end;
      continue;
    }
    const auto tv = Clock::now();
    RoundOutcome round = verify_row(row, out, out.row_offsets[r], on_backend, emitted[r]);
    row.spec.telemetry.target_forwards += 1;
    if (!row.speculates()) continue;
    row.spec.telemetry.verify_ns += static_cast<int64_t>((forward_secs + seconds_since(tv)) * 1e9);
    round.context = tap_context(out, tap_layers, r, round.accepted + 1);
    rounds.push_back(round);
  }
  coordinator_.commit(rounds);
  // Blocks this forward filled become shareable by later requests with the same prefix.
  if (options_.prefix_cache)
    for (const ScheduledRow& s : batch)
      if (s.row) kv_->cache_full_blocks(s.row->seq, s.row->tokens);
}

void EngineCore::score_prompt(Row& row, const ForwardResult& out, size_t r) const {
  const int first = out.row_offsets[r], count = out.row_offsets[r + 1] - first;
  const size_t vocab = static_cast<size_t>(out.vocab);
  for (int i = 0; i < count; ++i) {
    // build_forward asked for consecutive positions from the first prompt token not yet scored.
    const size_t next = row.prompt_logprobs.size() + 1;  // the prompt token these logits predict
    SPECDEC_CHECK(next < row.prompt_len, "prompt logits beyond the prompt (token ", next, " of ", row.prompt_len, ")");
    const std::span<const float> logits(out.logits_row(first + i), vocab);
    // The history is the prompt before the token: what the request's penalties would read there
    // had the prompt ended just before it (nothing generated yet).
    const TokenHistory history{std::span<const int32_t>(row.tokens.data(), next), {}};
    row.prompt_logprobs.push_back(with_context("target model", [&] {
      return token_logprobs(logits, row.req.sampling, history, row.tokens[next], row.req.prompt_logprobs);
    }));
  }
}

RoundOutcome EngineCore::verify_row(Row& row, const ForwardResult& out, int first, bool on_backend,
                                    std::vector<int32_t>& emitted) {
  const DraftProposal proposal = std::exchange(row.spec.proposal, {});
  const std::vector<int32_t>& drafts = proposal.tokens;
  const int k = static_cast<int>(drafts.size());
  const size_t width = static_cast<size_t>(k + 1);
  const size_t vocab = static_cast<size_t>(out.vocab);
  const std::span<const int32_t> prompt(row.tokens.data(), row.prompt_len);
  const std::span<const int32_t> generated(row.tokens.data() + row.prompt_len, row.tokens.size() - row.prompt_len);
  VerifyResult verdict;
  if (on_backend) {
    verdict = verify_exact(std::span<const int32_t>(out.tokens).subspan(static_cast<size_t>(first), width), drafts);
  } else {
    const std::span<const float> window(out.logits_row(first), vocab * width);
    const TokenHistory history{prompt, generated};
    const auto position = static_cast<uint64_t>(row.pending_pos + 1);
    const bool rejection = row.spec.mode == SpecMode::rejection && k > 0;
    verdict = with_context("target model", [&] {
      return rejection ? verify_rejection(window, out.vocab, drafts, proposal.q, row.req.sampling, history, position)
                       : verify_exact(window, out.vocab, drafts, row.req.sampling, history, position);
    });
  }
  // Window row i gave emitted token i: its logprobs come from that row, with the history that
  // plain decoding would have had there (the tokens before it, the accepted drafts included).
  std::vector<TokenLogprobs> logprobs;
  if (row.req.logprobs >= 0) {
    SPECDEC_CHECK(!on_backend, "logprobs need the host's copy of the logits");
    std::vector<int32_t> before(generated.begin(), generated.end());
    for (size_t i = 0; i < verdict.emitted.size(); ++i) {
      const std::span<const float> logits(out.logits_row(first + static_cast<int>(i)), vocab);
      logprobs.push_back(with_context("target model", [&] {
        return token_logprobs(logits, row.req.sampling, TokenHistory{prompt, before}, verdict.emitted[i],
                              row.req.logprobs);
      }));
      before.push_back(verdict.emitted[i]);
    }
  }
  // The target's KV holds pending + k drafts; keep pending + the accepted drafts. (With every
  // draft accepted there is nothing to drop, and a row's next step may already be running.)
  if (verdict.accepted < k) kv_->truncate(row.seq, static_cast<int>(row.pending_pos) + 1 + verdict.accepted);
  RoundOutcome round{&row.spec, row.pending, k, verdict.accepted, {}, false};
  row.pending_pos += 1 + verdict.accepted;
  row.pending = verdict.emitted.back();
  const size_t known = row.tokens.size();
  std::vector<int32_t> kept = row.take(verdict.emitted, target_.config().max_position);
  // Only tokens that joined the output have logprobs (an EOS or stop token that ended it has none).
  logprobs.resize(std::min(logprobs.size(), row.tokens.size() - known));
  row.logprobs.insert(row.logprobs.end(), logprobs.begin(), logprobs.end());
  row.stream(std::move(kept), std::move(logprobs));
  emitted = std::move(verdict.emitted);
  round.emitted = emitted;
  round.finished = !row.running();
  return round;
}

void EngineCore::retire() {
  // A row that ended leaves the forward launched ahead of it, whose results for it are dropped;
  // when no row is left there, the forward is waited for and dropped now, so that none stays
  // launched while the engine idles.
  if (ahead_) {
    bool any = false;
    for (ScheduledRow& s : ahead_->batch) {
      if (s.row && !s.row->running()) s.row = nullptr;
      any = any || s.row != nullptr;
    }
    if (!any) {
      with_context("target model", [&] { return target_.wait(ahead_->ticket); });
      ahead_.reset();
    }
  }
  for (std::unique_ptr<Row>& row : scheduler_.remove_finished()) {
    if (row->finish == FinishReason::cancelled || row->finish == FinishReason::error) row->stream({});
    if (row->speculates()) speculation_.add(row->spec.telemetry);
    results_[row->id] = row->result();
  }
}

void EngineCore::run() {
  while (!idle()) step();
}

EngineCounters EngineCore::stats() const {
  EngineCounters c;
  c.running = static_cast<int>(scheduler_.running().size());
  c.waiting = scheduler_.waiting();
  c.kv_blocks_total = kv_->total_blocks();
  c.kv_blocks_used = kv_->total_blocks() - kv_->free_blocks();
  c.kv_touched_bytes = kv_->touched_bytes() + coordinator_.kv_touched_bytes();
  c.kv_block_size = kv_->block_size();
  c.prefix_queried_tokens = kv_->prefix_queried_tokens();
  c.prefix_hit_tokens = kv_->prefix_hit_tokens();
  c.preemptions = scheduler_.preemptions();
  c.forwards = forwards_;
  c.forwards_ahead = forwards_ahead_;
  c.decode_iterations = decode_iterations_;
  c.decode_iteration_seconds = decode_iteration_seconds_;
  c.decode_device_seconds = decode_device_seconds_;
  c.one_off_iterations = one_off_iterations_;
  c.one_off_seconds = one_off_seconds_;
  c.speculation = speculation_.methods();
  return c;
}

std::optional<RequestResult> EngineCore::take_result(int64_t id) {
  auto it = results_.find(id);
  if (it == results_.end()) return std::nullopt;
  RequestResult r = std::move(it->second);
  results_.erase(it);
  return r;
}

}  // namespace specdec
