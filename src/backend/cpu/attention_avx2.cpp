// AVX2 + FMA attention for one token, one query head at a time. Scores: per position an 8-lane
// dot over head_dim (tail masked) folded by a fixed tree, four positions per tree. Softmax: exp
// by a fixed polynomial, summed in 8 lanes indexed by position mod 8. Values: accumulated in
// position order, 32 dimensions at a time in registers. No step depends on other tokens or on
// chunking.
#include <immintrin.h>

#include "backend/cpu/cpu_kernels.h"

namespace specdec::cpu {
namespace {

inline float hsum(__m256 v) {
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  const __m128 d = _mm_add_ss(c, _mm_movehdup_ps(c));
  return _mm_cvtss_f32(d);
}

inline float hmax(__m256 v) {
  const __m128 b = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 c = _mm_max_ps(b, _mm_movehl_ps(b, b));
  const __m128 d = _mm_max_ss(c, _mm_movehdup_ps(c));
  return _mm_cvtss_f32(d);
}

// All lanes below `count` set (count may exceed 8).
inline __m256i tail_mask(int64_t count) {
  const int c = count >= 8 ? 8 : static_cast<int>(count);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// e^x for x <= 0 (Cephes expf, as the AVX-512 path); inputs below -87 are clamped there.
inline __m256 exp_nonpositive(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
  p = _mm256_add_ps(p, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// hsum of four vectors at once: the same tree (lanes l and l + 4, then l + 2, then l + 1), so
// each result has the bits hsum gives it.
inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 ab = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
  const __m256 cd = _mm256_add_ps(_mm256_permute2f128_ps(c, d, 0x20), _mm256_permute2f128_ps(c, d, 0x31));
  // ab = [a', b'], cd = [c', d'] (4 lanes each); pair lanes l and l + 2 within each.
  const __m256 t = _mm256_add_ps(_mm256_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm256_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
  // t = [a0 a1 c0 c1 | b0 b1 d0 d1] (partial sums); pair neighbours.
  const __m256 u = _mm256_add_ps(t, _mm256_permute_ps(t, _MM_SHUFFLE(2, 3, 0, 1)));
  // a in lane 0, c in lane 2, b in lane 4, d in lane 6.
  const __m256 packed = _mm256_permutevar8x32_ps(u, _mm256_setr_epi32(0, 4, 2, 6, 0, 0, 0, 0));
  return _mm256_castps256_ps128(packed);
}

// s[u] = (q · k_u) * scale for U keys; each key's operations are the same whatever U is.
template <int U>
inline void scores(const float* q, const float* const* k, int64_t d, float scale, float* s) {
  __m256 acc[U];
  for (int u = 0; u < U; ++u) acc[u] = _mm256_setzero_ps();
  for (int64_t i = 0; i < d; i += 8) {
    const __m256i m = tail_mask(d - i);
    const __m256 qv = _mm256_maskload_ps(q + i, m);
    for (int u = 0; u < U; ++u) acc[u] = _mm256_fmadd_ps(qv, _mm256_maskload_ps(k[u] + i, m), acc[u]);
  }
  if constexpr (U == 4) {
    _mm_storeu_ps(s, _mm_mul_ps(hsum4(acc[0], acc[1], acc[2], acc[3]), _mm_set1_ps(scale)));
  } else {
    for (int u = 0; u < U; ++u) s[u] = _mm_cvtss_f32(_mm_mul_ss(_mm_set_ss(hsum(acc[u])), _mm_set_ss(scale)));
  }
}

template <int C>
void weighted_values(const AttendArgs& a, int64_t first, float* acc_out) {
  __m256 acc[C];
  __m256i m[C];
  for (int c = 0; c < C; ++c) {
    acc[c] = _mm256_setzero_ps();
    m[c] = tail_mask(a.d - first - 8 * c);
  }
  for (int64_t j0 = 0; j0 < a.n; j0 += a.block_size) {
    const float* vb = a.v + static_cast<int64_t>(a.blocks[j0 / a.block_size]) * a.block_size * a.stride + first;
    const int64_t count = a.n - j0 < a.block_size ? a.n - j0 : a.block_size;
    for (int64_t j = 0; j < count; ++j) {
      const __m256 e = _mm256_set1_ps(a.scores[j0 + j]);
      const float* v = vb + j * a.stride;
      for (int c = 0; c < C; ++c) acc[c] = _mm256_fmadd_ps(e, _mm256_maskload_ps(v + 8 * c, m[c]), acc[c]);
    }
  }
  for (int c = 0; c < C; ++c) _mm256_maskstore_ps(acc_out + first + 8 * c, m[c], acc[c]);
}

}  // namespace

namespace {

void attend_one(const AttendArgs& a) {
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
  const __m256 neg_inf = _mm256_set1_ps(-__builtin_inff());
  __m256 mx = neg_inf;
  for (int64_t j = 0; j < a.n; j += 8) {
    const __m256i m = tail_mask(a.n - j);
    mx = _mm256_max_ps(mx, _mm256_blendv_ps(neg_inf, _mm256_maskload_ps(a.scores + j, m), _mm256_castsi256_ps(m)));
  }
  const __m256 mxv = _mm256_set1_ps(hmax(mx));
  __m256 sum = _mm256_setzero_ps();
  for (int64_t j = 0; j < a.n; j += 8) {
    const __m256i m = tail_mask(a.n - j);
    const __m256 e =
        _mm256_and_ps(exp_nonpositive(_mm256_sub_ps(_mm256_maskload_ps(a.scores + j, m), mxv)), _mm256_castsi256_ps(m));
    _mm256_maskstore_ps(a.scores + j, m, e);
    sum = _mm256_add_ps(sum, e);
  }
  const __m256 inv = _mm256_set1_ps(_mm_cvtss_f32(_mm_div_ss(_mm_set_ss(1.0f), _mm_set_ss(hsum(sum)))));
  int64_t first = 0;
  for (; first + 32 <= a.d; first += 32) weighted_values<4>(a, first, a.out);
  switch ((a.d - first + 7) / 8) {
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
  for (int64_t i = 0; i < a.d; i += 8) {
    const __m256i m = tail_mask(a.d - i);
    _mm256_maskstore_ps(a.out + i, m, _mm256_mul_ps(_mm256_maskload_ps(a.out + i, m), inv));
  }
}

}  // namespace

void attend_avx2(const AttendArgs& a) {
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
