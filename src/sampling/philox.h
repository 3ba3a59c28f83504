// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): the
// counter-based generator behind every random draw, so a draw is a pure function of
// (request seed, absolute token position, stream) wherever and in whatever batch it happens.
#pragma once

#include <array>
#include <cstdint>

namespace specdec {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

namespace philox_detail {
constexpr uint32_t kMul0 = 0xD2511F53u;
constexpr uint32_t kMul1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u;  // golden ratio
constexpr uint32_t kWeyl1 = 0xBB67AE85u;  // sqrt(3) - 1

constexpr void round(PhiloxCounter& c, const PhiloxKey& k) {
  const uint64_t p0 = static_cast<uint64_t>(kMul0) * c[0];
  const uint64_t p1 = static_cast<uint64_t>(kMul1) * c[2];
  const auto hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
  const auto hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
  c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
}
}  // namespace philox_detail

// The 10-round block function: four independent 32-bit words per (counter, key).
constexpr PhiloxCounter philox4x32_10(PhiloxCounter counter, PhiloxKey key) {
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      key[0] += philox_detail::kWeyl0;
      key[1] += philox_detail::kWeyl1;
    }
    philox_detail::round(counter, key);
  }
  return counter;
}

// Maps the top 24 bits of a word to [0, 1): every value is exactly representable in a float,
// so the result is never rounded up to 1.
constexpr float word_to_unit(uint32_t word) {
  return static_cast<float>(word >> 8) * (1.0f / 16777216.0f);
}

// The four raw words for one (seed, position, stream): key = seed, counter = (position, stream).
constexpr PhiloxCounter philox_words(uint64_t seed, uint64_t position, uint32_t stream = 0) {
  return philox4x32_10(
      {static_cast<uint32_t>(position), static_cast<uint32_t>(position >> 32), stream, 0u},
      {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
}

// A uniform number in [0, 1) that depends on nothing but its arguments. Streams give several
// independent draws per position (the verifier uses 0 = the target's own token, 1 = the
// rejection-mode acceptance test, 2 = the rejection-mode resample).
constexpr float uniform01(uint64_t seed, uint64_t position, uint32_t stream = 0) {
  return word_to_unit(philox_words(seed, position, stream)[0]);
}

}  // namespace specdec
