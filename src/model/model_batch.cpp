// plan_forward: validation of a ragged forward request and its host-side layout.
// Positions continue each sequence's cache; slots come from the sequence's block table.
#include "model/model_batch.h"

#include <algorithm>
#include <unordered_set>

#include "core/error.h"
#include "sampling/sampling.h"

namespace specdec {

namespace {

void check_cache_shape(const KvCache& cache, const ModelConfig& config) {
  SPECDEC_CHECK(cache.num_layers() == config.num_layers && cache.kv_heads() == config.num_kv_heads &&
                    cache.head_dim() == config.head_dim,
                "KV cache shaped for ", cache.num_layers(), " layers x ", cache.kv_heads(), " kv heads x head_dim ",
                cache.head_dim(), " does not fit the model's ", config.num_layers, " x ", config.num_kv_heads, " x ",
                config.head_dim);
}

}  // namespace

ForwardPlan plan_forward(const ForwardRequest& request, const KvCache& cache, const ModelConfig& config) {
  check_cache_shape(cache, config);
  SPECDEC_CHECK(!request.rows.empty(), "forward request has no rows");
  for (int layer : request.tap_layers)
    SPECDEC_CHECK(layer >= 0 && layer <= config.num_layers, "tap layer ", layer, " outside [0, ", config.num_layers,
                  "] (", config.num_layers, " = final normed hidden)");

  ForwardPlan plan;
  plan.rows = static_cast<int>(request.rows.size());
  plan.block_size = cache.block_size();
  std::unordered_set<KvCache::SeqId> seen;
  for (size_t r = 0; r < request.rows.size(); ++r) {
    const SequenceInput& row = request.rows[r];
    SPECDEC_CHECK(cache.contains(row.seq), "forward row ", r, ": unknown KV sequence id ", row.seq);
    SPECDEC_CHECK(seen.insert(row.seq).second, "forward row ", r, ": sequence ", row.seq,
                  " appears twice in one request");
    const int n = static_cast<int>(row.tokens.size());
    SPECDEC_CHECK(n > 0, "forward row ", r, " (sequence ", row.seq, ") has no tokens");
    const int start = cache.length(row.seq);
    const int64_t end = static_cast<int64_t>(start) + n;
    SPECDEC_CHECK(end <= config.max_position, "forward row ", r, ": the sequence is longer than the context: ", end,
                  " positions > max_position_embeddings ", config.max_position);
    SPECDEC_CHECK(end <= cache.capacity(row.seq), "forward row ", r, ": KV of sequence ", row.seq,
                  " is reserved for ", cache.capacity(row.seq), " positions but needs ", end,
                  " (call KvCache::reserve first)");
    for (int i = 0; i < n; ++i) {
      const int32_t id = row.tokens[static_cast<size_t>(i)];
      SPECDEC_CHECK(id >= 0 && id < config.vocab_size, "forward row ", r, ": token id ", id, " at index ", i,
                    " outside the vocabulary [0, ", config.vocab_size, ")");
    }
    for (int32_t at : row.logits_at)
      SPECDEC_CHECK(at >= 0 && at < n, "forward row ", r, ": logits_at index ", at, " outside its ", n, " tokens");
    for (int32_t at : row.taps_at)
      SPECDEC_CHECK(at >= 0 && at < n, "forward row ", r, ": taps_at index ", at, " outside its ", n, " tokens");
    SPECDEC_CHECK(row.taps_at.empty() || !request.tap_layers.empty(), "forward row ", r,
                  ": taps_at positions given but the request names no tap layers");
    plan.max_row_tokens = std::max(plan.max_row_tokens, n);
    plan.max_row_len = std::max(plan.max_row_len, static_cast<int>(end));
    plan.max_blocks = std::max(plan.max_blocks, (static_cast<int>(end) + plan.block_size - 1) / plan.block_size);
    plan.tokens += n;
    plan.outputs += static_cast<int>(row.logits_at.size());
    plan.taps += static_cast<int>(row.taps_at.size());
  }

  SPECDEC_CHECK(request.sampling.empty() || request.sampling.size() == static_cast<size_t>(plan.outputs),
                "forward request: ", request.sampling.size(), " sampling rows for ", plan.outputs,
                " returned rows (one each, or none for logits)");
  for (size_t i = 0; i < request.sampling.size(); ++i) {
    try {
      validate(request.sampling[i]);
    } catch (const Error& e) {
      fail("forward request: sampling row ", i, ": ", e.what());
    }
  }

  SPECDEC_CHECK(request.from_previous.size() <= request.rows.size(), "forward request: ", request.from_previous.size(),
                " rows take the previous forward's tokens, of ", request.rows.size());
  for (size_t r = 0; r < request.from_previous.size(); ++r) {
    SPECDEC_CHECK(request.rows[r].tokens.size() == 1, "forward row ", r,
                  ": a row that takes the previous forward's token has one token, not ", request.rows[r].tokens.size());
    SPECDEC_CHECK(request.from_previous[r] >= 0, "forward row ", r, ": previous forward's row ",
                  request.from_previous[r], " is negative");
  }
  plan.from_previous = request.from_previous;

  const size_t T = static_cast<size_t>(plan.tokens);
  const size_t R = static_cast<size_t>(plan.rows);
  plan.ids.reserve(T);
  plan.positions.reserve(T);
  plan.slots.reserve(T);
  plan.row_starts.reserve(R + 1);
  plan.row_lens.reserve(R);
  plan.block_table.assign(R * static_cast<size_t>(plan.max_blocks), 0);
  plan.out_index.reserve(static_cast<size_t>(plan.outputs));
  plan.row_offsets.reserve(R + 1);
  plan.tap_index.reserve(static_cast<size_t>(plan.taps));
  plan.tap_offsets.reserve(R + 1);
  plan.row_starts.push_back(0);
  plan.row_offsets.push_back(0);
  plan.tap_offsets.push_back(0);
  for (size_t r = 0; r < R; ++r) {
    const SequenceInput& row = request.rows[r];
    const std::vector<int32_t>& table = cache.block_table(row.seq);
    const int start = cache.length(row.seq);
    const int n = static_cast<int>(row.tokens.size());
    const int token_base = plan.row_starts.back();
    for (int i = 0; i < n; ++i) {
      const int pos = start + i;
      plan.ids.push_back(row.tokens[static_cast<size_t>(i)]);
      plan.positions.push_back(pos);
      plan.slots.push_back(table[static_cast<size_t>(pos / plan.block_size)] * plan.block_size +
                           pos % plan.block_size);
    }
    const int used_blocks = (start + n + plan.block_size - 1) / plan.block_size;
    std::copy_n(table.begin(), used_blocks, plan.block_table.begin() + static_cast<std::ptrdiff_t>(r) * plan.max_blocks);
    for (int32_t at : row.logits_at) plan.out_index.push_back(token_base + at);
    plan.row_starts.push_back(token_base + n);
    plan.row_lens.push_back(start + n);
    plan.row_offsets.push_back(static_cast<int>(plan.out_index.size()));
    for (int32_t at : row.taps_at) plan.tap_index.push_back(token_base + at);
    plan.tap_offsets.push_back(static_cast<int>(plan.tap_index.size()));
  }
  return plan;
}

}  // namespace specdec
