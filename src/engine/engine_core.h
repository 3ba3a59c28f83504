// The engine core: requests in, tokens out, over one target model. Each iteration reads as the
// idea: schedule (admit, plan the forward) → propose (draft groups draft for their speculating
// rows) → ONE target forward over prefill chunks, plain steps and verify windows together →
// verify (and roll each row's KV back to what was accepted) → commit (draft groups learn the
// outcome, tokens stream, finished rows leave). Single-threaded: the public Engine runs it on
// its loop thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/request.h"
#include "engine/scheduler.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "speculative/coordinator.h"
#include "speculative/draft.h"
#include "speculative/policy.h"
#include "tokenizer/tokenizer.h"

namespace specdec {

// submit's refusal when the waiting queue is full (EngineOptions::max_queue).
class QueueFullError : public Error {
 public:
  using Error::Error;
};

// The engine's gauges and counters since it started (EngineCore::stats).
struct EngineCounters {
  int running = 0, waiting = 0;
  int kv_blocks_used = 0, kv_blocks_total = 0, kv_block_size = 0;
  // Bytes of the KV caches' blocks (the target's and the draft methods') handed out at least
  // once: on the CPU, their share of resident memory (KvCache::touched_bytes).
  size_t kv_touched_bytes = 0;
  int64_t prefix_queried_tokens = 0, prefix_hit_tokens = 0;
  int64_t preemptions = 0;
  int64_t forwards = 0;
  int64_t forwards_ahead = 0;  // of which launched before the previous step's tokens were committed
  // Iterations whose rows all decoded (no prefill chunk, no one-off costs): their count, their
  // wall seconds, and of those the seconds during which a target forward was in flight (from
  // its launch until its results were on the host, and through the commit when the next forward
  // was launched before it). The rest is the host's share of a decode iteration, during which
  // the device waits. Decode iterations whose forward paid one-off costs: their count and
  // wall seconds.
  int64_t decode_iterations = 0;
  double decode_iteration_seconds = 0, decode_device_seconds = 0;
  int64_t one_off_iterations = 0;
  double one_off_seconds = 0;
  std::map<std::string, SpecTelemetry> speculation;  // by method id, over finished requests
};

enum class Overlap {
  off,        // every step waits for the previous one's commit (the reference, for comparisons)
  automatic,  // where the backend queues calls (a GPU's): the host's work overlaps the device's
  always,     // also where calls run as they come, gaining nothing there (tests run the path)
};

struct EngineOptions {
  int kv_blocks = 0;            // 0 = enough for max_rows rows of the full context, capped at kv_memory
  // Cap on the KV cache's bytes. 0: sized from the backend's memory_available() at start, less
  // what the forwards' activations and kv_reserve need (auto_kv_memory).
  size_t kv_memory = 1ull << 30;
  // Device memory to leave free beside the KV cache for what is made after it (the draft
  // methods' caches and scratch), when kv_memory is 0.
  size_t kv_reserve = 0;
  int max_rows = 64;            // rows decoding or prefilling at once
  int max_batch_tokens = 512;   // tokens in one target forward (prefill chunks fill what decode leaves)
  // Requests that may wait beyond the rows free at submit time; one more is refused with
  // QueueFullError. -1: unbounded.
  int max_queue = -1;
  bool prefix_cache = true;     // rows share the KV blocks of prompt prefixes already computed
  // Draw tokens where the logits were computed when every decoding row allows it
  // (draws_on_backend). false: the host draws every token from copied logits (the reference
  // path, for comparisons).
  bool sample_on_backend = true;
  // Whether the next iteration's forward is launched before this one's tokens are committed,
  // where it needs nothing the host learns from them (EngineCore::launch_ahead).
  Overlap overlap = Overlap::automatic;
};

// The KV budget when EngineOptions::kv_memory is 0: of `available` device bytes, what remains after
// the activations of one forward at the options' largest shape (max_batch_tokens tokens, logits of
// every row's verify window), options.kv_reserve and a margin for the runtime's own allocations,
// times 0.9 so that fragmentation never turns the last allocation into a failure. Throws, naming
// --kv-memory, when that leaves less than one block.
size_t auto_kv_memory(size_t available, const ModelConfig& config, const EngineOptions& options, DType kv_dtype);

class EngineCore {
 public:
  EngineCore(Model& target, const Tokenizer& tokenizer, EngineOptions options = {});
  ~EngineCore();
  EngineCore(const EngineCore&) = delete;
  EngineCore& operator=(const EngineCore&) = delete;

