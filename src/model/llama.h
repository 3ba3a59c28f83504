// LlamaModel: the Llama-family decoder (Llama, Mistral, Qwen2 q/k/v biases, Qwen3 q/k norms,
// tied or separate LM head) bound to one backend, and its layer-by-layer ragged forward.
// Pure composition of Backend kernels: nothing here depends on which device runs them.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "kv/kv_cache.h"
#include "model/config.h"
#include "model/model.h"
#include "model/model_batch.h"
#include "model/weights.h"

namespace specdec {

class LlamaModel {
 public:
  // The store must hold every tensor of llama_weight_specs(config) (validated by the caller).
  LlamaModel(ModelConfig config, WeightStore store, Backend& backend);

  const ModelConfig& config() const { return config_; }
  Backend& backend() const { return backend_; }
  size_t parameter_count() const { return parameter_count_; }
  size_t weight_bytes() const { return weight_bytes_; }
  size_t step_weight_bytes(int tokens) const;

  // Runs a validated plan; fills result (logits, or with `sampling` the tokens drawn from them;
  // taps) and writes the rows' K/V into the cache. Does not change the cache's lengths.
  void forward(const ForwardPlan& plan, const std::vector<int>& tap_layers, std::span<const SampleRow> sampling,
               KvCache& cache, ForwardResult& result);

 private:
  struct Layer {
    Tensor input_norm, post_norm;
    Weight q_proj, k_proj, v_proj, o_proj;
    Tensor q_bias, k_bias, v_bias;  // empty unless config.attention_bias
    Tensor o_bias;                  // empty unless config.o_proj_bias
    Tensor q_norm, k_norm;          // empty unless config.qk_norm
    Weight gate_proj, up_proj, down_proj;
  };

  // Device-side view of one checkpoint tensor: zero copy when the store's memory is the
  // backend's (CPU), otherwise an uploaded copy owned by this model.
  Tensor bind(const std::string& name);
  // Grows `buffer` to at least `bytes` (never shrinks), so steady-state forwards allocate nothing.
  // Moving a buffer drops the recordings that point into it and marks the forward one-off.
  void ensure(Buffer& buffer, size_t bytes);

  // What a forward returns per output row: its logits, or its token, taken by Backend::argmax
  // when every row is greedy and by Backend::sample otherwise.
  enum class Selection : uint8_t { logits, argmax, sample };

  // Decode steps of one shape share a recording of their backend calls.
  struct ReplayKey {
    int rows = 0, tokens = 0, max_row_tokens = 0, max_blocks = 0, max_row_len = 0;
    Selection selection = Selection::logits;
    // The cache a recording writes into, by its memory: every pool's address and the pool size
    // (a later cache may reuse an earlier one's addresses, but then it is the same memory).
    int pool_blocks = 0;
    std::vector<const void*> pools;
    auto operator<=>(const ReplayKey&) const = default;
  };
  struct Replay {
    std::unique_ptr<RecordedCalls> recording;
    int runs = 0;
    bool unrecordable = false;
  };
  // Decode steps take a few shapes per batch size; a row's verify windows one per width.
  static constexpr size_t kMaxRecordings = 128;
  static ForwardPlan padded_for_replay(const ForwardPlan& plan);
  // Replays the recording for `key`, or runs `calls` (recording them from their second run on,
  // or third for a window shape).
  void replay_or_run(const ReplayKey& key, const std::function<void()>& calls);

  ModelConfig config_;
  WeightStore store_;  // keeps the mappings the CPU views point into alive
  Backend& backend_;
  bool one_off_ = false;  // this forward grew a buffer or did not replay a replayable shape
  std::vector<Buffer> uploads_;
  Tensor embed_, final_norm_;
  Weight lm_head_;
  std::vector<Layer> layers_;
  Buffer inv_freq_buffer_;
  Tensor inv_freq_;
  float rope_scaling_ = 1.0f;
  float attn_scale_ = 1.0f;
  size_t parameter_count_ = 0;
  size_t weight_bytes_ = 0;

  // Scratch, reused across forwards.
  Buffer meta_;         // the plan's i32 arrays
  Buffer activations_;  // per-token activations
  Buffer outputs_;      // per-output rows: gathered hidden, logits, taps
  std::vector<int32_t> meta_host_;
  std::map<ReplayKey, Replay> recordings_;
  bool backend_records_ = true;  // until Backend::record returns nothing
};

}  // namespace specdec
