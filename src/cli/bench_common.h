// What `specdec bench`'s parts share: its options, the prompt suite, engines kept across runs,
// and a run of prompts on one of them (bench.cpp); the replay of the suite (replay_bench.cpp).
#pragma once

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "api/session.h"
#include "sampling/sampling.h"

namespace specdec::cli {

using Clock = std::chrono::steady_clock;

SamplingParams greedy_params();

struct BenchOptions {
  ModelOptions common;
  std::vector<std::string> drafts;
  std::vector<int> batches{1, 4, 8, 16};
  int prompt_tokens = 128;
  int gen_tokens = 64;
  int num_draft = 0;
  int spec_batch = 8;
  std::string suite = std::string(SPECDEC_SOURCE_DIR) + "/bench/prompts.json";
  bool json = false;
  bool skip_plain = false;
  int repeats = 5;
  bool no_adaptive = false;
  bool replay = false;
  double replay_window_cost = 1.0;        // --replay: scale of a window's cost beyond a plain step
  std::vector<double> replay_forward_ms;  // --replay: target forward of 1, 2, ... tokens instead of measured
  // Greedy unless --temperature is given; seeded, so plain and speculative runs draw alike.
  SamplingParams sampling = greedy_params();
};

struct RunResult {
  std::vector<RequestResult> results;
  double wall = 0;
  int generated = 0;
  int prompt_tokens = 0;
  double max_ttft = 0;
  double max_decode = 0;
  int decode_tokens = 0;
};

// An engine kept for every run of one configuration (plain, or one draft method), as a server
// keeps its engine: its KV pool's pages are touched and its cost model has measured this
// machine's forwards before the timed runs, so that no run pays a new engine's page faults or
// calibration rounds (a fresh engine's first prefill measured ~10 ms slower than a warm one's).
// Nothing a request leaves behind carries over to the next: rows, their KV blocks, their draft
// state and their depth policies are made per request.
struct BenchEngine {
  std::unique_ptr<EngineCore> engine;
  std::string method;  // the draft method's name in the engine; empty for plain decoding
};

BenchEngine make_engine(Session& s, int rows, int batch_tokens, const std::string& draft, int num_draft);
// Submits every prompt, runs the engine until all are done; results in submission order.
RunResult run_batch(BenchEngine& e, const std::vector<std::vector<int32_t>>& prompts, int max_tokens,
                    const SamplingParams& sampling, int num_draft, bool adaptive = true);
// `tokens` tokens of `text`, starting `offset` tokens in (wrapping around).
std::vector<int32_t> synthetic_prompt(const Session& s, const std::string& text, int tokens, int offset);

// One prompt of the suite (bench/prompts.json: {"prompts": [{"name", "category", "prompt",
// "max_tokens"}, ...]}).
struct SuitePrompt {
  std::string name, category, text;
  int max_tokens = 0;
};

std::vector<SuitePrompt> load_suite(const std::string& path);
// Every prompt of the suite run together: the text synthetic prompts are cut from.
std::string suite_text(const std::vector<SuitePrompt>& suite);
double median(std::vector<double> v);

// --replay: each suite request's rounds replayed against this machine's measured costs.
void replay_bench(const BenchOptions& o, Session& s, const std::vector<SuitePrompt>& suite, nlohmann::json& report);

}  // namespace specdec::cli
