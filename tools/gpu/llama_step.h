// A Llama-3.1-8B-shaped forward made of the backend's real kernel sequence, with random bf16
// weights, for the kernel benchmarks: decode steps (B rows, one token each, at a given context)
// and a one-row prefill. Also counts the bytes and FLOPs one step needs, for the roofline.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "backend/backend.h"

namespace specdec::bench {

struct Shape {
  int hidden = 4096, intermediate = 14336, heads = 32, kv_heads = 8, head_dim = 128, vocab = 128256, layers = 32;
  int block_size = 16;
  int64_t layer_params() const {
    const int64_t h = hidden, q = int64_t{heads} * head_dim, kv = int64_t{kv_heads} * head_dim;
    return h * q + 2 * h * kv + q * h + 3 * h * intermediate;
  }
  int64_t linear_params() const { return layer_params() * layers + int64_t{vocab} * hidden; }
};

// All weights of the model (bf16) and per-layer KV pools (bf16), on one CUDA backend's device.
// They are plain device buffers, so a second backend on the same device may use them after a
// synchronize().
struct Weights {
  struct Layer {
    Buffer ln1, ln2, q, k, v, o, gate, up, down;
  };
  std::vector<Layer> layers;
  Buffer embed, norm, lm_head;
  std::vector<Buffer> k_pools, v_pools;
  int pool_blocks = 0;
};

Weights make_weights(Backend& be, const Shape& s, int pool_blocks);

// What one step reads and computes, counted from the shapes (see docs/perf-notes.md).
struct StepCost {
  double weight_bytes = 0, kv_bytes = 0, activation_bytes = 0, flops = 0;
  double bytes() const { return weight_bytes + kv_bytes + activation_bytes; }
};
StepCost decode_cost(const Shape& s, int batch, int context);
StepCost prefill_cost(const Shape& s, int tokens);

// Enqueues one forward on `be`: `rows` rows each bringing `tokens_per_row` new tokens, whose
// caches end at `context` positions (new tokens included). Logits only for each row's last token.
// Allocates its activations and batch tensors up front (Prepared), so repeats time only kernels.
class Step {
 public:
  struct Op {
    const char* name;
    std::function<void()> run;
  };
  Step(Backend& be, const Shape& s, Weights& w, int rows, int tokens_per_row, int context);
  void run();
  // The kernels of layer l, in order, each callable alone (for per-kernel timing), and the head.
  std::vector<Op> layer_ops(int l);
  std::vector<Op> head_ops();

 private:
  Backend& be_;
  Shape s_;
  Weights& w_;
  int rows_, tokens_;
  std::vector<Buffer> owned_;
  AttentionBatch batch_;
  Tensor ids_, x_, h_, q_, k_, v_, attn_, gate_, last_idx_, last_, logits_, next_, inv_freq_;
};

}  // namespace specdec::bench
