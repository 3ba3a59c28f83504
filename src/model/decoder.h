// Decoder: one model family's layers bound to a backend, i.e. what a forward runs between the
// token ids and the final hidden. The runner (runner.h) owns everything around it: the plan,
// the scratch buffers, recordings, the LM head's outputs and the hidden taps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "backend/backend.h"
#include "core/weight.h"
#include "kv/kv_cache.h"
#include "model/scratch.h"

namespace specdec {

// What one pass of a decoder reads and writes, laid out by the runner in backend memory.
struct DecoderPass {
  const Tensor& ids;            // [T] i32 token ids
  const AttentionBatch& batch;  // the ragged batch: positions, KV slots, block tables
  KvCache& cache;               // where the layers' K/V go
  const Tensor& x;              // [T, hidden] f32: the residual stream
  Carver scratch;               // the decoder's own scratch_bytes(T), laid out as it likes
  // Runs after layer i with the residual stream (hidden taps). It makes backend kernel calls
  // only (gathers of the tapped rows), so a recorded pass records them too.
  const std::function<void(int layer, const Tensor& x)>& after_layer;
};

class Decoder {
 public:
  virtual ~Decoder() = default;

  // Bytes of scratch one pass over `tokens` tokens lays out in DecoderPass::scratch.
  virtual size_t scratch_bytes(int64_t tokens) const = 0;
  // x = the embeddings of ids, then every layer over the batch: afterwards x is the residual
  // stream after the last layer and the cache holds the new tokens' K/V. Backend kernel calls
  // only (besides after_layer), so that the runner can record and replay a pass.
  virtual void run(const DecoderPass& pass) = 0;
  // The final norm of `rows` [n, hidden] in place: the LM head's input (and the last tap).
  virtual void final_norm(const Tensor& rows) = 0;
  // The LM head [vocab, hidden] (for a tied model, the embedding table).
  virtual const Weight& lm_head() const = 0;
  // The embedding table [vocab, hidden]: a forward reads only its tokens' rows of it.
  virtual const Tensor& embedding_table() const = 0;
};

}  // namespace specdec
