// `specdec bench`: throughput of plain decoding at several batch sizes against the measured
// memory bandwidth, and (with --draft) the prompt suite plain vs speculative, from one run (with
// --replay, the suite replayed instead: replay_bench.cpp).
#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>

#include "api/session.h"
#include "cli/bench_common.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace specdec::cli {

SamplingParams greedy_params() {
  SamplingParams p;
  p.temperature = 0.0f;
  return p;
}

BenchEngine make_engine(Session& s, int rows, int batch_tokens, const std::string& draft, int num_draft) {
  EngineOptions options = s.engine;
  options.max_rows = std::max(options.max_rows, rows);
  // Every prompt of a run is prefilled in its first iteration, so that decode figures time
  // decode-only iterations and not the prefill of later rows mixed into them.
  options.max_batch_tokens = std::max(options.max_batch_tokens, std::min(batch_tokens, 1 << 17));
  BenchEngine e;
  e.engine = std::make_unique<EngineCore>(*s.model, *s.tokenizer, options);
  if (!draft.empty()) e.method = add_draft_method(*e.engine, s, draft, num_draft);
  return e;
}

RunResult run_batch(BenchEngine& e, const std::vector<std::vector<int32_t>>& prompts, int max_tokens,
                    const SamplingParams& sampling, int num_draft, bool adaptive) {
  EngineCore& engine = *e.engine;
  std::vector<int64_t> ids;
  const auto t0 = Clock::now();
  for (const auto& p : prompts) {
    Request r;
    r.prompt = p;
    r.sampling = sampling;
    r.stop.max_tokens = max_tokens;
    r.stop.ignore_eos = true;
    r.spec.method = e.method;
    r.spec.max_depth = num_draft;
    r.spec.adaptive = adaptive;
    ids.push_back(engine.submit(std::move(r)));
  }
  engine.run();
  RunResult out;
  out.wall = std::chrono::duration<double>(Clock::now() - t0).count();
  for (int64_t id : ids) {
    RequestResult r = *engine.take_result(id);
    SPECDEC_CHECK(r.finish != FinishReason::error, r.error);
    out.generated += r.stats.generated_tokens;
    out.prompt_tokens += r.stats.prompt_tokens;
    out.max_ttft = std::max(out.max_ttft, r.stats.ttft_seconds);
    out.max_decode = std::max(out.max_decode, r.stats.decode_seconds);
    out.decode_tokens += r.stats.generated_tokens - 1;
    out.results.push_back(std::move(r));
  }
  return out;
}

std::vector<int32_t> synthetic_prompt(const Session& s, const std::string& text, int tokens, int offset) {
  std::vector<int32_t> all = s.tokenizer->encode(text, false);
  SPECDEC_CHECK(!all.empty(), "empty benchmark text");
  std::vector<int32_t> p;
  for (int i = 0; static_cast<int>(p.size()) < tokens; ++i)
    p.push_back(all[static_cast<size_t>(i + offset) % all.size()]);
  return p;
}

std::vector<SuitePrompt> load_suite(const std::string& path) {
  nlohmann::json suite;
  try {
    suite = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    throw Error(str_cat("bench suite ", path, " is not valid JSON: ", e.what()));
  }
  SPECDEC_CHECK(
      suite.is_object() && suite.contains("prompts") && suite["prompts"].is_array() && !suite["prompts"].empty(),
      "bench suite ", path, " must be an object with a non-empty \"prompts\" array");
  std::vector<SuitePrompt> prompts;
  for (const auto& p : suite["prompts"]) {
    const std::string at = str_cat("bench suite ", path, ": prompt ", prompts.size());
    SPECDEC_CHECK(p.is_object(), at, " is not an object");
    for (const char* key : {"name", "category", "prompt"})
      SPECDEC_CHECK(p.contains(key) && p[key].is_string(), at, " needs a string \"", key, "\"");
    SPECDEC_CHECK(p.contains("max_tokens") && p["max_tokens"].is_number_integer(), at,
                  " needs an integer \"max_tokens\"");
    SuitePrompt sp{p["name"], p["category"], p["prompt"], p["max_tokens"].get<int>()};
    SPECDEC_CHECK(!sp.text.empty(), at, " (", sp.name, ") has an empty prompt");
    SPECDEC_CHECK(sp.max_tokens >= 2, at, " (", sp.name, "): max_tokens must be at least 2, got ", sp.max_tokens);
    prompts.push_back(std::move(sp));
  }
  return prompts;
}

