// parse_command_line: CLI11 reads the words into plain flag values; each subcommand's values
// are then checked and turned into the typed command the library takes.
#include "cli/options.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <limits>
#include <cmath>
#include <memory>
#include <set>
#include <sstream>

#include "cli/common_flags.h"
#include "cli/require.h"
#include "cli/text_file.h"

namespace specdec::cli {

void add_common(CLI::App& cmd, CommonFlags& f) {
  cmd.add_option("--model", f.model, "model folder (config.json, *.safetensors, tokenizer.json)")
      ->capture_default_str();
  cmd.add_option("--device", f.device, "cpu or cuda (default: cuda when a GPU is present)");
  cmd.add_option("--threads", f.threads, "CPU threads (default: all)");
  cmd.add_option("--cpu-isa", f.cpu_isa,
                 "CPU kernels: auto (amx where the CPU has it, else avx512-bf16 where it has AVX-512 BF16, else best), "
                 "best (the fastest exact f32 ones), avx512, avx2, scalar, avx512-bf16 or amx (default: auto)");
  cmd.add_flag("--fast-gpu", f.fast_gpu, "GPU: fast kernels instead of batch-invariant ones");
  cmd.add_option("--kv-memory", f.kv_memory, "KV cache size in GiB (default: 1 on the CPU; on a GPU, the memory free after the weights, activations and drafts)");
  cmd.add_option("--gpu-memory", f.gpu_memory,
                 "GPU: cap on the device memory pool in GiB (default: the free memory at start)");
  cmd.add_option("--kv-dtype", f.kv_dtype,
                 "KV cache type: bf16, f16 or f32 on the GPU; on the CPU bf16 where the amx kernels run (else f32)")
      ->capture_default_str();
  cmd.add_option("--max-rows", f.max_rows, "rows decoding at once")->capture_default_str();
  cmd.add_option("--max-batch-tokens", f.max_batch_tokens, "tokens in one forward")->capture_default_str();
  cmd.add_flag("--no-prefix-cache", f.no_prefix_cache, "compute every prompt in full (no KV shared between requests)");
  cmd.add_flag("--no-overlap", f.no_overlap,
               "GPU: launch each forward only after the previous one's tokens are committed (by default, while no row "
               "drafts, the next forward is launched first, so that the host's work overlaps the device's)");
}

EngineConfig engine_config(const CommonFlags& f) {
  EngineConfig c;
  c.model_dir = f.model;
  const std::optional<DeviceKind> device = f.device.empty() ? DeviceKind::automatic : parse_device_kind(f.device);
  require(device && (f.device.empty() || *device != DeviceKind::automatic), "unknown device '", f.device,
          "' (expected cpu or cuda)");
  c.device = *device;
  const std::optional<CpuIsa> isa = f.cpu_isa.empty() ? CpuIsa::automatic : parse_cpu_isa(f.cpu_isa);
  require(isa.has_value(), "unknown --cpu-isa '", f.cpu_isa,
          "' (expected auto, best, avx512, avx2, scalar, avx512-bf16 or amx)");
  c.cpu_isa = *isa;
  const std::optional<KvCacheType> kv = parse_kv_cache_type(f.kv_dtype);
  require(kv.has_value(), "unknown --kv-dtype '", f.kv_dtype, "' (expected bf16, f16 or f32)");
  c.kv_type = *kv;
  c.threads = f.threads;
  c.batch_invariant = !f.fast_gpu;
  c.kv_memory_gb = f.kv_memory;
  c.gpu_memory_gb = f.gpu_memory;
  c.max_rows = f.max_rows;
  c.max_batch_tokens = f.max_batch_tokens;
  c.prefix_cache = !f.no_prefix_cache;
  c.overlap = !f.no_overlap;
  c.validate();
  return c;
}

// More threads than the machine has is allowed (up to max_threads()) but slow: say so.
std::string thread_warning(const EngineConfig& c) {
  if (c.threads <= hardware_threads()) return {};
  std::ostringstream out;
  out << "specdec: warning: --threads " << c.threads << " is more than this machine's " << hardware_threads()
      << " hardware threads; the extra threads only compete with each other";
  return out.str();
}

// --seed as an exact unsigned 64-bit integer: CLI11 would clamp 2^64, 1e30 or -1 silently.
uint64_t parse_seed(const std::string& text) {
  uint64_t seed = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, seed);
  require(!text.empty() && ec == std::errc() && ptr == end, "--seed must be an integer in [0, ",
          std::numeric_limits<uint64_t>::max(), "], got '", text, "'");
  return seed;
}

