// specdec::Engine: a loaded target model (with its tokenizer, sampling defaults and draft
// methods) serving requests from any thread. One loop thread owns the internal engine and runs
// its iterations (continuous batching, speculative rounds); submit, cancel and wait only hand
// work to it and take results from it, so a server's connection threads never step the model.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "specdec/model_info.h"
#include "specdec/options.h"
#include "specdec/replay.h"
#include "specdec/request.h"

namespace specdec {

struct MemoryBandwidth {
  double bytes_per_s = 0;
  std::string kind;  // what was measured: "host read" or "device-to-device copy, read + write"
};

// Thrown by submit and submit_all when the waiting queue (EngineConfig::max_queue) has no room:
// the request was not queued; a server answers 429.
class QueueFull : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Cumulative speculation figures of one draft method, over every request that used it.
struct DraftMethodStats {
  int64_t drafted = 0, accepted = 0, emitted = 0, rounds = 0;
  std::vector<int64_t> accepted_at;  // [i]: drafts accepted at window position i
};

// A snapshot of the engine's state and counters, taken after its latest iteration.
struct EngineStats {
  int running = 0;                                      // requests holding a row (prefilling or decoding)
  int waiting = 0;                                      // requests queued for a row (preempted ones included)
  int kv_blocks_used = 0, kv_blocks_total = 0;          // the target's KV; cached blocks no request holds count as free
  // Bytes of the KV caches (the target's and the draft methods') ever handed out: the pools are
  // allocated untouched, so on the CPU this is their share of resident memory. It grows with the
  // most blocks held at once and with the prefix cache (free blocks go before cached ones are
  // evicted), up to the whole pools.
  size_t kv_touched_bytes = 0;
  int kv_block_size = 0;                                // tokens per block
  int64_t prefix_cache_queries = 0;                     // prompt tokens looked up in the prefix cache
  int64_t prefix_cache_hits = 0;                        // of which found
  int64_t preemptions = 0;                              // rows preempted for KV (they recompute later)
  int64_t iterations = 0;                               // target forwards
  // Of those, launched before the previous iteration's tokens were committed (EngineConfig::overlap).
  int64_t iterations_ahead = 0;
  // Iterations whose rows all decoded: how many, their wall seconds, and the seconds of those
  // during which a target forward was in flight (from its launch until its results were on the
  // host, and through the commit when the next forward was launched before it); the difference
  // is work between forwards (scheduling, drafting, verifying, streaming). Iterations whose
  // forward paid one-off costs (a buffer grown; on a GPU, a shape run call by call before it is
  // recorded, or recorded) are counted apart, in one_off_iterations and their wall seconds.
  int64_t decode_iterations = 0;
  double decode_iteration_seconds = 0, decode_device_seconds = 0;
  int64_t one_off_iterations = 0;
  double one_off_seconds = 0;
  std::map<std::string, DraftMethodStats> speculation;  // by draft method id
};

// The target's KV cache as sized at start: `blocks` blocks of `block_size` positions.
struct KvCapacity {
  int blocks = 0;
  int block_size = 0;
  int64_t tokens = 0;  // blocks * block_size
  size_t bytes = 0;    // in the cache's element type, all layers, K and V
  // Rows that fit at once when each holds `context` positions (0 for a context of 0).
  int64_t rows_at(int context) const {
    const int64_t per_row = (int64_t{context} + block_size - 1) / std::max(block_size, 1);
    return per_row > 0 ? blocks / per_row : 0;
  }
};

class Engine {
 public:
  // Loads the model, its tokenizer, generation defaults and config.drafts, then starts the loop
  // thread. Throws std::runtime_error naming the cause (a missing file, a bad shape, an unknown
  // architecture, a draft with another vocabulary, ...).
  explicit Engine(const EngineConfig& config);
  // Stops the loop: requests still running finish as cancelled (their last events are sent and
  // their results kept for wait), then the thread is joined.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Registers another draft method; it loads on the loop thread between iterations (a draft
  // model pauses the engine while it loads). Throws for an id already in use or a bad spec.
  void add_draft(const DraftSpec& spec);
  bool has_draft(const std::string& id) const;

  // Validates and queues a request; returns its id. Throws std::runtime_error naming the cause
  // for a bad request (an empty prompt, an unknown draft id, a sampling field out of range, a
  // prompt longer than the context); the engine and other requests are unaffected.
  int64_t submit(GenerationRequest request);
  // Submits several requests between two iterations, so that they start together (a batch of a
  // benchmark). All or nothing: when one is bad it throws and none of them stays queued (those
  // queued before it get a cancelled last event).
  std::vector<int64_t> submit_all(std::vector<GenerationRequest> requests);
  // Ends a request as cancelled (its last event follows from the loop thread). Unknown or
  // finished ids are ignored.
  void cancel(int64_t request_id);
  // Blocks until the request has finished and hands its result over (once: a second wait for
  // the same id throws, as does one for an id never submitted).
  GenerationResult wait(int64_t request_id);
  // The caller will not wait for this request (it follows it through on_event): its result is
  // dropped when it finishes, or now if it has. Without it every result stays until waited for.
  void release(int64_t request_id);
  // The latest snapshot (cheap: no wait for the loop thread).
  EngineStats stats() const;

  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = true) const;

  const ModelInfo& model_info() const;
  DeviceKind device() const;        // cpu or cuda: what DeviceKind::automatic resolved to
  std::string device_name() const;  // e.g. "cpu-avx512 (2 threads)"
  // Bytes of weights one forward over `tokens` tokens reads (an untied embedding table only for
  // the tokens' rows): a decode step's weight traffic.
  size_t step_weight_bytes(int tokens) const;
  // Parameters each token of a forward multiplies (all but an untied embedding table): twice
  // this is a token's FLOPs in the linears, the figure a large batch's step is bound by.
  size_t matmul_parameters() const;
  // Bytes of K and V one cached position holds across all layers, in the KV cache's type.
  size_t kv_bytes_per_token() const;
  // The target's KV cache: how many blocks, tokens and bytes it holds.
  KvCapacity kv_capacity() const;
  // The memory bandwidth a decode step is bound by: host reads on the CPU, device copies on a
  // GPU. Runs on the loop thread between iterations (it pauses the engine for about a second).
  MemoryBandwidth measure_memory_bandwidth();
  // Greedy decoding of each prompt, then its speculative rounds replayed with every draft
  // method named (replay.h). The timing runs on the loop thread between iterations: the engine
  // serves nothing else meanwhile.
  ReplayReport replay(const ReplayRequest& request);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace specdec
