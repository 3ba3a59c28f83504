// Model: a loaded decoder-only transformer (any registered family, see family.h) and its ragged forward.
// One forward runs the "mixed iteration": prefill chunks, single decode tokens and verify windows
// of many sequences together, reading and extending their paged KV.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "kv/kv_cache.h"
#include "model/config.h"
#include "sampling/sample_row.h"

namespace specdec {

struct SequenceInput {
  KvCache::SeqId seq = 0;
  std::vector<int32_t> tokens;     // new tokens, at positions length(seq) .. length(seq)+n-1
  std::vector<int32_t> logits_at;  // indices into tokens whose logits are returned
  // Indices into tokens whose hidden states are tapped (ForwardRequest::tap_layers), apart from
  // the logits: a prefill chunk can tap every position without computing logits there.
  std::vector<int32_t> taps_at = {};
};

struct ForwardRequest {
  std::vector<SequenceInput> rows;
  // Hidden states tapped at every row's taps_at positions: i in [0, L) = residual stream after
  // layer i; L = the final normed hidden (the LM head's input). Gathered by kernel calls inside
  // the forward, so a forward with taps can still be replayed from a recording.
  std::vector<int> tap_layers;
  // Token selection on the backend. Empty: the logits come back. Otherwise one SampleRow per
  // returned row (every row's logits_at, in request order): the logits stay where they were
  // computed, the backend draws each row's token (Backend::sample; greedy rows take the argmax)
  // and only the tokens come back, in ForwardResult::tokens.
  std::vector<SampleRow> sampling = {};  // (the initializer lets brace-initialised requests omit it)
  // Input tokens the host does not know yet: the first from_previous.size() rows have one token
  // each, and row r's is the one the forward launched just before this one drew at its returned
  // row from_previous[r] (Model::launch); the id in rows[r].tokens is not read. The rows after
  // them give their tokens.
  std::vector<int32_t> from_previous = {};
};

struct ForwardResult {
  int vocab = 0;
  int hidden = 0;
  std::vector<float> logits;             // [total logits_at, vocab], rows in request order; empty when sampling
  std::vector<int32_t> tokens;           // [total logits_at] drawn per ForwardRequest::sampling, else empty
  std::vector<int> row_offsets;          // size rows+1: row r's logits rows are [row_offsets[r], row_offsets[r+1])
  // The hidden taps, device-side: per ForwardRequest::tap_layers entry (in that order, also kept
  // in tap_layers here) a [total taps_at, hidden] f32 view in the backend's memory (host memory
  // on the CPU: no copy). Row r's taps are rows [tap_offsets[r], tap_offsets[r+1]), in its
  // taps_at order. The views stay valid until the next forward on this model.
  std::vector<int> tap_layers;
  std::vector<Tensor> taps;
  std::vector<int> tap_offsets;          // size rows+1
  // The forward paid one-off costs: it grew the model's buffers (their first pages fault), or
  // its shape ran call by call for the first time or recorded its replay. Its time is no price
  // of the next forward of that shape.
  bool one_off = false;

  // Logits row i (of the total), vocab floats.
  const float* logits_row(int i) const { return logits.data() + static_cast<size_t>(i) * static_cast<size_t>(vocab); }
};

class ModelRunner;

class Model {
 public:
  // Reads dir/config.json and the safetensors, validated against the family's weight_specs.
  static std::unique_ptr<Model> load(const std::filesystem::path& dir, Backend& backend);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const;
  Backend& backend() const;
  size_t parameter_count() const;
  size_t weight_bytes() const;
  // Bytes of weights one forward over `tokens` tokens reads: every weight once, except an
  // embedding table that is not also the LM head, of which only the tokens' rows are read.
  // The numerator of a decode step's bandwidth figure.
  size_t step_weight_bytes(int tokens) const;
  // Parameters each token of a forward multiplies: every parameter but an embedding table that is
  // not also the LM head (a token reads one of its rows). Twice this is a token's FLOPs in the
  // linears; the norms' few weights are counted with them.
  size_t matmul_parameters() const;
  // A KV cache shaped for this model, with num_blocks blocks of 16 positions.
  std::unique_ptr<KvCache> make_cache(int num_blocks) const;

  // The target's own weights, for draft methods that reuse them instead of holding copies: the
  // embedding table [vocab, hidden] and the LM head [vocab, hidden] (for a tied model, the same
  // memory). Valid as long as the model.
  const Tensor& embedding() const;
  const Weight& lm_head() const;

  // Whether forwards whose every token returns its row (verify windows, one row's or a batch's)
  // are replayed from recordings of their shapes, where other forwards of several tokens a row
  // run call by call (on a GPU, a small model's forward then costs several replayed steps). True
  // until the backend has shown it records nothing.
  bool replays_windows() const;

  // One ragged forward over all rows. Each row's KV must already be reserved for length+n
  // (throws otherwise, before any work). Afterwards length(seq) += n for every row. Input is
  // checked completely before anything is computed: on error the cache is unchanged.
  ForwardResult forward(const ForwardRequest& request, KvCache& cache);

  // The same forward in two halves, so that the host works while the device does: launch
  // checks the request, queues the forward on the backend, advances the cache's lengths and
  // returns; wait returns its results. At most two forwards are launched and not yet waited
  // for, and they are waited for in launch order. Only a forward whose tokens are drawn on the
  // backend (ForwardRequest::sampling) returns from launch before the device has finished it,
  // and only such a forward's tokens can feed the next one (ForwardRequest::from_previous).
  // The hidden taps of a forward are valid until the next launch.
  using Ticket = uint64_t;
  Ticket launch(const ForwardRequest& request, KvCache& cache);
  ForwardResult wait(Ticket ticket);

 private:
  explicit Model(std::unique_ptr<ModelRunner> impl);
  std::unique_ptr<ModelRunner> impl_;
};

}  // namespace specdec