// Sampling divides the logits by the temperature; below this the quotients overflow to infinity
// for ordinary logits and no distribution is left to draw from. Such a temperature means "the
// most likely token", which is what 0 (greedy decoding) asks for exactly, so we say so rather
// than guess.
namespace {
constexpr float kMinSamplingTemperature = 1e-6f;

void check_temperature(float temperature, const char* flag) {
  require(temperature == 0.0f || !(temperature < kMinSamplingTemperature), flag, " ", temperature,
          " is too small to sample at (the logits divided by it overflow): use 0 for greedy decoding or at least ",
          kMinSamplingTemperature);
}
}  // namespace

VerifyMode spec_mode(const std::string& name) {
  const std::optional<VerifyMode> mode = parse_verify_mode(name);
  require(mode.has_value(), "unknown --spec-mode '", name, "' (expected exact or rejection)");
  return *mode;
}

DraftSpec draft_spec(const std::string& draft, int num_draft, bool context_lookup) {
  DraftSpec spec = draft == "ngram" ? DraftSpec::ngram({}, num_draft) : DraftSpec::model(draft, {}, num_draft);
  spec.context_lookup = context_lookup;
  return spec;
}

namespace {

struct GenerateFlags {
  CommonFlags common;
  std::string prompt, prompt_file, draft, spec_mode = "exact", seed = "0";
  GenerateOptions gen;
  float temperature = 0, top_p = 0, min_p = 0, repetition_penalty = 0;
  int top_k = 0, num_draft = 0;
  bool no_adaptive = false, json = false, no_context_lookup = false;
  CLI::Option *num_draft_opt = nullptr, *spec_mode_opt = nullptr, *no_adaptive_opt = nullptr,
              *no_context_lookup_opt = nullptr;
  CLI::Option *temperature_opt = nullptr, *top_p_opt = nullptr, *top_k_opt = nullptr, *min_p_opt = nullptr,
              *repetition_opt = nullptr;
};

struct BenchFlags {
  CommonFlags common;
  BenchCommand bench;
  std::string suite = std::string(SPECDEC_SOURCE_DIR) + "/bench/prompts.json";
  float temperature = 0, top_p = 1, min_p = 0;
  int top_k = 0;
  std::string seed = "0", spec_mode = "exact";
  bool no_adaptive = false, no_context_lookup = false;
};

CLI::App* add_generate(CLI::App& app, GenerateFlags& f) {
  CLI::App* cmd = app.add_subcommand("generate", "generate text from a prompt");
  add_common(*cmd, f.common);
  GenerateOptions& g = f.gen;
  cmd->add_option("--prompt", f.prompt, "prompt text");
  cmd->add_option("--prompt-file", f.prompt_file, "read the prompt from a file");
  cmd->add_option("--max-tokens", g.max_tokens, "maximum new tokens")->capture_default_str();
  f.temperature_opt = cmd->add_option("--temperature", f.temperature, "0 = greedy (default: generation_config.json)");
  f.top_p_opt = cmd->add_option("--top-p", f.top_p, "nucleus sampling mass");
  f.top_k_opt = cmd->add_option("--top-k", f.top_k, "keep the k most likely tokens (0 = off)");
  f.min_p_opt = cmd->add_option("--min-p", f.min_p, "drop tokens below min-p × the top probability");
  f.repetition_opt = cmd->add_option("--repetition-penalty", f.repetition_penalty, "repetition penalty (1 = off)");
  cmd->add_option("--presence-penalty", g.sampling.presence_penalty, "presence penalty");
  cmd->add_option("--frequency-penalty", g.sampling.frequency_penalty, "frequency penalty");
  cmd->add_option("--seed", f.seed, "sampling seed")->capture_default_str();
  cmd->add_option("--stop", g.stop, "stop string (repeatable)");
  cmd->add_flag("--ignore-eos", g.ignore_eos, "keep generating after the end-of-sequence token");
  cmd->add_flag("--json", f.json, "print one JSON object instead of streaming text");
  cmd->add_option("--draft", f.draft,
                  "speculative decoding: 'ngram', or the folder of a draft model, an EAGLE-3 head or a DFlash drafter");
  f.num_draft_opt =
      cmd->add_option("--num-draft-tokens", f.num_draft, "maximum draft tokens per round (default: the method's)");
  f.spec_mode_opt =
      cmd->add_option("--spec-mode", f.spec_mode, "exact (identical output) or rejection")->capture_default_str();
  f.no_adaptive_opt = cmd->add_flag("--no-adaptive", f.no_adaptive, "always draft the maximum depth");
  f.no_context_lookup_opt = cmd->add_flag("--no-context-lookup", f.no_context_lookup, kNoContextLookupHelp);
  return cmd;
}

GenerateCommand generate_command(GenerateFlags& f) {
  GenerateCommand c;
  c.engine = engine_config(f.common);
  require(f.prompt.empty() || f.prompt_file.empty(), "give --prompt or --prompt-file, not both");
  c.prompt = f.prompt_file.empty() ? f.prompt : read_text_file(f.prompt_file, "--prompt-file");
  require(!c.prompt.empty(),
          f.prompt_file.empty() ? "--prompt is empty" : "--prompt-file " + f.prompt_file + " is empty");
  c.request = f.gen;
  SamplingOptions& s = c.request.sampling;
  if (f.temperature_opt->count()) s.temperature = f.temperature;
  if (f.top_p_opt->count()) s.top_p = f.top_p;
  if (f.top_k_opt->count()) s.top_k = f.top_k;
  if (f.min_p_opt->count()) s.min_p = f.min_p;
  if (f.repetition_opt->count()) s.repetition_penalty = f.repetition_penalty;
  s.seed = parse_seed(f.seed);
  s.validate();
  if (f.temperature_opt->count()) check_temperature(f.temperature, "--temperature");
  require(c.request.max_tokens >= 1, "max_tokens must be at least 1, got ", c.request.max_tokens);
  require(f.num_draft >= 0, "--num-draft-tokens must not be negative, got ", f.num_draft);
  const VerifyMode mode = spec_mode(f.spec_mode);
  // Speculation flags without a method would be ignored silently.
  for (const CLI::Option* o : {f.num_draft_opt, f.spec_mode_opt, f.no_adaptive_opt, f.no_context_lookup_opt})
    require(o->count() == 0 || !f.draft.empty(), o->get_name(), " needs --draft (ngram or a draft model folder)");
  SpeculativeOptions& spec = c.request.speculative;
  spec.mode = mode;
  spec.adaptive = !f.no_adaptive;
  spec.num_draft_tokens = f.num_draft;
  if (!f.draft.empty()) {
    c.engine.drafts.push_back(draft_spec(f.draft, f.num_draft, !f.no_context_lookup));
    spec.draft = draft_id(c.engine.drafts.back());
  }
  c.json = f.json;
  return c;
}

CLI::App* add_bench(CLI::App& app, BenchFlags& f) {
  BenchCommand& o = f.bench;
  CLI::App* cmd = app.add_subcommand("bench", "measure throughput (plain, and speculative with --draft)");
  add_common(*cmd, f.common);
  cmd->add_option(
      "--draft", o.drafts,
      "draft method(s): 'ngram', or the folder of a draft model, an EAGLE-3 head or a DFlash drafter (repeatable)");
  cmd->add_option("--num-draft-tokens", o.num_draft, "maximum draft depth (default: the method's)");
  cmd->add_option("--spec-mode", f.spec_mode,
                  "speculative suite: exact (identical output, checked) or rejection (the same distribution)")
      ->capture_default_str();
  cmd->add_option("--batch-sizes", o.batches, "plain decoding batch sizes")->delimiter(',')->capture_default_str();
  cmd->add_option("--prompt-tokens", o.prompt_tokens, "plain benchmark prompt length")->capture_default_str();
  cmd->add_option("--new-tokens", o.gen_tokens, "plain benchmark tokens to generate")->capture_default_str();
  cmd->add_option("--spec-batch", o.spec_batch, "rows in the batched speculative run")->capture_default_str();
  cmd->add_option("--suite", f.suite, "prompt suite (JSON)")->capture_default_str();
  cmd->add_flag("--skip-plain", o.skip_plain, "only the speculative suite");
  cmd->add_flag("--no-adaptive", f.no_adaptive, "speculative suite: always draft the maximum depth");
  cmd->add_flag("--no-context-lookup", f.no_context_lookup, kNoContextLookupHelp);
  cmd->add_flag("--replay", o.replay,
                "speculative suite: replay each request (greedy, or sampled with --seed) against this machine's "
                "measured costs for the default policy, every fixed depth and the best schedule, instead of timing "
                "runs");
  cmd->add_option("--replay-window-cost", o.replay_window_cost,
                  "with --replay: what if a verify window's tokens beyond the first cost this many times as much")
      ->capture_default_str();
  cmd->add_option("--replay-forward-ms", o.replay_forward_ms,
                  "with --replay: the target forward of 1, 2, ... tokens in ms (comma-separated) instead of this "
                  "machine's measured ones, so that two builds' policies replay on the same costs")
      ->delimiter(',');
  cmd->add_option("--replay-draft-ms", o.replay_draft_ms,
                  "with --replay: a draft call's fixed part and its part per step in ms (comma-separated) instead of "
                  "the measured ones, for every method timed; with --replay-forward-ms, no cost is measured")
      ->delimiter(',');
  cmd->add_option("--replay-repeats", o.replay_repeats,
                  "with --replay: calls timed per measurement (fewer: a quicker, noisier replay)")
      ->capture_default_str();
  cmd->add_option("--repeats", o.repeats,
                  "speculative suite: plain/speculative pairs (more for short runs); speedup = median pair ratio, "
                  "tokens/s = fastest run")
      ->capture_default_str();
  cmd->add_option("--prefix-tokens", o.prefix_tokens,
                  "also measure the prefix cache: time to first token of a prompt whose first N tokens an earlier "
                  "request computed, against the same prompt computed in full");
  cmd->add_option("--modes", o.modes,
                  "GPU: plain table for each kernel mode, e.g. fast,invariant (default: --fast-gpu's)")
      ->delimiter(',');
  cmd->add_flag("--json", o.json, "also print the results as one JSON object");
  cmd->add_option("--temperature", f.temperature, "sample at this temperature (default: greedy)");
  cmd->add_option("--top-k", f.top_k, "with --temperature: keep the k most likely tokens (0 = off)");
  cmd->add_option("--top-p", f.top_p, "with --temperature: nucleus mass (1 = off)");
  cmd->add_option("--min-p", f.min_p, "with --temperature: minimum probability relative to the top");
  cmd->add_option("--seed", f.seed, "with --temperature: the sampler's seed");
  return cmd;
}

void check_replay_flags(const BenchCommand& o) {
  require(o.replay_window_cost >= 0, "--replay-window-cost must not be negative, got ", o.replay_window_cost);
  require(o.replay_forward_ms.empty() || o.replay_forward_ms.size() >= 2,
          "--replay-forward-ms needs the costs of at least 1 and 2 tokens, got ", o.replay_forward_ms.size());
  for (double ms : o.replay_forward_ms)
    require(ms > 0 && std::isfinite(ms), "--replay-forward-ms: every cost must be positive, got ", ms);
  require(o.replay_repeats >= 1, "--replay-repeats must be at least 1, got ", o.replay_repeats);
  require(o.replay_draft_ms.empty() || o.replay_draft_ms.size() == 2,
          "--replay-draft-ms needs two costs (a call's fixed part and its part per step), got ",
          o.replay_draft_ms.size());
  for (double ms : o.replay_draft_ms)
    require(ms >= 0 && std::isfinite(ms), "--replay-draft-ms: every cost must be at least 0, got ", ms);
  require(o.prefix_tokens >= 0, "--prefix-tokens must not be negative, got ", o.prefix_tokens);
  require(!o.replay || !o.drafts.empty(), "--replay replays speculative decoding: name a method with --draft");
}

BenchCommand bench_command(BenchFlags& f) {
  BenchCommand o = f.bench;
  o.engine = engine_config(f.common);
  o.adaptive = !f.no_adaptive;
  o.sampling.temperature = f.temperature;
  o.sampling.top_k = f.top_k;
  o.sampling.top_p = f.top_p;
  o.sampling.min_p = f.min_p;
  o.sampling.repetition_penalty = 1.0f;
  o.sampling.seed = parse_seed(f.seed);
  o.mode = spec_mode(f.spec_mode);
  require(!o.replay || o.mode == VerifyMode::exact,
          "--replay replays exact verification: a rejection-mode round's outcome is a draw of its own");
  require(o.repeats >= 1, "--repeats must be at least 1");
  check_replay_flags(o);
  require(o.spec_batch >= 1, "--spec-batch must be at least 1, got ", o.spec_batch);
  o.sampling.validate();
  check_temperature(f.temperature, "--temperature");
  require(o.num_draft >= 0, "--num-draft-tokens must not be negative, got ", o.num_draft);
  for (int b : o.batches) require(b >= 1, "--batch-sizes must be positive, got ", b);
  for (int b : o.batches) require(b <= 256, "--batch-sizes: at most 256 rows, got ", b);
  for (const std::string& m : o.modes)
    require(m == "fast" || m == "invariant", "--modes: unknown mode '", m, "' (expected fast or invariant)");
  require(o.prompt_tokens >= 1 && o.gen_tokens >= 2, "--prompt-tokens must be >= 1 and --new-tokens >= 2");
  std::set<std::string> seen;
  for (const std::string& d : o.drafts) {
    require(seen.insert(d).second, "--draft ", d, " is given twice");
    o.engine.drafts.push_back(draft_spec(d, o.num_draft, !f.no_context_lookup));
  }
  o.suite = load_suite(f.suite);
  return o;
}

}  // namespace

