// The "amx" kernels (the default where the CPU has AMX): linear over bf16 weights with AMX tiles (TDPBF16PS, a 16 × 16
// × 32 bf16 product per instruction), activations rounded to bf16 as in "avx512-bf16". The weights stay [N, K]
// row-major: an A tile is 16 weight rows × 32 k loaded straight from w, a B tile 32 k of up to 16 tokens in pair layout
// (x rounded and packed once per call by pack_bf16), so a C tile is outᵀ, 16 weight rows × 16 tokens, scattered back
// into out. A window of up to 16 tokens reads the weights once, as one token does, which is what makes a verify window
// cost about one decode step.
//
// Invariance: each C element is its own chain of TDPBF16PS steps over the k chunks in order, from
// zero, fed only by its A row (w[n]) and its B column (x[m]); M, the place in a tile and the N split
// change neither the chunks nor their order, and padded rows and tokens feed only dropped elements.
// Shapes the tiles do not take (K % 32 != 0, weights not bf16) run the avx512-bf16 linear for the
// whole call: a choice made by shape and dtype, never by M.
// GCC 12's AVX-512 headers warn about their own deliberately undefined lanes.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/amx_util.h"
#include "backend/cpu/cpu_kernels.h"

namespace specdec::cpu {
namespace {

// Palette 1, 64-byte layout (Intel SDM, LDTILECFG).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

}  // namespace

// Every tile is 16 rows × 64 bytes: here C (tmm0-2) 16 weight rows × 16 tokens of f32, A (tmm3)
// 16 weight rows × 32 bf16, B (tmm4-6) 16 k pairs × 16 tokens; attention_amx.cpp takes the same
// shape. The configuration is state of the thread: loaded at its first call and kept (nothing else
// in the process configures tiles; loading and releasing it at every call, ~60 ns, cost 5% of a
// decode step's MLP, whose fused calls run the kernel on 64 columns at a time).
void configure_tiles() {
  static thread_local bool configured = false;
  if (configured) return;
  configured = true;
  TileConfig cfg;
  for (int i = 0; i < 8; ++i) {
    cfg.colsb[i] = 64;
    cfg.rows[i] = 16;
  }
  memory_barrier();
  _tile_loadconfig(&cfg);
}

namespace {

constexpr int64_t kBlockRows = 16;  // weight rows of an A or C tile, tokens of a B tile

// f32_to_bf16 on 16 lanes, bit for bit: round to nearest even, a NaN kept and made quiet.
inline __m256i to_bf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v), high = _mm512_srli_epi32(u, 16);
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  const __m512i lsb = _mm512_and_si512(high, _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  r = _mm512_mask_or_epi32(r, nan, high, _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(r);
}

// pack_bf16: the rows first, then each chunk of each token block as the transpose of its T tokens'
// 16 pair words: row r of the chunk = pair r of every token.
void pack_bf16_amx(const float* x, int64_t M, int64_t K, uint16_t* x_bf16, uint16_t* tiles) {
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t k = 0; k < K; k += 16) {
      const __mmask16 mask =
          K - k >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (K - k)) - 1u);
      _mm256_mask_storeu_epi16(x_bf16 + m * K + k, mask, to_bf16(_mm512_maskz_loadu_ps(mask, x + m * K + k)));
    }
  }
  if (tiles == nullptr) return;
  const int64_t chunks = K / kTileK;
  // The slack that the last tile loads read past the layout: zeros rather than stale bytes.
  std::memset(tiles + M * K, 0, static_cast<size_t>(tile_activation_elements(M, K) - M * K) * sizeof(uint16_t));
  for (int64_t m0 = 0; m0 < M; m0 += kBlockRows) {
    const int64_t T = M - m0 < kBlockRows ? M - m0 : kBlockRows;
    const uint16_t* rows = x_bf16 + m0 * K;
    uint16_t* block = tiles + m0 * K;
    if (T == 1) {  // a decode step: the tile layout of one token is its row
      std::memcpy(block, rows, static_cast<size_t>(K) * sizeof(uint16_t));
    } else if (T <= 4) {  // a few tokens: each one's 16 words scattered down its column
      const __m512i column = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                                _mm512_set1_epi32(static_cast<int>(T)));
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t c = 0; c < chunks; ++c) {
          _mm512_i32scatter_epi32(block + c * T * kTileK + 2 * t, column, _mm512_loadu_si512(rows + t * K + c * kTileK),
                                  4);
        }
      }
    } else {
      const __mmask16 mask = static_cast<__mmask16>((1u << T) - 1u);
      for (int64_t c = 0; c < chunks; ++c) {
        __m512i r[16];
        for (int64_t t = 0; t < 16; ++t) {
          r[t] = t < T ? _mm512_loadu_si512(rows + t * K + c * kTileK) : _mm512_setzero_si512();
        }
        transpose16(r);
        for (int64_t j = 0; j < 16; ++j) _mm512_mask_storeu_epi32(block + c * T * kTileK + j * 2 * T, mask, r[j]);
      }
    }
  }
}

