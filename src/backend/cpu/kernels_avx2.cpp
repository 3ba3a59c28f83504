// AVX2 + FMA kernels. linear keeps one 8-lane accumulator per output (lane l takes the
// k ≡ l mod 8 terms; the K tail goes through a zero-padded copy that adds exact zeros) and folds
// it with a fixed tree; register tiles of x rows × weight rows (3 × 4 up to three x rows, 4 × 2
// and 5 × 2 for four and five, 4 × 3 beyond) share loads. A tile's shape never changes the
// operations one output sees.
#include <immintrin.h>

#include <array>
#include <cstring>

#include "backend/cpu/cpu_kernels.h"

namespace specdec::cpu {
namespace {

constexpr int kMaxMr = 5;
constexpr int kMaxNr = 4;
// Prefetch distance along each weight stream.
constexpr int64_t kPrefetchBytes = 2048;
// From this many x rows on, weight tiles go in blocks of about kBlockBytes (see linear_typed).
constexpr int64_t kBlockRows = 32;
constexpr int64_t kBlockBytes = 64 << 10;

// Fixed reduction tree: 8 → 4 → 2 → 1.
inline float hsum(__m256 v) {
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  const __m128 d = _mm_add_ss(c, _mm_movehdup_ps(c));
  return _mm_cvtss_f32(d);
}

template <DType W>
inline __m256 load_w(const void* base, int64_t i) {
  if constexpr (W == DType::f32) {
    return _mm256_loadu_ps(static_cast<const float*>(base) + i);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + i));
    if constexpr (W == DType::bf16) {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    } else {
      return _mm256_cvtph_ps(h);
    }
  }
}

// The last K % 8 elements of a row, zero-padded to a full vector.
template <DType W>
inline __m256 load_w_tail(const void* base, int64_t i, int64_t count) {
  alignas(32) uint8_t buf[32] = {};
  std::memcpy(buf, static_cast<const uint8_t*>(base) + static_cast<size_t>(i) * dtype_size(W),
              static_cast<size_t>(count) * dtype_size(W));
  return load_w<W>(buf, 0);
}

inline __m256 load_x_tail(const float* x, int64_t count) {
  alignas(32) float buf[8] = {};
  std::memcpy(buf, x, static_cast<size_t>(count) * sizeof(float));
  return _mm256_load_ps(buf);
}

