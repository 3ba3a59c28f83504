// `specdec bench`: throughput of plain decoding at several batch sizes against the measured
// memory bandwidth, and (with --draft) the prompt suite plain vs speculative, from one run on one
// Engine (with --replay, the suite replayed instead: replay_bench.cpp).
#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cli/bench_config.h"
#include "cli/bench_run.h"
#include "cli/commands.h"
#include "cli/require.h"

namespace specdec::cli {

RunResult run_batch(Engine& engine, const std::vector<std::vector<int32_t>>& prompts, int max_tokens,
                    const SamplingOptions& sampling, const RunMethod& method) {
  std::vector<GenerationRequest> requests;
  for (const auto& p : prompts) {
    GenerationRequest r;
    r.prompt_tokens = p;
    r.sampling = sampling;
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    r.speculative.draft = method.draft;
    r.speculative.num_draft_tokens = method.num_draft;
    r.speculative.adaptive = method.adaptive;
    r.speculative.mode = method.mode;
    requests.push_back(std::move(r));
  }
  const EngineStats before = engine.stats();
  const auto t0 = Clock::now();
  const std::vector<int64_t> ids = engine.submit_all(std::move(requests));
  RunResult out;
  for (int64_t id : ids) out.results.push_back(engine.wait(id));
  out.wall = std::chrono::duration<double>(Clock::now() - t0).count();
  // The loop publishes its counters just after the iteration that finished the last row.
  EngineStats after = engine.stats();
  while (after.running > 0 || after.waiting > 0) {
    std::this_thread::yield();
    after = engine.stats();
  }
  out.decode_iterations = after.decode_iterations - before.decode_iterations;
  out.iteration_seconds = after.decode_iteration_seconds - before.decode_iteration_seconds;
  out.device_seconds = after.decode_device_seconds - before.decode_device_seconds;
  out.one_off_iterations = after.one_off_iterations - before.one_off_iterations;
  out.one_off_seconds = after.one_off_seconds - before.one_off_seconds;
  for (const GenerationResult& r : out.results) {
    require(r.finish != Finish::error, r.error);
    out.generated += r.stats.generated_tokens;
    out.prompt_tokens += r.stats.prompt_tokens;
    out.max_ttft = std::max(out.max_ttft, r.stats.ttft_seconds);
    out.max_decode = std::max(out.max_decode, r.stats.decode_seconds);
    out.decode_tokens += r.stats.generated_tokens - 1;
  }
  return out;
}

std::vector<int32_t> synthetic_prompt(const Engine& engine, const std::string& text, int tokens, int offset) {
  std::vector<int32_t> all = engine.encode(text, false);
  require(!all.empty(), "empty benchmark text");
  std::vector<int32_t> p;
  for (int i = 0; static_cast<int>(p.size()) < tokens; ++i)
    p.push_back(all[static_cast<size_t>(i + offset) % all.size()]);
  return p;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string describe(const SamplingOptions& p) {
  if (p.temperature.value_or(0) == 0.0f) return "greedy";
  std::ostringstream s;
  s << "temperature " << *p.temperature;
  if (p.top_k.value_or(0) > 0) s << ", top-k " << *p.top_k;
  if (p.top_p.value_or(1) < 1.0f) s << ", top-p " << *p.top_p;
  if (p.min_p.value_or(0) > 0.0f) s << ", min-p " << *p.min_p;
  return s.str();
}

namespace {

// Why a plain-table row's decode rate cannot be measured ("" when it can): every row of the run
// stopped at its first token, so no decode step was timed.
std::string unmeasured_decode(const RunResult& r, const BenchCommand& o, int context) {
  if (r.decode_tokens > 0 && r.max_decode > 0) return {};
  const int room = context - o.prompt_tokens;
  if (room < 2)
    return (std::ostringstream() << "decode not measured: a " << o.prompt_tokens << "-token prompt leaves " << room
                                 << " position(s) of the model's " << context
                                 << "-token context, so each row stops at its first token")
        .str();
  return "decode not measured: every row stopped at its first token";
}

std::string mode_name(const Engine& engine, bool invariant) {
  if (engine.device() != DeviceKind::cuda) return "cpu";
  return invariant ? "invariant" : "fast";
}

// The plain table's rows for one engine (one kernel mode), printed as they are measured.
void plain_rows(const BenchCommand& o, Engine& engine, bool invariant, const MemoryBandwidth& bandwidth,
                nlohmann::json& rows, std::vector<std::string>& notes) {
  const std::string text = suite_text(o.suite);
  const int context = engine.model_info().context_length;
  const std::string mode = mode_name(engine, invariant);
  // Warm-up: every batch size once, so that each has KV pages and scratch buffers of its size.
  for (int b : o.batches) {
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < b; ++i) prompts.push_back(synthetic_prompt(engine, text, o.prompt_tokens, 1000 + i * 37));
    run_batch(engine, prompts, 8, o.sampling);
  }
  for (int b : o.batches) {
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < b; ++i) prompts.push_back(synthetic_prompt(engine, text, o.prompt_tokens, i * 37));
    const EngineStats before = engine.stats();
    RunResult r = run_batch(engine, prompts, o.gen_tokens, o.sampling);
    const EngineStats after = engine.stats();
    // Per decode iteration: its wall time and the host's part of it (the device waits then).
    const int64_t steps = after.decode_iterations - before.decode_iterations;
    const double step_ms = steps > 0 ? 1e3 * (after.decode_iteration_seconds - before.decode_iteration_seconds) / steps : 0;
    const double host_ms =
        steps > 0 ? step_ms - 1e3 * (after.decode_device_seconds - before.decode_device_seconds) / steps : 0;
    const double prefill_tps = r.prompt_tokens / std::max(1e-9, r.max_ttft);
    const std::string why = unmeasured_decode(r, o, context);
    nlohmann::json row = {
        {"mode", mode}, {"batch", b}, {"prefill_tokens_per_s", prefill_tps}, {"ttft_ms", r.max_ttft * 1e3}};
    if (!why.empty()) {
      std::printf("%-10s %6d %14.1f %14s %10.1f %12s %9s %9s %9s\n", mode.c_str(), b, prefill_tps, "-",
                  r.max_ttft * 1e3, "-", "-", "-", "-");
      notes.push_back(mode + ", batch " + std::to_string(b) + ": " + why);
      row["decode_unmeasured"] = why;
    } else {
      const double decode_tps = r.decode_tokens / r.max_decode;
      // bytes one decode step reads: the weights once (of an untied embedding table only the
      // step's rows), plus each row's KV at its mean context
      const int new_tokens = std::min(o.gen_tokens, context - o.prompt_tokens);
      const double mean_ctx = o.prompt_tokens + new_tokens / 2.0;
      const double kv_bytes = double(engine.kv_bytes_per_token()) * mean_ctx * b;
      const double step_bytes = double(engine.step_weight_bytes(b)) + kv_bytes;
      const double fraction = step_bytes * (decode_tps / b) / bandwidth.bytes_per_s;
      // The linears' arithmetic per second of the whole step: each decoded token multiplies every
      // matmul parameter once (attention's own products left out). Where the linears' share of it
      // nears the device's peak, the step is bound by compute and its bandwidth fraction cannot
      // reach 1.
      const double tflops = 2.0 * double(engine.matmul_parameters()) * decode_tps / 1e12;
      std::printf("%-10s %6d %14.1f %14.1f %10.1f %12.2f %9.3f %9.3f %9.3f\n", mode.c_str(), b, prefill_tps, decode_tps,
                  r.max_ttft * 1e3, fraction, tflops, step_ms, host_ms);
      row["decode_tokens_per_s"] = decode_tps;
      row["bytes_per_step"] = step_bytes;
      row["bandwidth_fraction"] = fraction;
      row["matmul_tflops_per_s"] = tflops;
      row["decode_step_ms"] = step_ms;
      row["host_ms_per_step"] = host_ms;
    }
    std::fflush(stdout);
    rows.push_back(std::move(row));
  }
}

// Tokens per second of the decode phase (after each row's first token), over the slowest row.
double decode_rate(const RunResult& r) { return r.decode_tokens / std::max(1e-9, r.max_decode); }

// A decode iteration's time inside the target's forward, and outside it less `draft_seconds` (a
// speculative run's draft calls: what is left is the engine's own work, scheduling, verifying
// and the method's bookkeeping), in microseconds.
double device_us(const RunResult& r) {
  return r.decode_iterations > 0 ? 1e6 * r.device_seconds / double(r.decode_iterations) : 0.0;
}
double host_us(const RunResult& r, double draft_seconds) {
  return r.decode_iterations > 0
             ? 1e6 * (r.iteration_seconds - r.device_seconds - draft_seconds) / double(r.decode_iterations)
             : 0.0;
}

// Plain and speculative runs of the same prompts, and what the speculative one gained.
struct Pair {
  RunResult plain, spec;      // the fastest run of each (their tokens/s columns)
  double speedup = 0;         // whole run: median over the pairs of spec / plain tokens/s
  double decode_speedup = 0;  // decode phase, likewise
  nlohmann::json pairs = nlohmann::json::array();  // each pair's ratios and speculative telemetry
};

// The telemetry of a run's rows, summed: how often they drafted, and what they accepted.
SpeculativeStats run_telemetry(const RunResult& run) {
  SpeculativeStats tel;
  for (const GenerationResult& r : run.results) {
    if (!r.stats.speculative) continue;
    const SpeculativeStats& s = *r.stats.speculative;
    tel.draft = s.draft;
    tel.drafted += s.drafted;
    tel.accepted += s.accepted;
    tel.rounds += s.rounds;
    tel.emitted += s.emitted;
    tel.target_forwards += s.target_forwards;
    tel.draft_seconds += s.draft_seconds;
    tel.verify_seconds += s.verify_seconds;
    for (auto [from, to] : {std::pair{&s.drafted_at, &tel.drafted_at}, std::pair{&s.accepted_at, &tel.accepted_at}}) {
      if (to->size() < from->size()) to->resize(from->size(), 0);
      for (size_t i = 0; i < from->size(); ++i) (*to)[i] += (*from)[i];
    }
  }
  return tel;
}

// Pairs of one plain and one speculative run: o.repeats of them, and more while the runs are
// short. A run of a few tens of milliseconds (a small model on a GPU) moves by several percent
// with the machine, so such runs take pairs until each side has run kMinPairedSeconds, up to
// kMaxPairFactor times o.repeats. The speedup is the median of each pair's ratio: the two runs of
// a pair follow each other, so a machine whose speed drifts (other load) slows both alike, where
// comparing the fastest plain run with the fastest speculative one mixes different minutes. The
// pairs alternate which run goes first, so that what the first leaves behind (warm caches, a
// clock that has risen) favours neither side.
constexpr double kMinPairedSeconds = 0.5;
constexpr int kMaxPairFactor = 4;
constexpr int kUntimedRuns = 3;
// The deepest draft depth the suite's warm-up runs on a GPU: a 16-token window, the widest that
// pads to a power of two (ReplayCache::window_width).
constexpr int kWarmDepths = 15;

Pair measure_pair(Engine& engine, const RunMethod& method, const std::vector<std::vector<int32_t>>& prompts,
                  int max_tokens, const BenchCommand& o) {
  Pair best;
  std::vector<double> whole, decode;
  auto keep = [](const RunResult& r, RunResult& into) {
    if (into.wall == 0 || r.generated / r.wall > into.generated / into.wall) into = r;
  };
  // Untimed runs of each first: a prompt's first runs bring shapes not seen before (windows and
  // draft calls at new context bounds), which a GPU records as graphs and every backend sizes
  // buffers for, once per shape over an engine's life; timed, they would sit in the first pairs
  // and pull the median toward those one-off costs. A shape is recorded on its second run and a
  // window's on its third (ReplayCache::replay_or_run), so one untimed run left the recordings
  // to the first timed pair; three leave the pairs to replay what the prompt's runs repeat.
  for (int warm = 0; warm < kUntimedRuns; ++warm) {
    run_batch(engine, prompts, max_tokens, o.sampling);
    run_batch(engine, prompts, max_tokens, o.sampling, method);
  }
  double paired = 0;  // seconds of the shorter side so far
  for (int rep = 0; rep < o.repeats || (paired < kMinPairedSeconds && rep < kMaxPairFactor * o.repeats); ++rep) {
    RunResult plain, spec;
    if (rep % 2 == 0) {
      plain = run_batch(engine, prompts, max_tokens, o.sampling);
      spec = run_batch(engine, prompts, max_tokens, o.sampling, method);
    } else {
      spec = run_batch(engine, prompts, max_tokens, o.sampling, method);
      plain = run_batch(engine, prompts, max_tokens, o.sampling);
    }
    paired += std::min(plain.wall, spec.wall);
    whole.push_back((spec.generated / spec.wall) / (plain.generated / plain.wall));
    decode.push_back(decode_rate(spec) / decode_rate(plain));
    const SpeculativeStats tel = run_telemetry(spec);
    best.pairs.push_back({{"speedup", whole.back()},
                          {"decode_speedup", decode.back()},
                          {"plain_ms", plain.wall * 1e3},
                          {"spec_ms", spec.wall * 1e3},
                          {"rounds", tel.rounds},
                          {"drafting_rounds", tel.drafted_at.empty() ? 0 : tel.drafted_at[0]},
                          {"drafted", tel.drafted},
                          {"accepted", tel.accepted},
                          {"draft_ms", tel.draft_seconds * 1e3},
                          {"verify_ms", tel.verify_seconds * 1e3},
                          {"plain_iterations", plain.decode_iterations},
                          {"spec_iterations", spec.decode_iterations},
                          {"plain_host_us", host_us(plain, 0)},
                          {"spec_host_us", host_us(spec, tel.draft_seconds)},
                          {"plain_device_us", device_us(plain)},
                          {"spec_device_us", device_us(spec)},
                          {"plain_one_off_iterations", plain.one_off_iterations},
                          {"spec_one_off_iterations", spec.one_off_iterations},
                          {"spec_one_off_ms", spec.one_off_seconds * 1e3}});
    keep(plain, best.plain);
    keep(spec, best.spec);
  }
  best.speedup = median(whole);
  best.decode_speedup = median(decode);
  return best;
}

// The spread of a Pair's decode ratios and each pair's figures, for the JSON report.
nlohmann::json pair_spread(const Pair& m) {
  double lo = 0, hi = 0;
  for (const auto& p : m.pairs) {
    const double r = p["decode_speedup"].get<double>();
    lo = lo == 0 ? r : std::min(lo, r);
    hi = std::max(hi, r);
  }
  return {{"decode_speedup_min", lo}, {"decode_speedup_max", hi}, {"pairs", m.pairs}};
}

// Warm-up, on text the suite's prompts do not start with: one row, then a full batch, plain and
// speculative (the engine's cost model measures its forwards and drafts here).
void warm_up_suite(const BenchCommand& o, Engine& engine, const RunMethod& method) {
  const std::string text = suite_text(o.suite);
  const std::vector<int32_t> one = synthetic_prompt(engine, text, 96, 7);
  for (const RunMethod& m : {RunMethod{}, method}) {
    run_batch(engine, {one}, 64, o.sampling, m);
    std::vector<std::vector<int32_t>> rows;
    for (int i = 0; i < o.spec_batch; ++i) rows.push_back(synthetic_prompt(engine, text, 96, 7 + 131 * i));
    run_batch(engine, rows, 32, o.sampling, m);
  }
  // The GPU runs a verify window's shape (its width, padded to a power of two) call by call
  // twice, then records it, and replays the recording from then on. A width the depth policy
  // first picks inside a timed pair would put those three forwards' one-off costs into that pair
  // alone, and the adaptive runs above need not have picked every width. One run at the deepest
  // depth of each padded width records them all, as a server's first requests do once.
  if (engine.device() != DeviceKind::cuda || !method.adaptive) return;
  for (int depth = 1; depth <= kWarmDepths; depth = 2 * depth + 1) {
    RunMethod fixed = method;
    fixed.num_draft = depth;
    fixed.adaptive = false;
    run_batch(engine, {one}, 64, o.sampling, fixed);
  }
}

// The pairs' lowest and highest generation speedups, for the table: how far one pair strays.
std::string pair_range(const Pair& m) {
  const nlohmann::json spread = pair_spread(m);
  char text[32];
  std::snprintf(text, sizeof text, "%.2f-%.2f", spread["decode_speedup_min"].get<double>(),
                spread["decode_speedup_max"].get<double>());
  return text;
}

nlohmann::json prompt_row(const SuitePrompt& sp, const Pair& m) {
  const RunResult& plain = m.plain;
  const RunResult& spec = m.spec;
  const double pt = plain.generated / plain.wall, st = spec.generated / spec.wall;
  const double pd = decode_rate(plain), sd = decode_rate(spec);
  const SpeculativeStats tel = spec.results[0].stats.speculative.value_or(SpeculativeStats{});
  const bool same = plain.results[0].tokens == spec.results[0].tokens;
  std::printf("%-18s %-16s %9.1f %10.1f %10.1f %7.2fx %11s %7.2fx %8.2f %8.2f %5s\n", sp.name.c_str(),
              sp.category.c_str(), plain.max_ttft * 1e3, pd, sd, m.decode_speedup, pair_range(m).c_str(), m.speedup,
              tel.acceptance_rate(), tel.mean_accepted_length(), same ? "yes" : "NO");
  return {{"prompt", sp.name},
          {"category", sp.category},
          {"plain_tokens_per_s", pt},
          {"spec_tokens_per_s", st},
          {"speedup", m.speedup},
          {"plain_decode_tokens_per_s", pd},
          {"spec_decode_tokens_per_s", sd},
          {"decode_speedup", m.decode_speedup},
          {"plain_ttft_ms", plain.max_ttft * 1e3},
          {"spec_ttft_ms", spec.max_ttft * 1e3},
          {"identical", same},
          {"telemetry", nlohmann::json::parse(tel.to_json())},
          {"spread", pair_spread(m)}};
}

nlohmann::json spec_method_bench(const BenchCommand& o, Engine& engine, const std::string& draft, size_t index) {
  const RunMethod method{draft_id(o.engine.drafts.at(index)), o.num_draft, o.adaptive, o.mode};
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& p : o.suite) prompts.push_back(engine.encode(p.text, false));
  std::vector<std::vector<int32_t>> batch;
  int max_len = 0;
  for (int i = 0; i < o.spec_batch; ++i) {
    const size_t p = static_cast<size_t>(i) % prompts.size();
    batch.push_back(prompts[p]);
    max_len = std::max(max_len, o.suite[p].max_tokens);
  }
  warm_up_suite(o, engine, method);
  std::printf("\nspeculative: %s, batch 1, %s%s, %s\n", draft.c_str(), describe(o.sampling).c_str(),
              o.mode == VerifyMode::rejection ? ", rejection sampling (outputs need not equal plain)" : "",
              engine.device_name().c_str());
  // Generation tokens/s (after each row's first token), as the plain table's decode tok/s and
  // as other servers report their generation rate: what speculation speeds up. TTFT (the
  // prefill, the same work in both runs) beside it, the range of the pairs' speedups (so that a
  // figure within the machine's noise reads as such), and the speedup of the whole request,
  // prefill included.
  std::printf("%-18s %-16s %9s %10s %10s %8s %11s %8s %8s %8s %5s\n", "prompt", "category", "TTFT ms", "plain t/s",
              "spec t/s", "speedup", "pairs", "whole", "accept", "mean len", "same");
  nlohmann::json per_prompt = nlohmann::json::array();
  for (size_t i = 0; i < prompts.size(); ++i)
    per_prompt.push_back(prompt_row(o.suite[i], measure_pair(engine, method, {prompts[i]}, o.suite[i].max_tokens, o)));
  const Pair m = measure_pair(engine, method, batch, max_len, o);
  const double pt = m.plain.generated / m.plain.wall, st = m.spec.generated / m.spec.wall;
  bool same = true;
  for (size_t i = 0; i < batch.size(); ++i) same = same && m.plain.results[i].tokens == m.spec.results[i].tokens;
  // The batch's rows' telemetry summed: how often its rows drafted, and what they accepted.
  const SpeculativeStats tel = run_telemetry(m.spec);
  const std::string label = "batch " + std::to_string(o.spec_batch);
  std::printf("%-18s %-16s %9.1f %10.1f %10.1f %7.2fx %11s %7.2fx %8.2f %8.2f %5s\n", label.c_str(), "all",
              m.plain.max_ttft * 1e3, decode_rate(m.plain), decode_rate(m.spec), m.decode_speedup,
              pair_range(m).c_str(), m.speedup, tel.acceptance_rate(), tel.mean_accepted_length(), same ? "yes" : "NO");
  return {{"method", draft},
          {"verify", o.mode == VerifyMode::rejection ? "rejection" : "exact"},
          {"batch1", per_prompt},
          {"batch",
           {{"rows", o.spec_batch},
            {"plain_tokens_per_s", pt},
            {"spec_tokens_per_s", st},
            {"speedup", m.speedup},
            {"decode_speedup", m.decode_speedup},
            {"identical", same},
            {"telemetry", nlohmann::json::parse(tel.to_json())},
            {"spread", pair_spread(m)}}}};
}

