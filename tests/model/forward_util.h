// Helpers shared by the forward tests: where the test models are, deterministic token ids, and
// index lists.
#pragma once

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

namespace specdec::model_test {

inline std::string model_dir(const std::string& name) {
  if (name == "draft" || name == "target") return std::string(SPECDEC_SOURCE_DIR) + "/models/" + name;
  return std::string(SPECDEC_SOURCE_DIR) + "/tests/fixtures/models/" + name;
}

// Deterministic pseudo-random token ids in [0, vocab).
inline std::vector<int32_t> tokens_for(int n, int vocab, uint32_t seed) {
  std::vector<int32_t> out;
  uint32_t x = seed * 2654435761u + 12345u;
  for (int i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    out.push_back(static_cast<int32_t>((x >> 8) % static_cast<uint32_t>(vocab)));
  }
  return out;
}

inline std::vector<int32_t> all_positions(size_t n) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

}  // namespace specdec::model_test
