// The logits-processor stages and the (seed, position)-keyed sampler. Every loop that sums walks
// tokens in id order, so results do not depend on threads, batches or neighbours.
#include "sampling/sampling.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"
#include "sampling/draw.h"
#include "sampling/philox.h"

namespace specdec {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

void check_tokens(std::span<const int32_t> tokens, size_t vocab, const char* what) {
  for (int32_t t : tokens) {
    SPECDEC_CHECK(t >= 0 && static_cast<size_t>(t) < vocab, "sampling: ", what, " token ", t,
                  " is outside the vocabulary of ", vocab);
  }
}

}  // namespace

SamplingParams sampling_params(const SampleRow& row) {
  SamplingParams p;
  p.temperature = row.temperature;
  p.top_k = row.top_k;
  p.top_p = row.top_p;
  p.min_p = row.min_p;
  p.seed = row.seed;
  return p;
}

void SamplingParams::validate(int64_t vocab_size) const {
  SPECDEC_CHECK(std::isfinite(temperature) && temperature >= 0.0f,
                "sampling: temperature must be finite and >= 0 (0 = greedy), got ", temperature);
  SPECDEC_CHECK(top_k >= 0, "sampling: top_k must be >= 0 (0 = off), got ", top_k);
  SPECDEC_CHECK(top_p > 0.0f && top_p <= 1.0f, "sampling: top_p must be in (0, 1], got ", top_p);
  SPECDEC_CHECK(min_p >= 0.0f && min_p <= 1.0f, "sampling: min_p must be in [0, 1], got ", min_p);
  SPECDEC_CHECK(std::isfinite(repetition_penalty) && repetition_penalty > 0.0f,
                "sampling: repetition_penalty must be finite and > 0 (1 = off), got ",
                repetition_penalty);
  SPECDEC_CHECK(presence_penalty >= -2.0f && presence_penalty <= 2.0f,
                "sampling: presence_penalty must be in [-2, 2], got ", presence_penalty);
  SPECDEC_CHECK(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f,
                "sampling: frequency_penalty must be in [-2, 2], got ", frequency_penalty);
  for (const auto& [token, bias] : logit_bias) {
    SPECDEC_CHECK(token >= 0, "sampling: logit_bias token ", token, " is negative");
    SPECDEC_CHECK(vocab_size <= 0 || token < vocab_size, "sampling: logit_bias token ", token,
                  " is outside the vocabulary of ", vocab_size);
    SPECDEC_CHECK(bias >= -100.0f && bias <= 100.0f, "sampling: logit_bias for token ", token,
                  " must be in [-100, 100], got ", bias);
  }
}

LogitsProcessor::LogitsProcessor(const SamplingParams& params) : params_(params) {
  params_.validate();
}

namespace {

// Per-token counts of a history, in a vocabulary-sized table of the calling thread that is left
// zeroed: a sampled row with penalties reads its whole history at every position it draws (each
// position of a verify window too), and sorting that history each time cost more than the draw.
class TokenCounts {
 public:
  explicit TokenCounts(size_t vocab) {
    if (table().size() < vocab) table().resize(vocab, 0);
  }
  ~TokenCounts() {
    for (int32_t t : seen_) table()[static_cast<size_t>(t)] = 0;
  }
  TokenCounts(const TokenCounts&) = delete;
  TokenCounts& operator=(const TokenCounts&) = delete;
  void add(std::span<const int32_t> tokens) {
    for (int32_t t : tokens) {
      uint32_t& c = table()[static_cast<size_t>(t)];
      if (c++ == 0) seen_.push_back(t);
    }
  }
  // Distinct tokens, in the order first seen.
  std::span<const int32_t> seen() const { return seen_; }
  uint32_t count(int32_t t) const { return table()[static_cast<size_t>(t)]; }

 private:
  static std::vector<uint32_t>& table() {
    thread_local std::vector<uint32_t> counts;
    return counts;
  }
  std::vector<int32_t> seen_;
};

}  // namespace

