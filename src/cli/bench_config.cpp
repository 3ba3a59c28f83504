// bench_engine_config (bench_config.h).
#include "cli/bench_config.h"

#include <algorithm>
#include <cstdint>

namespace specdec::cli {

// The engine's limits, raised so that every run of the benchmark prefills all its prompts in its
// first iteration: decode figures then time decode-only iterations, not the prefill of later rows
// mixed into them. The suite's prompts are bounded by their bytes plus a token for a prefix (no
// tokenizer gives more tokens than that), as the engine that would count them is not loaded yet.
EngineConfig bench_engine_config(const BenchCommand& o, const ModelInfo& model) {
  EngineConfig c = o.engine;
  int rows = o.drafts.empty() ? 1 : o.spec_batch, tokens = 1;
  // Without --kv-memory, a cache that holds every row of the largest run at its full length
  // (prompt, new tokens and a partly filled block each; a speculative row also its last window),
  // so that no row waits for blocks: the plain batches, the suite alone and the suite's batch.
  int64_t kv_tokens = 0;
  if (!o.skip_plain) {
    const int max_batch = *std::max_element(o.batches.begin(), o.batches.end());
    rows = std::max(rows, max_batch);
    tokens = std::max(tokens, std::min(max_batch * o.prompt_tokens + 1, 1 << 17));
    kv_tokens = int64_t{max_batch} * (std::min(o.prompt_tokens + o.gen_tokens, model.context_length) + 32);
  }
  if (!o.drafts.empty()) {
    constexpr int kRowMargin = 64;
    const auto row_tokens = [&](const SuitePrompt& p) {
      return std::min(static_cast<int>(p.text.size()) + 3 + p.max_tokens, model.context_length) + kRowMargin;
    };
    int suite_tokens = 1, longest = 1;
    int64_t batch_kv = 0, longest_kv = 0;
    for (int i = 0; i < o.spec_batch; ++i) {
      const SuitePrompt& p = o.suite[static_cast<size_t>(i) % o.suite.size()];
      suite_tokens += static_cast<int>(p.text.size()) + 2;
      batch_kv += row_tokens(p);
    }
    for (const auto& p : o.suite) {
      longest = std::max(longest, static_cast<int>(p.text.size()) + 3);
      longest_kv = std::max<int64_t>(longest_kv, row_tokens(p));
    }
    tokens = std::max({tokens, std::min(suite_tokens, 1 << 17), longest});
    kv_tokens = std::max({kv_tokens, batch_kv, longest_kv});
  }
  if (c.kv_memory_gb == 0) {
    const double kv_elem = c.kv_type == KvCacheType::f32 ? 4 : 2;
    const double per_token = 2.0 * model.num_layers * model.num_kv_heads * model.head_dim * kv_elem;
    const double gib = per_token * static_cast<double>(kv_tokens) / double(1ull << 30) * 1.05;
    // On the host, never below the engine's 1 GiB default; on a GPU, this instead of the
    // engine's default (all free memory), which would only lengthen the start.
    if (c.device != DeviceKind::cpu || gib > 1.0) c.kv_memory_gb = gib;
  }
  c.max_rows = std::max(c.max_rows, rows);
  c.max_batch_tokens = std::max(c.max_batch_tokens, tokens);
  // Timed runs repeat their prompts: each must compute its prompt, not find it cached.
  c.prefix_cache = false;
  return c;
}

}  // namespace specdec::cli
