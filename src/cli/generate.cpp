// `specdec generate`: one prompt, streamed to stdout, plain or speculative — a thin client of
// the public Generator.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"

namespace specdec::cli {

namespace {

void print_json(const Generation& g, const std::string& device) {
  nlohmann::json j;
  j["text"] = g.text;
  j["tokens"] = g.tokens;
  j["finish_reason"] = g.finish_reason;
  nlohmann::json st;
  st["prompt_tokens"] = g.stats.prompt_tokens;
  st["generated_tokens"] = g.tokens.size();
  st["prefill_tokens_per_s"] = g.stats.prefill_tokens_per_s();
  st["decode_tokens_per_s"] = g.stats.decode_tokens_per_s();
  st["ttft_s"] = g.stats.ttft_seconds;
  st["context_full"] = g.stats.context_full;
  st["device"] = device;
  if (g.stats.speculative) st["speculative"] = nlohmann::json::parse(g.stats.speculative->to_json());
  j["stats"] = st;
  std::cout << j.dump() << std::endl;
}

}  // namespace

void run_generate(const GenerateCommand& c) {
  Generator generator(c.engine);
  std::function<void(std::string_view)> stream;
  if (!c.json)
    stream = [](std::string_view piece) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    };
  const Generation g = generator.generate(c.prompt, c.request, stream);
  if (c.json) {
    print_json(g, generator.device_name());
    return;
  }
  std::fprintf(stdout, "\n");
  std::fflush(stdout);  // the text ends before the stats line, also when both go to one file
  std::fprintf(stderr,
               "[stats] prompt tokens %d, generated tokens %zu, prefill %.1f tokens/s, decode %.1f tokens/s, finish %s",
               g.stats.prompt_tokens, g.tokens.size(), g.stats.prefill_tokens_per_s(), g.stats.decode_tokens_per_s(),
               g.finish_reason.c_str());
  if (g.stats.speculative)
    std::fprintf(stderr, ", %s acceptance %.2f, mean accepted length %.2f", g.stats.speculative->draft.c_str(),
                 g.stats.speculative->acceptance_rate(), g.stats.speculative->mean_accepted_length());
  std::fprintf(stderr, "\n");
  if (g.stats.context_full)
    std::fprintf(stderr, "specdec: note: generation stopped at the end of the model's context, before --max-tokens %d\n",
                 c.request.max_tokens);
}

}  // namespace specdec::cli
