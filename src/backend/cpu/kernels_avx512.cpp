// AVX-512 kernels (F/BW/VL/DQ). linear keeps one 16-lane accumulator per output (lane l takes
// the k ≡ l mod 16 terms, the K tail through a masked load that adds exact zeros) and folds it
// with a fixed tree; register tiles of up to 4 x rows × 8 weight rows share every load. A tile's
// shape changes which outputs share loads, never the operations one output sees. Each weight tile
// prefetches the next, which brings decode (one x row) to streaming memory bandwidth.
// GCC 12's AVX-512 headers build some intrinsics from _mm512_undefined_*() and then warn about
// those (deliberately) undefined lanes; the warning says nothing about this file.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <array>

#include "backend/cpu/avx512_reduce.h"
#include "backend/cpu/cpu_kernels.h"

namespace specdec::cpu {
namespace {

constexpr int kMaxMr = 6;
constexpr int kMaxNr = 8;

template <DType W>
inline __m512 load_w(const void* base, int64_t i) {
  if constexpr (W == DType::f32) {
    return _mm512_loadu_ps(static_cast<const float*>(base) + i);
  } else {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(base) + i));
    if constexpr (W == DType::bf16) {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    } else {
      return _mm512_cvtph_ps(h);
    }
  }
}

template <DType W>
inline __m512 load_w_tail(const void* base, int64_t i, __mmask16 m) {
  if constexpr (W == DType::f32) {
    return _mm512_maskz_loadu_ps(m, static_cast<const float*>(base) + i);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(base) + i);
    if constexpr (W == DType::bf16) {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    } else {
      return _mm512_cvtph_ps(h);
    }
  }
}

// `ahead`: bytes past each weight element to prefetch (the next tile's rows), 0 for none.
template <DType W, int MR, int NR>
void tile(const LinearArgs& a, int64_t m0, int64_t n0, int64_t ahead) {
  const int64_t K = a.K;
  const size_t esize = dtype_size(W);
  const char* wbase = static_cast<const char*>(a.w);
  const void* wrow[NR];
  for (int j = 0; j < NR; ++j) wrow[j] = wbase + static_cast<size_t>(n0 + j) * static_cast<size_t>(K) * esize;
  const float* xrow[MR];
  for (int i = 0; i < MR; ++i) xrow[i] = a.x + (m0 + i) * K;
  __m512 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 xv[MR];
    for (int i = 0; i < MR; ++i) xv[i] = _mm512_loadu_ps(xrow[i] + k);
    if (ahead && ((static_cast<size_t>(k) * esize) & 63) == 0) {  // once per cache line
      for (int j = 0; j < NR; ++j) {
        _mm_prefetch(static_cast<const char*>(wrow[j]) + static_cast<size_t>(k) * esize + ahead, _MM_HINT_T0);
      }
    }
    for (int j = 0; j < NR; ++j) {
      const __m512 wv = load_w<W>(wrow[j], k);
      for (int i = 0; i < MR; ++i) acc[i][j] = _mm512_fmadd_ps(xv[i], wv, acc[i][j]);
    }
  }
  if (k < K) {
    const __mmask16 m = static_cast<__mmask16>((1u << (K - k)) - 1u);
    __m512 xv[MR];
    for (int i = 0; i < MR; ++i) xv[i] = _mm512_maskz_loadu_ps(m, xrow[i] + k);
    for (int j = 0; j < NR; ++j) {
      const __m512 wv = load_w_tail<W>(wrow[j], k, m);
      for (int i = 0; i < MR; ++i) acc[i][j] = _mm512_fmadd_ps(xv[i], wv, acc[i][j]);
    }
  }
  store_tile_sums(acc, a.out + m0 * a.N + n0, a.N, a.bias, n0);
}

using TileFn = void (*)(const LinearArgs&, int64_t, int64_t, int64_t);
using TileTable = std::array<std::array<TileFn, kMaxNr>, kMaxMr>;

template <DType W, int MR, int... NR>
constexpr std::array<TileFn, kMaxNr> tile_row(std::integer_sequence<int, NR...>) {
  return {&tile<W, MR, NR + 1>...};
}
template <DType W, int... MR>
constexpr TileTable tile_table(std::integer_sequence<int, MR...>) {
  return {tile_row<W, MR + 1>(std::make_integer_sequence<int, kMaxNr>())...};
}
template <DType W>
constexpr TileTable kTiles = tile_table<W>(std::make_integer_sequence<int, kMaxMr>());

