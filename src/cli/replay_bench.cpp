// `specdec bench --replay`: each suite request's rounds replayed against this machine's measured
// costs, for the default policy, every fixed depth and the best schedule (speculative/replay.h).
#include <algorithm>
#include <cstdio>
#include <span>

#include "cli/bench_common.h"
#include "core/error.h"
#include "speculative/methods/draft_model.h"
#include "speculative/methods/ngram.h"
#include "speculative/methods/ngram_method.h"
#include "speculative/replay.h"

namespace specdec::cli {

namespace {

// Median seconds of fn() over `reps` calls.
template <typename Fn>
double median_seconds(int reps, Fn&& fn) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return median(t);
}

// A scratch sequence in its own cache, with room for `room` tokens past its context.
struct Scratch {
  std::unique_ptr<KvCache> cache;
  KvCache::SeqId seq = 0;
  int context = 0;
};

Scratch empty_scratch(Model& model, int room) {
  Scratch sc;
  sc.cache = model.make_cache(room / 16 + 4);
  sc.seq = sc.cache->create();
  SPECDEC_CHECK(sc.cache->reserve(sc.seq, room), "replay: the scratch KV cache is too small");
  return sc;
}

// A scratch sequence holding `context` (fed in one forward).
Scratch scratch(Model& model, const std::vector<int32_t>& context, int room) {
  Scratch sc = empty_scratch(model, static_cast<int>(context.size()) + room);
  sc.context = static_cast<int>(context.size());
  model.forward(ForwardRequest{{SequenceInput{sc.seq, context, {}}}, {}}, *sc.cache);
  return sc;
}

// One forward of `width` tokens at the scratch sequence's end, greedy tokens drawn on the
// backend at every position (as a verify window or a draft step), then rolled back.
void window(Model& model, Scratch& sc, int width) {
  SPECDEC_CHECK(sc.cache->reserve(sc.seq, sc.context + width), "replay: the scratch KV cache is too small");
  SequenceInput in{sc.seq, std::vector<int32_t>(static_cast<size_t>(width), 7), {}};
  for (int j = 0; j < width; ++j) in.logits_at.push_back(j);
  model.forward(ForwardRequest{{in}, {}, std::vector<SampleRow>(static_cast<size_t>(width))}, *sc.cache);
  sc.cache->truncate(sc.seq, sc.context);
}

// Greedy tokens the model predicts after each prefix prompt + tokens[0..j), j < tokens.size().
std::vector<int32_t> teacher_forced(Model& model, const std::vector<int32_t>& prompt,
                                    const std::vector<int32_t>& tokens) {
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), tokens.begin(), tokens.end());
  Scratch sc = empty_scratch(model, static_cast<int>(all.size()));
  SequenceInput in{sc.seq, all, {}};
  for (size_t j = 0; j < tokens.size(); ++j) in.logits_at.push_back(static_cast<int32_t>(prompt.size() + j) - 1);
  const size_t n = in.logits_at.size();
  return model.forward(ForwardRequest{{in}, {}, std::vector<SampleRow>(n)}, *sc.cache).tokens;
}

// run[t]: how many of the predictions from t on equal the generated tokens.
std::vector<int> runs_of(const std::vector<int32_t>& predicted, const std::vector<int32_t>& generated) {
  std::vector<int> run(generated.size() + 1, 0);
  for (size_t t = generated.size(); t-- > 0;) run[t] = predicted[t] == generated[t] ? run[t + 1] + 1 : 0;
  run.pop_back();
  return run;
}

ReplayTrace ngram_trace(const std::vector<int32_t>& prompt, const std::vector<int32_t>& generated, int depth) {
  const NgramOptions defaults;
  NgramIndex index(defaults.max_ngram, defaults.min_ngram);
  index.append(prompt);
  ReplayTrace trace;
  trace.run.assign(generated.size(), 0);
  trace.proposal.assign(generated.size(), 0);
  for (size_t t = 1; t < generated.size(); ++t) {
    index.append(std::span<const int32_t>(&generated[t - 1], 1));
    const std::vector<int32_t> drafts = index.propose(depth);
    int matched = 0;
    while (matched < static_cast<int>(drafts.size()) && t + static_cast<size_t>(matched) < generated.size() &&
           drafts[static_cast<size_t>(matched)] == generated[t + static_cast<size_t>(matched)])
      ++matched;
    trace.run[t] = matched;
    trace.proposal[t] = static_cast<int>(drafts.size());
  }
  return trace;
}

}  // namespace

