// AVX-512 attention for one token's query heads sharing a kv head. Scores: per (head, position) a
// 16-lane dot over head_dim (tail masked) folded by the fixed tree, four at a time. Softmax: exp
// by a fixed polynomial, summed in 16 lanes indexed by position mod 16. Values: accumulated in
// position order for up to 4 heads × 64 dimensions in registers, each value loaded once for
// them. No step depends on other tokens, on chunking or on how many heads share the call.
// GCC 12's AVX-512 headers warn about their own deliberately undefined lanes.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <array>
#include <utility>

#include "backend/cpu/avx512_exp.h"
#include "backend/cpu/avx512_reduce.h"
#include "backend/cpu/cpu_kernels.h"

namespace specdec::cpu {
namespace {

inline __mmask16 tail_mask(int64_t count) {
  return count >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << count) - 1u);
}

// First slot of the block holding cache position j (positions j .. block end follow at stride).
inline const float* block_base(const AttendArgs& a, const float* pool, int64_t j) {
  return pool + static_cast<int64_t>(a.blocks[j / a.block_size]) * a.block_size * a.stride;
}

// Pulls `count` floats from p toward L1: the next block's row while this block is computed
// (blocks are scattered, so the hardware prefetcher cannot guess them).
inline void prefetch_row(const float* p, int64_t count) {
  for (int64_t i = 0; i < count; i += 16) _mm_prefetch(reinterpret_cast<const char*>(p + i), _MM_HINT_T0);
}

// Up to four pending scores (query head × key), computed together once four are queued. Each
// score is the same operation sequence whichever others share its batch: 16-lane FMAs over d
// (tail masked), the fixed tree, then the scale.
class ScoreBatch {
 public:
  ScoreBatch(int64_t d, float scale) : d_(d), scale_(scale) {}
  void add(const float* q, const float* k, float* out) {
    q_[count_] = q;
    k_[count_] = k;
    out_[count_] = out;
    if (++count_ == 4) flush();
  }
  void flush() {
    if (count_ == 0) return;
    for (int u = count_; u < 4; ++u) {  // padding: recomputes the first, result dropped
      q_[u] = q_[0];
      k_[u] = k_[0];
    }
    __m512 acc[4];
    for (int u = 0; u < 4; ++u) acc[u] = _mm512_setzero_ps();
    for (int64_t i = 0; i < d_; i += 16) {
      const __mmask16 m = tail_mask(d_ - i);
      for (int u = 0; u < 4; ++u) {
        acc[u] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q_[u] + i), _mm512_maskz_loadu_ps(m, k_[u] + i), acc[u]);
      }
    }
    alignas(16) float s[4];
    _mm_store_ps(s, _mm_mul_ps(hsum4(acc[0], acc[1], acc[2], acc[3]), _mm_set1_ps(scale_)));
    for (int u = 0; u < count_; ++u) *out_[u] = s[u];
    count_ = 0;
  }

 private:
  int64_t d_;
  float scale_;
  int count_ = 0;
  const float* q_[4] = {};
  const float* k_[4] = {};
  float* out_[4] = {};
};

// For HT heads from g0 and C chunks of 16 dimensions from `first`: out = sum over positions of
// e_j * v_j, accumulated in position order; each value chunk is loaded once for all HT heads.
template <int HT, int C>
void weighted_values(const AttendArgs& a, int64_t g0, int64_t first) {
  __m512 acc[HT][C];
  __mmask16 m[C];
  for (int c = 0; c < C; ++c) m[c] = tail_mask(a.d - first - 16 * c);
  for (int h = 0; h < HT; ++h)
    for (int c = 0; c < C; ++c) acc[h][c] = _mm512_setzero_ps();
  const float* e = a.scores + g0 * a.n;
  for (int64_t j0 = 0; j0 < a.n; j0 += a.block_size) {
    const float* vb = block_base(a, a.v, j0) + first;
    const int64_t count = a.n - j0 < a.block_size ? a.n - j0 : a.block_size;
    const float* next = j0 + a.block_size < a.n ? block_base(a, a.v, j0 + a.block_size) + first : nullptr;
    for (int64_t j = 0; j < count; ++j) {
      if (next) prefetch_row(next + j * a.stride, a.d - first < 16 * C ? a.d - first : 16 * C);
      const float* v = vb + j * a.stride;
      __m512 vv[C];
      for (int c = 0; c < C; ++c) vv[c] = _mm512_maskz_loadu_ps(m[c], v + 16 * c);
      for (int h = 0; h < HT; ++h) {
        const __m512 w = _mm512_set1_ps(e[h * a.n + j0 + j]);
        for (int c = 0; c < C; ++c) acc[h][c] = _mm512_fmadd_ps(w, vv[c], acc[h][c]);
      }
    }
  }
  for (int h = 0; h < HT; ++h) {
    for (int c = 0; c < C; ++c) _mm512_mask_storeu_ps(a.out + (g0 + h) * a.d + first + 16 * c, m[c], acc[h][c]);
  }
}