// Weight rows n0, n0 + stride, ..., n0 + (NR - 1) · stride against x rows m0 .. m0 + MR - 1.
// `ahead`: bytes past each weight element to prefetch, 0 for none.
template <DType W, int MR, int NR>
void tile(const LinearArgs& a, int64_t m0, int64_t n0, int64_t stride, int64_t ahead) {
  const int64_t K = a.K;
  const size_t esize = dtype_size(W);
  const char* wbase = static_cast<const char*>(a.w);
  const void* wrow[NR];
  for (int j = 0; j < NR; ++j) {
    wrow[j] = wbase + static_cast<size_t>(n0 + j * stride) * static_cast<size_t>(K) * esize;
  }
  const float* xrow[MR];
  for (int i = 0; i < MR; ++i) xrow[i] = a.x + (m0 + i) * K;
  __m256 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  // One step: eight k of every x row against every weight row, x loaded inside the step so that
  // no more than MR × NR + MR + 1 vector registers are live.
  const auto step = [&](int64_t kk) {
    __m256 xv[MR];
    for (int i = 0; i < MR; ++i) xv[i] = _mm256_loadu_ps(xrow[i] + kk);
    for (int j = 0; j < NR; ++j) {
      const __m256 wv = load_w<W>(wrow[j], kk);
      for (int i = 0; i < MR; ++i) acc[i][j] = _mm256_fmadd_ps(xv[i], wv, acc[i][j]);
    }
  };
  // A cache line (64 bytes) of every weight row at a time, the prefetch outside the steps:
  // a branch inside each step made g++ keep one more x vector live and spill an accumulator of the
  // 4 × 3 tile through the stack.
  constexpr int64_t line = W == DType::f32 ? 16 : 32;  // k per 64 bytes of a weight row
  int64_t k = 0;
  for (; k + line <= K; k += line) {
    if (ahead) {
      for (int j = 0; j < NR; ++j) {
        _mm_prefetch(static_cast<const char*>(wrow[j]) + static_cast<size_t>(k) * esize + ahead, _MM_HINT_T0);
      }
    }
    for (int64_t kk = k; kk < k + line; kk += 8) step(kk);
  }
  for (; k + 8 <= K; k += 8) step(k);
  if (k < K) {
    __m256 xv[MR];
    for (int i = 0; i < MR; ++i) xv[i] = load_x_tail(xrow[i] + k, K - k);
    for (int j = 0; j < NR; ++j) {
      const __m256 wv = load_w_tail<W>(wrow[j], k, K - k);
      for (int i = 0; i < MR; ++i) acc[i][j] = _mm256_fmadd_ps(xv[i], wv, acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    float* out = a.out + (m0 + i) * a.N;
    for (int j = 0; j < NR; ++j) {
      const int64_t n = n0 + j * stride;
      float v = hsum(acc[i][j]);
      if (a.bias) v += a.bias[n];
      out[n] = v;
    }
  }
}

using TileFn = void (*)(const LinearArgs&, int64_t, int64_t, int64_t, int64_t);
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
  // Up to three x rows: one pass of 3 × 4 tiles. Four or five (verify windows of depth 3 and 4):
  // one pass of 4 × 2 or 5 × 2 tiles, which cost about what three rows do (3.3 and 3.7 against
  // 2.8 ms for 44 MB of weights, one thread), where a 3 × 4 pass plus a pass for the rest cost
  // 6.0 ms: on Zen 3 each pass runs at the core's pace, not the memory's. More rows (wide
  // windows, prefill): passes of 4 × 3 tiles, the rows split evenly (11 = 4 + 4 + 3), 3-19 %
  // faster than passes of 3 × 4 from 8 rows up (each widened weight vector feeds four FMAs
  // instead of three; the 4 × 3 tiles ran 73-76 against 67-70 GFLOP/s with the weights in L2,
  // one thread).
  const int64_t nr_main = a.M == 4 || a.M == 5 ? 2 : a.M >= 6 ? 3 : kMaxNr;
  const int64_t m_tiles = a.M <= 5 ? 1 : (a.M + 3) / 4;
  // A tile's weight rows come from nr_main equal segments of [n_begin, n_end), one row from each:
  // every segment is read front to back, so the weights arrive as a few long sequential streams
  // instead of interleaved rows of one block (which halved the read bandwidth on Zen 3: one x row
  // 6 → 15 GB/s on one thread). x tiles run inside each weight tile, so weights are read from
  // memory once whatever M is.
  const int64_t seg = (n_end - n_begin) / nr_main;
  // Weight tiles first .. first + count - 1 (tile i: weight rows i, i + stride, ...), every x tile
  // passing over all of them before the next x tile; the x rows split evenly over m_tiles.
  auto passes = [&](int64_t first, int64_t count, int64_t nr, int64_t stride) {
    for (int64_t t = 0, m0 = 0; t < m_tiles; ++t) {
      const int64_t mr = (a.M - m0) / (m_tiles - t);
      // The first x tile of each weight tile pulls its streams' next bytes toward the cache.
      for (int64_t i = first; i < first + count; ++i) {
        tiles[static_cast<size_t>(mr - 1)][static_cast<size_t>(nr - 1)](a, m0, i, stride, m0 == 0 ? kPrefetchBytes : 0);
      }
      m0 += mr;
    }
  };
  // Up to kBlockRows x rows, one weight tile at a time. Many x rows (prefill): x no longer fits
  // beside the weights in L2, and every x tile passing over one weight tile reads all of x again
  // for each weight tile; the weight tiles go in blocks of about kBlockBytes instead, every x tile
  // passing over a whole block (its weights from L2) before the next: a 175-token prefill's
  // linears 13-19 % faster.
  const int64_t tile_bytes = nr_main * a.K * static_cast<int64_t>(dtype_size(W));
  const int64_t block = a.M < kBlockRows || kBlockBytes / tile_bytes < 1 ? 1 : kBlockBytes / tile_bytes;
  for (int64_t i0 = 0; i0 < seg; i0 += block) passes(n_begin + i0, block < seg - i0 ? block : seg - i0, nr_main, seg);
  const int64_t rest = n_begin + nr_main * seg;
  if (rest < n_end) passes(rest, 1, n_end - rest, 1);
}

void linear_avx2(const LinearArgs& a, int64_t n_begin, int64_t n_end) {
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

// e^x, 8 lanes (the arithmetic in cpu_kernels.h). AVX2 has no scalef: 2^n is applied as two exact
// powers of two, 2^⌊n/2⌋ · 2^(n − ⌊n/2⌋), each a normal float for |n| ≤ 159, so the second product
// is the only one that can round, as scalef rounds once.
inline __m256 exp_avx2(__m256 x) {
  x = _mm256_max_ps(_mm256_set1_ps(-kExpClamp), _mm256_min_ps(_mm256_set1_ps(kExpClamp), x));
  const __m256 n =
      _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kExpLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kExpLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kExpLn2Lo), r);
  __m256 p = _mm256_set1_ps(kExpPoly[0]);
  for (int i = 1; i < kExpPolyTerms; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpPoly[i]));
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i n1 = _mm256_srai_epi32(ni, 1);
  const __m256i n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

// silu(g) · u = g / (1 + e^-g) · u, with silu_mul_scalar's roundings around exp_avx2.
inline __m256 silu_times_avx2(__m256 g, __m256 u) {
  const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), g));
  return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

}  // namespace

void silu_mul_avx2(const float* g, const float* u, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, silu_times_avx2(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
  }
  if (i < n) {  // the tail through zero-padded copies: lanes are independent
    const size_t bytes = static_cast<size_t>(n - i) * sizeof(float);
    alignas(32) float gb[8] = {}, ub[8] = {}, ob[8];
    std::memcpy(gb, g + i, bytes);
    std::memcpy(ub, u + i, bytes);
    _mm256_store_ps(ob, silu_times_avx2(_mm256_load_ps(gb), _mm256_load_ps(ub)));
    std::memcpy(out + i, ob, bytes);
  }
}

double sum_exp_avx2(const float* x, int64_t n, float shift) {
  const __m256 s = _mm256_set1_ps(shift);
  __m256d acc0 = _mm256_setzero_pd(), acc1 = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + i), s));
    acc0 = _mm256_add_pd(acc0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    acc1 = _mm256_add_pd(acc1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(acc0, acc1));
  double sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  if (i < n) {  // the tail through a zero-padded copy, whose padding lanes are not added
    const size_t bytes = static_cast<size_t>(n - i) * sizeof(float);
    alignas(32) float xb[8] = {};
    std::memcpy(xb, x + i, bytes);
    alignas(32) float eb[8];
    _mm256_store_ps(eb, exp_avx2(_mm256_sub_ps(_mm256_load_ps(xb), s)));
    for (int64_t j = 0; j < n - i; ++j) sum += eb[j];
  }
  return sum;
}

const Kernels& avx2_kernels() {
  static const Kernels k{"avx2", linear_avx2, attend_avx2, silu_mul_avx2, sum_exp_avx2};
  return k;
}

}  // namespace specdec::cpu