void replay_bench(const BenchOptions& o, Session& s, const std::vector<SuitePrompt>& suite, nlohmann::json& report) {
  SPECDEC_CHECK(o.sampling.greedy(), "--replay needs greedy decoding: sampled tokens change from run to run");
  constexpr int kWidths = 17, kReps = 15;
  std::vector<std::vector<int32_t>> prompts;
  int batch_tokens = 1;
  for (const auto& p : suite) {
    prompts.push_back(s.tokenizer->encode(p.text, false));
    batch_tokens = std::max(batch_tokens, static_cast<int>(prompts.back().size()) + 1);
  }
  // The requests' tokens: plain greedy decoding (speculative decoding emits the same).
  BenchEngine plain_engine = make_engine(s, 1, batch_tokens, "", 0);
  std::vector<std::vector<int32_t>> generated;
  for (size_t i = 0; i < prompts.size(); ++i)
    generated.push_back(run_batch(plain_engine, {prompts[i]}, suite[i].max_tokens, o.sampling, 0).results[0].tokens);
  // Target forwards of 1 .. kWidths tokens at a context of 128: each width's median over a block
  // of calls (a width follows itself, as a plain step does in decoding), then the median over
  // three passes, so that a drifting machine does not tilt one width against the others.
  const std::vector<int32_t> context = synthetic_prompt(s, suite_text(suite), 128, 3);
  Scratch target = scratch(*s.model, context, kWidths + 16);
  ReplayCosts measured;
  measured.forward.assign(kWidths + 1, 0.0);
  {
    std::vector<std::vector<double>> t(kWidths + 1);
    for (int pass = 0; pass < 3; ++pass)
      for (int w = 1; w <= kWidths; ++w) {
        for (int i = 0; i < 3; ++i) window(*s.model, target, w);  // not timed: the switch of width
        t[static_cast<size_t>(w)].push_back(median_seconds(kReps, [&] { window(*s.model, target, w); }));
      }

    for (int w = 1; w <= kWidths; ++w) measured.forward[static_cast<size_t>(w)] = median(t[static_cast<size_t>(w)]);
  }
  // Given costs replace the measured ones; widths past the list go on at its last step.
  const std::vector<double> timed = measured.forward;
  if (!o.replay_forward_ms.empty()) {
    ReplayCosts given;
    given.forward.push_back(0.0);  // no width 0
    for (double ms : o.replay_forward_ms) given.forward.push_back(ms * 1e-3);
    for (int w = 1; w <= kWidths; ++w) measured.forward[static_cast<size_t>(w)] = given.forward_cost(w);
  }
  std::vector<double> prefill;
  for (const auto& p : prompts) prefill.push_back(median_seconds(5, [&] { Scratch fresh = scratch(*s.model, p, 1); }));
  std::printf(
      "\nreplay: %s, greedy; target forward of 1 / 2 / 4 / 8 / 11 / 16 tokens: %.3f / %.3f / %.3f / %.3f / %.3f / %.3f "
      "ms\n",
      s.backend->name().c_str(), measured.forward[1] * 1e3, measured.forward[2] * 1e3, measured.forward[4] * 1e3,
      measured.forward[8] * 1e3, measured.forward[11] * 1e3, measured.forward[16] * 1e3);
  nlohmann::json methods = nlohmann::json::array();
  for (const std::string& draft : o.drafts) {
    const bool ngram = draft == "ngram";
    ReplayCosts costs = measured;
    std::shared_ptr<Model> draft_model;
    int depth = o.num_draft;
    std::vector<double> draft_prefill(prompts.size(), 0.0);
    if (ngram) {
      if (depth == 0) depth = NgramOptions{}.num_draft;
    } else {
      BenchEngine loader = make_engine(s, 1, batch_tokens, draft, o.num_draft);
      draft_model = s.draft_models.at(draft);
      if (depth == 0) depth = DraftModelOptions{}.num_draft;
      // A draft call right after a target forward (as in a round): calls of one and of eight
      // steps give the fixed part and the step; a catch-up feed costs about one step.
      Scratch d = scratch(*draft_model, context, 16);
      auto call = [&](int k) {
        std::vector<double> t;
        for (int rep = 0; rep < kReps; ++rep) {
          window(*s.model, target, 4);
          t.push_back(median_seconds(1, [&] {
            for (int j = 0; j < k; ++j) window(*draft_model, d, 1);
          }));
        }
        return median(t);
      };
      const double one = call(1), eight = call(8);
      costs.draft_step = std::max(0.0, (eight - one) / 7);
      costs.draft_fixed = std::max(0.0, one - costs.draft_step);
      costs.catch_up = costs.draft_step;
      // A verify window of w tokens follows a draft call of depth w - 1, whose steps take some
      // of the target's weights out of the caches: time the windows that way.
      for (int w = 2; w <= kWidths; ++w) {
        std::vector<double> t;
        for (int rep = 0; rep < kReps; ++rep) {
          for (int j = 0; j < w - 1; ++j) window(*draft_model, d, 1);
          t.push_back(median_seconds(1, [&] { window(*s.model, target, w); }));
        }
        // With given costs, the window after a call keeps what the call's eviction added here.
        costs.forward[static_cast<size_t>(w)] =
            measured.forward[static_cast<size_t>(w)] + median(t) - timed[static_cast<size_t>(w)];
      }
      for (size_t i = 0; i < prompts.size(); ++i)
        draft_prefill[i] = median_seconds(3, [&] { Scratch fresh = scratch(*draft_model, prompts[i], 1); });
      std::printf(
          "draft model %s: a call of depth k after a target forward: %.3f + %.3f k ms; a window of 2 / 4 / 8 tokens "
          "after a call: %.3f / %.3f / %.3f ms\n",
          draft.c_str(), costs.draft_fixed * 1e3, costs.draft_step * 1e3, costs.forward[2] * 1e3,
          costs.forward[4] * 1e3, costs.forward[8] * 1e3);
    }
    // What if a window's tokens beyond the first cost o.replay_window_cost times as much.
    for (int w = 2; w <= kWidths; ++w) {
      double& f = costs.forward[static_cast<size_t>(w)];
      f = costs.forward[1] + o.replay_window_cost * (f - costs.forward[1]);
    }
    std::printf(
        "\nreplay: %s (depth up to %d%s); speedups over plain decoding: decode phase / whole request (prefill "
        "counted in both)\n",
        draft.c_str(), depth,
        o.replay_window_cost == 1.0 ? "" : str_cat(", window tokens at ", o.replay_window_cost, "x").c_str());
    std::printf("%-18s %9s %15s %9s %20s %15s\n", "prompt", "plain ms", "policy", "tok/fwd", "best fixed depth",
                "best schedule");
    nlohmann::json per_prompt = nlohmann::json::array();
    for (size_t i = 0; i < prompts.size(); ++i) {
      ReplayTrace trace;
      if (ngram) {
        trace = ngram_trace(prompts[i], generated[i], depth);
      } else {
        trace.run = runs_of(teacher_forced(*draft_model, prompts[i], generated[i]), generated[i]);
      }
      const double plain = replay_plain(trace, costs);
      auto whole = [&](double decode) { return (prefill[i] + plain) / (prefill[i] + draft_prefill[i] + decode); };
      const ReplayResult policy = replay_policy(trace, costs, depth, true);
      ReplayResult fixed;
      int fixed_depth = 0;
      for (int k = 1; k <= depth; ++k) {
        const ReplayResult r = replay_policy(trace, costs, k, false);
        if (fixed_depth == 0 || r.seconds < fixed.seconds) {
          fixed = r;
          fixed_depth = k;
        }
      }
      const ReplayResult best = replay_best(trace, costs, depth);
      std::printf("%-18s %9.1f %6.2fx / %5.2fx %9.2f %3d: %6.2fx / %5.2fx %6.2fx / %5.2fx\n", suite[i].name.c_str(),
                  (prefill[i] + plain) * 1e3, plain / policy.seconds, whole(policy.seconds),
                  policy.tokens_per_forward(), fixed_depth, plain / fixed.seconds, whole(fixed.seconds),
                  plain / best.seconds, whole(best.seconds));
      auto entry = [&](const ReplayResult& r) {
        return nlohmann::json{{"decode_speedup", plain / r.seconds},
                              {"speedup", whole(r.seconds)},
                              {"rounds", r.rounds},
                              {"drafted", r.drafted},
                              {"accepted", r.accepted}};
      };
      nlohmann::json fixed_json = entry(fixed);
      fixed_json["depth"] = fixed_depth;
      per_prompt.push_back({{"prompt", suite[i].name},
                            {"plain_ms", (prefill[i] + plain) * 1e3},
                            {"prefill_ms", prefill[i] * 1e3},
                            {"policy", entry(policy)},
                            {"best_fixed_depth", fixed_json},
                            {"best_schedule", entry(best)}});
    }
    methods.push_back({{"method", draft},
                       {"draft_call_ms", {{"fixed", costs.draft_fixed * 1e3}, {"per_step", costs.draft_step * 1e3}}},
                       {"prompts", per_prompt}});
  }
  nlohmann::json widths = nlohmann::json::array();
  for (int w = 1; w <= kWidths; ++w) widths.push_back(measured.forward[static_cast<size_t>(w)] * 1e3);
  report["replay"] = {{"forward_ms", widths}, {"methods", methods}};
}

}  // namespace specdec::cli
