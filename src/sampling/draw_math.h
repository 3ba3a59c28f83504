// The arithmetic of the sampled draw (draw.h) that the host and the CUDA sampler share, one
// definition compiled for both, so that both compute the same weights, masses and targets: C++17
// (nvcc's dialect here) and nothing of the standard library beyond <cmath> and <cstring>.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define SPECDEC_DRAW_FN __host__ __device__ inline
#else
#define SPECDEC_DRAW_FN inline
#endif

namespace specdec {

// A token's mass: floor(e * 2^40) for its weight e = exp(scaled - max) in [0, 1]. Weights below
// 2^-40 (about e^-27.7 of the most likely token's) weigh nothing.
constexpr int kMassBits = 40;
// The longest row whose masses sum below 2^63 (each is at most 2^41).
constexpr size_t kMaxDrawVocab = size_t{1} << 22;
// Tokens per block of the walk: a block's masses are summed as the weights are computed, so the
// walk finds the crossing's block from the sums and computes masses for that block alone.
constexpr size_t kDrawBlock = 256;

// The constants of draw_weight, shared by every kernel set: exp(x) = 2^n exp(r) with
// n = round(x / ln 2), r = x - n ln 2 (ln 2 split in two so that n ln 2 loses nothing), exp(r)
// by its Taylor polynomial to r^7 (on |r| <= ln(2) / 2 the rest is below 1e-8).
namespace draw_exp {
constexpr float kMinExponent = -28.0f;  // below it every mass is 0 (e^-28 * 2^40 < 1)
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kRound = 12582912.0f;              // 1.5 * 2^23: adding it rounds to an integer
constexpr float kLn2Hi = 0.693145751953125f;       // ln 2 to 16 bits
constexpr float kLn2Lo = 1.42860682030941723e-6f;  // the rest of ln 2
constexpr float kC0 = 1.0f, kC1 = 1.0f, kC2 = 0.5f, kC3 = 1.0f / 6, kC4 = 1.0f / 24, kC5 = 1.0f / 120, kC6 = 1.0f / 720,
                kC7 = 1.0f / 5040;
constexpr float kC[8] = {kC0, kC1, kC2, kC3, kC4, kC5, kC6, kC7};  // for the vector kernels' loops
}  // namespace draw_exp

namespace draw_bits {
SPECDEC_DRAW_FN uint32_t of(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}
SPECDEC_DRAW_FN float to_float(uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}
}  // namespace draw_bits

// The weight exp(x) for x <= 0 as every kernel set computes it, 0 below e^-28 (and for -inf):
// x = n ln 2 + r with n = round(x / ln 2), exp(x) = 2^n exp(r). Every multiply-add is fused, so
// each step rounds once on every instruction set and on the GPU.
SPECDEC_DRAW_FN float draw_weight(float x) {
  using namespace draw_exp;
  if (!(x >= kMinExponent)) return 0.0f;
  const float shifted = fmaf(x, kLog2e, kRound);
  const float n = shifted - kRound;
  float r = fmaf(-n, kLn2Hi, x);
  r = fmaf(-n, kLn2Lo, r);
  float p = kC7;
  p = fmaf(p, r, kC6);
  p = fmaf(p, r, kC5);
  p = fmaf(p, r, kC4);
  p = fmaf(p, r, kC3);
  p = fmaf(p, r, kC2);
  p = fmaf(p, r, kC1);
  p = fmaf(p, r, kC0);
  // p is in [0.7, 1.42] and n in [-41, 0]: adding n to the exponent field cannot leave the normal range.
  const auto exponent = static_cast<int32_t>(draw_bits::of(shifted) - draw_bits::of(kRound));
  return draw_bits::to_float(draw_bits::of(p) + static_cast<uint32_t>(exponent * (1 << 23)));
}

// floor(e * 2^40) for a weight e in [0, 2) given as its bits (the order key the threshold
// searches walk): the significand shifted by the exponent's distance from 2^-40's.
SPECDEC_DRAW_FN uint64_t draw_mass_of_bits(uint32_t bits) {
  const int shift = static_cast<int>(bits >> 23) - (127 + 23 - kMassBits);
  const uint64_t significand = (bits & 0x7fffffu) | 0x800000u;
  if (shift >= 0) return significand << shift;
  return shift > -24 ? significand >> -shift : 0;
}
SPECDEC_DRAW_FN uint64_t draw_mass(float e) { return draw_mass_of_bits(draw_bits::of(e)); }

// ceil(fraction * total) for a fraction in (0, 1), exactly: the fraction is its 24-bit
// significand times 2^-shift (a subnormal or tiny fraction gives 1).
SPECDEC_DRAW_FN uint64_t ceil_share(float fraction, uint64_t total) {
  const uint32_t bits = draw_bits::of(fraction);
  const int shift = 150 - static_cast<int>(bits >> 23);
  if (shift >= 88) return 1;  // fraction * total < 2^63 * 2^-64: below one unit
  const unsigned __int128 product = static_cast<unsigned __int128>((bits & 0x7fffffu) | 0x800000u) * total;
  const unsigned __int128 floor = product >> shift;
  const bool exact = (floor << shift) == product;
  return static_cast<uint64_t>(floor) + (exact ? 0 : 1);
}

// The draw's target at uniform u (a multiple of 2^-24 in [0, 1), uniform01's values): the first
// token whose cumulative mass exceeds floor(u * total) is drawn.
SPECDEC_DRAW_FN uint64_t draw_target(float u, uint64_t total) {
  const auto k = static_cast<uint64_t>(u * 16777216.0f);
  return static_cast<uint64_t>((static_cast<unsigned __int128>(k) * total) >> 24);
}

}  // namespace specdec
