// An EAGLE-3 draft head in its published layout (docs/formats.md): config.json with architecture
// LlamaForCausalLMEagle3 and model.safetensors holding fc (three target taps fused into one
// hidden), one decoder layer whose attention reads [normed embedding; normed hidden], its own
// norm and LM head over a reduced draft vocabulary, and the draft-to-target id map d2t.
// The head runs as backend kernel calls on its own paged KV, like the target.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "core/weight.h"
#include "kv/kv_cache.h"
#include "model/config.h"

namespace specdec {

struct Eagle3Config {
  // The decoder layer's shape, RoPE and norm epsilon; vocab_size is the target's vocabulary
  // (the ids the head's embedding reads), num_layers is 1.
  ModelConfig layer;
  int target_hidden = 0;  // width of each target tap (target_hidden_size, else hidden_size)
  int draft_vocab = 0;    // rows of lm_head (draft_vocab_size, else vocab_size)
  // eagle_aux_hidden_state_layer_ids as written (each: the output of that target layer); empty:
  // the loaders' default, the inputs of layers 2, L/2 and L-3.
  std::vector<int> aux_layer_ids;
  bool norm_before_residual = false;  // the layer's residual is the normed hidden (a vLLM option)

  // The target taps fc reads, in fc's order (seam numbering: i = the residual after layer i).
  std::vector<int> tap_layers(int target_layers) const;
};

// True when dir/config.json names the EAGLE-3 head architecture.
bool is_eagle3_dir(const std::filesystem::path& dir);
Eagle3Config load_eagle3_config(const std::filesystem::path& dir);

class Eagle3Head {
 public:
  // Reads and validates dir (every tensor present and shaped, d2t inside the target vocabulary)
  // and uploads the weights to `backend`. Errors name the folder and the tensor.
  static std::unique_ptr<Eagle3Head> load(const std::filesystem::path& dir, Backend& backend);
  ~Eagle3Head();
  Eagle3Head(const Eagle3Head&) = delete;
  Eagle3Head& operator=(const Eagle3Head&) = delete;

  const Eagle3Config& config() const { return config_; }
  Backend& backend() const { return backend_; }
  // Whether the checkpoint carries its own embed_tokens; without, forward() reads the target's.
  bool has_embedding() const { return !own_embed_.empty(); }
  // Target id of each draft id (d2t applied; the identity without d2t).
  std::span<const int32_t> draft_to_target() const { return draft_to_target_; }
  std::unique_ptr<KvCache> make_cache(int num_blocks) const;

  // One row of a forward: new tokens continuing the row's head KV, and which of them return
  // logits and hidden states.
  struct Row {
    KvCache::SeqId seq = 0;
    std::vector<int32_t> tokens;
    std::vector<int32_t> outputs_at;
  };
  struct Output {
    std::vector<float> logits;  // [outputs, draft_vocab], rows in request order
    std::vector<float> hidden;  // [outputs, hidden]: the layer's output before the final norm,
                                // the next chained step's hidden input
  };
  // inputs: f32 [tokens, 3 * target_hidden] fused taps when `fused`, else [tokens, hidden] (the
  // head's own earlier outputs), in host memory or the backend's (there read by the queued calls,
  // in order before anything queued later). `embedding` is the target's table [vocab, hidden],
  // used when the head has none. Each row's KV must be reserved for its new tokens.
  Output forward(std::span<const Row> rows, const Tensor& inputs, bool fused, const Tensor* embedding, KvCache& cache);
  // The same with inputs in host memory.
  Output forward(std::span<const Row> rows, std::span<const float> inputs, bool fused, const Tensor* embedding,
                 KvCache& cache);

 private:
  Eagle3Head(Eagle3Config config, Backend& backend);
  // A copy of host bytes in the backend's memory, kept for the head's lifetime.
  Tensor upload(DType dtype, std::initializer_list<int64_t> shape, const void* bytes);
  void ensure(Buffer& buffer, size_t bytes);

  Eagle3Config config_;
  Backend& backend_;
  std::vector<Buffer> weights_;
  Weight fc_, q_proj_, k_proj_, v_proj_, o_proj_, gate_proj_, up_proj_, down_proj_, lm_head_;
  Tensor hidden_norm_, input_norm_, post_norm_, final_norm_, own_embed_;
  std::vector<int32_t> draft_to_target_;
  Buffer inv_freq_buffer_;
  Tensor inv_freq_;
  float rope_scaling_ = 1.0f;
  float attn_scale_ = 1.0f;
  Buffer meta_, activations_;  // reused across forwards, grown as needed
};

}  // namespace specdec