CommandLine parse_command_line(const std::vector<std::string>& args) {
  CLI::App app{"specdec: LLM inference with lossless speculative decoding"};
  app.require_subcommand(1);
  GenerateFlags generate;
  CLI::App* generate_cmd = add_generate(app, generate);
  InfoCommand info;
  info.model_dir = SPECDEC_DEFAULT_MODEL_DIR;
  CLI::App* info_cmd = app.add_subcommand("info", "describe a model folder");
  info_cmd->add_option("--model", info.model_dir, "model folder")->capture_default_str();
  BenchFlags bench;
  CLI::App* bench_cmd = add_bench(app, bench);
  ChatTemplateCommand chat;
  CLI::App* chat_cmd = app.add_subcommand("chat-template", "print a chat template's render of a conversation");
  chat_cmd->add_option("--template", chat.template_file, "a .jinja file or a model folder")->required();
  chat_cmd->add_option("--messages", chat.messages_file, "JSON: a list of messages, or {\"messages\": [...], ...}")
      ->required();
  chat_cmd->add_flag("!--no-generation-prompt", chat.add_generation_prompt, "end without the assistant's header");
  chat_cmd->add_option("--bos", chat.bos, "bos_token");
  chat_cmd->add_option("--eos", chat.eos, "eos_token");
  ServeFlags serve;
  CLI::App* serve_cmd = serve.add(app);
  CommandLine line;
  try {
    std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes the words last first
    app.parse(std::move(reversed));
  } catch (const CLI::ParseError& e) {
    // --help and friends end with status 0 and print what they print; a real parse error gets
    // the same single line and status 1 as every other error.
    std::ostringstream out, err;
    if (e.get_exit_code() == 0) {
      line.exit_status = app.exit(e, out, err);
      line.out = out.str();
      return line;
    }
    line.exit_status = 1;
    line.err = std::string("specdec: error: ") + e.what() + " (see --help)";
    return line;
  }
  try {
    if (generate_cmd->parsed()) line.command = generate_command(generate);
    if (info_cmd->parsed()) line.command = info;
    if (bench_cmd->parsed()) line.command = bench_command(bench);
    if (chat_cmd->parsed()) line.command = chat;
    if (serve_cmd->parsed()) line.command = serve.command();
    if (!line.command) return line;
    if (const auto* g = std::get_if<GenerateCommand>(&line.command.value())) line.err = thread_warning(g->engine);
    if (const auto* b = std::get_if<BenchCommand>(&line.command.value())) line.err = thread_warning(b->engine);
  } catch (const std::exception& e) {
    line.exit_status = 1;
    line.err = std::string("specdec: error: ") + e.what();
  }
  return line;
}

}  // namespace specdec::cli
