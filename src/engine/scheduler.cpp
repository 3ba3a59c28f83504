// Scheduler: admission, the plan of one forward under the token budget, KV reservation with
// preemption of the youngest rows (recompute: a preempted row drops its KV and draft state and
// re-prefills everything it knows when readmitted), and retirement of finished rows.
#include "engine/scheduler.h"

#include <algorithm>

#include "core/error.h"

namespace specdec {

Scheduler::Scheduler(KvCache& kv, Coordinator& coordinator, SchedulerOptions options)
    : kv_(kv), coordinator_(coordinator), options_(options) {}

void Scheduler::add(std::unique_ptr<Row> row) { waiting_.push_back(std::move(row)); }

void Scheduler::cancel(int64_t id) {
  for (auto& row : running_)
    if (row->id == id) row->end(FinishReason::cancelled);
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
    if ((*it)->id == id) {
      (*it)->end(FinishReason::cancelled);
      running_.push_back(std::move(*it));  // leaves through remove_finished like any other
      waiting_.erase(it);
      return;
    }
  }
}

int Scheduler::decoding() const {
  return static_cast<int>(
      std::count_if(running_.begin(), running_.end(), [](const auto& r) { return r->decoding && r->running(); }));
}

bool Scheduler::admit(bool plain_only) {
  while (!waiting_.empty() && static_cast<int>(running_.size()) < options_.max_rows) {
    Row& row = *waiting_.front();
    const int context = static_cast<int>(row.tokens.size());
    const int need = (context + kv_.block_size()) / kv_.block_size();
    if (need > kv_.free_blocks() && !running_.empty()) break;  // wait for rows to finish
    if (plain_only && row.speculates()) return true;
    row.start(kv_.create());
    // A row whose method has no room for it decodes plainly rather than wait.
    if (row.speculates() && coordinator_.has_room(row.spec, context)) coordinator_.join(row.spec);
    // Prompt logprobs come from the prefill's logits, which a shared prefix never computes for
    // this row: such a row prefills everything (as vLLM skips its cache for prompt logprobs).
    if (options_.prefix_cache && !row.needs_prompt_logits()) share_cached_prefix(row);
    row.admitted = Clock::now();
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  return false;
}

void Scheduler::share_cached_prefix(Row& row) {
  // A method that reads the target's hidden states gets no taps for the shared positions (they
  // were computed for another row): it takes them as a gap in its context, as it takes the
  // positions of rounds its row did not tap, and reads taps from the first computed position on.
  // Not in rejection mode: there the tokens depend on the drafts, and a drafter missing those
  // positions drafts otherwise, so a seeded request would not repeat its output.
  if (row.spec.joined && row.spec.mode == SpecMode::rejection && !coordinator_.tap_layers(row.spec).empty()) return;
  const std::span<const int32_t> prompt(row.tokens.data(), static_cast<size_t>(row.prefill_end));
  const int covered = kv_.share_prefix(row.seq, prompt);
  if (covered == 0) return;
  row.prefilled = covered;
  row.decoding = covered == row.prefill_end;
  coordinator_.prefill_shared(row.spec, prompt.first(static_cast<size_t>(covered)));
}

std::vector<ScheduledRow> Scheduler::schedule() {
  std::vector<ScheduledRow> plan;
  int budget = options_.max_batch_tokens;
  for (size_t i = 0; i < running_.size(); ++i) {
    Row& row = *running_[i];
    if (!row.decoding || !row.running()) continue;
    const int width = 1 + static_cast<int>(row.spec.proposal.tokens.size());
    if (!reserve(row, static_cast<int>(row.pending_pos) + width, "request")) {
      if (row.running()) --i;  // preempted: running_[i] is the next row now
      continue;
    }
    budget -= width;
    plan.push_back(ScheduledRow{&row, true, 0});
  }
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Row& row = *running_[i];
    if (row.decoding || !row.running()) continue;
    const int chunk = std::min(budget, row.prefill_end - row.prefilled);
    if (!reserve(row, row.prefilled + chunk, "prompt")) {
      if (row.running()) --i;
      continue;
    }
    budget -= chunk;
    plan.push_back(ScheduledRow{&row, false, chunk});
  }
  // Preemption may have taken out rows planned earlier in this loop.
  std::erase_if(plan, [](const ScheduledRow& s) { return !s.row->has_seq || !s.row->running(); });
  return plan;
}

bool Scheduler::reserve(Row& row, int length, const char* what) {
  bool reserved = kv_.reserve(row.seq, length);
  while (!reserved) {
    // Free the youngest other row that holds KV; the oldest rows keep running.
    auto victim = std::find_if(running_.rbegin(), running_.rend(), [&](const auto& r) {
      return r.get() != &row && r->has_seq && r->running();
    });
    if (victim == running_.rend() || victim->get() == running_.front().get()) break;
    preempt(**victim);
    reserved = kv_.reserve(row.seq, length);
  }
  if (reserved) return true;
  // Even with every younger row preempted the cache is short: the oldest row cannot run at
  // all, any other row waits for the rows ahead of it.
  if (&row == running_.front().get()) {
    row.end(FinishReason::error, str_cat("the KV cache cannot hold this ", what));
  } else {
    preempt(row);
  }
  return false;
}

void Scheduler::preempt(Row& row) {
  ++preemptions_;
  if (row.has_seq) kv_.release(row.seq);
  row.has_seq = false;
  row.spec.proposal = {};
  SpecRow* leaving = &row.spec;
  if (row.spec.joined) coordinator_.leave(std::span<SpecRow* const>(&leaving, 1));
  auto it = std::find_if(running_.begin(), running_.end(), [&](const auto& r) { return r.get() == &row; });
  waiting_.push_front(std::move(*it));
  running_.erase(it);
}

std::vector<std::unique_ptr<Row>> Scheduler::remove_finished() {
  std::vector<std::unique_ptr<Row>> done;
  if (std::all_of(running_.begin(), running_.end(), [](const auto& r) { return r->running(); })) return done;
  std::vector<SpecRow*> leaving;
  for (auto& r : running_)
    if (!r->running() && r->spec.joined) leaving.push_back(&r->spec);
  coordinator_.leave(leaving);
  for (auto it = running_.begin(); it != running_.end();) {
    if ((*it)->running()) {
      ++it;
      continue;
    }
    if ((*it)->has_seq) kv_.release((*it)->seq);
    (*it)->has_seq = false;
    done.push_back(std::move(*it));
    it = running_.erase(it);
  }
  return done;
}

}  // namespace specdec
