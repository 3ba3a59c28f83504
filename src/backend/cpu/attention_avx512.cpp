// AVX-512 attention for one (token, head). Scores: per position a 16-lane dot over head_dim (tail
// masked) folded by the fixed tree, four positions in flight. Softmax: exp by a fixed
// polynomial, summed in 16 lanes indexed by position mod 16. Values: accumulated in position
// order, 64 dimensions at a time in registers. No step depends on other tokens or on chunking.
// GCC 12's AVX-512 headers warn about their own deliberately undefined lanes.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "backend/cpu/cpu_kernels.h"

namespace specdec::cpu {
namespace {

inline float hsum(__m512 v) {
  const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  const __m128 d = _mm_add_ss(c, _mm_movehdup_ps(c));
  return _mm_cvtss_f32(d);
}

inline __mmask16 tail_mask(int64_t count) {
  return count >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << count) - 1u);
}

// e^x for x <= 0 (Cephes expf: range reduction by ln 2 in two parts, degree-5 minimax
// polynomial); inputs below -87 are clamped there (e^-87 is negligible beside the max's 1).
inline __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r);
  p = _mm512_add_ps(p, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// s[u] = (q · k_u) * scale for U keys; each key's operations are the same whatever U is.
template <int U>
inline void scores(const float* q, const float* const* k, int64_t d, float scale, float* s) {
  __m512 acc[U];
  for (int u = 0; u < U; ++u) acc[u] = _mm512_setzero_ps();
  for (int64_t i = 0; i < d; i += 16) {
    const __mmask16 m = tail_mask(d - i);
    const __m512 qv = _mm512_maskz_loadu_ps(m, q + i);
    for (int u = 0; u < U; ++u) acc[u] = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, k[u] + i), acc[u]);
  }
  for (int u = 0; u < U; ++u) s[u] = _mm_cvtss_f32(_mm_mul_ss(_mm_set_ss(hsum(acc[u])), _mm_set_ss(scale)));
}

// out[c*16 ..] (+)= sum over positions of e_j * v_j for C chunks of 16 dimensions from `first`.
template <int C>
void weighted_values(const AttendArgs& a, int64_t first, float* acc_out) {
  __m512 acc[C];
  __mmask16 m[C];
  for (int c = 0; c < C; ++c) {
    acc[c] = _mm512_setzero_ps();
    m[c] = tail_mask(a.d - first - 16 * c);
  }
  for (int64_t j0 = 0; j0 < a.n; j0 += a.block_size) {
    const float* vb = a.v + static_cast<int64_t>(a.blocks[j0 / a.block_size]) * a.block_size * a.stride + first;
    const int64_t count = a.n - j0 < a.block_size ? a.n - j0 : a.block_size;
    for (int64_t j = 0; j < count; ++j) {
      const __m512 e = _mm512_set1_ps(a.scores[j0 + j]);
      const float* v = vb + j * a.stride;
      for (int c = 0; c < C; ++c) acc[c] = _mm512_fmadd_ps(e, _mm512_maskz_loadu_ps(m[c], v + 16 * c), acc[c]);
    }
  }
  for (int c = 0; c < C; ++c) _mm512_mask_storeu_ps(acc_out + first + 16 * c, m[c], acc[c]);
}

}  // namespace

void attend_avx512(const AttendArgs& a) {
  // 1. Scores, block by block, four keys at a time.
  for (int64_t j0 = 0; j0 < a.n; j0 += a.block_size) {
    const float* kb = a.k + static_cast<int64_t>(a.blocks[j0 / a.block_size]) * a.block_size * a.stride;
    const int64_t count = a.n - j0 < a.block_size ? a.n - j0 : a.block_size;
    int64_t j = 0;
    for (; j + 4 <= count; j += 4) {
      const float* k[4] = {kb + j * a.stride, kb + (j + 1) * a.stride, kb + (j + 2) * a.stride,
                           kb + (j + 3) * a.stride};
      scores<4>(a.q, k, a.d, a.scale, a.scores + j0 + j);
    }
    for (; j < count; ++j) {
      const float* k[1] = {kb + j * a.stride};
      scores<1>(a.q, k, a.d, a.scale, a.scores + j0 + j);
    }
  }
  // 2. Max (exact in any order), then exponentials and their sum in lanes j mod 16.
  __m512 mx = _mm512_set1_ps(-__builtin_inff());
  for (int64_t j = 0; j < a.n; j += 16) {
    const __mmask16 m = tail_mask(a.n - j);
    mx = _mm512_mask_max_ps(mx, m, mx, _mm512_maskz_loadu_ps(m, a.scores + j));
  }
  const __m512 mxv = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < a.n; j += 16) {
    const __mmask16 m = tail_mask(a.n - j);
    const __m512 e =
        _mm512_maskz_mov_ps(m, exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, a.scores + j), mxv)));
    _mm512_mask_storeu_ps(a.scores + j, m, e);
    sum = _mm512_add_ps(sum, e);
  }
  const __m512 inv = _mm512_set1_ps(_mm_cvtss_f32(_mm_div_ss(_mm_set_ss(1.0f), _mm_set_ss(hsum(sum)))));
  // 3. Weighted values, 64 dimensions per sweep, then the normalisation.
  int64_t first = 0;
  for (; first + 64 <= a.d; first += 64) weighted_values<4>(a, first, a.out);
  switch ((a.d - first + 15) / 16) {
    case 1:
      weighted_values<1>(a, first, a.out);
      break;
    case 2:
      weighted_values<2>(a, first, a.out);
      break;
    case 3:
      weighted_values<3>(a, first, a.out);
      break;
    default:
      break;
  }
  for (int64_t i = 0; i < a.d; i += 16) {
    const __mmask16 m = tail_mask(a.d - i);
    _mm512_mask_storeu_ps(a.out + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, a.out + i), inv));
  }
}

}  // namespace specdec::cpu
