// The opt-in "amx" kernels: linear over bf16 weights with AMX tiles (TDPBF16PS, a 16 × 16 × 32
// bf16 product per instruction), activations rounded to bf16 as in "avx512-bf16". The weights stay
// [N, K] row-major: an A tile is 16 weight rows × 32 k loaded straight from w, a B tile 32 k of 16
// tokens in pair layout (x packed once per call by pack_tiles), so a C tile is outᵀ, 16 weight rows
// × 16 tokens, scattered back into out. A window of up to 16 tokens reads the weights once, as
// one token does, which is what makes a verify window cost about one decode step.
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

#include "backend/cpu/cpu_kernels.h"

namespace specdec::cpu {
namespace {

constexpr int64_t kBlockRows = 16;               // weight rows of an A or C tile, tokens of a B tile
constexpr int64_t kChunkElements = 16 * kTileK;  // bf16 of one B tile: 16 pairs × 16 tokens × 2
constexpr int kMaxBlocks = 4;                    // C tiles sharing one B tile

// GCC's tile intrinsics are asm statements that name only registers (and, for ldtilecfg, the
// first bytes of the configuration) as inputs: memory written just before one of them must be
// made visible to the compiler first.
inline void memory_barrier() { asm volatile("" ::: "memory"); }

// Palette 1, 64-byte layout (Intel SDM, LDTILECFG).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Every tile is 16 rows × 64 bytes: C (tmm0-3) 16 weight rows × 16 tokens of f32, A (tmm4, tmm5,
// tmm7) 16 weight rows × 32 bf16, B (tmm6) 16 k pairs × 16 tokens. The configuration is state of
// the thread, loaded at its first call and kept (nothing else in the process configures tiles).
void configure_tiles() {
  static thread_local bool configured = false;
  if (configured) return;
  TileConfig cfg;
  for (int i = 0; i < 8; ++i) {
    cfg.colsb[i] = 64;
    cfg.rows[i] = 16;
  }
  memory_barrier();
  _tile_loadconfig(&cfg);
  configured = true;
}

// pack_tiles: chunk c of token block b, dst[r][t] = the bf16 pair (2r, 2r + 1) of the chunk of
// token t (32-bit words), tokens past M zero.
void pack_tiles_amx(const uint16_t* x, int64_t M, int64_t K, uint16_t* tiles) {
  const int64_t chunks = K / kTileK;
  for (int64_t m0 = 0; m0 < M; m0 += kBlockRows) {
    const int64_t tokens = M - m0 < kBlockRows ? M - m0 : kBlockRows;
    uint16_t* block = tiles + m0 / kBlockRows * chunks * kChunkElements;
    if (tokens < kBlockRows) std::memset(block, 0, static_cast<size_t>(chunks * kChunkElements) * sizeof(uint16_t));
    // One token's chunk is 16 words; the scatter writes them down column t of the chunk's tile.
    const __m512i column = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                              _mm512_set1_epi32(16));
    for (int64_t t = 0; t < tokens; ++t) {
      const uint16_t* row = x + (m0 + t) * K;
      for (int64_t c = 0; c < chunks; ++c) {
        const __m512i pairs = _mm512_loadu_si512(row + c * kTileK);
        _mm512_i32scatter_epi32(block + c * kChunkElements + 2 * t, column, pairs, 4);
      }
    }
  }
}

// C tiles 0 .. NB-1 = out[m0 .. m0+16) × w rows [n0 + 16j, n0 + 16j + 16), from zero over every k
// chunk in order; stored to c[j] as [16 rows][16 tokens] f32. Rows n0 .. n0 + 16 NB must exist in w.
template <int NB>
void full_blocks(const LinearArgs& a, int64_t n0, const uint16_t* b_tiles, float (*c)[256]) {
  static_assert(NB >= 1 && NB <= kMaxBlocks);
  const int64_t K = a.K, stride = K * static_cast<int64_t>(sizeof(uint16_t)), chunks = K / kTileK;
  const uint16_t* w = static_cast<const uint16_t*>(a.w) + n0 * K;
  _tile_zero(0);
  if constexpr (NB > 1) _tile_zero(1);
  if constexpr (NB > 2) _tile_zero(2);
  if constexpr (NB > 3) _tile_zero(3);
  for (int64_t ch = 0; ch < chunks; ++ch) {
    const uint16_t* wk = w + ch * kTileK;
    _tile_loadd(6, b_tiles + ch * kChunkElements, 64);
    _tile_loadd(4, wk, stride);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NB > 1) {
      _tile_loadd(5, wk + kBlockRows * K, stride);
      _tile_dpbf16ps(1, 5, 6);
    }
    if constexpr (NB > 2) {
      _tile_loadd(7, wk + 2 * kBlockRows * K, stride);
      _tile_dpbf16ps(2, 7, 6);
    }
    if constexpr (NB > 3) {
      _tile_loadd(4, wk + 3 * kBlockRows * K, stride);
      _tile_dpbf16ps(3, 4, 6);
    }
  }
  _tile_stored(0, c[0], 64);
  if constexpr (NB > 1) _tile_stored(1, c[1], 64);
  if constexpr (NB > 2) _tile_stored(2, c[2], 64);
  if constexpr (NB > 3) _tile_stored(3, c[3], 64);
}