// Replaces scores s[0, n) by exp(s - max) (max exact in any order; exp by the fixed polynomial)
// and returns 1 / their sum (summed in lanes j mod 16, then the fixed tree), broadcast.
__m512 softmax_numerators(float* s, int64_t n) {
  __m512 mx = _mm512_set1_ps(-__builtin_inff());
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = tail_mask(n - j);
    mx = _mm512_mask_max_ps(mx, m, mx, _mm512_maskz_loadu_ps(m, s + j));
  }
  const __m512 mxv = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = tail_mask(n - j);
    const __m512 e = _mm512_maskz_mov_ps(m, exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + j), mxv)));
    _mm512_mask_storeu_ps(s + j, m, e);
    sum = _mm512_add_ps(sum, e);
  }
  return _mm512_set1_ps(_mm_cvtss_f32(_mm_div_ss(_mm_set_ss(1.0f), _mm_set_ss(hsum(sum)))));
}

// Scores of head g0 through the queue (any head_dim).
void scores_any(const AttendArgs& a, int64_t g0) {
  ScoreBatch batch(a.d, a.scale);
  for (int64_t j0 = 0; j0 < a.n; j0 += a.block_size) {
    const float* kb = block_base(a, a.k, j0);
    const int64_t count = a.n - j0 < a.block_size ? a.n - j0 : a.block_size;
    for (int64_t j = 0; j < count; ++j) batch.add(a.q + g0 * a.d, kb + j * a.stride, a.scores + g0 * a.n + j0 + j);
  }
  batch.flush();
}

// Scores of HT heads from g0 against PT keys at a time (HT * PT = 4 dot products per tree), the
// queries (C chunks of 16) held in registers. Same operations per score as ScoreBatch, so a
// head's scores have the same bits whichever tile computes them.
template <int HT, int PT, int C>
void score_tile(const AttendArgs& a, int64_t g0) {
  static_assert(HT * PT == 4);
  __mmask16 m[C];
  __m512 qv[HT][C];
  for (int c = 0; c < C; ++c) m[c] = tail_mask(a.d - 16 * c);
  for (int h = 0; h < HT; ++h)
    for (int c = 0; c < C; ++c) qv[h][c] = _mm512_maskz_loadu_ps(m[c], a.q + (g0 + h) * a.d + 16 * c);
  const __m128 scale = _mm_set1_ps(a.scale);
  ScoreBatch rest(a.d, a.scale);
  for (int64_t j0 = 0; j0 < a.n; j0 += a.block_size) {
    const float* kb = block_base(a, a.k, j0);
    const int64_t count = a.n - j0 < a.block_size ? a.n - j0 : a.block_size;
    const float* next = j0 + a.block_size < a.n ? block_base(a, a.k, j0 + a.block_size) : nullptr;
    int64_t j = 0;
    for (; j + PT <= count; j += PT) {
      __m512 acc[4];
      for (int u = 0; u < 4; ++u) acc[u] = _mm512_setzero_ps();
      for (int p = 0; p < PT; ++p) {
        if (next) prefetch_row(next + (j + p) * a.stride, a.d);
      }
      for (int c = 0; c < C; ++c) {
        for (int p = 0; p < PT; ++p) {
          const __m512 kv = _mm512_maskz_loadu_ps(m[c], kb + (j + p) * a.stride + 16 * c);
          for (int h = 0; h < HT; ++h) acc[h * PT + p] = _mm512_fmadd_ps(qv[h][c], kv, acc[h * PT + p]);
        }
      }
      alignas(16) float s[4];
      _mm_store_ps(s, _mm_mul_ps(hsum4(acc[0], acc[1], acc[2], acc[3]), scale));
      for (int h = 0; h < HT; ++h)
        for (int p = 0; p < PT; ++p) a.scores[(g0 + h) * a.n + j0 + j + p] = s[h * PT + p];
    }
    for (; j < count; ++j) {
      if (next) prefetch_row(next + j * a.stride, a.d);
      for (int h = 0; h < HT; ++h)
        rest.add(a.q + (g0 + h) * a.d, kb + j * a.stride, a.scores + (g0 + h) * a.n + j0 + j);
    }
  }
  rest.flush();
}