  // Makes a draft method instance available to requests under `id` (SpecOptions::method).
  // Two instances of one method (two draft models, two n-gram configurations) live side by
  // side under different ids, each with its own rows; an id already in use is refused.
  void add_method(const std::string& id, std::shared_ptr<DraftMethod> method);
  bool has_method(const std::string& id) const { return coordinator_.has_method(id); }

  // Validates and queues a request; throws specdec::Error (naming the cause) for a bad one,
  // leaving the engine and other requests untouched.
  int64_t submit(Request request);
  void cancel(int64_t id);
  // One iteration. Returns false when there was nothing to do.
  bool step();
  // Steps until every submitted request has finished.
  void run();
  bool idle() const { return scheduler_.idle(); }

  // The result of a finished request (moves it out); nullopt while it runs.
  std::optional<RequestResult> take_result(int64_t id);

  const KvCache& kv() const { return *kv_; }
  const Model& target() const { return target_; }
  int64_t target_forwards() const { return forwards_; }
  EngineCounters stats() const;

 private:
  // A forward launched on the target and what its results are for.
  struct Launch {
    std::vector<ScheduledRow> batch;  // a row that ended before the results came is null
    Model::Ticket ticket = 0;
    bool on_backend = false;
    bool decode_only = false;
    bool ahead = false;  // launched by launch_ahead, during the previous iteration
    int tokens = 0;
    Clock::time_point launched_at;
  };

  // The steps of one iteration.
  void propose();
  // The row's ask for drafts in the round `later` steps past the one its state describes (1: the
  // round after the one in flight, whose pending token is not known yet, only for a round that
  // will draft nothing).
  DraftAsk draft_ask(Row& row, int later) const;
  ForwardRequest build_forward(const std::vector<ScheduledRow>& batch, bool on_backend) const;
  // Schedules and launches this iteration's forward; nullopt when no row runs.
  std::optional<Launch> launch_scheduled();
  // The next iteration's forward, launched before now's tokens are on the host, where it needs
  // nothing the host learns from them: now's rows each one step on (a decode step whose input
  // is the token now draws, read where it was drawn; the first decode step of a row whose
  // prefill now completes; the next prefill chunk), rows that now's token ends by budget or
  // context left out, and plain requests admitted into free rows with their first chunk. Only
  // when now's tokens are drawn on the backend and so will the next step's, every running row is
  // in now, none drafts or is tapped in now or in the next step (a speculating row must be
  // paused through both; the next step's proposals are made here), and the KV is free for all of
  // it. nullopt otherwise.
  std::optional<Launch> launch_ahead(const Launch& now);
  void verify_and_commit(const std::vector<ScheduledRow>& batch, const ForwardResult& out, bool on_backend,
                         double forward_secs);
  // Verifies one decoding row's window, rolls its KV back and takes the emitted tokens; returns
  // the round for its draft group.
  RoundOutcome verify_row(Row& row, const ForwardResult& out, int first, bool on_backend,
                          std::vector<int32_t>& emitted);
  // Appends the prompt logprobs that batch row r's prefill chunk returned logits for.
  void score_prompt(Row& row, const ForwardResult& out, size_t r) const;
  // Where this iteration's tokens are drawn: on the backend when every decoding row allows it.
  bool draws_on_backend(const std::vector<ScheduledRow>& batch) const;
  void retire();

  Model& target_;
  const Tokenizer& tokenizer_;
  EngineOptions options_;
  std::unique_ptr<KvCache> kv_;
  Coordinator coordinator_;
  Scheduler scheduler_;
  bool overlap_ = false;         // options_.overlap on this backend
  std::optional<Launch> ahead_;  // the next iteration's forward, already launched
  std::map<int64_t, RequestResult> results_;
  CostModel costs_;
  SpecTelemetryByMethod speculation_;  // finished requests' speculation, per method
  int64_t next_id_ = 1;
  int64_t forwards_ = 0, forwards_ahead_ = 0;
  int64_t decode_iterations_ = 0;
  double decode_iteration_seconds_ = 0, decode_device_seconds_ = 0;
  int64_t one_off_iterations_ = 0;
  double one_off_seconds_ = 0;
};

}  // namespace specdec
