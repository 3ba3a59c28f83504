// What `specdec bench`'s parts share: a run of prompts on the one Engine of the benchmark, its
// figures, and prompts cut from the suite's text.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/options.h"

namespace specdec::cli {

using Clock = std::chrono::steady_clock;

struct RunResult {
  std::vector<GenerationResult> results;
  double wall = 0;
  int generated = 0;
  int prompt_tokens = 0;
  double max_ttft = 0;
  double max_decode = 0;
  int decode_tokens = 0;
  // The engine's decode iterations during the run (EngineStats), their wall seconds and the
  // seconds the target's forward held the device: the rest is the host's share.
  int64_t decode_iterations = 0;
  double iteration_seconds = 0, device_seconds = 0;
  // Decode iterations whose forward paid one-off costs (EngineStats::one_off_iterations) and
  // their wall seconds: not in the three figures above, but in the run's wall time.
  int64_t one_off_iterations = 0;
  double one_off_seconds = 0;
};

// The method a run speculates with ("" = plain decoding) and how.
struct RunMethod {
  std::string draft;
  int num_draft = 0;
  bool adaptive = true;
  VerifyMode mode = VerifyMode::exact;
};

// Submits every prompt at once, waits for all; results in submission order.
RunResult run_batch(Engine& engine, const std::vector<std::vector<int32_t>>& prompts, int max_tokens,
                    const SamplingOptions& sampling, const RunMethod& method = {});
// "greedy", or the temperature and the filters that are on.
std::string describe(const SamplingOptions& p);
// `tokens` tokens of `text`, starting `offset` tokens in (wrapping around).
std::vector<int32_t> synthetic_prompt(const Engine& engine, const std::string& text, int tokens, int offset);
double median(std::vector<double> v);

// --replay: each suite request's rounds replayed against this machine's measured costs.
void replay_bench(const BenchCommand& o, Engine& engine, nlohmann::json& report);
// --prefix-tokens: time to first token with and without the prefix cache (bench_prefix.cpp).
// `uncached` runs with `config` and the prefix cache off; a second engine with it on is made here.
void prefix_bench(const BenchCommand& o, const EngineConfig& config, Engine& uncached, nlohmann::json& report);

}  // namespace specdec::cli
