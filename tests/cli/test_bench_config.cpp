// The engine configuration `specdec bench` runs with: without --kv-memory its KV cache must hold
// the largest run at full length, speculative suite included (on a GPU the cache is sized to the
// benchmark, not to free memory, so a cache sized for the plain rows alone refused the suite's
// longer prompts with "the KV cache cannot hold this request").
#include <gtest/gtest.h>

#include <string>

#include "cli/bench_config.h"

namespace specdec::cli {
namespace {

ModelInfo small_model() {
  ModelInfo m;
  m.num_layers = 8;
  m.num_kv_heads = 2;
  m.head_dim = 64;
  m.context_length = 2048;
  return m;
}

// Bytes of bf16 K and V a position of small_model() holds.
constexpr double kPerToken = 2.0 * 8 * 2 * 64 * 2;

double kv_bytes(const EngineConfig& c) { return c.kv_memory_gb * double(1ull << 30); }

BenchCommand gpu_bench() {
  BenchCommand o;
  o.engine.device = DeviceKind::cuda;
  o.batches = {1};
  o.prompt_tokens = 128;
  o.gen_tokens = 64;
  return o;
}

TEST(BenchConfig, PlainRowsAtFullLength) {
  BenchCommand o = gpu_bench();
  o.batches = {1, 8};
  const EngineConfig c = bench_engine_config(o, small_model());
  EXPECT_GE(kv_bytes(c), 8 * (128 + 64) * kPerToken);
  EXPECT_GE(c.max_rows, 8);
}

TEST(BenchConfig, TheSuitesLongestPromptFitsBesideSmallPlainRuns) {
  BenchCommand o = gpu_bench();
  o.drafts = {"ngram"};
  o.spec_batch = 4;
  // 1,500 bytes and 300 new tokens: at most 1,803 positions, far past the plain rows' 192.
  o.suite = {{"long", "c", std::string(1500, 'x'), 300}, {"short", "c", "def f():", 16}};
  const EngineConfig c = bench_engine_config(o, small_model());
  EXPECT_GE(kv_bytes(c), (1500 + 300) * kPerToken) << "the suite's longest row alone";
  // The suite's batch: two rows of each prompt.
  EXPECT_GE(kv_bytes(c), 2 * (1500 + 300 + 8 + 16) * kPerToken) << "the suite's batch";
  EXPECT_GE(c.max_rows, 4);
  EXPECT_GE(c.max_batch_tokens, 1500);

  // Only the suite (--skip-plain): sized the same way, not left to the engine's default.
  o.skip_plain = true;
  const EngineConfig s = bench_engine_config(o, small_model());
  EXPECT_GE(kv_bytes(s), 2 * (1500 + 300 + 8 + 16) * kPerToken);
}

TEST(BenchConfig, AGivenKvMemoryIsKept) {
  BenchCommand o = gpu_bench();
  o.engine.kv_memory_gb = 0.25;
  o.drafts = {"ngram"};
  o.suite = {{"long", "c", std::string(1500, 'x'), 300}};
  EXPECT_EQ(bench_engine_config(o, small_model()).kv_memory_gb, 0.25);
}

}  // namespace
}  // namespace specdec::cli
