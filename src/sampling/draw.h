// The host's sampled draw: temperature, top-k, top-p and min-p over one row of logits, then the
// inverse CDF at the row's uniform, in a few vectorised passes. Masses are integers (each token's
// exp(scaled - max) in 2^-40 units), so every sum is exact whatever its order: the draw is the
// same for any instruction set, thread count or batch, and no pass walks the vocabulary one
// dependent addition at a time. What is rounded is fixed here, once, for every CPU: the exp is
// this file's own (a polynomial of fused multiply-adds, correctly rounded on every path), not the
// C library's, whose bits differ between its builds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "sampling/draw_math.h"
#include "sampling/sampling.h"

namespace specdec {

// The passes that touch every token, one implementation per instruction set, all giving the same
// bits (tests/sampling/test_draw.cpp).
struct DrawKernels {
  const char* name;
  // s[i] = l[i] / temperature (a copy when temperature is 1); returns the largest s. Sets *nan
  // when some logit is NaN.
  float (*scale)(const float* l, float* s, size_t n, float temperature, bool* nan);
  // In place: s[i] becomes its weight exp(s[i] - max) (0 below e^-28 and for -inf); block_sums[b]
  // gets the masses of tokens [b * kDrawBlock, (b + 1) * kDrawBlock); returns their total.
  uint64_t (*weigh)(float* s, size_t n, float max, uint64_t* block_sums);
  // The block sums and total of weights' masses (after filters zeroed some of the weights).
  uint64_t (*masses)(const float* e, size_t n, uint64_t* block_sums);
};

const DrawKernels& draw_kernels_scalar();
// Null where this build or this CPU lacks the instruction set.
const DrawKernels* draw_kernels_avx2();
const DrawKernels* draw_kernels_avx512();
// The fastest set this CPU runs.
const DrawKernels& draw_kernels();

// The token a sampled (temperature > 0) row draws at uniform u (a multiple of 2^-24 in [0, 1),
// uniform01's values), after its penalties and logit bias: temperature, top-k (ties with the k-th
// kept), top-p (the most likely tokens, ties in id order, while the mass before each is below
// top_p), min-p (weight at least min_p times the largest), then the first token in id order
// whose cumulative mass exceeds u times the total. Throws on NaN or a row with no finite logit.
int32_t draw_sampled(std::span<const float> logits, const SamplingParams& params, float u);
// log(sum_i exp(l_i)) over a row (NaN refused, -inf allowed, some logit finite): the row's
// maximum plus the log of its weights' exact total, every weight below 2^-40 of the largest
// counting as 0 (together at most V * 2^-40 of the sum); the same bits on every instruction set.
double log_sum_exp(std::span<const float> logits);
// The k-th largest of the values (with multiplicity), 1 <= k <= values.size().
float kth_largest(std::span<const float> values, size_t k);
// The distribution draw_sampled draws from: each token's mass over the total, after the same
// filters (removed tokens and those below the masses' resolution get 0).
std::vector<float> draw_probabilities(std::span<const float> logits, const SamplingParams& params);

}  // namespace specdec
