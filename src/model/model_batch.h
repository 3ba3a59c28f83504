// ForwardPlan: a ForwardRequest checked against the cache and the config, laid out host-side as
// the flat i32 arrays one forward needs (token ids, positions, KV slots, the AttentionBatch
// tables, the rows whose logits are returned). Built before any work, so bad input changes nothing.
#pragma once

#include <cstdint>
#include <vector>

#include "kv/kv_cache.h"
#include "model/config.h"
#include "model/model.h"

namespace specdec {

struct ForwardPlan {
  int rows = 0;
  int tokens = 0;        // T: new tokens of all rows
  int outputs = 0;       // total logits_at entries
  int taps = 0;          // total taps_at entries
  int max_blocks = 0;    // block_table row width
  int block_size = 16;
  int max_row_len = 0;
  int max_row_tokens = 0;
  std::vector<int32_t> ids;          // [T]
  std::vector<int32_t> positions;    // [T]
  std::vector<int32_t> slots;        // [T]
  std::vector<int32_t> row_starts;   // [R + 1]
  std::vector<int32_t> row_lens;     // [R]: cache length after this forward
  std::vector<int32_t> block_table;  // [R, max_blocks], padded with block 0 (never read)
  std::vector<int32_t> out_index;    // [outputs]: token index (into T) of each returned row
  std::vector<int> row_offsets;      // [R + 1] into out_index
  std::vector<int32_t> tap_index;    // [taps]: token index (into T) of each tapped row
  std::vector<int> tap_offsets;      // [R + 1] into tap_index
  // The first rows' inputs, one token each: the previous forward's returned row whose drawn token
  // is row r's (ForwardRequest::from_previous); the gather overwrites their ids.
  std::vector<int32_t> from_previous;
};

// Checks the request: at least one row; no row without tokens; no sequence twice; token ids in
// [0, vocab); logits_at and taps_at inside the row (taps_at only with tap layers); the sequence fits max_position; KV
// reserved for length + n; tap layers in [0, num_layers]; the cache shaped for this model; no sampling rows or one
// valid SampleRow per returned row; from_previous no longer than the rows, each a non-negative index for a row of one
// token. Throws Error naming the row and the limit.
ForwardPlan plan_forward(const ForwardRequest& request, const KvCache& cache, const ModelConfig& config);

}  // namespace specdec