// The plain table's kernel modes: --modes, or the one --fast-gpu chose.
std::vector<bool> invariant_modes(const BenchCommand& o) {
  if (o.modes.empty()) return {o.engine.batch_invariant};
  std::vector<bool> out;
  for (const std::string& m : o.modes) out.push_back(m == "invariant");
  return out;
}

}  // namespace

void run_bench(const BenchCommand& o) {
  // The model's shape and context from its files, before any engine is loaded: a prompt the
  // context cannot hold fails here, at once.
  const ModelInfo model = inspect_model(o.engine.model_dir);
  if (!o.skip_plain)
    require(o.prompt_tokens < model.context_length, "--prompt-tokens ", o.prompt_tokens,
            " does not fit the model's context of ", model.context_length, " tokens (at most ",
            model.context_length - 1, ": the first new token needs a position)");
  const std::vector<bool> modes = invariant_modes(o);
  nlohmann::json report;
  report["model"] = o.engine.model_dir;
  nlohmann::json rows = nlohmann::json::array();
  std::vector<std::string> notes;  // KV and bandwidth lines first, then rows whose decode was not measured
  size_t bandwidth_lines = 0;
  for (size_t i = 0; i < modes.size(); ++i) {
    if (o.skip_plain && i + 1 < modes.size()) continue;
    EngineConfig config = bench_engine_config(o, model);
    config.batch_invariant = modes[i];
    Engine engine(config);  // one engine at a time: the previous one's device memory is freed
    // The CPU has one kernel mode: a second engine would measure the same again.
    const bool last = i + 1 == modes.size() || engine.device() != DeviceKind::cuda;
    const KvCapacity kv = engine.kv_capacity();
    const int context = std::min(o.prompt_tokens + o.gen_tokens, model.context_length);
    char kv_line[256];
    std::snprintf(kv_line, sizeof kv_line,
                  "KV cache (%s): %d blocks of %d positions, %lld tokens, %.2f GB: %lld rows at %d positions",
                  mode_name(engine, modes[i]).c_str(), kv.blocks, kv.block_size, static_cast<long long>(kv.tokens),
                  kv.bytes / 1e9, static_cast<long long>(kv.rows_at(context)), context);
    // Under the plain table with the bandwidth lines (so that the modes' rows stay one table).
    if (o.skip_plain) {
      std::printf("%s\n", kv_line);
    } else {
      notes.insert(notes.begin() + static_cast<std::ptrdiff_t>(bandwidth_lines++), kv_line);
    }
    report["kv_cache"] = {{"blocks", kv.blocks},
                          {"block_size", kv.block_size},
                          {"tokens", kv.tokens},
                          {"bytes", kv.bytes},
                          {"rows_at_context", kv.rows_at(context)},
                          {"context", context}};
    if (!o.skip_plain) {
      const MemoryBandwidth bandwidth = engine.measure_memory_bandwidth();
      if (i == 0) {
        std::printf("\nplain decoding, %s, prompt %d tokens, %d new tokens, %s\n", engine.device_name().c_str(),
                    o.prompt_tokens, o.gen_tokens, describe(o.sampling).c_str());
        std::printf("%-10s %6s %14s %14s %10s %12s %9s %9s %9s\n", "mode", "batch", "prefill tok/s", "decode tok/s",
                    "TTFT ms", "BW fraction", "TFLOP/s", "step ms", "host ms");
      }
      plain_rows(o, engine, modes[i], bandwidth, rows, notes);
      const bool gpu = engine.device() == DeviceKind::cuda;
      char line[256];
      std::snprintf(line, sizeof line,
                    "%s: measured %s bandwidth %.1f GB/s; weights %.1f MB, read per batch-1 step %.1f MB",
                    mode_name(engine, modes[i]).c_str(), gpu ? "device copy" : "host read", bandwidth.bytes_per_s / 1e9,
                    engine.model_info().weight_bytes / 1e6, engine.step_weight_bytes(1) / 1e6);
      notes.insert(notes.begin() + static_cast<std::ptrdiff_t>(bandwidth_lines++), line);
      nlohmann::json& plain = report["plain"];
      plain["device"] = engine.device_name();
      plain["sampling"] = describe(o.sampling);
      plain["bandwidth_bytes_per_s"] = bandwidth.bytes_per_s;
      plain["bandwidth_kind"] = bandwidth.kind;
      plain["weight_bytes"] = engine.model_info().weight_bytes;
      plain["prompt_tokens"] = o.prompt_tokens;
      plain["new_tokens"] = o.gen_tokens;
      if (last) {
        for (const std::string& n : notes) std::printf("%s\n", n.c_str());
        plain["rows"] = rows;
      }
    }
    if (!last) continue;
    if (!o.drafts.empty()) {
      if (o.replay) {
        replay_bench(o, engine, report);
      } else {
        nlohmann::json methods = nlohmann::json::array();
        for (size_t d = 0; d < o.drafts.size(); ++d) methods.push_back(spec_method_bench(o, engine, o.drafts[d], d));
        report["speculative"] = methods;
      }
    }
    if (o.prefix_tokens > 0) prefix_bench(o, config, engine, report);
    break;
  }
  if (o.json) std::cout << report.dump() << std::endl;
}

}  // namespace specdec::cli
