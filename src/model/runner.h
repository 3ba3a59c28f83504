// ModelRunner: the forward machinery every model family shares. It lays a plan out in backend
// memory (metadata, scratch), runs the family's decoder (replayed from a recording for decode
// steps), then the final norm and LM head at the returned positions only, and hands back
// logits or the tokens drawn from them on the backend, with views of the hidden taps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "kv/kv_cache.h"
#include "model/bound_weights.h"
#include "model/config.h"
#include "model/decoder.h"
#include "model/model.h"
#include "model/model_batch.h"
#include "model/replay.h"
#include "model/weights.h"

namespace specdec {

class ModelRunner {
 public:
  // The store must hold every tensor of weight_specs(config) (validated by the caller).
  ModelRunner(ModelConfig config, WeightStore store, Backend& backend);

  const ModelConfig& config() const { return config_; }
  Backend& backend() const { return backend_; }
  size_t parameter_count() const { return weights_.parameter_count(); }
  size_t weight_bytes() const { return weights_.bytes(); }
  size_t step_weight_bytes(int tokens) const;
  size_t matmul_parameters() const;
  const Tensor& embedding() const { return decoder_->embedding_table(); }
  const Weight& lm_head() const { return decoder_->lm_head(); }
  bool replays_windows() const { return replays_.available(); }

  // Queues a validated plan (Model::launch): it writes the rows' K/V into the cache and, with
  // `sampling`, draws tokens that are copied back while the host goes on; a forward returning
  // logits copies them back before launch returns. Does not change the cache's lengths.
  uint64_t launch(const ForwardPlan& plan, const std::vector<int>& tap_layers, std::span<const SampleRow> sampling,
                  KvCache& cache);
  // The oldest launched forward's result (logits, or the drawn tokens; views of the taps in
  // outputs_), once the backend has finished it.
  ForwardResult wait(uint64_t ticket);

 private:
  struct MetaViews;
  struct OutputViews;

  // Sizes `buffer` for a layout (growing it if needed), then lays the views out in it; `laid_out`,
  // if given, receives the bytes the layout takes.
  template <typename Make>
  auto scratch(Buffer& buffer, const Make& make, size_t* laid_out = nullptr);
  // Grows `buffer` to at least `bytes` (never shrinks), so steady-state forwards allocate nothing.
  // Moving a buffer drops the recordings that point into it and marks the forward one-off.
  void ensure(Buffer& buffer, size_t bytes);
  // Once the backend has recorded: grows the three buffers to what the widest windows that replay
  // take (ReplayCache::kMaxPaddedWindowTokens tokens, every one returning its row and tapped at
  // `tap_count` layers, over `max_blocks` blocks a row). A buffer that moves drops every
  // recording, and each shape then runs call by call and records again; sized at the first such
  // forward, they do not move when a wider window than any before comes late in a request.
  void reserve_for_windows(int max_blocks, size_t tap_count);
  // Lays the plan's i32 arrays and the sampling rows out in meta_ and uploads them in one copy.
  MetaViews upload_meta(const ForwardPlan& plan, std::span<const SampleRow> sampling);
  // A launched forward not yet waited for.
  struct Launched {
    uint64_t ticket = 0;
    ForwardResult result;
    std::vector<float> temperatures;  // the returned rows' (for the error of a row without a token)
    int slot = -1;                    // staging_ holding its drawn tokens; -1: none to fetch
    uint64_t fence = 0;
  };
  // Queues the copies of the drawn tokens (to drawn_, and to a staging slot for wait) or copies
  // the logits back at once.
  void queue_results(const OutputViews& out, bool selects, Launched& l);

  ModelConfig config_;
  Backend& backend_;
  BoundWeights weights_;
  std::unique_ptr<Decoder> decoder_;
  ReplayCache replays_;
  bool one_off_ = false;  // this forward grew a buffer or did not replay a replayable shape
  int reserved_blocks_ = -1;  // the block-table width and tap count reserve_for_windows sized for
  size_t reserved_taps_ = 0;

  // Scratch, reused across forwards.
  Buffer meta_;         // the plan's i32 arrays
  Buffer activations_;  // per-token activations: the residual stream and the decoder's scratch
  Buffer outputs_;      // per-output rows: gathered hidden, logits; the tapped rows (the result's views)
  std::vector<SampleRow> padded_sampling_;  // the sampling rows with the padding's appended
  std::vector<int32_t> meta_host_;

  std::deque<Launched> launched_;  // oldest first, at most two
  uint64_t tickets_ = 0;
  Buffer staging_[2];  // host copies of drawn tokens, one per forward in flight
  // The last launched forward's drawn tokens in backend memory, which the next forward may take
  // as input (from_previous); -1 when it drew none.
  Buffer drawn_;
  int64_t drawn_count_ = -1;
};

}  // namespace specdec