// Where the B tiles of one token block of x_tiles are: chunk ch at base + ch * step, rows `stride`
// bytes apart. A block of T < 16 tokens is loaded as 16 columns too: the columns past T read the
// next words of the layout, which feed only C columns that are dropped.
struct TokenBlock {
  const uint16_t* base;
  int64_t step;    // elements from one chunk to the next: T * kTileK
  int64_t stride;  // bytes between B rows: 4 T
};

TokenBlock token_block(const LinearArgs& a, int64_t m0) {
  const int64_t T = a.M - m0 < kBlockRows ? a.M - m0 : kBlockRows;
  return {a.x_tiles + m0 * a.K, T * kTileK, T * 4};
}

// Chunks ahead that the staged copy prefetches: far enough to cover a memory latency behind the
// copy of one chunk, near enough to stay in L1 (docs/perf-notes.md has the sweep).
constexpr int64_t kStagePrefetch = 4;

// Chunk ch of the TB token blocks times the A tile at a_tile, into C tiles tmm0 + t.
template <int TB>
inline void step(const TokenBlock* tb, int64_t ch, const uint16_t* a_tile, int64_t a_stride) {
  _tile_loadd(4, tb[0].base + ch * tb[0].step, tb[0].stride);
  if constexpr (TB > 1) _tile_loadd(5, tb[1].base + ch * tb[1].step, tb[1].stride);
  if constexpr (TB > 2) _tile_loadd(6, tb[2].base + ch * tb[2].step, tb[2].stride);
  _tile_loadd(3, a_tile, a_stride);
  _tile_dpbf16ps(0, 3, 4);
  if constexpr (TB > 1) _tile_dpbf16ps(1, 3, 5);
  if constexpr (TB > 2) _tile_dpbf16ps(2, 3, 6);
}

// One 16-row block of w from n0 (A tile tmm3) times TB token blocks (B tiles tmm4 + t): C tile t
// (tmm0 + t) = w rows [n0, n0 + 16) × the tokens of block t, from zero over every k chunk in
// order, stored to c[t] as [16 rows][16 tokens] f32. One block of w at a time keeps few enough
// rows (16 sequential streams) in flight for the hardware prefetchers to follow them; up to
// three token blocks share each A load.
// Staged: each chunk's rows go through an aligned copy first, for weights that do not start on a
// 64-byte boundary (a tile row split over two cache lines is read as two; safetensors files place
// tensors on 8-byte boundaries, and the model copies such weights where the backend asks for
// alignment) and for the last rows of w,
// n0 .. N-1 (fewer than 16: the copy is zero-padded so that nothing past w is read). Either way
// the same values reach the same TDPBF16PS steps in order.
template <int TB, bool Staged>
void block(const LinearArgs& a, int64_t n0, const TokenBlock* tb, float (*c)[256]) {
  static_assert(TB >= 1 && TB <= 3);
  const int64_t K = a.K, stride = K * static_cast<int64_t>(sizeof(uint16_t)), chunks = K / kTileK;
  const uint16_t* w = static_cast<const uint16_t*>(a.w) + n0 * K;
  _tile_zero(0);
  if constexpr (TB > 1) _tile_zero(1);
  if constexpr (TB > 2) _tile_zero(2);
  if constexpr (Staged) {
    // Chunk ch + 1 is copied while chunk ch is in the tiles: the copy's loads run ahead, and
    // the tile load does not wait for stores just issued.
    const int64_t rows = a.N - n0 < kBlockRows ? a.N - n0 : kBlockRows;
    alignas(64) uint16_t staged[2][kBlockRows * kTileK];
    for (int64_t r = rows; r < kBlockRows; ++r) {
      _mm512_store_si512(staged[0] + r * kTileK, _mm512_setzero_si512());
      _mm512_store_si512(staged[1] + r * kTileK, _mm512_setzero_si512());
    }
    const auto copy = [&](int64_t ch) {
      for (int64_t r = 0; r < rows; ++r) {
        _mm512_store_si512(staged[ch & 1] + r * kTileK, _mm512_loadu_si512(w + r * K + ch * kTileK));
        _mm_prefetch(reinterpret_cast<const char*>(w + r * K + (ch + kStagePrefetch) * kTileK), _MM_HINT_T0);
      }
    };
    copy(0);
    for (int64_t ch = 0; ch < chunks; ++ch) {
      if (ch + 1 < chunks) copy(ch + 1);
      memory_barrier();
      step<TB>(tb, ch, staged[ch & 1], 64);
    }
  } else {
    for (int64_t ch = 0; ch < chunks; ++ch) step<TB>(tb, ch, w + ch * kTileK, stride);
  }
  _tile_stored(0, c[0], 64);
  if constexpr (TB > 1) _tile_stored(1, c[1], 64);
  if constexpr (TB > 2) _tile_stored(2, c[2], 64);
}

