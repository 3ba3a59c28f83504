// AVX2 + FMA attention for one token, the query heads of one kv head together (each key and
// value chunk loaded once for all of them). Scores: per (head, position) an 8-lane FMA chain over
// head_dim (tail masked) folded by a fixed tree. Softmax: exp by a fixed polynomial, summed in 8
// lanes indexed by position mod 8. Values: accumulated in position order, 8 dimensions to a
// register. No step of one head's output depends on the other heads, other tokens or chunking.
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

// Loads of eight floats at i of a row of d: plain while whole, masked (zeros past d) at the tail;
// the same values either way.
inline __m256 load_d(const float* p, int64_t i, int64_t d) {
  return i + 8 <= d ? _mm256_loadu_ps(p + i) : _mm256_maskload_ps(p + i, tail_mask(d - i));
}

// Keys j .. j + U - 1 of a block (`kb`: its first slot) against H query heads: s[h][j] = (q_h · k)
// * scale, an 8-lane FMA chain over d folded by hsum's tree. A key's k chunk is loaded once for
// every head; each score's operations are the same whatever H and U are.
template <int H, int U>
inline void scores(const AttendArgs& a, const float* kb, int64_t j, int64_t j_abs) {
  __m256 acc[H][U];
  for (int h = 0; h < H; ++h)
    for (int u = 0; u < U; ++u) acc[h][u] = _mm256_setzero_ps();
  for (int64_t i = 0; i < a.d; i += 8) {
    __m256 kv[U];
    for (int u = 0; u < U; ++u) kv[u] = load_d(kb + (j + u) * a.stride, i, a.d);
    for (int h = 0; h < H; ++h) {
      const __m256 qv = load_d(a.q + h * a.d, i, a.d);
      for (int u = 0; u < U; ++u) acc[h][u] = _mm256_fmadd_ps(qv, kv[u], acc[h][u]);
    }
  }
  for (int u = 0; u < U; ++u) {
    if constexpr (H == 4) {
      alignas(16) float s[4];
      _mm_store_ps(s, _mm_mul_ps(hsum4(acc[0][u], acc[1][u], acc[2][u], acc[3][u]), _mm_set1_ps(a.scale)));
      for (int h = 0; h < 4; ++h) a.scores[h * a.n + j_abs + u] = s[h];
    } else {
      for (int h = 0; h < H; ++h) {
        a.scores[h * a.n + j_abs + u] = _mm_cvtss_f32(_mm_mul_ss(_mm_set_ss(hsum(acc[h][u])), _mm_set_ss(a.scale)));
      }
    }
  }
}

template <int H>
void all_scores(const AttendArgs& a) {
  for (int64_t j0 = 0; j0 < a.n; j0 += a.block_size) {
    const float* kb = a.k + static_cast<int64_t>(a.blocks[j0 / a.block_size]) * a.block_size * a.stride;
    const int64_t count = a.n - j0 < a.block_size ? a.n - j0 : a.block_size;
    int64_t j = 0;
    for (; j + 2 <= count; j += 2) scores<H, 2>(a, kb, j, j0 + j);
    if (j < count) scores<H, 1>(a, kb, j, j0 + j);
  }
}

// One head's softmax numerators in place: e^(s - max), and 1 / their sum (eight lanes indexed by
// position mod 8, folded by hsum's tree).
inline float softmax_numerators(float* s, int64_t n) {
  const __m256 neg_inf = _mm256_set1_ps(-__builtin_inff());
  __m256 mx = neg_inf;
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(s + j));
  if (j < n) {
    const __m256i m = tail_mask(n - j);
    mx = _mm256_max_ps(mx, _mm256_blendv_ps(neg_inf, _mm256_maskload_ps(s + j, m), _mm256_castsi256_ps(m)));
  }
  const __m256 mxv = _mm256_set1_ps(hmax(mx));
  __m256 sum = _mm256_setzero_ps();
  for (j = 0; j + 8 <= n; j += 8) {
    const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(s + j), mxv));
    _mm256_storeu_ps(s + j, e);
    sum = _mm256_add_ps(sum, e);
  }
  if (j < n) {
    const __m256i m = tail_mask(n - j);
    const __m256 e =
        _mm256_and_ps(exp_nonpositive(_mm256_sub_ps(_mm256_maskload_ps(s + j, m), mxv)), _mm256_castsi256_ps(m));
    _mm256_maskstore_ps(s + j, m, e);
    sum = _mm256_add_ps(sum, e);
  }
  return _mm_cvtss_f32(_mm_div_ss(_mm_set_ss(1.0f), _mm_set_ss(hsum(sum))));
}

// Dimensions first .. first + 8 C - 1 of H heads' outputs: the weighted values accumulated in
// position order (each value chunk loaded once for every head), times the head's 1 / sum.
template <int H, int C>
void weighted_values(const AttendArgs& a, int64_t first, const float* inv) {
  __m256 acc[H][C];
  for (int h = 0; h < H; ++h)
    for (int c = 0; c < C; ++c) acc[h][c] = _mm256_setzero_ps();
  for (int64_t j0 = 0; j0 < a.n; j0 += a.block_size) {
    const float* vb = a.v + static_cast<int64_t>(a.blocks[j0 / a.block_size]) * a.block_size * a.stride;
    const int64_t count = a.n - j0 < a.block_size ? a.n - j0 : a.block_size;
    for (int64_t j = 0; j < count; ++j) {
      __m256 vv[C];
      for (int c = 0; c < C; ++c) vv[c] = load_d(vb + j * a.stride, first + 8 * c, a.d);
      for (int h = 0; h < H; ++h) {
        const __m256 e = _mm256_broadcast_ss(a.scores + h * a.n + j0 + j);
        for (int c = 0; c < C; ++c) acc[h][c] = _mm256_fmadd_ps(e, vv[c], acc[h][c]);
      }
    }
  }
  for (int h = 0; h < H; ++h) {
    const __m256 iv = _mm256_set1_ps(inv[h]);
    for (int c = 0; c < C; ++c) {
      const int64_t i = first + 8 * c;
      const __m256 o = _mm256_mul_ps(acc[h][c], iv);
      if (i + 8 <= a.d) {
        _mm256_storeu_ps(a.out + h * a.d + i, o);
      } else {
        _mm256_maskstore_ps(a.out + h * a.d + i, tail_mask(a.d - i), o);
      }
    }
  }
}

// H heads (of one kv head) at once.
template <int H>
void attend_heads(const AttendArgs& a) {
  all_scores<H>(a);
  float inv[H];
  for (int h = 0; h < H; ++h) inv[h] = softmax_numerators(a.scores + h * a.n, a.n);
  int64_t first = 0;
  for (; first + 16 <= a.d; first += 16) weighted_values<H, 2>(a, first, inv);
  if (first < a.d) weighted_values<H, 1>(a, first, inv);
  if (first + 8 < a.d) weighted_values<H, 1>(a, first + 8, inv);
}

}  // namespace

void attend_avx2(const AttendArgs& a) {
  for (int64_t g = 0; g < a.heads; g += 4) {
    AttendArgs part = a;
    part.q = a.q + g * a.d;
    part.out = a.out + g * a.d;
    part.scores = a.scores + g * a.n;
    switch (a.heads - g < 4 ? a.heads - g : 4) {
      case 1:
        attend_heads<1>(part);
        break;
      case 2:
        attend_heads<2>(part);
        break;
      case 3:
        attend_heads<3>(part);
        break;
      default:
        attend_heads<4>(part);
        break;
    }
  }
}

}  // namespace specdec::cpu
