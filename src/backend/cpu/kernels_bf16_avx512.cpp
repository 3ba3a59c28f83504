// The "avx512-bf16" kernels (the default where the CPU has AVX-512 BF16 but no AMX): linear over
// bf16 weights with _mm512_dpbf16_ps, activations rounded to bf16 first (by cpu::linear, into
// LinearArgs::x_bf16). Twice the multiply rate of the f32 path, and half its instructions a
// weight; the rounding departs from the f32 reference, which "best" keeps. Each output keeps one
// 16-lane accumulator (lane l takes the pairs k ≡ 2l, 2l+1 mod 32) and folds it with the same
// fixed tree as the f32 path: still batch- and thread-invariant.
// GCC 12's AVX-512 headers warn about their own deliberately undefined lanes.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <cpuid.h>
#include <immintrin.h>

#include <array>

#include "backend/cpu/avx512_reduce.h"
#include "backend/cpu/cpu_kernels.h"

namespace specdec::cpu {
namespace {

constexpr int kMaxMr = 4;
constexpr int kMaxNr = 4;  // the widest tile linear_bf16 takes
// The most x rows that take the one-row walk where the CPU needs no software prefetch: a verify
// window of eight drafts and its pending token. Beyond, the 4 × 4 tiles' single pass over each
// weight row wins.
constexpr int kOneRowMaxM = 9;

inline __m512bh as_bh(__m512i v) { return reinterpret_cast<__m512bh&>(v); }

template <int MR, int NR>
void tile(const LinearArgs& a, int64_t m0, int64_t n0, int64_t ahead) {
  const int64_t K = a.K;
  const uint16_t* w = static_cast<const uint16_t*>(a.w);
  const uint16_t* wrow[NR];
  for (int j = 0; j < NR; ++j) wrow[j] = w + (n0 + j) * K;
  const uint16_t* xrow[MR];
  for (int i = 0; i < MR; ++i) xrow[i] = a.x_bf16 + (m0 + i) * K;
  __m512 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    __m512bh xv[MR];
    for (int i = 0; i < MR; ++i) xv[i] = as_bh(_mm512_loadu_si512(xrow[i] + k));
    if (ahead) {
      for (int j = 0; j < NR; ++j) _mm_prefetch(reinterpret_cast<const char*>(wrow[j] + k) + ahead, _MM_HINT_T0);
    }
    for (int j = 0; j < NR; ++j) {
      const __m512bh wv = as_bh(_mm512_loadu_si512(wrow[j] + k));
      for (int i = 0; i < MR; ++i) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv[i], wv);
    }
  }
  if (k < K) {
    const __mmask32 m = static_cast<__mmask32>((1ull << (K - k)) - 1ull);
    __m512bh xv[MR];
    for (int i = 0; i < MR; ++i) xv[i] = as_bh(_mm512_maskz_loadu_epi16(m, xrow[i] + k));
    for (int j = 0; j < NR; ++j) {
      const __m512bh wv = as_bh(_mm512_maskz_loadu_epi16(m, wrow[j] + k));
      for (int i = 0; i < MR; ++i) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv[i], wv);
    }
  }
  store_tile_sums(acc, a.out + m0 * a.N + n0, a.N, a.bias, n0);
}

// The same products over the packed layout (kPackRows): the first NR rows of the group that
// starts at row n0, whose chunk k of each row lies kPackK elements after the row before it.
template <int MR, int NR>
void tile_packed(const LinearArgs& a, int64_t m0, int64_t n0) {
  const int64_t K = a.K;
  const uint16_t* group = a.w_packed + n0 * K;
  const uint16_t* xrow[MR];
  for (int i = 0; i < MR; ++i) xrow[i] = a.x_bf16 + (m0 + i) * K;
  __m512 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += kPackK) {
    __m512bh xv[MR];
    for (int i = 0; i < MR; ++i) xv[i] = as_bh(_mm512_loadu_si512(xrow[i] + k));
    const uint16_t* chunk = group + k * kPackRows;
    for (int j = 0; j < NR; ++j) {
      const __m512bh wv = as_bh(_mm512_load_si512(chunk + j * kPackK));
      for (int i = 0; i < MR; ++i) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv[i], wv);
    }
  }
  store_tile_sums(acc, a.out + m0 * a.N + n0, a.N, a.bias, n0);
}

using TileFn = void (*)(const LinearArgs&, int64_t, int64_t, int64_t);
using TileTable = std::array<std::array<TileFn, kMaxNr>, kMaxMr>;

template <int MR, int... NR>
constexpr std::array<TileFn, kMaxNr> tile_row(std::integer_sequence<int, NR...>) {
  return {&tile<MR, NR + 1>...};
}
template <int... MR>
constexpr TileTable tile_table(std::integer_sequence<int, MR...>) {
  return {tile_row<MR + 1>(std::make_integer_sequence<int, kMaxNr>())...};
}
constexpr TileTable kTiles = tile_table(std::make_integer_sequence<int, kMaxMr>());

