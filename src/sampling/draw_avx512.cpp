// The draw's vectorised passes for AVX-512 (draw.h): the scalar definition's operations, sixteen
// tokens at a time, with the same fused multiply-adds, so the same bits.
// GCC 12's AVX-512 headers build some intrinsics from _mm512_undefined_*() and then warn about
// those (deliberately) undefined lanes; the warning says nothing about this file.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <limits>

#include "sampling/draw.h"

namespace specdec {

namespace {

using namespace draw_exp;

float scale_avx512(const float* l, float* s, size_t n, float temperature, bool* nan) {
  const __m512 t = _mm512_set1_ps(temperature);
  const bool divide = temperature != 1.0f;
  __m512 max = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __mmask16 bad = 0;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 v = _mm512_loadu_ps(l + i);
    if (divide) v = _mm512_div_ps(v, t);
    _mm512_storeu_ps(s + i, v);
    bad |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    max = _mm512_max_ps(max, v);
  }
  float m = _mm512_reduce_max_ps(max);
  bool any = bad != 0;
  for (; i < n; ++i) {
    const float v = divide ? l[i] / temperature : l[i];
    s[i] = v;
    any |= v != v;
    m = v > m ? v : m;
  }
  *nan = any;
  return m;
}

// Sixteen weights from sixteen exponents, as draw_weight computes each.
inline __m512 weights16(__m512 x) {
  const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kMinExponent), _CMP_GE_OQ);
  x = _mm512_max_ps(x, _mm512_set1_ps(kMinExponent));
  const __m512 shifted = _mm512_fmadd_ps(x, _mm512_set1_ps(kLog2e), _mm512_set1_ps(kRound));
  const __m512 n = _mm512_sub_ps(shifted, _mm512_set1_ps(kRound));
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kC[7]);
  for (int i = 6; i >= 0; --i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kC[i]));
  const __m512i exponent =
      _mm512_sub_epi32(_mm512_castps_si512(shifted), _mm512_set1_epi32(std::bit_cast<int32_t>(kRound)));
  const __m512i bits = _mm512_add_epi32(_mm512_castps_si512(p), _mm512_slli_epi32(exponent, 23));
  return _mm512_maskz_mov_ps(live, _mm512_castsi512_ps(bits));
}

// The sum of sixteen weights' masses, floor(e * 2^40) = significand << (biased exponent - 110).
inline __m512i masses16(__m512 e) {
  const __m512i bits = _mm512_castps_si512(e);
  const __m512i significand =
      _mm512_or_si512(_mm512_and_si512(bits, _mm512_set1_epi32(0x7fffff)), _mm512_set1_epi32(0x800000));
  const __m512i shift = _mm512_sub_epi32(_mm512_srli_epi32(bits, 23), _mm512_set1_epi32(110));
  const __m512i left = _mm512_max_epi32(shift, _mm512_setzero_si512());
  const __m512i right = _mm512_max_epi32(_mm512_sub_epi32(_mm512_setzero_si512(), shift), _mm512_setzero_si512());
  // A zero weight has exponent 0: a right shift of 110, past every bit.
  const auto widen = [](__m512i v, int half) {
    return _mm512_cvtepu32_epi64(half ? _mm512_extracti64x4_epi64(v, 1) : _mm512_castsi512_si256(v));
  };
  __m512i sum = _mm512_setzero_si512();
  for (int half : {0, 1}) {
    const __m512i m =
        _mm512_srlv_epi64(_mm512_sllv_epi64(widen(significand, half), widen(left, half)), widen(right, half));
    sum = _mm512_add_epi64(sum, m);
  }
  return sum;
}

uint64_t weigh_avx512(float* s, size_t n, float max, uint64_t* block_sums) {
  const __m512 vmax = _mm512_set1_ps(max);
  uint64_t total = 0;
  for (size_t b = 0; b * kDrawBlock < n; ++b) {
    const size_t end = std::min(n, (b + 1) * kDrawBlock);
    __m512i acc = _mm512_setzero_si512();
    size_t i = b * kDrawBlock;
    for (; i + 16 <= end; i += 16) {
      const __m512 e = weights16(_mm512_sub_ps(_mm512_loadu_ps(s + i), vmax));
      _mm512_storeu_ps(s + i, e);
      acc = _mm512_add_epi64(acc, masses16(e));
    }
    auto sum = static_cast<uint64_t>(_mm512_reduce_add_epi64(acc));
    for (; i < end; ++i) {
      s[i] = draw_weight(s[i] - max);
      sum += draw_mass(s[i]);
    }
    block_sums[b] = sum;
    total += sum;
  }
  return total;
}

uint64_t masses_avx512(const float* e, size_t n, uint64_t* block_sums) {
  uint64_t total = 0;
  for (size_t b = 0; b * kDrawBlock < n; ++b) {
    const size_t end = std::min(n, (b + 1) * kDrawBlock);
    __m512i acc = _mm512_setzero_si512();
    size_t i = b * kDrawBlock;
    for (; i + 16 <= end; i += 16) acc = _mm512_add_epi64(acc, masses16(_mm512_loadu_ps(e + i)));
    auto sum = static_cast<uint64_t>(_mm512_reduce_add_epi64(acc));
    for (; i < end; ++i) sum += draw_mass(e[i]);
    block_sums[b] = sum;
    total += sum;
  }
  return total;
}

const DrawKernels kAvx512{"avx512", scale_avx512, weigh_avx512, masses_avx512};

}  // namespace

const DrawKernels* draw_kernels_avx512() {
  const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
  return has ? &kAvx512 : nullptr;
}

}  // namespace specdec
