// Exact and rejection verification of one row's draft window, and the stop cut of a burst. Every
// random draw is keyed by (request seed, absolute position, stream), so a row's verdict does not
// depend on its batch or on how many drafts were proposed.
#include "speculative/verifier.h"

#include <algorithm>

#include "core/error.h"
#include "sampling/philox.h"

namespace specdec {
namespace {

// The checked pieces of one verification call.
struct Window {
  std::span<const float> logits;
  size_t vocab;
  std::vector<int32_t> generated;  // history.generated then every draft (if penalties read it)

  std::span<const float> row(size_t i) const { return logits.subspan(i * vocab, vocab); }
  // The generated tokens before window row i: the row's own plus drafts[0, i).
  std::span<const int32_t> generated_before(size_t i, size_t base) const {
    if (generated.empty()) return {};
    return std::span<const int32_t>(generated).first(base + i);
  }
};

Window make_window(std::span<const float> window, int64_t vocab, std::span<const int32_t> drafts,
                   const SamplingParams& params, const TokenHistory& history) {
  SPECDEC_CHECK(vocab > 0, "verifier: vocabulary size must be positive, got ", vocab);
  const size_t v = static_cast<size_t>(vocab);
  SPECDEC_CHECK(window.size() == (drafts.size() + 1) * v, "verifier: window holds ", window.size(),
                " logits, expected (", drafts.size(), " drafts + 1) x ", v);
  for (size_t i = 0; i < drafts.size(); ++i) {
    SPECDEC_CHECK(drafts[i] >= 0 && static_cast<size_t>(drafts[i]) < v, "verifier: draft ", i,
                  " is token ", drafts[i], ", outside the vocabulary of ", v);
  }
  Window w{window, v, {}};
  // Only penalties read the history; without them the (possibly long) copy is skipped and
  // generated_before() hands out an empty span.
  if (params.uses_history()) {
    w.generated.reserve(history.generated.size() + drafts.size());
    w.generated.assign(history.generated.begin(), history.generated.end());
    w.generated.insert(w.generated.end(), drafts.begin(), drafts.end());
  }
  return w;
}

}  // namespace

VerifyResult verify_exact(std::span<const float> window, int64_t vocab,
                          std::span<const int32_t> drafts, const SamplingParams& params,
                          const TokenHistory& history, uint64_t first_position) {
  const Window w = make_window(window, vocab, drafts, params, history);
  const size_t base = history.generated.size();
  VerifyResult out;
  out.emitted.reserve(drafts.size() + 1);
  for (size_t i = 0; i <= drafts.size(); ++i) {
    const int32_t target =
        sample(w.row(i), params, history.prompt, w.generated_before(i, base), first_position + i);
    out.emitted.push_back(target);
    if (i == drafts.size() || drafts[i] != target) break;
    ++out.accepted;
  }
  return out;
}

VerifyResult verify_exact(std::span<const int32_t> targets, std::span<const int32_t> drafts) {
  SPECDEC_CHECK(targets.size() == drafts.size() + 1, "verifier: ", targets.size(), " target tokens for ",
                drafts.size(), " drafts (expected one more)");
  VerifyResult out;
  out.emitted.reserve(targets.size());
  for (size_t i = 0; i < targets.size(); ++i) {
    out.emitted.push_back(targets[i]);
    if (i == drafts.size() || drafts[i] != targets[i]) break;
    ++out.accepted;
  }
  return out;
}

VerifyResult verify_rejection(std::span<const float> window, int64_t vocab,
                              std::span<const int32_t> drafts,
                              std::span<const std::vector<float>> q, const SamplingParams& params,
                              const TokenHistory& history, uint64_t first_position) {
  // p is one-hot at temperature 0: accepting x with p(x)/q(x) and resampling from p - q reduce to
  // "accept iff x is the argmax, else emit the argmax", which is exact matching.
  if (params.greedy()) return verify_exact(window, vocab, drafts, params, history, first_position);
  const Window w = make_window(window, vocab, drafts, params, history);
  SPECDEC_CHECK(q.empty() || q.size() == drafts.size(), "verifier: ", q.size(),
                " draft distributions for ", drafts.size(), " drafts");
  for (size_t i = 0; i < q.size(); ++i) {
    SPECDEC_CHECK(q[i].empty() || q[i].size() == w.vocab, "verifier: draft distribution ", i,
                  " has ", q[i].size(), " entries, expected ", w.vocab);
  }
  const size_t base = history.generated.size();
  VerifyResult out;
  out.emitted.reserve(drafts.size() + 1);
  for (size_t i = 0; i < drafts.size(); ++i) {
    const uint64_t position = first_position + i;
    std::vector<float> p =
        probabilities(w.row(i), params, history.prompt, w.generated_before(i, base));
    const bool one_hot = q.empty() || q[i].empty();
    const auto x = static_cast<size_t>(drafts[i]);
    const float qx = one_hot ? 1.0f : q[i][x];
    // u < p/q written without the division: a draft whose q(x) is 0 is accepted iff p(x) > 0.
    const float u = uniform01(params.seed, position, static_cast<uint32_t>(RandomStream::accept));
    if (u * qx < p[x]) {
      out.emitted.push_back(drafts[i]);
      ++out.accepted;
      continue;
    }
    // Residual max(0, p - q); reused in place. If rounding left it all zero (p == q to the last
    // bit makes a rejection impossible in exact arithmetic), p itself is the right fallback.
    std::vector<float> residual = p;
    if (one_hot) {
      residual[x] = std::max(0.0f, residual[x] - 1.0f);
    } else {
      for (size_t t = 0; t < w.vocab; ++t) residual[t] = std::max(0.0f, p[t] - q[i][t]);
    }
    const bool empty =
        std::none_of(residual.begin(), residual.end(), [](float r) { return r > 0; });
    const float v = uniform01(params.seed, position, static_cast<uint32_t>(RandomStream::resample));
    out.emitted.push_back(sample_from_weights(empty ? p : residual, v));
    return out;
  }
  const size_t k = drafts.size();
  out.emitted.push_back(
      sample(w.row(k), params, history.prompt, w.generated_before(k, base), first_position + k));
  return out;
}

BurstCut cut_burst(std::span<const int32_t> emitted, std::span<const int32_t> eos_ids,
                   size_t remaining) {
  BurstCut cut;
  for (int32_t token : emitted) {
    if (cut.kept == remaining) break;
    ++cut.kept;
    if (std::find(eos_ids.begin(), eos_ids.end(), token) != eos_ids.end()) {
      cut.eos = true;
      return cut;
    }
  }
  cut.length = cut.kept == remaining;
  return cut;
}

}  // namespace specdec
