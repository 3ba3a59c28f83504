// The draw's vectorised passes for AVX2 with FMA (draw.h): the scalar definition's operations,
// eight tokens at a time, with the same fused multiply-adds, so the same bits.
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <limits>

#include "sampling/draw.h"

namespace specdec {

namespace {

using namespace draw_exp;

float scale_avx2(const float* l, float* s, size_t n, float temperature, bool* nan) {
  const __m256 t = _mm256_set1_ps(temperature);
  const bool divide = temperature != 1.0f;
  __m256 max = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 bad = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(l + i);
    if (divide) v = _mm256_div_ps(v, t);
    _mm256_storeu_ps(s + i, v);
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    max = _mm256_max_ps(max, v);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, max);
  float m = -std::numeric_limits<float>::infinity();
  for (float v : lanes) m = v > m ? v : m;
  bool any = _mm256_movemask_ps(bad) != 0;
  for (; i < n; ++i) {
    const float v = divide ? l[i] / temperature : l[i];
    s[i] = v;
    any |= v != v;
    m = v > m ? v : m;
  }
  *nan = any;
  return m;
}

inline __m256 weights8(__m256 x) {
  const __m256 live = _mm256_cmp_ps(x, _mm256_set1_ps(kMinExponent), _CMP_GE_OQ);
  x = _mm256_max_ps(x, _mm256_set1_ps(kMinExponent));
  const __m256 shifted = _mm256_fmadd_ps(x, _mm256_set1_ps(kLog2e), _mm256_set1_ps(kRound));
  const __m256 n = _mm256_sub_ps(shifted, _mm256_set1_ps(kRound));
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kC[7]);
  for (int i = 6; i >= 0; --i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC[i]));
  const __m256i exponent =
      _mm256_sub_epi32(_mm256_castps_si256(shifted), _mm256_set1_epi32(std::bit_cast<int32_t>(kRound)));
  const __m256i bits = _mm256_add_epi32(_mm256_castps_si256(p), _mm256_slli_epi32(exponent, 23));
  return _mm256_and_ps(live, _mm256_castsi256_ps(bits));
}

inline __m256i masses8(__m256 e) {
  const __m256i bits = _mm256_castps_si256(e);
  const __m256i significand =
      _mm256_or_si256(_mm256_and_si256(bits, _mm256_set1_epi32(0x7fffff)), _mm256_set1_epi32(0x800000));
  const __m256i shift = _mm256_sub_epi32(_mm256_srli_epi32(bits, 23), _mm256_set1_epi32(110));
  const __m256i left = _mm256_max_epi32(shift, _mm256_setzero_si256());
  const __m256i right = _mm256_max_epi32(_mm256_sub_epi32(_mm256_setzero_si256(), shift), _mm256_setzero_si256());
  const auto widen = [](__m256i v, int half) {
    return _mm256_cvtepu32_epi64(half ? _mm256_extracti128_si256(v, 1) : _mm256_castsi256_si128(v));
  };
  __m256i sum = _mm256_setzero_si256();
  for (int half : {0, 1}) {
    const __m256i m =
        _mm256_srlv_epi64(_mm256_sllv_epi64(widen(significand, half), widen(left, half)), widen(right, half));
    sum = _mm256_add_epi64(sum, m);
  }
  return sum;
}

uint64_t lane_sum(__m256i v) {
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), v);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

uint64_t weigh_avx2(float* s, size_t n, float max, uint64_t* block_sums) {
  const __m256 vmax = _mm256_set1_ps(max);
  uint64_t total = 0;
  for (size_t b = 0; b * kDrawBlock < n; ++b) {
    const size_t end = std::min(n, (b + 1) * kDrawBlock);
    __m256i acc = _mm256_setzero_si256();
    size_t i = b * kDrawBlock;
    for (; i + 8 <= end; i += 8) {
      const __m256 e = weights8(_mm256_sub_ps(_mm256_loadu_ps(s + i), vmax));
      _mm256_storeu_ps(s + i, e);
      acc = _mm256_add_epi64(acc, masses8(e));
    }
    uint64_t sum = lane_sum(acc);
    for (; i < end; ++i) {
      s[i] = draw_weight(s[i] - max);
      sum += draw_mass(s[i]);
    }
    block_sums[b] = sum;
    total += sum;
  }
  return total;
}

uint64_t masses_avx2(const float* e, size_t n, uint64_t* block_sums) {
  uint64_t total = 0;
  for (size_t b = 0; b * kDrawBlock < n; ++b) {
    const size_t end = std::min(n, (b + 1) * kDrawBlock);
    __m256i acc = _mm256_setzero_si256();
    size_t i = b * kDrawBlock;
    for (; i + 8 <= end; i += 8) acc = _mm256_add_epi64(acc, masses8(_mm256_loadu_ps(e + i)));
    uint64_t sum = lane_sum(acc);
    for (; i < end; ++i) sum += draw_mass(e[i]);
    block_sums[b] = sum;
    total += sum;
  }
  return total;
}

const DrawKernels kAvx2{"avx2", scale_avx2, weigh_avx2, masses_avx2};

}  // namespace

const DrawKernels* draw_kernels_avx2() {
  const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has ? &kAvx2 : nullptr;
}

}  // namespace specdec
