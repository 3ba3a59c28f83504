// Portable attention for one (token, head): the reference path, in plain C++. Scores are dot
// products with 16 partial sums folded by a fixed tree (as the portable linear), then a
// two-pass softmax and the weighted values, all in position order.
#include <cmath>
#include <limits>

#include "backend/cpu/cpu_kernels.h"

namespace specdec::cpu {
namespace {

float dot16(const float* a, const float* b, int64_t n) {
  float acc[16] = {};
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) {
    for (int l = 0; l < 16; ++l) {
      const float p = a[k + l] * b[k + l];
      acc[l] = acc[l] + p;
    }
  }
  for (int l = 0; k + l < n; ++l) {
    const float p = a[k + l] * b[k + l];
    acc[l] = acc[l] + p;
  }
  for (int width = 8; width >= 1; width /= 2) {
    for (int l = 0; l < width; ++l) acc[l] = acc[l] + acc[l + width];
  }
  return acc[0];
}

}  // namespace

namespace {

void attend_one(const AttendArgs& a) {
  const auto slot = [&](int64_t j) {
    return (static_cast<int64_t>(a.blocks[j / a.block_size]) * a.block_size + j % a.block_size) * a.stride;
  };
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < a.n; ++j) {
    const float s = dot16(a.q, a.k + slot(j), a.d) * a.scale;
    a.scores[j] = s;
    mx = s > mx ? s : mx;
  }
  float sum = 0.0f;
  for (int64_t j = 0; j < a.n; ++j) {
    const float e = std::exp(a.scores[j] - mx);
    a.scores[j] = e;
    sum = sum + e;
  }
  for (int64_t i = 0; i < a.d; ++i) a.out[i] = 0.0f;
  for (int64_t j = 0; j < a.n; ++j) {
    const float* v = a.v + slot(j);
    const float e = a.scores[j];
    for (int64_t i = 0; i < a.d; ++i) {
      const float p = e * v[i];
      a.out[i] = a.out[i] + p;
    }
  }
  const float inv = 1.0f / sum;
  for (int64_t i = 0; i < a.d; ++i) a.out[i] = a.out[i] * inv;
}

}  // namespace

void attend_scalar(const AttendArgs& a) {
  for (int64_t g = 0; g < a.heads; ++g) {
    AttendArgs one = a;
    one.heads = 1;
    one.q = a.q + g * a.d;
    one.out = a.out + g * a.d;
    one.scores = a.scores + g * a.n;
    attend_one(one);
  }
}

}  // namespace specdec::cpu
