// SampleRow: how one row of logits draws its token when nothing but the logits decides it (no
// penalty, no logit bias), together with the draw's key. Plain data of a fixed layout, so arrays
// of it can be copied into device memory and read by kernels; kept to C++17 for the .cu files.
#pragma once

#include <cstdint>

namespace specdec {

struct SampleRow {
  float temperature = 0.0f;  // 0 = greedy: the argmax of the raw logits (lowest id on ties)
  int32_t top_k = 0;         // 0 = off
  float top_p = 1.0f;        // 1 = off
  float min_p = 0.0f;        // 0 = off
  uint64_t seed = 0;
  uint64_t position = 0;  // absolute token position: the draw is uniform01(seed, position, token stream)
};

// i32 words of one SampleRow: a tensor of n rows of them is [n, kSampleRowWords] i32.
constexpr int kSampleRowWords = 8;
static_assert(sizeof(SampleRow) == kSampleRowWords * sizeof(int32_t), "SampleRow must stay 32 bytes, no padding");

}  // namespace specdec
