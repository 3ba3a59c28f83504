// The host's sampled draw (draw.h): the scalar kernels, the choice of kernel set, and the filters
// and walk that follow the vectorised passes.
#include "sampling/draw.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "core/error.h"

namespace specdec {

namespace {

using namespace draw_exp;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

float scale_scalar(const float* l, float* s, size_t n, float temperature, bool* nan) {
  float max = kNegInf;
  bool bad = false;
  for (size_t i = 0; i < n; ++i) {
    const float v = temperature == 1.0f ? l[i] : l[i] / temperature;
    s[i] = v;
    bad |= v != v;
    max = v > max ? v : max;
  }
  *nan = bad;
  return max;
}

uint64_t masses_scalar(const float* e, size_t n, uint64_t* block_sums) {
  uint64_t total = 0;
  for (size_t b = 0; b * kDrawBlock < n; ++b) {
    uint64_t sum = 0;
    for (size_t i = b * kDrawBlock; i < std::min(n, (b + 1) * kDrawBlock); ++i) sum += draw_mass(e[i]);
    block_sums[b] = sum;
    total += sum;
  }
  return total;
}

uint64_t weigh_scalar(float* s, size_t n, float max, uint64_t* block_sums) {
  // The fallback for CPUs without AVX2: weights, then their masses, in two passes.
  for (size_t i = 0; i < n; ++i) s[i] = draw_weight(s[i] - max);
  return masses_scalar(s, n, block_sums);
}

uint32_t key_of(float e) { return std::bit_cast<uint32_t>(e); }  // weights are >= 0: ordered as their bits

// The digit of `key` at bits [shift, shift + 10) chosen by a radix pass: walking the digits' masses
// from the top, the first at which the mass at or above reaches `need`; `above` gathers the mass
// of the digits passed over.
uint32_t crossing_digit(const std::array<uint64_t, 1024>& hist, uint64_t need, uint64_t& above) {
  uint32_t d = 1023;
  for (; d > 0 && above + hist[d] < need; --d) above += hist[d];
  return d;
}

// Zeroes every weight outside the top-p set: the most likely tokens (larger weight first, ties
// in id order) while the mass before each is below top_p of the total. The last kept weight is
// found by a radix select over the weights' bits (weights are >= 0, so their bits order them),
// three digits of 10 bits, each pass summing the masses of the tokens still in play per digit;
// the second pass gathers the tokens of the chosen top digit, so the third reads only those. The
// kept ties are the first few in id order.
void keep_top_p(std::span<float> e, float top_p, uint64_t total, std::vector<uint32_t>& in_play) {
  const uint64_t need = ceil_share(top_p, total);  // the mass that ends the set
  uint64_t above = 0;                              // mass of the tokens whose key is above the chosen prefix's range
  std::array<uint64_t, 1024> hist{};
  for (float w : e) hist[key_of(w) >> 20] += draw_mass(w);  // keys of weights <= 1 are below 2^30
  uint32_t prefix = crossing_digit(hist, need, above);
  hist.fill(0);
  in_play.clear();
  for (float w : e) {
    const uint32_t key = key_of(w);
    if ((key >> 20) != prefix) continue;
    in_play.push_back(key);
    hist[(key >> 10) & 1023] += draw_mass(w);
  }
  prefix = (prefix << 10) | crossing_digit(hist, need, above);
  hist.fill(0);
  for (uint32_t key : in_play)
    if ((key >> 10) == prefix) hist[key & 1023] += draw_mass_of_bits(key);
  prefix = (prefix << 10) | crossing_digit(hist, need, above);
  // prefix is the last kept key: the largest whose mass at or above reaches `need`.
  const uint64_t each = draw_mass_of_bits(prefix);
  SPECDEC_CHECK(each > 0 && above < need, "sampling: top-p selection found no token (total mass ", total, ")");
  const uint64_t kept_ties = (need - above + each - 1) / each;  // while the mass before a tie is below need
  uint64_t ties = 0;
  for (float& w : e) {
    const uint32_t key = key_of(w);
    ties += key == prefix;
    w = key < prefix ? 0.0f : w;
  }
  if (ties <= kept_ties) return;
  uint64_t left = kept_ties;
  for (float& w : e) {
    if (key_of(w) != prefix) continue;
    if (left > 0) {
      --left;
      continue;
    }
    w = 0.0f;
  }
}

const DrawKernels kScalar{"scalar", scale_scalar, weigh_scalar, masses_scalar};

// Scratch of the calling thread: a draw runs on whichever pool thread samples its row, and a
// vocabulary-sized buffer allocated per call would cost more than the draw (large ones are
// mapped afresh and fault their pages every time).
struct DrawScratch {
  std::vector<float> weights;
  std::vector<uint64_t> block_sums;
  std::vector<uint32_t> in_play;  // top-p's tokens still in play after its first digit
};

}  // namespace

const DrawKernels& draw_kernels_scalar() { return kScalar; }

const DrawKernels& draw_kernels() {
  static const DrawKernels& chosen = []() -> const DrawKernels& {
    if (const DrawKernels* k = draw_kernels_avx512()) return *k;
    if (const DrawKernels* k = draw_kernels_avx2()) return *k;
    return kScalar;
  }();
  return chosen;
}

namespace {

// The row divided by the temperature into the scratch's weights (sized, with the block sums, for
// the row); returns its largest value. Refuses what no draw can use.
float scale_row(std::span<const float> logits, float temperature, DrawScratch& scratch) {
  const size_t n = logits.size();
  SPECDEC_CHECK(n > 0, "sampling: empty logits row");
  SPECDEC_CHECK(n <= kMaxDrawVocab, "sampling: a row of ", n, " logits is longer than the ", kMaxDrawVocab,
                " the sampler sums exactly");
  scratch.weights.resize(n);
  scratch.block_sums.resize((n + kDrawBlock - 1) / kDrawBlock);
  bool nan = false;
  const float max = draw_kernels().scale(logits.data(), scratch.weights.data(), n, temperature, &nan);
  SPECDEC_CHECK(!nan, "sampling: logits contain NaN");
  SPECDEC_CHECK(std::isfinite(max), "sampling: no token has a finite logit (max is ", max, ")");
  return max;
}

// The row's weights after every filter, with their block sums (in the scratch) and total.
uint64_t filtered_weights(std::span<const float> logits, const SamplingParams& params, DrawScratch& scratch) {
  SPECDEC_CHECK(params.temperature > 0.0f, "sampling: a sampled draw needs a temperature above 0");
  const float max = scale_row(logits, params.temperature, scratch);
  std::vector<float>& e = scratch.weights;
  const DrawKernels& kernels = draw_kernels();
  if (params.top_k > 0 && static_cast<size_t>(params.top_k) < e.size()) {
    const float kth = kth_largest(e, static_cast<size_t>(params.top_k));
    for (float& s : e) s = s < kth ? kNegInf : s;
  }
  uint64_t total = kernels.weigh(e.data(), e.size(), max, scratch.block_sums.data());
  // The most likely token weighs exp(0) = 1 and survives every filter, so the total stays above 0.
  if (params.top_p < 1.0f) keep_top_p(e, params.top_p, total, scratch.in_play);
  if (params.min_p > 0.0f) {
    for (float& w : e) w = w < params.min_p ? 0.0f : w;  // the largest weight is 1
  }
  if (params.top_p < 1.0f || params.min_p > 0.0f) total = kernels.masses(e.data(), e.size(), scratch.block_sums.data());
  return total;
}

}  // namespace

int32_t draw_sampled(std::span<const float> logits, const SamplingParams& params, float u) {
  thread_local DrawScratch scratch;
  const uint64_t total = filtered_weights(logits, params, scratch);
  const std::vector<float>& e = scratch.weights;
  const std::vector<uint64_t>& sums = scratch.block_sums;
  // The first token whose cumulative mass exceeds u * total, with u = k / 2^24.
  const uint64_t target = draw_target(u, total);
  uint64_t cum = 0;
  for (size_t b = 0; b < sums.size(); ++b) {
    if (cum + sums[b] <= target) {
      cum += sums[b];
      continue;
    }
    for (size_t i = b * kDrawBlock; i < std::min(e.size(), (b + 1) * kDrawBlock); ++i) {
      cum += draw_mass(e[i]);
      if (cum > target) return static_cast<int32_t>(i);
    }
  }
  fail("sampling: the draw's walk ended below its target (total mass ", total, ")");
}

// A small k keeps a min-heap of the k largest seen,
// which most values fail to enter at one comparison; a large one selects on a copy.
float kth_largest(std::span<const float> s, size_t k) {
  SPECDEC_CHECK(k >= 1 && k <= s.size(), "sampling: the ", k, "-th largest of ", s.size(), " values");
  if (k > 512) {
    std::vector<float> values(s.begin(), s.end());
    std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(k - 1), values.end(),
                     std::greater<float>());
    return values[k - 1];
  }
  std::vector<float> heap(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(k));
  std::make_heap(heap.begin(), heap.end(), std::greater<float>());
  for (size_t i = k; i < s.size(); ++i) {
    if (s[i] <= heap.front()) continue;
    std::pop_heap(heap.begin(), heap.end(), std::greater<float>());
    heap.back() = s[i];
    std::push_heap(heap.begin(), heap.end(), std::greater<float>());
  }
  return heap.front();
}

double log_sum_exp(std::span<const float> logits) {
  thread_local DrawScratch scratch;
  const float max = scale_row(logits, 1.0f, scratch);
  const uint64_t total =
      draw_kernels().weigh(scratch.weights.data(), scratch.weights.size(), max, scratch.block_sums.data());
  return static_cast<double>(max) + std::log(static_cast<double>(total)) - kMassBits * std::log(2.0);
}

std::vector<float> draw_probabilities(std::span<const float> logits, const SamplingParams& params) {
  thread_local DrawScratch scratch;
  const double inverse = 1.0 / static_cast<double>(filtered_weights(logits, params, scratch));
  std::vector<float> p(logits.size());
  for (size_t i = 0; i < p.size(); ++i)
    p[i] = static_cast<float>(static_cast<double>(draw_mass(scratch.weights[i])) * inverse);
  return p;
}

}  // namespace specdec