// The last rows of w, n0 .. N-1 (fewer than 16): each chunk's rows are copied to a zero-padded
// A tile first, so nothing past w is read. The same steps as full_blocks for those rows.
void tail_block(const LinearArgs& a, int64_t n0, const uint16_t* b_tiles, float* c) {
  const int64_t K = a.K, chunks = K / kTileK, rows = a.N - n0;
  const uint16_t* w = static_cast<const uint16_t*>(a.w) + n0 * K;
  alignas(64) uint16_t tile[kBlockRows * kTileK] = {};
  _tile_zero(0);
  for (int64_t ch = 0; ch < chunks; ++ch) {
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(tile + r * kTileK, w + r * K + ch * kTileK, kTileK * sizeof(uint16_t));
    }
    memory_barrier();
    _tile_loadd(6, b_tiles + ch * kChunkElements, 64);
    _tile_loadd(4, tile, 64);
    _tile_dpbf16ps(0, 4, 6);
  }
  _tile_stored(0, c, 64);
}

// out[m0 + t][n0 + r] = c[r][t] (+ bias[n0 + r]) for t < tokens, r < rows.
void scatter(const LinearArgs& a, const float* c, int64_t m0, int64_t tokens, int64_t n0, int64_t rows) {
  const __mmask16 mask = static_cast<__mmask16>((1u << rows) - 1u);
  const __m512i row_starts =
      _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32(16));
  const __m512 bias = a.bias ? _mm512_maskz_loadu_ps(mask, a.bias + n0) : _mm512_setzero_ps();
  for (int64_t t = 0; t < tokens; ++t) {
    __m512 v = _mm512_i32gather_ps(_mm512_add_epi32(row_starts, _mm512_set1_epi32(static_cast<int>(t))), c, 4);
    if (a.bias) v = _mm512_add_ps(v, bias);
    _mm512_mask_storeu_ps(a.out + (m0 + t) * a.N + n0, mask, v);
  }
}

void linear_amx(const LinearArgs& a, int64_t n_begin, int64_t n_end) {
  if (a.wdtype != DType::bf16 || a.x_tiles == nullptr || a.K % kTileK != 0) {
    avx512_bf16_kernels().linear(a, n_begin, n_end);
    return;
  }
  configure_tiles();
  const int64_t chunks = a.K / kTileK;
  alignas(64) float c[kMaxBlocks][256];
  for (int64_t n0 = n_begin; n0 < n_end;) {
    // Up to four whole 16-row blocks of w from n0 (rows past n_end are computed and dropped), or
    // the short last block of w alone.
    int nb = 0;
    while (nb < kMaxBlocks && n0 + kBlockRows * nb < n_end && n0 + kBlockRows * (nb + 1) <= a.N) ++nb;
    for (int64_t m0 = 0; m0 < a.M; m0 += kBlockRows) {
      const uint16_t* b_tiles = a.x_tiles + m0 / kBlockRows * chunks * kChunkElements;
      switch (nb) {
        case 0:
          tail_block(a, n0, b_tiles, c[0]);
          break;
        case 1:
          full_blocks<1>(a, n0, b_tiles, c);
          break;
        case 2:
          full_blocks<2>(a, n0, b_tiles, c);
          break;
        case 3:
          full_blocks<3>(a, n0, b_tiles, c);
          break;
        default:
          full_blocks<4>(a, n0, b_tiles, c);
          break;
      }
      const int64_t tokens = a.M - m0 < kBlockRows ? a.M - m0 : kBlockRows;
      for (int j = 0; j < (nb == 0 ? 1 : nb); ++j) {
        const int64_t nj = n0 + kBlockRows * j;
        scatter(a, c[j], m0, tokens, nj, n_end - nj < kBlockRows ? n_end - nj : kBlockRows);
      }
    }
    n0 += kBlockRows * (nb == 0 ? 1 : nb);
  }
}

}  // namespace

const Kernels& amx_kernels() {
  static const Kernels k{"amx", linear_amx, attend_avx512, silu_mul_avx512, true, pack_tiles_amx};
  return k;
}

}  // namespace specdec::cpu