// out[m0 + t][n0 + r] = c[r][t] (+ bias[n0 + r]) for t < tokens, r < rows: a gather per token
// for a few tokens, a transpose of the tile for more.
void scatter(const LinearArgs& a, const float* c, int64_t m0, int64_t tokens, int64_t n0, int64_t rows) {
  const __mmask16 mask = static_cast<__mmask16>((1u << rows) - 1u);
  const __m512 bias = a.bias ? _mm512_maskz_loadu_ps(mask, a.bias + n0) : _mm512_setzero_ps();
  const auto store = [&](int64_t t, __m512 v) {
    if (a.bias) v = _mm512_add_ps(v, bias);
    _mm512_mask_storeu_ps(a.out + (m0 + t) * a.N + n0, mask, v);
  };
  if (tokens <= 4) {
    const __m512i row_starts = _mm512_mullo_epi32(
        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32(16));
    for (int64_t t = 0; t < tokens; ++t) {
      store(t, _mm512_i32gather_ps(_mm512_add_epi32(row_starts, _mm512_set1_epi32(static_cast<int>(t))), c, 4));
    }
    return;
  }
  __m512i r[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_load_si512(c + i * 16);
  transpose16(r);
  for (int64_t t = 0; t < tokens; ++t) store(t, _mm512_castsi512_ps(r[t]));
}

// block<TB, Staged> by [TB - 1][Staged].
using BlockFn = void (*)(const LinearArgs&, int64_t, const TokenBlock*, float (*)[256]);
constexpr BlockFn kBlocks[3][2] = {
    {block<1, false>, block<1, true>}, {block<2, false>, block<2, true>}, {block<3, false>, block<3, true>}};

void linear_amx(const LinearArgs& a, int64_t n_begin, int64_t n_end) {
  if (a.wdtype != DType::bf16 || a.x_tiles == nullptr || a.K % kTileK != 0) {
    avx512_bf16_kernels().linear(a, n_begin, n_end);
    return;
  }
  configure_tiles();
  const bool aligned = (reinterpret_cast<uintptr_t>(a.w) & 63) == 0;  // then so is every chunk of w
  alignas(64) float c[3][256];
  for (int64_t n0 = n_begin; n0 < n_end; n0 += kBlockRows) {
    // Rows past n_end are computed and dropped; rows past N are not read.
    const bool direct = aligned && n0 + kBlockRows <= a.N;
    const int64_t rows = n_end - n0 < kBlockRows ? n_end - n0 : kBlockRows;
    for (int64_t m0 = 0; m0 < a.M;) {
      const int64_t left = (a.M - m0 + kBlockRows - 1) / kBlockRows;  // token blocks from m0
      const int tb = left >= 3 ? 3 : static_cast<int>(left);
      TokenBlock b_tiles[3];
      for (int t = 0; t < tb; ++t) b_tiles[t] = token_block(a, m0 + kBlockRows * t);
      kBlocks[tb - 1][direct ? 0 : 1](a, n0, b_tiles, c);
      for (int t = 0; t < tb; ++t) {
        const int64_t mt = m0 + kBlockRows * t, tokens = a.M - mt < kBlockRows ? a.M - mt : kBlockRows;
        scatter(a, c[t], mt, tokens, n0, rows);
      }
      m0 += kBlockRows * tb;
    }
  }
}

}  // namespace

const Kernels& amx_kernels() {
  // A tile row of a weight that straddles two cache lines goes through the staged copy (block):
  // weights on 64-byte boundaries stream without it.
  static const Kernels k{"amx",         linear_amx, attend_avx512,   silu_mul_avx512,        sum_exp_avx512, true,
                         pack_bf16_amx, 64,         attend_rows_amx, attend_rows_amx_scratch};
  return k;
}

}  // namespace specdec::cpu
