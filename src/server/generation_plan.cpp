// plan_generation: what the engine needs that the body alone cannot say.
#include "server/generation_plan.h"

#include <algorithm>
#include <random>

#include "server/api_error.h"

namespace specdec::server {

namespace {

// Completions default to OpenAI's 16 new tokens; chat to whatever the context has left.
constexpr int kCompletionDefaultTokens = 16;

// The server's speculation, narrowed by the request's `speculative` object.
SpeculativeOptions speculative_options(const CompletionRequest& r, const ServerOptions& o) {
  SpeculativeOptions s;
  s.adaptive = o.adaptive;
  s.mode = o.spec_mode;
  s.num_draft_tokens = o.num_draft_tokens;
  const std::string method = r.spec_method.value_or("");
  if (method == "none") return s;
  const DraftKind* wanted = nullptr;
  const DraftKind ngram = DraftKind::ngram, model = DraftKind::model;
  if (method == "ngram") wanted = &ngram;
  if (method == "draft") wanted = &model;
  for (const DraftSpec& d : o.drafts)
    if (!wanted || d.kind == *wanted) {
      s.draft = draft_id(d);
      break;
    }
  if (wanted && s.draft.empty())
    throw invalid_field("speculative.method",
                        "'speculative.method' " + method + " is not available: the server was not started with it");
  if (r.num_draft_tokens) {
    if (o.num_draft_tokens > 0 && *r.num_draft_tokens > o.num_draft_tokens)
      throw invalid_field("speculative.num_draft_tokens", "'speculative.num_draft_tokens' must be at most " +
                                                              std::to_string(o.num_draft_tokens) +
                                                              " (the server's --num-draft-tokens)");
    s.num_draft_tokens = *r.num_draft_tokens;
  }
  return s;
}

std::vector<int32_t> prompt_tokens(const Prompt& p, const Engine& engine) {
  if (p.tokens.empty()) return engine.encode(p.text);
  const int vocab = engine.model_info().tokenizer_vocab_size;
  for (int32_t t : p.tokens)
    if (t >= vocab)
      throw invalid_field("prompt", "'prompt' token id " + std::to_string(t) + " is outside the vocabulary (" +
                                        std::to_string(vocab) + " tokens)");
  return p.tokens;
}

int checked_max_tokens(const CompletionRequest& r, int prompt_len, int context) {
  const int left = context - prompt_len;
  const std::string param = r.max_tokens ? "max_tokens" : "prompt";
  const int max_tokens = r.max_tokens.value_or(r.endpoint == Endpoint::chat ? left : kCompletionDefaultTokens);
  if (max_tokens < 1 || static_cast<int64_t>(prompt_len) + max_tokens > context)
    throw invalid_field(param, "This model's maximum context length is " + std::to_string(context) +
                                   " tokens. However, you requested " +
                                   std::to_string(static_cast<int64_t>(prompt_len) + std::max(max_tokens, 1)) +
                                   " tokens (" + std::to_string(prompt_len) + " in the prompt, " +
                                   std::to_string(std::max(max_tokens, 1)) +
                                   " for the completion). Please reduce the prompt or max_tokens.");
  return max_tokens;
}

}  // namespace

std::vector<int32_t> end_of_turn_tokens(const PromptRenderer& render, const Engine& engine) {
  if (!render) return {};
  static const std::string kProbe = "specdec-end-of-turn-probe";
  std::string text;
  try {
    const nlohmann::json messages =
        nlohmann::json::array({{{"role", "user"}, {"content", "hi"}}, {{"role", "assistant"}, {"content", kProbe}}});
    text = render(messages, false);
  } catch (const std::exception&) {
    return {};
  }
  const size_t at = text.rfind(kProbe);
  if (at == std::string::npos) return {};
  const std::vector<int32_t> after = engine.encode(text.substr(at + kProbe.size()), true);
  // A special token decodes to nothing when specials are skipped: the first token after the
  // text is the end of turn only when it is one.
  if (after.empty() || !engine.decode({after.front()}, true).empty()) return {};
  return {after.front()};
}

GenerationPlan plan_generation(const CompletionRequest& r, const Engine& engine, const ServerOptions& options,
                               const std::vector<int32_t>& end_of_turn) {
  GenerationPlan plan;
  const SpeculativeOptions spec = speculative_options(r, options);
  const int vocab = engine.model_info().tokenizer_vocab_size;
  for (const auto& [token, bias] : r.sampling.logit_bias)
    if (token >= vocab)
      throw invalid_field("logit_bias", "'logit_bias' token id " + std::to_string(token) +
                                            " is outside the vocabulary (" + std::to_string(vocab) + " tokens)");
  for (int32_t t : r.stop_token_ids)
    if (t >= vocab)
      throw invalid_field("stop_token_ids", "'stop_token_ids' token id " + std::to_string(t) +
                                                " is outside the vocabulary (" + std::to_string(vocab) + " tokens)");
  const int context = engine.model_info().context_length;
  const uint64_t seed = r.seeded ? r.sampling.seed : std::random_device{}();
  for (size_t p = 0; p < r.prompts.size(); ++p) {
    std::vector<int32_t> tokens = prompt_tokens(r.prompts[p], engine);
    const int max_tokens = checked_max_tokens(r, static_cast<int>(tokens.size()), context);
    plan.prompt_tokens += static_cast<int>(tokens.size());
    const std::string text = r.prompts[p].tokens.empty() ? r.prompts[p].text : engine.decode(tokens, false);
    for (int c = 0; c < r.n; ++c) {
      PlannedChoice choice;
      GenerationRequest& g = choice.request;
      g.prompt_tokens = tokens;
      g.max_tokens = max_tokens;
      g.sampling = r.sampling;
      // Each choice of a sampled request draws its own tokens; a seeded request stays repeatable.
      g.sampling.seed = seed + static_cast<uint64_t>(plan.choices.size());
      g.stop = r.stop;
      g.stop_token_ids = r.stop_token_ids;
      if (r.endpoint == Endpoint::chat)
        g.stop_token_ids.insert(g.stop_token_ids.end(), end_of_turn.begin(), end_of_turn.end());
      g.ignore_eos = r.ignore_eos;
      g.logprobs = r.logprobs;
      // The echoed prompt's logprobs and vLLM's prompt_logprobs come from one scoring, with the
      // larger number of alternatives; each response field keeps its own.
      const int echo_top = r.echo && r.logprobs ? *r.logprobs : -1;
      const int prompt_top = std::max(echo_top, r.prompt_logprobs.value_or(-1));
      if (prompt_top >= 0) g.prompt_logprobs = prompt_top;
      g.speculative = spec;
      choice.prompt_index = static_cast<int>(p);
      choice.prompt_text = text;
      plan.choices.push_back(std::move(choice));
    }
  }
  return plan;
}

}  // namespace specdec::server