// Every prompt of the suite run together: the text synthetic prompts are cut from.
std::string suite_text(const std::vector<SuitePrompt>& suite) {
  std::string text;
  for (const auto& p : suite) text += p.text;
  return text;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

namespace {

// Read bandwidth of host memory: every thread sums its slice of a large buffer; best of 5.
double measure_host_bandwidth(size_t threads) {
  const size_t bytes = size_t(1) << 30;
  Buffer buf = Buffer::host(bytes);
  auto* words = static_cast<uint64_t*>(buf.data());
  const size_t n = bytes / sizeof(uint64_t);
  ThreadPool pool(threads);
  pool.parallel_for(n, 4096, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) words[i] = i * 0x9e3779b97f4a7c15ull;
  });
  double best = 0;
  std::vector<uint64_t> sinks(pool.size() * 8, 0);
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    pool.parallel_for(n, 4096, [&](size_t b, size_t e) {
      uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
      size_t i = b;
      for (; i + 4 <= e; i += 4) {
        a0 += words[i];
        a1 += words[i + 1];
        a2 += words[i + 2];
        a3 += words[i + 3];
      }
      for (; i < e; ++i) a0 += words[i];
      sinks[(b / 4096) % sinks.size()] += a0 ^ a1 ^ a2 ^ a3;
    });
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, bytes / s);
  }
  volatile uint64_t keep = 0;
  for (uint64_t v : sinks) keep = keep + v;
  return best;
}