void LogitsProcessor::apply_penalties(std::span<float> logits, const TokenHistory& history) const {
  if (!params_.uses_history()) return;  // long histories cost nothing when no penalty reads them
  const size_t vocab = logits.size();
  check_tokens(history.prompt, vocab, "prompt");
  check_tokens(history.generated, vocab, "generated");

  // Each distinct token is penalised once, whatever the order it is met in.
  const float rep = params_.repetition_penalty;
  if (rep != 1.0f) {
    TokenCounts seen(vocab);
    seen.add(history.prompt);
    seen.add(history.generated);
    for (int32_t t : seen.seen()) {
      float& l = logits[static_cast<size_t>(t)];
      l = l < 0.0f ? l * rep : l / rep;
    }
  }

  const float presence = params_.presence_penalty, frequency = params_.frequency_penalty;
  if (presence != 0.0f || frequency != 0.0f) {
    TokenCounts generated(vocab);
    generated.add(history.generated);
    for (int32_t t : generated.seen()) {
      const auto count = static_cast<float>(generated.count(t));
      logits[static_cast<size_t>(t)] -= presence + frequency * count;
    }
  }
}

void LogitsProcessor::apply_logit_bias(std::span<float> logits) const {
  for (const auto& [token, bias] : params_.logit_bias) {
    SPECDEC_CHECK(static_cast<size_t>(token) < logits.size(), "sampling: logit_bias token ", token,
                  " is outside the vocabulary of ", logits.size());
    logits[static_cast<size_t>(token)] += bias;
  }
}

void LogitsProcessor::apply_temperature(std::span<float> logits) const {
  const float t = params_.temperature;
  if (t == 0.0f || t == 1.0f) return;
  for (float& l : logits) l /= t;
}

void LogitsProcessor::apply_top_k(std::span<float> logits) const {
  const auto k = static_cast<size_t>(params_.top_k);
  if (k == 0 || k >= logits.size()) return;
  std::vector<float> values(logits.begin(), logits.end());
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(k - 1),
                   values.end(), std::greater<float>());
  const float kth = values[k - 1];
  for (float& l : logits) {
    if (l < kth) l = kNegInf;
  }
}

void LogitsProcessor::apply_top_p(std::span<float> logits) const {
  if (params_.top_p >= 1.0f) return;
  std::vector<float> probs(logits.begin(), logits.end());
  softmax_in_place(probs);
  std::vector<int32_t> order;
  order.reserve(probs.size());
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] > 0.0f) order.push_back(static_cast<int32_t>(i));
  }
  // (probability desc, id asc) is a strict total order, so the m most probable tokens found by
  // nth_element are exactly the first m of the fully sorted order: sorting grows m only until
  // the boundary is found, which is a few dozen tokens for the distributions models produce.
  const auto higher = [&](int32_t a, int32_t b) {
    const float pa = probs[static_cast<size_t>(a)], pb = probs[static_cast<size_t>(b)];
    return pa != pb ? pa > pb : a < b;
  };
  // A token stays while the mass strictly before it (in this order) is below top_p: the same
  // set HF's TopPLogitsWarper keeps, and never empty.
  double before = 0.0;
  size_t keep = 0, sorted = 0;
  while (before < params_.top_p && keep < order.size()) {
    if (keep == sorted) {
      const size_t m = std::min(order.size(), std::max<size_t>(64, 2 * sorted));
      const auto first = order.begin() + static_cast<std::ptrdiff_t>(sorted);
      const auto mid = order.begin() + static_cast<std::ptrdiff_t>(m);
      if (mid != order.end()) std::nth_element(first, mid - 1, order.end(), higher);
      std::sort(first, mid, higher);
      sorted = m;
    }
    before += probs[static_cast<size_t>(order[keep])];
    ++keep;
  }
  // Everything else goes, including tokens whose probability underflowed to 0.
  std::vector<float> kept_logits(keep);
  for (size_t r = 0; r < keep; ++r) kept_logits[r] = logits[static_cast<size_t>(order[r])];
  std::fill(logits.begin(), logits.end(), kNegInf);
  for (size_t r = 0; r < keep; ++r) logits[static_cast<size_t>(order[r])] = kept_logits[r];
}

