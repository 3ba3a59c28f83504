// The fixed horizontal reduction of a 16-lane f32 accumulator shared by the AVX-512 kernels:
// lanes l and l + 8, then l + 4, l + 2, l + 1. Its order is part of every output's bits, so
// there is one definition. Include only from files compiled for AVX-512 (*_avx512.cpp).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace specdec::cpu {

// 16 → 8 → 4 → 2 → 1.
inline float hsum(__m512 v) {
  const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  const __m128 d = _mm_add_ss(c, _mm_movehdup_ps(c));
  return _mm_cvtss_f32(d);
}

// hsum of four vectors at once, {hsum(a), hsum(b), hsum(c), hsum(d)}: the same lane pairs, so
// the same bits, with a quarter of the shuffles.
inline __m128 hsum4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 t = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 u = _mm512_add_ps(t, _mm512_permute_ps(t, _MM_SHUFFLE(1, 0, 3, 2)));
  const __m512 v = _mm512_add_ps(u, _mm512_permute_ps(u, _MM_SHUFFLE(2, 3, 0, 1)));
  const __m512i pick = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(pick, v));
}

// Stores a linear tile's MR x NR accumulators, each folded by hsum (four at once by hsum4 when NR
// is 4), plus bias[n0 + j] where bias is set: out row i at out + i * ld.
template <int MR, int NR>
inline void store_tile_sums(const __m512 (&acc)[MR][NR], float* out, int64_t ld, const float* bias, int64_t n0) {
  for (int i = 0; i < MR; ++i) {
    float* row = out + i * ld;
    if constexpr (NR == 4) {
      __m128 v = hsum4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
      if (bias) v = _mm_add_ps(v, _mm_loadu_ps(bias + n0));
      _mm_storeu_ps(row, v);
    } else {
      for (int j = 0; j < NR; ++j) {
        float v = hsum(acc[i][j]);
        if (bias) v = _mm_cvtss_f32(_mm_add_ss(_mm_set_ss(v), _mm_set_ss(bias[n0 + j])));
        row[j] = v;
      }
    }
  }
}

}  // namespace specdec::cpu