using PackedTileFn = void (*)(const LinearArgs&, int64_t, int64_t);
using PackedTileTable = std::array<std::array<PackedTileFn, kPackRows>, kMaxMr>;
template <int MR, int... NR>
constexpr std::array<PackedTileFn, kPackRows> packed_tile_row(std::integer_sequence<int, NR...>) {
  return {&tile_packed<MR, NR + 1>...};
}
template <int... MR>
constexpr PackedTileTable packed_tile_table(std::integer_sequence<int, MR...>) {
  return {packed_tile_row<MR + 1>(std::make_integer_sequence<int, kPackRows>())...};
}
constexpr PackedTileTable kPackedTiles = packed_tile_table(std::make_integer_sequence<int, kMaxMr>());

// Packed weights: a group's rows at once against up to four x rows, one sequential stream of
// weights whatever M (a group of 4 × K, 8 KB at K = 1,024, stays in L1 for the later passes over
// x rows). n_begin is a multiple of kPackRows: the callers split N in multiples of 16.
void linear_packed(const LinearArgs& a, int64_t n_begin, int64_t n_end) {
  for (int64_t n0 = n_begin; n0 < n_end; n0 += kPackRows) {
    const int64_t nr = n_end - n0 < kPackRows ? n_end - n0 : kPackRows;
    for (int64_t m0 = 0; m0 < a.M; m0 += kMaxMr) {
      const int64_t mr = a.M - m0 < kMaxMr ? a.M - m0 : kMaxMr;
      kPackedTiles[static_cast<size_t>(mr - 1)][static_cast<size_t>(nr - 1)](a, m0, n0);
    }
  }
}

// How many weight rows ahead a one-row-at-a-time walk prefetches. Intel's cores, for which the walk
// was first written, stall on each next row's first lines without it; AMD's hardware prefetchers
// already follow a row read front to back, and there the prefetch instructions only take load
// slots from the stream.
int64_t prefetch_rows() {
  static const int64_t rows = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool amd = __get_cpuid(0, &eax, &ebx, &ecx, &edx) && ebx == 0x68747541 && edx == 0x69746e65 &&
                     ecx == 0x444d4163;  // "AuthenticAMD"
    return amd ? int64_t{0} : int64_t{16};
  }();
  return rows;
}

void linear_bf16(const LinearArgs& a, int64_t n_begin, int64_t n_end) {
  if (a.wdtype != DType::bf16 || a.x_bf16 == nullptr) {
    avx512_kernels().linear(a, n_begin, n_end);
    return;
  }
  if (a.w_packed && n_begin % kPackRows == 0) {
    linear_packed(a, n_begin, n_end);
    return;
  }
  // Up to four x rows: one weight row at a time, the rows' K read front to back, prefetched
  // prefetch_rows() rows ahead. Weight rows walked side by side (a full cache line of each per
  // step) stall on their loads, where the f32 kernels' half-line steps do not; one row at a time
  // streams them as fast as those. More rows: 4 × 4 tiles, where the products, not the loads,
  // bound it; except on cores whose hardware prefetchers follow the one-row walk (no software
  // prefetch), where side-by-side rows stall on their loads up to kOneRowMaxM x rows as well, and
  // each weight row is walked once per four x rows instead (the later passes read it from L1).
  // Each output keeps its one accumulator either way, so the bits do not change with the tile.
  const bool one_row = a.M <= (prefetch_rows() ? kMaxMr : kOneRowMaxM);
  const int64_t nr_main = one_row ? 1 : kMaxNr;
  const int64_t rows_ahead = one_row ? prefetch_rows() : nr_main;
  for (int64_t n0 = n_begin; n0 < n_end; n0 += nr_main) {
    const int64_t nr = n_end - n0 < nr_main ? n_end - n0 : nr_main;
    for (int64_t m0 = 0; m0 < a.M; m0 += kMaxMr) {
      const int64_t mr = a.M - m0 < kMaxMr ? a.M - m0 : kMaxMr;
      const int64_t ahead = m0 == 0 ? rows_ahead * a.K * 2 : 0;
      kTiles[static_cast<size_t>(mr - 1)][static_cast<size_t>(nr - 1)](a, m0, n0, ahead);
    }
  }
}

}  // namespace

const Kernels& avx512_bf16_kernels() {
  static const Kernels k = [] {
    Kernels t{"avx512-bf16", linear_bf16, attend_avx512, silu_mul_avx512, sum_exp_avx512, true};
    t.packed_weights = true;
    return t;
  }();
  return k;
}

}  // namespace specdec::cpu