using TileFn = void (*)(const AttendArgs&, int64_t);
template <int HT, int... C>
constexpr std::array<TileFn, sizeof...(C)> score_tiles(std::integer_sequence<int, C...>) {
  return {&score_tile<HT, 4 / HT, C + 1>...};
}
constexpr auto kTiles4 = score_tiles<4>(std::make_integer_sequence<int, 4>());
constexpr auto kTiles2 = score_tiles<2>(std::make_integer_sequence<int, 8>());
constexpr auto kTiles1 = score_tiles<1>(std::make_integer_sequence<int, 16>());

using ValuesFn = void (*)(const AttendArgs&, int64_t, int64_t);
template <int HT, int... C>
constexpr std::array<ValuesFn, 4> values_row(std::integer_sequence<int, C...>) {
  return {&weighted_values<HT, C + 1>...};
}
template <int... HT>
constexpr std::array<std::array<ValuesFn, 4>, 4> values_table(std::integer_sequence<int, HT...>) {
  return {values_row<HT + 1>(std::make_integer_sequence<int, 4>())...};
}
constexpr std::array<std::array<ValuesFn, 4>, 4> kValues = values_table(std::make_integer_sequence<int, 4>());

}  // namespace

void attend_avx512(const AttendArgs& a) {
  // 1. Scores, a register tile of heads at a time (their queries held in registers).
  const int64_t chunks = (a.d + 15) / 16;
  for (int64_t g = 0; g < a.heads;) {
    if (a.heads - g >= 4 && chunks <= 4) {
      kTiles4[static_cast<size_t>(chunks - 1)](a, g);
      g += 4;
    } else if (a.heads - g >= 2 && chunks <= 8) {
      kTiles2[static_cast<size_t>(chunks - 1)](a, g);
      g += 2;
    } else if (chunks <= 16) {
      kTiles1[static_cast<size_t>(chunks - 1)](a, g);
      g += 1;
    } else {
      scores_any(a, g);
      g += 1;
    }
  }
  // 2. Heads four at a time: softmax of each head's scores, the weighted values of all four
  // (64 dimensions per sweep), then each head's normalisation.
  for (int64_t g0 = 0; g0 < a.heads; g0 += 4) {
    const int64_t ht = a.heads - g0 < 4 ? a.heads - g0 : 4;
    __m512 inv[4];
    for (int64_t h = 0; h < ht; ++h) inv[h] = softmax_numerators(a.scores + (g0 + h) * a.n, a.n);
    for (int64_t first = 0; first < a.d; first += 64) {
      const int64_t chunks = (a.d - first + 15) / 16;
      kValues[static_cast<size_t>(ht - 1)][static_cast<size_t>((chunks < 4 ? chunks : 4) - 1)](a, g0, first);
    }
    for (int64_t h = 0; h < ht; ++h) {
      float* o = a.out + (g0 + h) * a.d;
      for (int64_t i = 0; i < a.d; i += 16) {
        const __mmask16 m = tail_mask(a.d - i);
        _mm512_mask_storeu_ps(o + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, o + i), inv[h]));
      }
    }
  }
}

}  // namespace specdec::cpu
