// What the tests of Backend::sample share: a grid of sampling rows and logits of several shapes
// (peaked, flat, coarse with many exact ties, partly masked to -inf), and whether a backend that
// sums in another order may legitimately draw another token than the host sampler: the host
// pipeline rerun with its decision margins measured. A device's probabilities differ from the
// host's by a few ulps (its exp and its sum order), so its token may differ only where u * total
// lies that close to a CDF boundary, or a top-p / min-p cut falls that close to a token. Tests
// accept a token that differs from the host's only where this finds such a margin, and rarely.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "sampling/philox.h"
#include "sampling/sampling.h"

namespace specdec::testing {

// Greedy (filters set, and skipped), then every T in {0.5, 1, 1.5} with no filter, top-k 1, 5,
// 50, top-p 0.5, 0.9, min-p 0.05, 0.2 and combinations of them. Seeds and positions vary by row.
inline std::vector<SampleRow> sampling_grid(uint64_t salt) {
  struct Filters {
    int top_k;
    float top_p, min_p;
  };
  const std::vector<Filters> filters = {{0, 1.0f, 0.0f},   {1, 1.0f, 0.0f},    {5, 1.0f, 0.0f},   {50, 1.0f, 0.0f},
                                        {0, 0.5f, 0.0f},   {0, 0.9f, 0.0f},    {0, 1.0f, 0.05f},  {0, 1.0f, 0.2f},
                                        {50, 0.9f, 0.0f},  {5, 0.5f, 0.05f},   {0, 0.9f, 0.2f},   {50, 0.9f, 0.05f}};
  std::vector<SampleRow> rows;
  const auto add = [&](float t, const Filters& f) {
    const uint64_t n = rows.size() + salt * 1000;
    rows.push_back(SampleRow{t, f.top_k, f.top_p, f.min_p, 1234567 + n * 7919, 17 + n * 104729});
  };
  add(0.0f, {0, 1.0f, 0.0f});
  add(0.0f, {50, 0.9f, 0.05f});
  for (float t : {0.5f, 1.0f, 1.5f})
    for (const Filters& f : filters) add(t, f);
  return rows;
}

enum class LogitShape { peaked, flat, ties, masked, equal };
constexpr LogitShape kLogitShapes[] = {LogitShape::peaked, LogitShape::flat, LogitShape::ties, LogitShape::masked,
                                       LogitShape::equal};

// One row of V logits: peaked (normal, sd 2.5, with a few tokens lifted well above the rest, as
// language models give), flat (uniform in +-1), ties (peaked rounded to halves: many exact
// ties), masked (peaked with about a third at -inf) or equal (all zero: every decision a tie).
inline std::vector<float> shaped_logits(LogitShape shape, size_t V, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.5f);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::vector<float> l(V);
  for (float& x : l) {
    switch (shape) {
      case LogitShape::flat: x = unit(rng); break;
      case LogitShape::equal: x = 0.0f; break;
      default: x = normal(rng); break;
    }
  }
  if (shape == LogitShape::peaked || shape == LogitShape::ties || shape == LogitShape::masked) {
    for (int j = 0; j < 8; ++j) l[rng() % V] += 6.0f + 0.5f * static_cast<float>(j);
  }
  if (shape == LogitShape::ties) {
    for (float& x : l) x = std::round(2.0f * x) / 2.0f;
  }
  if (shape == LogitShape::masked) {
    const float inf = std::numeric_limits<float>::infinity();
    for (size_t i = 0; i < V; ++i) {
      if (rng() % 3 == 0 && l[i] < 6.0f) l[i] = -inf;
    }
  }
  return l;
}

// Relative margin: well above a few float ulps (~1e-7) of accumulated rounding.
constexpr double kSamplingMargin = 1e-5;

inline bool near(double a, double b, double scale, double margin) { return std::abs(a - b) <= margin * scale; }

// True when the host's draw for `row` lies within `margin` of a decision another rounding could
// make differently. Greedy rows and top-k compare exact values: never near.
inline bool near_a_boundary(std::span<const float> logits, const SampleRow& row, double margin = kSamplingMargin) {
  if (row.temperature == 0.0f) return false;
  const LogitsProcessor proc(sampling_params(row));
  std::vector<float> l(logits.begin(), logits.end());
  proc.apply_temperature(l);
  proc.apply_top_k(l);
  if (row.top_p < 1.0f) {
    std::vector<float> p = l;
    softmax_in_place(p);
    std::vector<int32_t> order;
    for (size_t i = 0; i < p.size(); ++i)
      if (p[i] > 0.0f) order.push_back(static_cast<int32_t>(i));
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      const float pa = p[static_cast<size_t>(a)], pb = p[static_cast<size_t>(b)];
      return pa != pb ? pa > pb : a < b;
    });
    double before = 0.0;
    for (size_t r = 0; r < order.size(); ++r) {
      const double pr = p[static_cast<size_t>(order[r])];
      // The cut: the mass before this token or through it is close to top_p.
      if (near(before, row.top_p, 1.0, margin) || near(before + pr, row.top_p, 1.0, margin)) return true;
      if (before + pr >= row.top_p) {
        // The last kept token: another token of nearly (not exactly) its probability could swap
        // places with it under other rounding.
        const auto last = static_cast<size_t>(order[r]);
        for (size_t i = 0; i < p.size(); ++i) {
          if (i != last && l[i] != l[last] && near(p[i], pr, pr, margin)) return true;
        }
        break;
      }
      before += pr;
    }
    proc.apply_top_p(l);
  }
  if (row.min_p > 0.0f) {
    std::vector<float> p = l;
    softmax_in_place(p);
    const double cut = static_cast<double>(row.min_p) * *std::max_element(p.begin(), p.end());
    for (float v : p) {
      if (v > 0.0f && near(v, cut, cut, margin)) return true;
    }
    proc.apply_min_p(l);
  }
  softmax_in_place(l);
  double total = 0.0;
  for (float w : l)
    if (w > 0.0f) total += w;
  const double target = static_cast<double>(uniform01(row.seed, row.position)) * total;
  double cum = 0.0;
  for (float w : l) {
    if (!(w > 0.0f)) continue;
    if (near(cum, target, total, margin)) return true;
    cum += w;
    if (cum > target) return near(cum, target, total, margin);
  }
  return false;
}

}  // namespace specdec::testing
