// `specdec bench --prefix-tokens N`: what the prefix cache saves. A prompt whose first N tokens
// an earlier request computed starts after prefilling only the rest; its time to first token is
// set against the same prompt computed in full on an engine without the cache, and its tokens
// must be the same.
#include <cstdio>

#include "cli/bench_run.h"
#include "cli/bench_suite.h"
#include "cli/require.h"

namespace specdec::cli {

namespace {

constexpr int kSuffixTokens = 16;
constexpr int kNewTokens = 16;

GenerationResult run_one(Engine& engine, std::vector<int32_t> prompt, const SamplingOptions& sampling) {
  RunResult r = run_batch(engine, {std::move(prompt)}, kNewTokens, sampling);
  return r.results.front();
}

}  // namespace

void prefix_bench(const BenchCommand& o, const EngineConfig& config, Engine& uncached, nlohmann::json& report) {
  EngineConfig cached_config = config;
  cached_config.prefix_cache = true;
  cached_config.drafts.clear();
  Engine cached(cached_config);
  const std::string text = suite_text(o.suite);
  std::vector<double> cold, warm, full;
  bool same = true;
  const int repeats = std::max(1, o.repeats);
  for (int i = 0; i < repeats; ++i) {
    // A new prefix each repeat (another offset into the text), so the first request is cold.
    const int offset = 7919 * (i + 1);
    std::vector<int32_t> prefix = synthetic_prompt(uncached, text, o.prefix_tokens, offset);
    auto with_suffix = [&](int at) {
      std::vector<int32_t> p = prefix;
      const auto suffix = synthetic_prompt(uncached, text, kSuffixTokens, at);
      p.insert(p.end(), suffix.begin(), suffix.end());
      return p;
    };
    const std::vector<int32_t> first = with_suffix(offset + 104729), second = with_suffix(offset + 1299709);
    cold.push_back(run_one(cached, first, o.sampling).stats.ttft_seconds);
    const GenerationResult hit = run_one(cached, second, o.sampling);
    const GenerationResult computed = run_one(uncached, second, o.sampling);
    warm.push_back(hit.stats.ttft_seconds);
    full.push_back(computed.stats.ttft_seconds);
    same = same && hit.tokens == computed.tokens;
  }
  const double cold_ms = median(cold) * 1e3, warm_ms = median(warm) * 1e3, full_ms = median(full) * 1e3;
  std::printf("\nprefix cache: %d shared prompt tokens + %d of its own, median of %d\n", o.prefix_tokens,
              kSuffixTokens, repeats);
  std::printf("  TTFT computed in full %.2f ms, first with the cache %.2f ms, sharing the prefix %.2f ms: %.1fx; "
              "same tokens: %s\n",
              full_ms, cold_ms, warm_ms, full_ms / std::max(warm_ms, 1e-6), same ? "yes" : "NO");
  report["prefix_cache"] = {{"prefix_tokens", o.prefix_tokens}, {"suffix_tokens", kSuffixTokens},
                            {"repeats", repeats},           {"full_ttft_ms", full_ms},
                            {"cold_ttft_ms", cold_ms},      {"hit_ttft_ms", warm_ms},
                            {"ttft_speedup", full_ms / std::max(warm_ms, 1e-6)}, {"identical", same}};
}

}  // namespace specdec::cli