// Device-to-device copy bandwidth (bytes read + bytes written per second); best of 10.
double measure_device_bandwidth(Backend& backend) {
  const size_t bytes = size_t(1) << 30;
  Buffer host = Buffer::host(bytes);
  auto* words = static_cast<uint64_t*>(host.data());
  for (size_t i = 0; i < bytes / 8; ++i) words[i] = i * 0x9e3779b97f4a7c15ull;
  Buffer a = backend.allocate(bytes), b = backend.allocate(bytes);
  const Tensor ta = a.view(DType::i32, {static_cast<int64_t>(bytes / 4)});
  const Tensor tb = b.view(DType::i32, {static_cast<int64_t>(bytes / 4)});
  backend.copy(host.view(DType::i32, {static_cast<int64_t>(bytes / 4)}), ta);
  backend.copy(ta, tb);  // warm-up
  backend.synchronize();
  double best = 0;
  for (int rep = 0; rep < 10; ++rep) {
    const auto t0 = Clock::now();
    backend.copy(ta, tb);
    backend.synchronize();
    best = std::max(best, 2.0 * bytes / std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

std::string describe(const SamplingParams& p) {
  if (p.greedy()) return "greedy";
  return str_cat("temperature ", p.temperature, p.top_k > 0 ? str_cat(", top-k ", p.top_k) : std::string(),
                 p.top_p < 1.0f ? str_cat(", top-p ", p.top_p) : std::string(),
                 p.min_p > 0.0f ? str_cat(", min-p ", p.min_p) : std::string());
}

void plain_bench(const BenchOptions& o, Session& s, const std::vector<SuitePrompt>& suite, nlohmann::json& report) {
  const std::string text = suite_text(suite);
  const bool gpu = s.backend->device() == Device::cuda;
  const double bandwidth = gpu ? measure_device_bandwidth(*s.backend)
                               : measure_host_bandwidth(static_cast<size_t>(std::max(0, o.common.threads)));
  const ModelConfig& c = s.model->config();
  const int max_batch = *std::max_element(o.batches.begin(), o.batches.end());
  BenchEngine engine = make_engine(s, max_batch, max_batch * o.prompt_tokens + 1, "", 0);
  // Warm-up: every batch size once, so that each has KV pages and scratch buffers of its size.
  for (int b : o.batches) {
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < b; ++i) prompts.push_back(synthetic_prompt(s, text, o.prompt_tokens, 1000 + i * 37));
    run_batch(engine, prompts, 8, o.sampling, 0);
  }
  nlohmann::json rows = nlohmann::json::array();
  std::printf("\nplain decoding, %s, prompt %d tokens, %d new tokens, %s\n", s.backend->name().c_str(), o.prompt_tokens,
              o.gen_tokens, describe(o.sampling).c_str());
  std::printf("%6s %14s %14s %10s %12s\n", "batch", "prefill tok/s", "decode tok/s", "TTFT ms", "BW fraction");
  for (int b : o.batches) {
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < b; ++i) prompts.push_back(synthetic_prompt(s, text, o.prompt_tokens, i * 37));
    RunResult r = run_batch(engine, prompts, o.gen_tokens, o.sampling, 0);
    const double prefill_tps = r.prompt_tokens / std::max(1e-9, r.max_ttft);
    const double decode_tps = r.decode_tokens / std::max(1e-9, r.max_decode);
    // bytes one decode step reads: the weights once (of an untied embedding table only the
    // step's rows), plus each row's KV at its mean context
    const double mean_ctx = o.prompt_tokens + o.gen_tokens / 2.0;
    const double kv_bytes =
        2.0 * c.num_layers * c.num_kv_heads * c.head_dim * dtype_size(s.backend->kv_dtype()) * mean_ctx * b;
    const double step_bytes = double(s.model->step_weight_bytes(b)) + kv_bytes;
    const double steps_per_s = decode_tps / b;
    const double fraction = step_bytes * steps_per_s / bandwidth;
    std::printf("%6d %14.1f %14.1f %10.1f %12.2f\n", b, prefill_tps, decode_tps, r.max_ttft * 1e3, fraction);
    rows.push_back({{"batch", b},
                    {"prefill_tokens_per_s", prefill_tps},
                    {"decode_tokens_per_s", decode_tps},
                    {"ttft_ms", r.max_ttft * 1e3},
                    {"bytes_per_step", step_bytes},
                    {"bandwidth_fraction", fraction}});
  }
  std::printf("measured %s bandwidth %.1f GB/s; weights %.1f MB, read per batch-1 step %.1f MB\n",
              gpu ? "device copy" : "host read", bandwidth / 1e9, s.model->weight_bytes() / 1e6,
              s.model->step_weight_bytes(1) / 1e6);
  report["plain"] = {{"device", s.backend->name()},
                     {"sampling", describe(o.sampling)},
                     {"bandwidth_bytes_per_s", bandwidth},
                     {"bandwidth_kind", gpu ? "device-to-device copy, read + write" : "host read"},
                     {"weight_bytes", s.model->weight_bytes()},
                     {"prompt_tokens", o.prompt_tokens},
                     {"new_tokens", o.gen_tokens},
                     {"rows", rows}};
}

// Tokens per second of the decode phase (after each row's first token), over the slowest row.
double decode_rate(const RunResult& r) { return r.decode_tokens / std::max(1e-9, r.max_decode); }

// Plain and speculative runs of the same prompts, and what the speculative one gained.
struct Pair {
  RunResult plain, spec;      // the fastest run of each (their tokens/s columns)
  double speedup = 0;         // whole run: median over the repeats of spec / plain tokens/s
  double decode_speedup = 0;  // decode phase, likewise
};

// Plain and speculative runs alternate o.repeats times. The speedup is the median of each
// repeat's ratio: the two runs of a repeat follow each other within a second, so a machine whose
// speed drifts (other load) slows both alike, where comparing the fastest plain run with the
// fastest speculative one mixes different minutes.
Pair measure_pair(BenchEngine& plain_engine, BenchEngine& spec_engine, const std::vector<std::vector<int32_t>>& prompts,
                  int max_tokens, const BenchOptions& o) {
  Pair best;
  std::vector<double> whole, decode;
  auto keep = [](const RunResult& r, RunResult& into) {
    if (into.wall == 0 || r.generated / r.wall > into.generated / into.wall) into = r;
  };
  for (int rep = 0; rep < o.repeats; ++rep) {
    const RunResult plain = run_batch(plain_engine, prompts, max_tokens, o.sampling, 0);
    const RunResult spec = run_batch(spec_engine, prompts, max_tokens, o.sampling, o.num_draft, !o.no_adaptive);
    whole.push_back((spec.generated / spec.wall) / (plain.generated / plain.wall));
    decode.push_back(decode_rate(spec) / decode_rate(plain));
    keep(plain, best.plain);
    keep(spec, best.spec);
  }
  best.speedup = median(whole);
  best.decode_speedup = median(decode);
  return best;
}

void spec_bench(const BenchOptions& o, Session& s, const std::vector<SuitePrompt>& suite, nlohmann::json& report) {
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& p : suite) prompts.push_back(s.tokenizer->encode(p.text, false));
  std::vector<std::vector<int32_t>> batch;
  int max_len = 0, batch_tokens = 1;
  for (int i = 0; i < o.spec_batch; ++i) {
    const size_t p = static_cast<size_t>(i) % prompts.size();
    batch.push_back(prompts[p]);
    max_len = std::max(max_len, suite[p].max_tokens);
    batch_tokens += static_cast<int>(prompts[p].size());
  }
  for (const auto& p : prompts) batch_tokens = std::max(batch_tokens, static_cast<int>(p.size()) + 1);
  const std::string text = suite_text(suite);
  nlohmann::json methods = nlohmann::json::array();
  for (const std::string& draft : o.drafts) {
    BenchEngine plain_engine = make_engine(s, o.spec_batch, batch_tokens, "", 0);
    BenchEngine spec_engine = make_engine(s, o.spec_batch, batch_tokens, draft, o.num_draft);
    // Warm-up, on text the suite's prompts do not start with: one row, then a full batch, in
    // each engine (the speculative one's cost model measures its forwards and drafts here).
    for (BenchEngine* e : {&plain_engine, &spec_engine}) {
      run_batch(*e, {synthetic_prompt(s, text, 96, 7)}, 64, o.sampling, o.num_draft, !o.no_adaptive);
      std::vector<std::vector<int32_t>> rows;
      for (int i = 0; i < o.spec_batch; ++i) rows.push_back(synthetic_prompt(s, text, 96, 7 + 131 * i));
      run_batch(*e, rows, 32, o.sampling, o.num_draft, !o.no_adaptive);
    }
    std::printf("\nspeculative: %s, batch 1, %s, %s\n", draft.c_str(), describe(o.sampling).c_str(),
                s.backend->name().c_str());
    // Generation tokens/s (after each row's first token), as the plain table's decode tok/s and
    // as other servers report their generation rate: what speculation speeds up. TTFT (the
    // prefill, the same work in both runs) beside it, and the speedup of the whole request,
    // prefill included.
    std::printf("%-18s %-16s %9s %10s %10s %8s %8s %8s %8s %5s\n", "prompt", "category", "TTFT ms", "plain t/s",
                "spec t/s", "speedup", "whole", "accept", "mean len", "same");
    nlohmann::json per_prompt = nlohmann::json::array();
    for (size_t i = 0; i < prompts.size(); ++i) {
      const SuitePrompt& sp = suite[i];
      const Pair m = measure_pair(plain_engine, spec_engine, {prompts[i]}, sp.max_tokens, o);
      const RunResult& plain = m.plain;
      const RunResult& spec = m.spec;
      const double pt = plain.generated / plain.wall, st = spec.generated / spec.wall;
      const double pd = decode_rate(plain), sd = decode_rate(spec);
      const auto& tel = spec.results[0].stats.speculative;
      const bool same = plain.results[0].tokens == spec.results[0].tokens;
      std::printf("%-18s %-16s %9.1f %10.1f %10.1f %7.2fx %7.2fx %8.2f %8.2f %5s\n", sp.name.c_str(),
                  sp.category.c_str(), plain.max_ttft * 1e3, pd, sd, m.decode_speedup, m.speedup, tel.acceptance_rate(),
                  tel.mean_accepted_length(), same ? "yes" : "NO");
      per_prompt.push_back({{"prompt", sp.name},
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
                            {"telemetry", tel.to_json()}});
    }
    const Pair m = measure_pair(plain_engine, spec_engine, batch, max_len, o);
    const double pt = m.plain.generated / m.plain.wall, st = m.spec.generated / m.spec.wall;
    bool same = true;
    for (size_t i = 0; i < batch.size(); ++i) same = same && m.plain.results[i].tokens == m.spec.results[i].tokens;
    const std::string label = "batch " + std::to_string(o.spec_batch);
    std::printf("%-18s %-16s %9.1f %10.1f %10.1f %7.2fx %7.2fx %8s %8s %5s\n", label.c_str(), "all",
                m.plain.max_ttft * 1e3, decode_rate(m.plain), decode_rate(m.spec), m.decode_speedup, m.speedup, "", "",
                same ? "yes" : "NO");
    methods.push_back({{"method", draft},
                       {"batch1", per_prompt},
                       {"batch",
                        {{"rows", o.spec_batch},
                         {"plain_tokens_per_s", pt},
                         {"spec_tokens_per_s", st},
                         {"speedup", m.speedup},
                         {"decode_speedup", m.decode_speedup},
                         {"identical", same}}}});
  }
  report["speculative"] = methods;
}

}  // namespace

