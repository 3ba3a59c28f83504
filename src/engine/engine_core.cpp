// Engine: admission, the mixed iteration (draft → one target forward → verify → rollback →
// commit → stream), stop conditions and preemption. See engine.h for the contract.
#include "engine/engine_core.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "core/error.h"
#include "speculative/verifier.h"

namespace specdec {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
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

struct EngineCore::Row {
  int64_t id = 0;
  Request req;
  std::vector<int32_t> tokens;  // prompt + generated: everything known
  size_t prompt_len = 0;
  bool has_seq = false;
  KvCache::SeqId seq = 0;
  int prefill_end = 0;  // target prefill covers tokens[0, prefill_end) (all but the pending one)
  int prefilled = 0;
  bool decoding = false;
  int32_t pending = 0;
  int64_t pending_pos = 0;
  std::unique_ptr<IncrementalDecoder> detok;
  std::string text;
  size_t streamed = 0;
  size_t holdback = 0;
  FinishReason finish = FinishReason::none;
  std::string error;
  std::unique_ptr<DepthPolicy> policy;
  SpecTelemetry telemetry;
  DraftProposal proposal;  // this iteration's drafts, between the draft call and the plan
  bool in_group = false;
  Clock::time_point submitted, admitted, first_token;
  bool got_first = false;
  int max_tokens = 0;

  int generated() const { return static_cast<int>(tokens.size() - prompt_len); }
};

struct EngineCore::Group {
  std::shared_ptr<DraftMethod> method;
  std::unique_ptr<DraftRows> rows;
  std::vector<Row*> members;
  DraftCost draft_cost;        // seconds of this group's draft calls
  int forced_probes_left = 0;  // this iteration's probes against the measured costs
  // This iteration's draft asks (and the rows asking) and commits; kept between iterations so
  // that a step allocates nothing for them.
  std::vector<DraftRequestRow> asks;
  std::vector<Row*> askers;
  std::vector<RowCommit> commits;
  int index_of(const Row* row) const {
    auto it = std::find(members.begin(), members.end(), row);
    return it == members.end() ? -1 : static_cast<int>(it - members.begin());
  }
};

EngineCore::EngineCore(Model& target, const Tokenizer& tokenizer, EngineOptions options)
    : target_(target), tokenizer_(tokenizer), options_(options) {
  const ModelConfig& c = target_.config();
  int blocks = options_.kv_blocks;
  if (blocks <= 0) {
    const int per_row = (c.max_position + 15) / 16 + 1;
    const int by_memory = KvCache::blocks_for_memory(options_.kv_memory, c.num_layers, c.num_kv_heads, c.head_dim,
                                                     target_.backend().kv_dtype());
    blocks = std::max(1, std::min(per_row * options_.max_rows, by_memory));
  }
  kv_ = target_.make_cache(blocks);
}

EngineCore::~EngineCore() = default;

void EngineCore::add_method(const std::string& id, std::shared_ptr<DraftMethod> method) {
  SPECDEC_CHECK(method != nullptr, "null draft method");
  SPECDEC_CHECK(!id.empty(), "a draft method needs a non-empty id");
  SPECDEC_CHECK(!methods_.count(id), "a draft method with id '", id, "' is already registered");
  const std::string& name = id;
  auto group = std::make_unique<Group>();
  TargetView view;
  view.model = &target_;
  view.vocab_size = target_.config().vocab_size;
  view.hidden_size = target_.config().hidden_size;
  view.num_layers = target_.config().num_layers;
  group->rows = method->open(view);
  group->method = method;
  groups_[name] = std::move(group);
  methods_[name] = std::move(method);
}

bool EngineCore::has_method(const std::string& id) const { return methods_.count(id) > 0; }

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
  if (!request.spec.method.empty())
    SPECDEC_CHECK(methods_.count(request.spec.method), "unknown draft method '", request.spec.method, "'");
  for (const auto& s : request.stop.stop_strings) SPECDEC_CHECK(!s.empty(), "a stop string is empty");

  auto row = std::make_unique<Row>();
  row->id = next_id_++;
  row->prompt_len = request.prompt.size();
  row->tokens = request.prompt;
  row->max_tokens = std::min<int>(request.stop.max_tokens, c.max_position - static_cast<int>(request.prompt.size()));
  row->detok = std::make_unique<IncrementalDecoder>(tokenizer_, true);
  for (const auto& s : request.stop.stop_strings) row->holdback = std::max(row->holdback, s.size() - 1);
  if (!request.spec.method.empty()) {
    const auto& method = methods_.at(request.spec.method);
    const int depth = request.spec.max_depth > 0 ? request.spec.max_depth : method->default_depth();
    row->policy = std::make_unique<DepthPolicy>(depth, request.spec.adaptive);
    row->telemetry.method = request.spec.method;
  }
  row->req = std::move(request);
  row->submitted = Clock::now();
  const int64_t id = row->id;
  waiting_.push_back(std::move(row));
  return id;
}