void LogitsProcessor::apply_min_p(std::span<float> logits) const {
  if (params_.min_p <= 0.0f) return;
  std::vector<float> probs(logits.begin(), logits.end());
  softmax_in_place(probs);
  const float scaled = params_.min_p * *std::max_element(probs.begin(), probs.end());
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] < scaled) logits[i] = kNegInf;
  }
}

void LogitsProcessor::apply(std::span<float> logits, const TokenHistory& history) const {
  apply_penalties(logits, history);
  apply_logit_bias(logits);
  if (params_.greedy()) return;  // the filters keep the argmax, so greedy needs none of them
  apply_temperature(logits);
  apply_top_k(logits);
  apply_top_p(logits);
  apply_min_p(logits);
}

int32_t argmax(std::span<const float> values) {
  SPECDEC_CHECK(!values.empty(), "sampling: argmax of an empty row");
  // The first maximum wins. A NaN anywhere means the model's numbers broke down: an error, as
  // in sampled decoding, never a silent token 0. Computed in two passes that the compiler
  // vectorises: the maximum over 16 independent lanes (noting NaNs as it goes), then the first
  // index holding a value equal to it.
  SPECDEC_CHECK(!std::isnan(values[0]), "sampling: logits contain NaN");
  constexpr size_t kLanes = 16;
  std::array<float, kLanes> lane;
  std::array<int, kLanes> nan{};
  lane.fill(values[0]);
  const size_t n = values.size(), body = n / kLanes * kLanes;
  for (size_t i = 0; i < body; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) {
      lane[j] = values[i + j] > lane[j] ? values[i + j] : lane[j];
      nan[j] |= values[i + j] != values[i + j];
    }
  }
  float max = lane[0];
  for (size_t j = 1; j < kLanes; ++j) max = lane[j] > max ? lane[j] : max;
  for (size_t i = body; i < n; ++i) {
    max = values[i] > max ? values[i] : max;
    nan[0] |= std::isnan(values[i]);
  }
  for (int any : nan) SPECDEC_CHECK(!any, "sampling: logits contain NaN");
  for (size_t i = 0; i < n; ++i) {
    if (values[i] == max) return static_cast<int32_t>(i);
  }
  return 0;  // unreachable: max is one of the values
}

void softmax_in_place(std::span<float> logits) {
  SPECDEC_CHECK(!logits.empty(), "sampling: softmax of an empty row");
  float max = kNegInf;
  for (float l : logits) {
    SPECDEC_CHECK(!std::isnan(l), "sampling: logits contain NaN");
    max = std::max(max, l);
  }
  SPECDEC_CHECK(std::isfinite(max), "sampling: no token has a finite logit (max is ", max, ")");
  double sum = 0.0;
  for (float& l : logits) {
    l = std::exp(l - max);
    sum += l;
  }
  const auto inv = static_cast<float>(1.0 / sum);
  for (float& l : logits) l *= inv;
}

int32_t sample_from_weights(std::span<const float> weights, float u) {
  double total = 0.0;
  for (float w : weights) {
    if (w > 0.0f) total += w;
  }
  SPECDEC_CHECK(total > 0.0, "sampling: every token has zero probability (", weights.size(),
                " tokens)");
  // The cumulative sum below repeats the total's additions in the same order, so the last
  // positive token's cumulative equals total > u * total: the loop always returns.
  const double target = static_cast<double>(u) * total;
  double cum = 0.0;
  int32_t last = -1;
  for (size_t i = 0; i < weights.size(); ++i) {
    if (!(weights[i] > 0.0f)) continue;
    cum += weights[i];
    last = static_cast<int32_t>(i);
    if (cum > target) return last;
  }
  return last;
}

namespace {

// A copy of the logits after the params' penalties (over `history`) and logit bias: the row
// every distribution, draw and logprob starts from. Validates the params.
std::vector<float> penalised_logits(std::span<const float> logits, const SamplingParams& params,
                                    const TokenHistory& history) {
  const LogitsProcessor processor(params);
  std::vector<float> l(logits.begin(), logits.end());
  processor.apply_penalties(l, history);
  processor.apply_logit_bias(l);
  return l;
}

}  // namespace

