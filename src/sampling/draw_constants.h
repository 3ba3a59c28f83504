// The constants of the host's sampled draw (draw.h) that the CUDA sampler shares, so that both
// compute the same weights and masses: C++17, with nothing of the standard library.
#pragma once

#include <cstddef>

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
constexpr float kC[8] = {1.0f, 1.0f, 0.5f, 1.0f / 6, 1.0f / 24, 1.0f / 120, 1.0f / 720, 1.0f / 5040};
}  // namespace draw_exp

}  // namespace specdec