void EngineCore::cancel(int64_t id) {
  for (auto& row : rows_)
    if (row->id == id && row->finish == FinishReason::none) finish(*row, FinishReason::cancelled);
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
    if ((*it)->id == id) {
      finish(**it, FinishReason::cancelled);
      rows_.push_back(std::move(*it));
      waiting_.erase(it);
      break;
    }
  }
  remove_finished();
}

EngineCore::Group* EngineCore::group_of(const Row& row) {
  if (row.req.spec.method.empty()) return nullptr;
  return groups_.at(row.req.spec.method).get();
}

void EngineCore::admit() {
  while (!waiting_.empty() && static_cast<int>(rows_.size()) < options_.max_rows) {
    Row& row = *waiting_.front();
    const int need =
        kv_->block_size() > 0 ? (static_cast<int>(row.tokens.size()) + kv_->block_size()) / kv_->block_size() : 1;
    if (need > kv_->free_blocks() && !rows_.empty()) break;  // wait for rows to finish
    row.seq = kv_->create();
    row.has_seq = true;
    row.prefill_end = static_cast<int>(row.tokens.size()) - 1;
    row.prefilled = 0;
    row.decoding = row.prefill_end == 0;
    row.pending = row.tokens.back();
    row.pending_pos = row.prefill_end;
    if (Group* g = group_of(row)) {
      const Checkpoint* none = nullptr;
      PreparedChange change = g->rows->prepare_append(std::span<const Checkpoint* const>(&none, 1));
      g->members.push_back(&row);
      change.commit();
      row.in_group = true;
    }
    row.admitted = Clock::now();
    rows_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
}

void EngineCore::preempt(Row& row) {
  // Recompute policy: drop the KV and draft state; on readmission the row re-prefills
  // everything it knows and continues from its pending token.
  if (row.has_seq) kv_->release(row.seq);
  row.has_seq = false;
  if (Group* g = group_of(row); g && row.in_group) {
    std::vector<int> keep;
    std::vector<Row*> members;
    for (size_t i = 0; i < g->members.size(); ++i)
      if (g->members[i] != &row) {
        keep.push_back(static_cast<int>(i));
        members.push_back(g->members[i]);
      }
    g->rows->filter_rows(keep);
    g->members = std::move(members);
    row.in_group = false;
  }
  for (auto it = rows_.begin(); it != rows_.end(); ++it) {
    if (it->get() == &row) {
      waiting_.push_front(std::move(*it));
      rows_.erase(it);
      return;
    }
  }
}

bool EngineCore::reserve_or_preempt(Row& row, int new_len) {
  while (!kv_->reserve(row.seq, new_len)) {
    // Free the youngest other row that holds KV; the oldest rows keep running.
    Row* victim = nullptr;
    for (auto it = rows_.rbegin(); it != rows_.rend(); ++it)
      if (it->get() != &row && (*it)->has_seq && (*it)->finish == FinishReason::none) {
        victim = it->get();
        break;
      }
    if (victim == nullptr || victim == rows_.front().get()) return false;
    preempt(*victim);
  }
  return true;
}

bool EngineCore::reserve_or_yield(Row& row, int new_len, const char* what) {
  if (reserve_or_preempt(row, new_len)) return true;
  // Even with every younger row preempted the cache is short: the oldest row cannot run at
  // all, any other row waits for the rows ahead of it.
  if (&row == rows_.front().get()) {
    finish(row, FinishReason::error, str_cat("the KV cache cannot hold this ", what));
  } else {
    preempt(row);
  }
  return false;
}

bool EngineCore::step() {
  admit();
  if (rows_.empty()) return false;
  const int max_position = target_.config().max_position;

  struct Plan {
    Row* row;
    bool decode;
    int chunk = 0;  // prefill tokens
    DraftProposal proposal;
  };
  std::vector<Plan> plans;
  int decoding = 0;
  for (auto& r : rows_)
    if (r->decoding && r->finish == FinishReason::none) ++decoding;

  // 1. Draft, per method group, batched over its rows that speculate this round.
  for (auto& [name, g] : groups_) {
    g->forced_probes_left = 1;
    g->asks.clear();
    g->askers.clear();
  }
  for (auto& r : rows_) {
    Row& row = *r;
    if (!row.decoding || row.finish != FinishReason::none || !row.policy) continue;
    Group* g = group_of(row);
    int depth = row.policy->next_depth(costs_, g->draft_cost, std::max(1, decoding), &g->forced_probes_left);
    depth = std::min(depth, row.max_tokens - row.generated() - 1);
    depth = std::min<int>(depth, max_position - static_cast<int>(row.pending_pos) - 1);
    if (depth <= 0) continue;
    DraftRequestRow ask;
    ask.row = g->index_of(&row);
    ask.pending = row.pending;
    ask.depth = depth;
    ask.position = row.pending_pos;
    ask.sampling = &row.req.sampling;
    ask.want_q = row.req.spec.mode == SpecMode::rejection;
    g->asks.push_back(ask);
    g->askers.push_back(&row);
  }
  for (auto& [name, g] : groups_) {
    if (g->asks.empty()) continue;
    const auto t0 = Clock::now();
    std::vector<DraftProposal> got = g->rows->draft(g->asks);
    const double secs = seconds_since(t0);
    int depth = 0;
    bool caught_up = false;
    for (size_t i = 0; i < got.size(); ++i) {
      depth = std::max(depth, static_cast<int>(got[i].tokens.size()));
      caught_up = caught_up || got[i].caught_up > 0;
      g->askers[i]->proposal = std::move(got[i]);
    }
    // A call that also caught a row up on the tokens of rounds it did not draft in (after a
    // pause) would charge that one-off to every drafted token, and so prolong the pause.
    if (!caught_up) g->draft_cost.observe(depth, secs / static_cast<double>(got.size()));
    for (Row* row : g->askers) row->telemetry.draft_ns += static_cast<int64_t>(secs * 1e9 / g->askers.size());
  }

  // 2. Plan the forward: decode/verify windows first (oldest rows first), then prefill chunks.
  int budget = options_.max_batch_tokens;
  ForwardRequest request;
  for (size_t i = 0; i < rows_.size(); ++i) {
    Row& row = *rows_[i];
    if (!row.decoding || row.finish != FinishReason::none) continue;
    Plan plan{&row, true, 0, std::exchange(row.proposal, {})};
    const int width = 1 + static_cast<int>(plan.proposal.tokens.size());
    if (!reserve_or_yield(row, static_cast<int>(row.pending_pos) + width, "request")) {
      if (row.finish == FinishReason::none) --i;  // preempted: rows_[i] is the next row now
      continue;
    }
    budget -= width;
    plans.push_back(std::move(plan));
  }
  for (size_t i = 0; i < rows_.size() && budget > 0; ++i) {
    Row& row = *rows_[i];
    if (row.decoding || row.finish != FinishReason::none) continue;
    const int chunk = std::min(budget, row.prefill_end - row.prefilled);
    if (!reserve_or_yield(row, row.prefilled + chunk, "prompt")) {
      if (row.finish == FinishReason::none) --i;
      continue;
    }
    budget -= chunk;
    plans.push_back(Plan{&row, false, chunk, {}});
  }
  // Preemption may have removed rows planned earlier in this loop; drop their plans.
  std::erase_if(plans, [&](const Plan& p) { return !p.row->has_seq || p.row->finish != FinishReason::none; });
  if (plans.empty()) {
    remove_finished();
    return !idle();
  }
  int total_tokens = 0;
  for (const Plan& p : plans) {
    SequenceInput in;
    in.seq = p.row->seq;
    if (p.decode) {
      in.tokens.push_back(p.row->pending);
      in.tokens.insert(in.tokens.end(), p.proposal.tokens.begin(), p.proposal.tokens.end());
      for (int j = 0; j < static_cast<int>(in.tokens.size()); ++j) in.logits_at.push_back(j);
    } else {
      in.tokens.assign(p.row->tokens.begin() + p.row->prefilled, p.row->tokens.begin() + p.row->prefilled + p.chunk);
    }
    total_tokens += static_cast<int>(in.tokens.size());
    request.rows.push_back(std::move(in));
  }

  // A row whose token depends on nothing but its logits and its (seed, position) key needs only
  // that token at each window position: no penalties or bias, and exact verification (rejection
  // mode weighs p against q on the host, unless there are no drafts to weigh or it is greedy,
  // where it is exact matching). When every decoding row is such a row, the backend draws the
  // tokens and the logits never leave it.
  const bool on_backend = options_.sample_on_backend && std::all_of(plans.begin(), plans.end(), [](const Plan& p) {
                            const SamplingParams& s = p.row->req.sampling;
                            const bool exact =
                                p.row->req.spec.mode == SpecMode::exact || p.proposal.tokens.empty() || s.greedy();
                            return !p.decode || (s.logits_only() && exact);
                          });
  if (on_backend) {
    for (size_t r = 0; r < plans.size(); ++r) {
      if (!plans[r].decode) continue;
      const Row& row = *plans[r].row;
      for (size_t j = 0; j < request.rows[r].logits_at.size(); ++j)
        request.sampling.push_back(sample_row(row.req.sampling, static_cast<uint64_t>(row.pending_pos + 1) + j));
    }
  }

  // 3. One target forward.
  const auto t0 = Clock::now();
  ForwardResult out = target_.forward(request, *kv_);
  const double forward_secs = seconds_since(t0);
  ++forwards_;
  // The depth policy prices verify windows; iterations with prefill chunks would skew the fit,
  // and so would a forward that paid one-off costs (a fresh engine's first window of four tokens
  // took 2.5 ms against 1.2 in steady state on a CPU; a GPU's plain step 0.52 ms while recording
  // its replay against 0.15), which a policy that stops choosing that width never measures again.
  if (!out.one_off && std::all_of(plans.begin(), plans.end(), [](const Plan& p) { return p.decode; }))
    costs_.observe_forward(total_tokens, forward_secs);

  // 4. Verify, roll back, stream, and collect the draft groups' commits.
  for (auto& [name, g] : groups_) g->commits.clear();
  for (size_t r = 0; r < plans.size(); ++r) {
    Plan& p = plans[r];
    Row& row = *p.row;
    Group* g = row.in_group ? group_of(row) : nullptr;
    if (!p.decode) {
      std::span<const int32_t> chunk(row.tokens.data() + row.prefilled, static_cast<size_t>(p.chunk));
      if (g) g->rows->prefill(g->index_of(&row), chunk);
      row.prefilled += p.chunk;
      if (row.prefilled == row.prefill_end) row.decoding = true;
      continue;
    }
    const int k = static_cast<int>(p.proposal.tokens.size());
    const int first = out.row_offsets[r];
    std::span<const int32_t> prompt(row.tokens.data(), row.prompt_len);
    std::span<const int32_t> generated(row.tokens.data() + row.prompt_len, row.tokens.size() - row.prompt_len);
    const auto tv = Clock::now();
    const size_t width = static_cast<size_t>(k + 1);
    VerifyResult verdict;
    if (on_backend) {
      verdict = verify_exact(std::span<const int32_t>(out.tokens).subspan(static_cast<size_t>(first), width),
                             p.proposal.tokens);
    } else {
      const std::span<const float> window(out.logits_row(first), static_cast<size_t>(out.vocab) * width);
      const TokenHistory history{prompt, generated};
      const auto position = static_cast<uint64_t>(row.pending_pos + 1);
      verdict = row.req.spec.mode == SpecMode::rejection && k > 0
                    ? verify_rejection(window, out.vocab, p.proposal.tokens, p.proposal.q, row.req.sampling, history,
                                       position)
                    : verify_exact(window, out.vocab, p.proposal.tokens, row.req.sampling, history, position);
    }
    const int accepted = verdict.accepted;
    // The target's KV holds pending + k drafts; keep pending + the accepted drafts.
    kv_->truncate(row.seq, static_cast<int>(row.pending_pos) + 1 + accepted);
    if (row.policy) {
      row.policy->observe(k, accepted);
      row.telemetry.record_round(k, accepted);
      row.telemetry.verify_ns += static_cast<int64_t>((forward_secs + seconds_since(tv)) * 1e9);
    }
    row.telemetry.target_forwards += 1;
    const int32_t opened_by = row.pending;
    // EOS and the token budget cut the burst (cut_burst); stop strings are found in the text.
    static const std::vector<int32_t> kNoEos;
    const BurstCut cut = cut_burst(verdict.emitted, row.req.stop.ignore_eos ? kNoEos : row.req.stop.eos_ids,
                                   static_cast<size_t>(row.max_tokens - row.generated()));
    std::vector<int32_t> emitted_now;
    bool done = false;
    for (size_t i = 0; i < cut.kept && !done; ++i) {
      emitted_now.push_back(verdict.emitted[i]);
      done = append_token(row, verdict.emitted[i], cut.eos && i + 1 == cut.kept);
    }
    if (!done && cut.length) {
      finish(row, FinishReason::length);
      done = true;
    }
    row.pending_pos += 1 + accepted;
    row.pending = verdict.emitted.back();
    stream(row, std::move(emitted_now), done);
    if (g && !done) {
      RowCommit c;
      c.row = g->index_of(&row);
      c.pending = opened_by;
      c.accepted = accepted;
      c.emitted = std::move(verdict.emitted);
      c.drafted = k;
      g->commits.push_back(std::move(c));
    }
    if (!done && row.pending_pos + 1 > max_position) finish(row, FinishReason::length);
  }
  for (auto& [name, g] : groups_)
    if (!g->commits.empty()) g->rows->commit(g->commits);
  remove_finished();
  return true;
}

bool EngineCore::append_token(Row& row, int32_t token, bool is_eos) {
  if (!row.got_first) {
    row.got_first = true;
    row.first_token = Clock::now();
  }
  if (is_eos) {  // ends the request; not part of its tokens or text
    finish(row, FinishReason::eos);
    return true;
  }
  row.tokens.push_back(token);
  const size_t before = row.text.size();
  row.text += row.detok->push(token);
  for (const auto& s : row.req.stop.stop_strings) {
    const size_t from = before >= s.size() ? before - s.size() + 1 : 0;
    const size_t at = row.text.find(s, from);
    if (at != std::string::npos) {
      row.text.resize(at);
      finish(row, FinishReason::stop);
      return true;
    }
  }
  return false;
}

void EngineCore::stream(Row& row, std::vector<int32_t> tokens, bool final) {
  if (final && row.finish != FinishReason::stop && row.finish != FinishReason::error) row.text += row.detok->flush();
  const size_t hold = final ? 0 : row.holdback;
  const size_t upto = row.text.size() > hold ? row.text.size() - hold : 0;
  StreamEvent ev;
  ev.id = row.id;
  if (upto > row.streamed) {
    ev.text = row.text.substr(row.streamed, upto - row.streamed);
    row.streamed = upto;
  }
  ev.tokens = std::move(tokens);
  ev.finish = final ? row.finish : FinishReason::none;
  if (row.req.on_event && (!ev.text.empty() || !ev.tokens.empty() || final)) row.req.on_event(ev);
}

void EngineCore::finish(Row& row, FinishReason reason, const std::string& error) {
  if (row.finish != FinishReason::none) return;
  row.finish = reason;
  row.error = error;
}

void EngineCore::remove_finished() {
  for (auto& [name, g] : groups_) {
    // Most iterations finish no row: nothing to build then.
    if (std::none_of(g->members.begin(), g->members.end(),
                     [](const Row* r) { return r->finish != FinishReason::none; }))
      continue;
    std::vector<int> keep;
    std::vector<Row*> members;
    for (size_t i = 0; i < g->members.size(); ++i) {
      if (g->members[i]->finish == FinishReason::none) {
        keep.push_back(static_cast<int>(i));
        members.push_back(g->members[i]);
      } else {
        g->members[i]->in_group = false;
      }
    }
    if (members.size() != g->members.size()) {
      g->rows->filter_rows(keep);
      g->members = std::move(members);
    }
  }
  for (auto it = rows_.begin(); it != rows_.end();) {
    Row& row = **it;
    if (row.finish == FinishReason::none) {
      ++it;
      continue;
    }
    if (row.has_seq) kv_->release(row.seq);
    row.has_seq = false;
    if (row.finish == FinishReason::cancelled || row.finish == FinishReason::error) stream(row, {}, true);
    RequestResult res;
    res.id = row.id;
    res.tokens.assign(row.tokens.begin() + static_cast<std::ptrdiff_t>(row.prompt_len), row.tokens.end());
    res.text = row.text;
    res.finish = row.finish;
    res.error = row.error;
    res.stats.prompt_tokens = static_cast<int>(row.prompt_len);
    res.stats.generated_tokens = row.generated();
    const auto end = Clock::now();
    auto secs = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
    res.stats.queue_seconds = secs(row.submitted, row.admitted);
    if (row.got_first) {
      res.stats.prefill_seconds = secs(row.admitted, row.first_token);
      res.stats.ttft_seconds = secs(row.submitted, row.first_token);
      res.stats.decode_seconds = secs(row.first_token, end);
    }
    res.stats.speculative = row.telemetry;
    results_[row.id] = std::move(res);
    it = rows_.erase(it);
  }
}

void EngineCore::run() {
  while (!idle()) step();
}

std::optional<RequestResult> EngineCore::take_result(int64_t id) {
  auto it = results_.find(id);
  if (it == results_.end()) return std::nullopt;
  RequestResult r = std::move(it->second);
  results_.erase(it);
  return r;
}

}  // namespace specdec