void add_bench(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand("bench", "measure throughput (plain, and speculative with --draft)");
  add_common(*cmd, o->common);
  cmd->add_option("--draft", o->drafts, "draft method(s): 'ngram' or a draft model folder (repeatable)");
  cmd->add_option("--num-draft-tokens", o->num_draft, "maximum draft depth (default: the method's)");
  cmd->add_option("--batch-sizes", o->batches, "plain decoding batch sizes")->delimiter(',')->capture_default_str();
  cmd->add_option("--prompt-tokens", o->prompt_tokens, "plain benchmark prompt length")->capture_default_str();
  cmd->add_option("--new-tokens", o->gen_tokens, "plain benchmark tokens to generate")->capture_default_str();
  cmd->add_option("--spec-batch", o->spec_batch, "rows in the batched speculative run")->capture_default_str();
  cmd->add_option("--suite", o->suite, "prompt suite (JSON)")->capture_default_str();
  cmd->add_flag("--skip-plain", o->skip_plain, "only the speculative suite");
  cmd->add_flag("--no-adaptive", o->no_adaptive, "speculative suite: always draft the maximum depth");
  cmd->add_flag("--replay", o->replay,
                "speculative suite, greedy: replay each request against this machine's measured costs for the default "
                "policy, every fixed depth and the best schedule, instead of timing runs");
  cmd->add_option("--replay-window-cost", o->replay_window_cost,
                  "with --replay: what if a verify window's tokens beyond the first cost this many times as much")
      ->capture_default_str();
  cmd->add_option("--replay-forward-ms", o->replay_forward_ms,
                  "with --replay: the target forward of 1, 2, ... tokens in ms (comma-separated) instead of this "
                  "machine's measured ones, so that two builds' policies replay on the same costs")
      ->delimiter(',');
  cmd->add_option("--repeats", o->repeats,
                  "speculative suite: plain/speculative pairs; speedup = median pair ratio, tokens/s = fastest run")
      ->capture_default_str();
  cmd->add_flag("--json", o->json, "also print the results as one JSON object");
  cmd->add_option("--temperature", o->sampling.temperature, "sample at this temperature (default: greedy)");
  cmd->add_option("--top-k", o->sampling.top_k, "with --temperature: keep the k most likely tokens (0 = off)");
  cmd->add_option("--top-p", o->sampling.top_p, "with --temperature: nucleus mass (1 = off)");
  cmd->add_option("--min-p", o->sampling.min_p, "with --temperature: minimum probability relative to the top");
  cmd->add_option("--seed", o->sampling.seed, "with --temperature: the sampler's seed");
  cmd->callback([o] {
    SPECDEC_CHECK(o->repeats >= 1, "--repeats must be at least 1");
    SPECDEC_CHECK(o->replay_window_cost >= 0, "--replay-window-cost must not be negative, got ", o->replay_window_cost);
    SPECDEC_CHECK(o->replay_forward_ms.empty() || o->replay_forward_ms.size() >= 2,
                  "--replay-forward-ms needs the costs of at least 1 and 2 tokens, got ", o->replay_forward_ms.size());
    for (double ms : o->replay_forward_ms)
      SPECDEC_CHECK(ms > 0 && std::isfinite(ms), "--replay-forward-ms: every cost must be positive, got ", ms);
    SPECDEC_CHECK(!o->replay || !o->drafts.empty(),
                  "--replay replays speculative decoding: name a method with --draft");
    SPECDEC_CHECK(o->spec_batch >= 1, "--spec-batch must be at least 1, got ", o->spec_batch);
    o->sampling.validate();
    SPECDEC_CHECK(o->num_draft >= 0, "--num-draft-tokens must not be negative, got ", o->num_draft);
    for (int b : o->batches) SPECDEC_CHECK(b >= 1, "--batch-sizes must be positive, got ", b);
    SPECDEC_CHECK(o->prompt_tokens >= 1 && o->gen_tokens >= 2, "--prompt-tokens must be >= 1 and --new-tokens >= 2");
    const std::vector<SuitePrompt> suite = load_suite(o->suite);
    Session s = open_session(o->common);
    nlohmann::json report;
    report["model"] = o->common.model_dir;
    if (!o->skip_plain) plain_bench(*o, s, suite, report);
    if (!o->drafts.empty()) {
      if (o->replay) {
        replay_bench(*o, s, suite, report);
      } else {
        spec_bench(*o, s, suite, report);
      }
    }
    if (o->json) std::cout << report.dump() << std::endl;
  });
}

}  // namespace specdec::cli