template <DType W>
void linear_typed(const LinearArgs& a, int64_t n_begin, int64_t n_end) {
  const TileTable& tiles = kTiles<W>;
  // Up to three x rows (a decode step, a short verify window): still bound by the weight
  // stream, so 8 weight rows in flight keep 8 load streams open (at two rows, 4 cost 35 % more
  // than one row's forward). Four rows: one 4 × 6 tile (24 accumulators; 5-10 % faster than
  // 4 × 4 in a verify window of 4, measured; at 5 rows and more 4 × 6 or 3 × 8 tiles lost to
  // the 6 × 4 ones, which read x fewer times). More rows: tiles of up to 6 x rows × 4 weight rows (24
  // accumulators, 6 + 4 loads per 24 FMAs), the rows split evenly (11 = 6 + 5, 8 = 4 + 4) so no
  // tile is left nearly empty.
  const int64_t nr_main = a.M <= 3 ? 8 : a.M == 4 ? 6 : 4;
  const int64_t m_tiles = a.M <= 3 ? 1 : (a.M + kMaxMr - 1) / kMaxMr;
  for (int64_t n0 = n_begin; n0 < n_end; n0 += nr_main) {
    const int64_t nr = n_end - n0 < nr_main ? n_end - n0 : nr_main;
    for (int64_t t = 0, m0 = 0; t < m_tiles; ++t) {
      const int64_t mr = (a.M - m0) / (m_tiles - t);
      if (mr == 0) break;
      // The first x tile of each weight block pulls the next block toward the cache.
      const int64_t ahead = m0 == 0 ? nr_main * a.K * static_cast<int64_t>(dtype_size(W)) : 0;
      tiles[static_cast<size_t>(mr - 1)][static_cast<size_t>(nr - 1)](a, m0, n0, ahead);
      m0 += mr;
    }
  }
}

void linear_avx512(const LinearArgs& a, int64_t n_begin, int64_t n_end) {
  switch (a.wdtype) {
    case DType::f32:
      return linear_typed<DType::f32>(a, n_begin, n_end);
    case DType::bf16:
      return linear_typed<DType::bf16>(a, n_begin, n_end);
    case DType::f16:
      return linear_typed<DType::f16>(a, n_begin, n_end);
    case DType::i32:
      return;
  }
}

// e^x, 16 lanes (the arithmetic in cpu_kernels.h), 2^n applied by scalef.
inline __m512 exp_avx512(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-kExpClamp), _mm512_min_ps(_mm512_set1_ps(kExpClamp), x));
  const __m512 n =
      _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kExpLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kExpLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kExpLn2Lo), r);
  __m512 p = _mm512_set1_ps(kExpPoly[0]);
  for (int i = 1; i < kExpPolyTerms; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpPoly[i]));
  return _mm512_scalef_ps(p, n);
}

// silu(g) · u = g / (1 + e^-g) · u, with silu_mul_scalar's roundings around exp_avx512.
inline __m512 silu_times_avx512(__m512 g, __m512 u) {
  const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_setzero_ps(), g));
  return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u);
}

}  // namespace

void silu_mul_avx512(const float* g, const float* u, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(out + i, silu_times_avx512(_mm512_loadu_ps(g + i), _mm512_loadu_ps(u + i)));
  }
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
    _mm512_mask_storeu_ps(out + i, m,
                          silu_times_avx512(_mm512_maskz_loadu_ps(m, g + i), _mm512_maskz_loadu_ps(m, u + i)));
  }
}

double sum_exp_avx512(const float* x, int64_t n, float shift) {
  const __m512 s = _mm512_set1_ps(shift);
  __m512d acc0 = _mm512_setzero_pd(), acc1 = _mm512_setzero_pd();
  const auto add = [&](__m512 e) {
    acc0 = _mm512_add_pd(acc0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
    acc1 = _mm512_add_pd(acc1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
  };
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) add(exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(x + i), s)));
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
    add(_mm512_maskz_mov_ps(m, exp_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), s))));
  }
  return _mm512_reduce_add_pd(_mm512_add_pd(acc0, acc1));
}

const Kernels& avx512_kernels() {
  static const Kernels k{"avx512", linear_avx512, attend_avx512, silu_mul_avx512, sum_exp_avx512};
  return k;
}

}  // namespace specdec::cpu
