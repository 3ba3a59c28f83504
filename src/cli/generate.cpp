// `specdec generate`: one prompt, streamed to stdout, plain or speculative.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/session.h"
#include "core/error.h"

namespace specdec::cli {

namespace {

struct GenerateOptions {
  CommonOptions common;
  std::string prompt;
  std::string prompt_file;
  int max_tokens = 128;
  float temperature = -1;  // -1 = from generation_config.json
  float top_p = -1;
  int top_k = -1;
  float min_p = -1;
  float repetition_penalty = -1;
  float presence_penalty = 0;
  float frequency_penalty = 0;
  uint64_t seed = 0;
  bool json = false;
  std::string draft;
  int num_draft = 0;
  std::string spec_mode = "exact";
  bool no_adaptive = false;
  std::vector<std::string> stop;
  bool ignore_eos = false;
};

SamplingParams sampling_from(const GenerateOptions& o, const GenerationDefaults& d) {
  SamplingParams p;
  p.temperature = o.temperature >= 0 ? o.temperature : (d.do_sample ? d.temperature : 0.0f);
  p.top_p = o.top_p >= 0 ? o.top_p : (d.do_sample ? d.top_p : 1.0f);
  p.top_k = o.top_k >= 0 ? o.top_k : (d.do_sample ? d.top_k : 0);
  p.min_p = o.min_p >= 0 ? o.min_p : (d.do_sample ? d.min_p : 0.0f);
  p.repetition_penalty = o.repetition_penalty >= 0 ? o.repetition_penalty : d.repetition_penalty;
  p.presence_penalty = o.presence_penalty;
  p.frequency_penalty = o.frequency_penalty;
  p.seed = o.seed;
  return p;
}

void run(const GenerateOptions& o) {
  SPECDEC_CHECK(o.prompt.empty() || o.prompt_file.empty(), "give --prompt or --prompt-file, not both");
  const std::string text = o.prompt_file.empty() ? o.prompt : read_file(o.prompt_file);
  SPECDEC_CHECK(!text.empty(), "the prompt is empty");
  SPECDEC_CHECK(o.num_draft >= 0, "--num-draft-tokens must not be negative, got ", o.num_draft);
  SPECDEC_CHECK(o.spec_mode == "exact" || o.spec_mode == "rejection", "unknown --spec-mode '", o.spec_mode,
                "' (expected exact or rejection)");
  Session s = open_session(o.common);
  Engine engine(*s.model, *s.tokenizer, s.engine);
  Request req;
  req.prompt = s.tokenizer->encode(text, true);
  req.sampling = sampling_from(o, s.defaults);
  req.stop.max_tokens = o.max_tokens;
  req.stop.eos_ids = s.eos_ids;
  req.stop.ignore_eos = o.ignore_eos;
  req.stop.stop_strings = o.stop;
  if (!o.draft.empty()) {
    req.spec.method = add_draft_method(engine, s, o.draft, o.num_draft);
    req.spec.max_depth = o.num_draft;
    req.spec.adaptive = !o.no_adaptive;
    req.spec.mode = o.spec_mode == "rejection" ? SpecMode::rejection : SpecMode::exact;
  }
  if (!o.json) {
    req.on_event = [](const StreamEvent& ev) {
      std::fwrite(ev.text.data(), 1, ev.text.size(), stdout);
      std::fflush(stdout);
    };
  }
  const int64_t id = engine.submit(std::move(req));
  engine.run();
  RequestResult r = *engine.take_result(id);
  SPECDEC_CHECK(r.finish != FinishReason::error, r.error);
  const double prefill_tps = r.stats.prefill_seconds > 0 ? r.stats.prompt_tokens / r.stats.prefill_seconds : 0;
  const double decode_tps =
      r.stats.decode_seconds > 0 && r.stats.generated_tokens > 1 ? (r.stats.generated_tokens - 1) / r.stats.decode_seconds : 0;
  if (o.json) {
    nlohmann::json j;
    j["text"] = r.text;
    j["tokens"] = r.tokens;
    j["finish_reason"] = finish_reason_name(r.finish);
    nlohmann::json st;
    st["prompt_tokens"] = r.stats.prompt_tokens;
    st["generated_tokens"] = r.stats.generated_tokens;
    st["prefill_tokens_per_s"] = prefill_tps;
    st["decode_tokens_per_s"] = decode_tps;
    st["ttft_s"] = r.stats.ttft_seconds;
    st["device"] = s.backend->name();
    if (!o.draft.empty()) st["speculative"] = r.stats.speculative.to_json();
    j["stats"] = st;
    std::cout << j.dump() << std::endl;
  } else {
    std::fprintf(stdout, "\n");
    std::fprintf(stderr,
                 "[stats] prompt tokens %d, generated tokens %d, prefill %.1f tokens/s, decode %.1f tokens/s, "
                 "finish %s",
                 r.stats.prompt_tokens, r.stats.generated_tokens, prefill_tps, decode_tps,
                 finish_reason_name(r.finish));
    if (!o.draft.empty()) {
      const auto& t = r.stats.speculative;
      std::fprintf(stderr, ", %s acceptance %.2f, mean accepted length %.2f", o.draft.c_str(), t.acceptance_rate(),
                   t.mean_accepted_length());
    }
    std::fprintf(stderr, "\n");
  }
}

}  // namespace

void add_common(CLI::App& cmd, CommonOptions& o) {
  o.model_dir = SPECDEC_DEFAULT_MODEL_DIR;
  cmd.add_option("--model", o.model_dir, "model folder (config.json, *.safetensors, tokenizer.json)")
      ->capture_default_str();
  cmd.add_option("--device", o.device, "cpu or cuda (default: cuda when a GPU is present)");
  cmd.add_option("--threads", o.threads, "CPU threads (default: all)");
  cmd.add_option("--cpu-isa", o.isa, "CPU kernels: avx512, avx2 or scalar (default: best available)");
  cmd.add_flag("--fast-gpu", o.fast_gpu, "GPU: fast kernels instead of batch-invariant ones");
  cmd.add_option("--kv-memory", o.kv_gb, "KV cache size in GiB (default: 1 on the CPU, 16 on a GPU)");
  cmd.add_option("--kv-dtype", o.kv_dtype, "GPU KV cache type: bf16, f16 or f32")->capture_default_str();
  cmd.add_option("--max-rows", o.max_rows, "rows decoding at once")->capture_default_str();
  cmd.add_option("--max-batch-tokens", o.max_batch_tokens, "tokens in one forward")->capture_default_str();
}

void add_generate(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  CLI::App* cmd = app.add_subcommand("generate", "generate text from a prompt");
  add_common(*cmd, o->common);
  cmd->add_option("--prompt", o->prompt, "prompt text");
  cmd->add_option("--prompt-file", o->prompt_file, "read the prompt from a file");
  cmd->add_option("--max-tokens", o->max_tokens, "maximum new tokens")->capture_default_str();
  cmd->add_option("--temperature", o->temperature, "0 = greedy (default: generation_config.json)");
  cmd->add_option("--top-p", o->top_p, "nucleus sampling mass");
  cmd->add_option("--top-k", o->top_k, "keep the k most likely tokens (0 = off)");
  cmd->add_option("--min-p", o->min_p, "drop tokens below min-p × the top probability");
  cmd->add_option("--repetition-penalty", o->repetition_penalty, "repetition penalty (1 = off)");
  cmd->add_option("--presence-penalty", o->presence_penalty, "presence penalty");
  cmd->add_option("--frequency-penalty", o->frequency_penalty, "frequency penalty");
  cmd->add_option("--seed", o->seed, "sampling seed")->capture_default_str();
  cmd->add_option("--stop", o->stop, "stop string (repeatable)");
  cmd->add_flag("--ignore-eos", o->ignore_eos, "keep generating after the end-of-sequence token");
  cmd->add_flag("--json", o->json, "print one JSON object instead of streaming text");
  cmd->add_option("--draft", o->draft, "speculative decoding: 'ngram' or a draft model folder");
  cmd->add_option("--num-draft-tokens", o->num_draft, "maximum draft tokens per round (default: the method's)");
  cmd->add_option("--spec-mode", o->spec_mode, "exact (identical output) or rejection")->capture_default_str();
  cmd->add_flag("--no-adaptive", o->no_adaptive, "always draft the maximum depth");
  cmd->callback([o] { run(*o); });
}

}  // namespace specdec::cli