std::vector<float> probabilities(std::span<const float> logits, const SamplingParams& params,
                                 std::span<const int32_t> prompt,
                                 std::span<const int32_t> generated) {
  SPECDEC_CHECK(!logits.empty(), "sampling: empty logits row");
  std::vector<float> p = penalised_logits(logits, params, TokenHistory{prompt, generated});
  if (params.greedy()) {
    const int32_t best = argmax(p);
    std::fill(p.begin(), p.end(), 0.0f);
    p[static_cast<size_t>(best)] = 1.0f;
    return p;
  }
  return draw_probabilities(p, params);
}

int32_t sample(std::span<const float> logits, const SamplingParams& params,
               std::span<const int32_t> prompt, std::span<const int32_t> generated,
               uint64_t position) {
  if (params.selects_argmax()) {
    // Nothing changes the logits, and probabilities() would only turn their argmax into a
    // one-hot row: take the argmax directly (no copy of the vocabulary per verified position).
    params.validate();
    SPECDEC_CHECK(!logits.empty(), "sampling: empty logits row");
    return argmax(logits);
  }
  SPECDEC_CHECK(!logits.empty(), "sampling: empty logits row");
  const TokenHistory history{prompt, generated};
  if (params.greedy()) return argmax(penalised_logits(logits, params, history));
  const float u = uniform01(params.seed, position, static_cast<uint32_t>(RandomStream::token));
  if (params.logits_only()) {
    params.validate();
    return draw_sampled(logits, params, u);
  }
  return draw_sampled(penalised_logits(logits, params, history), params, u);
}

TokenLogprobs token_logprobs(std::span<const float> logits, const SamplingParams& params, const TokenHistory& history,
                             int32_t token, int top) {
  SPECDEC_CHECK(!logits.empty(), "sampling: empty logits row");
  SPECDEC_CHECK(token >= 0 && static_cast<size_t>(token) < logits.size(), "sampling: token ", token,
                " is outside the vocabulary of ", logits.size());
  SPECDEC_CHECK(top >= 0, "sampling: a negative number of top logprobs (", top, ")");
  // A copy only where penalties or a bias change the logits.
  std::vector<float> changed;
  std::span<const float> l = logits;
  params.validate();
  if (!params.logits_only()) {
    changed = penalised_logits(logits, params, history);
    l = changed;
  }
  const double log_sum = log_sum_exp(l);
  const auto logprob = [&](size_t i) { return static_cast<float>(static_cast<double>(l[i]) - log_sum); };
  TokenLogprobs out;
  out.token = token;
  out.logprob = logprob(static_cast<size_t>(token));
  const float own = l[static_cast<size_t>(token)];
  out.rank = 1 + static_cast<int>(std::count_if(l.begin(), l.end(), [&](float v) { return v > own; }));
  const size_t k = std::min(static_cast<size_t>(top), l.size());
  if (k == 0) return out;
  // The k most likely, ties in id order: those at or above the k-th largest value, sorted.
  const float kth = kth_largest(l, k);
  std::vector<int32_t> ids;
  for (size_t i = 0; i < l.size(); ++i)
    if (l[i] >= kth) ids.push_back(static_cast<int32_t>(i));
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    const float la = l[static_cast<size_t>(a)], lb = l[static_cast<size_t>(b)];
    return la != lb ? la > lb : a < b;
  });
  for (size_t i = 0; i < k; ++i) out.top.emplace_back(ids[i], logprob(static_cast<size_t>(ids[i])));
  return out;
}

SampleRow sample_row(const SamplingParams& params, uint64_t position) {
  SPECDEC_CHECK(params.logits_only(), "sampling: a row with penalties or a logit bias reads more than its logits ",
                "and has no SampleRow");
  return SampleRow{params.temperature, params.top_k, params.top_p, params.min_p, params.seed, position};
}

void validate(const SampleRow& row) { sampling_params(row).validate(); }

int32_t sample(std::span<const float> logits, const SampleRow& row) {
  return sample(logits, sampling_params(row), {}, {}, row.position);
}

}  // namespace specdec
