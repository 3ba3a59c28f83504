// `specdec generate`: one prompt, streamed to stdout, plain or speculative — a thin client of
// the public Generator API.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "api/session.h"
#include "cli/commands.h"
#include "core/error.h"

namespace specdec::cli {

namespace {

struct GenerateCommand {
  ModelOptions model;
  GenerateOptions gen;
  std::string prompt;
  std::string prompt_file;
  std::string spec_mode = "exact";
  bool no_adaptive = false;
  bool json = false;
};

void run(GenerateCommand& c) {
  SPECDEC_CHECK(c.prompt.empty() || c.prompt_file.empty(), "give --prompt or --prompt-file, not both");
  const std::string text = c.prompt_file.empty() ? c.prompt : read_file(c.prompt_file);
  SPECDEC_CHECK(!text.empty(), "the prompt is empty");
  SPECDEC_CHECK(c.spec_mode == "exact" || c.spec_mode == "rejection", "unknown --spec-mode '", c.spec_mode,
                "' (expected exact or rejection)");
  c.gen.rejection = c.spec_mode == "rejection";
  c.gen.adaptive = !c.no_adaptive;
  Generator generator(c.model);
  std::function<void(std::string_view)> stream;
  if (!c.json)
    stream = [](std::string_view piece) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    };
  const Generation g = generator.generate(text, c.gen, stream);
  if (c.json) {
    nlohmann::json j;
    j["text"] = g.text;
    j["tokens"] = g.tokens;
    j["finish_reason"] = g.finish_reason;
    nlohmann::json st;
    st["prompt_tokens"] = g.prompt_tokens;
    st["generated_tokens"] = g.tokens.size();
    st["prefill_tokens_per_s"] = g.prefill_tokens_per_s;
    st["decode_tokens_per_s"] = g.decode_tokens_per_s;
    st["ttft_s"] = g.ttft_s;
    st["device"] = generator.device_name();
    if (!g.speculative_json.empty()) st["speculative"] = nlohmann::json::parse(g.speculative_json);
    j["stats"] = st;
    std::cout << j.dump() << std::endl;
    return;
  }
  std::fprintf(stdout, "\n");
  std::fflush(stdout);  // the text ends before the stats line, also when both go to one file
  std::fprintf(
      stderr, "[stats] prompt tokens %d, generated tokens %zu, prefill %.1f tokens/s, decode %.1f tokens/s, finish %s",
      g.prompt_tokens, g.tokens.size(), g.prefill_tokens_per_s, g.decode_tokens_per_s, g.finish_reason.c_str());
  if (!c.gen.draft.empty())
    std::fprintf(stderr, ", %s acceptance %.2f, mean accepted length %.2f", c.gen.draft.c_str(), g.acceptance_rate,
                 g.mean_accepted_length);
  std::fprintf(stderr, "\n");
}

}  // namespace

void add_common(CLI::App& cmd, ModelOptions& o) {
  o.model_dir = SPECDEC_DEFAULT_MODEL_DIR;
  cmd.add_option("--model", o.model_dir, "model folder (config.json, *.safetensors, tokenizer.json)")
      ->capture_default_str();
  cmd.add_option("--device", o.device, "cpu or cuda (default: cuda when a GPU is present)");
  cmd.add_option("--threads", o.threads, "CPU threads (default: all)");
  cmd.add_option("--cpu-isa", o.cpu_isa, "CPU kernels: avx512, avx2, scalar or avx512-bf16 (default: best exact)");
  cmd.add_flag_callback(
      "--fast-gpu", [&o] { o.batch_invariant = false; }, "GPU: fast kernels instead of batch-invariant ones");
  cmd.add_option("--kv-memory", o.kv_memory_gb, "KV cache size in GiB (default: 1 on the CPU, 16 on a GPU)");
  cmd.add_option("--gpu-memory", o.gpu_memory_gb,
                 "GPU: cap on the device memory pool in GiB (default: the free memory at start)");
  cmd.add_option("--kv-dtype", o.kv_dtype, "GPU KV cache type: bf16, f16 or f32")->capture_default_str();
  cmd.add_option("--max-rows", o.max_rows, "rows decoding at once")->capture_default_str();
  cmd.add_option("--max-batch-tokens", o.max_batch_tokens, "tokens in one forward")->capture_default_str();
}

void add_generate(CLI::App& app) {
  auto c = std::make_shared<GenerateCommand>();
  CLI::App* cmd = app.add_subcommand("generate", "generate text from a prompt");
  add_common(*cmd, c->model);
  GenerateOptions& g = c->gen;
  cmd->add_option("--prompt", c->prompt, "prompt text");
  cmd->add_option("--prompt-file", c->prompt_file, "read the prompt from a file");
  cmd->add_option("--max-tokens", g.max_tokens, "maximum new tokens")->capture_default_str();
  cmd->add_option("--temperature", g.temperature, "0 = greedy (default: generation_config.json)");
  cmd->add_option("--top-p", g.top_p, "nucleus sampling mass");
  cmd->add_option("--top-k", g.top_k, "keep the k most likely tokens (0 = off)");
  cmd->add_option("--min-p", g.min_p, "drop tokens below min-p × the top probability");
  cmd->add_option("--repetition-penalty", g.repetition_penalty, "repetition penalty (1 = off)");
  cmd->add_option("--presence-penalty", g.presence_penalty, "presence penalty");
  cmd->add_option("--frequency-penalty", g.frequency_penalty, "frequency penalty");
  cmd->add_option("--seed", g.seed, "sampling seed")->capture_default_str();
  cmd->add_option("--stop", g.stop, "stop string (repeatable)");
  cmd->add_flag("--ignore-eos", g.ignore_eos, "keep generating after the end-of-sequence token");
  cmd->add_flag("--json", c->json, "print one JSON object instead of streaming text");
  cmd->add_option("--draft", g.draft, "speculative decoding: 'ngram' or a draft model folder");
  cmd->add_option("--num-draft-tokens", g.num_draft_tokens, "maximum draft tokens per round (default: the method's)");
  cmd->add_option("--spec-mode", c->spec_mode, "exact (identical output) or rejection")->capture_default_str();
  cmd->add_flag("--no-adaptive", c->no_adaptive, "always draft the maximum depth");
  cmd->callback([c] { run(*c); });
}

}  // namespace specdec::cli
