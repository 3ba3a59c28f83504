// AMX attention over a bf16 KV cache, all of one row's tokens against one kv head per call. A
// verify window of 16 tokens over 512 positions is ~17 MFLOP a layer of scores and weighted
// values, which the f32 kernels run at the FMA units' peak; TDPBF16PS takes 16 × 16 × 32 products
// an instruction, and the bf16 cache halves what a decode step reads.
// Per call, the query columns (token × head of the group, token-major) go 16 at a time:
// - their q rounded to bf16; scores = q · k over the head's dimensions in 32-wide chunks, 16
//   positions a tile. A few columns (a decode step's heads) take the keys as A tiles, loaded
//   straight from the cache's rows where a block holds whole tiles (else copied), and the queries
//   as B; more take the queries as A and the keys as B, transposed once per call into pair layout
//   (dimensions 2w, 2w + 1 of 16 positions a row);
// - each column's softmax over its own positions 0 .. p (max, e^x, the sum in lanes j mod 16 and
//   the fixed tree, as the f32 kernels do), its weights rounded to bf16, zero past p;
// - weighted values over 32-position chunks, the values interleaved by position pairs (B's pair
//   layout, zeros past the row's last position), normalized at the end.
// Invariance: a C element is its own chain of TDPBF16PS steps fed only by its A row and B column,
// over chunks in a fixed order from position 0, and its products (bf16 × bf16, exact in f32) are
// the same whichever operand is A; the chunks past a column's position that other columns need
// add exact zeros (weights 0 against finite values). So a token's output is the same alone, in a
// window, in any split of the row's tokens, or beside any other columns.
// GCC 12's AVX-512 headers warn about their own deliberately undefined lanes.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "backend/cpu/amx_util.h"
#include "backend/cpu/avx512_exp.h"
#include "backend/cpu/avx512_reduce.h"
#include "backend/cpu/cpu_kernels.h"

namespace specdec::cpu {
namespace {

constexpr int64_t kColumns = 16;    // query columns of a tile
constexpr int64_t kFewColumns = 8;  // calls of at most this many columns take the keys as A

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

inline __mmask16 lanes(int64_t count) {
  if (count >= 16) return static_cast<__mmask16>(0xffff);
  return count <= 0 ? static_cast<__mmask16>(0) : static_cast<__mmask16>((1u << count) - 1u);
}
inline __mmask32 lanes32(int64_t count) {
  if (count >= 32) return ~static_cast<__mmask32>(0);
  return count <= 0 ? static_cast<__mmask32>(0) : static_cast<__mmask32>((1u << count) - 1u);
}

// Where each part of the scratch lies, in bytes from its start (each a multiple of 64).
struct Layout {
  int64_t n_pad;  // positions, to a multiple of 32 (a weighted-values chunk)
  int64_t dk;     // head dimensions, to a multiple of 32 (a scores chunk)
  int64_t dv;     // head dimensions, to a multiple of 16 (a weighted-values C tile)
  int64_t keys, values, queries, scores, weights, outputs, tile, total;
};

Layout layout(int64_t n, int64_t d) {
  Layout l{};
  l.n_pad = round_up(n < 1 ? 1 : n, 32);
  l.dk = round_up(d, 32);
  l.dv = round_up(d, 16);
  l.keys = 0;
  l.values = l.keys + (l.n_pad / 16) * (l.dk / 32) * 1024;     // a 1 KB tile per 16 positions × 32 dims
  l.queries = l.values + (l.n_pad / 32) * (l.dv / 16) * 1024;  // a 1 KB tile per 32 positions × 16 dims
  l.scores = l.queries + kColumns * l.dk * 2;
  l.weights = l.scores + kColumns * l.n_pad * 4;
  l.outputs = l.weights + kColumns * l.n_pad * 2;
  l.tile = l.outputs + kColumns * l.dv * 4;
  l.total = l.tile + 2 * 16 * 16 * 4;
  return l;
}

// The slots of positions 0, 1, 2, ... of one of the row's pools (k or v, offset to the kv head),
// walked in order: a block id looked up once per block rather than a division per position.
class Slots {
 public:
  Slots(const AttendRowArgs& a, const uint16_t* pool) : a_(a), pool_(pool) {}
  const uint16_t* next() {
    if (offset_ == 0) base_ = pool_ + static_cast<int64_t>(a_.blocks[block_++]) * a_.block_size * a_.stride;
    const uint16_t* p = base_ + offset_ * a_.stride;
    if (++offset_ == a_.block_size) offset_ = 0;
    return p;
  }

 private:
  const AttendRowArgs& a_;
  const uint16_t* pool_;
  const uint16_t* base_ = nullptr;
  int64_t block_ = 0, offset_ = 0;
};

// Keys p0 .. p0 + 15 (the next 16 of `slots`; zeros from n on), one 1 KB tile per 32 dimensions
// at out: as B (`transposed`), row w holds pair w (dimensions 2w, 2w + 1) of each of the 16
// positions; as A, row i is position p0 + i's 32 dimensions.
void key_tiles(const AttendRowArgs& a, Slots& slots, int64_t p0, int64_t n, int64_t chunks, bool transposed,
               uint32_t* out) {
  const uint16_t* rows[16];
  for (int64_t i = 0; i < 16; ++i) rows[i] = p0 + i < n ? slots.next() : nullptr;
  for (int64_t c = 0; c < chunks; ++c) {
    const __mmask32 m = lanes32(a.d - 32 * c);
    __m512i r[16];
    for (int64_t i = 0; i < 16; ++i)
      r[i] = rows[i] ? _mm512_maskz_loadu_epi16(m, rows[i] + 32 * c) : _mm512_setzero_si512();
    if (transposed) transpose16(r);
    for (int64_t w = 0; w < 16; ++w) _mm512_store_si512(out + c * 256 + 16 * w, r[w]);
  }
}

// Values p0 .. p0 + 31 (the next 32 of `slots`; zeros from n on) as B tiles, one per 16
// dimensions from block b0 (nb of them) at out: row r holds dimension e of positions p0 + 2r and
// p0 + 2r + 1 at pair e.
void value_tiles(const AttendRowArgs& a, Slots& slots, int64_t p0, int64_t n, int64_t b0, int64_t nb, uint32_t* out) {
  // Word e of [x0 (16 words) | x1 (16 words)] -> x0[e], x1[e] side by side.
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                                              6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  for (int64_t r = 0; r < 16; ++r) {
    const int64_t j = p0 + 2 * r;
    const uint16_t* v0 = j < n ? slots.next() : nullptr;
    const uint16_t* v1 = j + 1 < n ? slots.next() : nullptr;
    for (int64_t b = b0; b < b0 + nb; ++b) {
      const __mmask16 m = lanes(a.d - 16 * b);
      const __m256i x0 = v0 ? _mm256_maskz_loadu_epi16(m, v0 + 16 * b) : _mm256_setzero_si256();
      const __m256i x1 = v1 ? _mm256_maskz_loadu_epi16(m, v1 + 16 * b) : _mm256_setzero_si256();
      const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(x0), x1, 1);
      _mm512_store_si512(out + (b - b0) * 256 + 16 * r, _mm512_permutexvar_epi16(interleave, both));
    }
  }
}

// 32 floats from x (count of them real, zeros after) rounded to bf16, in order.
inline __m512i bf16x32(const float* x, int64_t count) {
  return reinterpret_cast<__m512i>(
      _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(lanes(count - 16), x + 16), _mm512_maskz_loadu_ps(lanes(count), x)));
}

// One column's softmax over its scores s[0, len) (times scale, as the f32 kernels scale a dot):
// the weights e^(x - max) rounded to bf16 into w[0, len), zeros on to w[pad); returns 1 / their
// f32 sum (lanes j mod 16, then the fixed tree).
float softmax_column(const float* s, int64_t len, float scale, uint16_t* w, int64_t pad) {
  const __m512 sc = _mm512_set1_ps(scale);
  __m512 mx = _mm512_set1_ps(-__builtin_inff());
  for (int64_t j = 0; j < len; j += 16) {
    const __mmask16 m = lanes(len - j);
    mx = _mm512_mask_max_ps(mx, m, mx, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, s + j), sc));
  }
  const __m512 mxv = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < pad; j += 16) {
    const __mmask16 m = lanes(len - j);
    const __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, s + j), sc);
    const __m512 e = _mm512_maskz_mov_ps(m, exp_nonpositive(_mm512_sub_ps(x, mxv)));
    sum = _mm512_add_ps(sum, e);
    _mm256_store_si256(reinterpret_cast<__m256i*>(w + j), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(e)));
  }
  return _mm_cvtss_f32(_mm_div_ss(_mm_set_ss(1.0f), _mm_set_ss(hsum(sum))));
}

// The tile intrinsics name their tiles by literal number (they paste it into the instruction),
// so the alternating forms below are spelled out by macro.
//
// One block's scores [16 positions][16 columns] into `out` for one to four 32-dimension chunks,
// the queries held in tiles 4-7: keys (rows `stride` bytes apart) through A tiles 1 and 2 in turn,
// C in tile C. Callers alternate C between tiles 0 and 3, so one block's products need not wait
// for the last block's scores to be stored.
#define SPECDEC_FEW_SCORES(C, k, stride, chunks, out) \
  do {                                                \
    _tile_zero(C);                                    \
    _tile_loadd(1, (k), (stride));                    \
    _tile_dpbf16ps(C, 1, 4);                          \
    if ((chunks) > 1) {                               \
      _tile_loadd(2, (k) + 32, (stride));             \
      _tile_dpbf16ps(C, 2, 5);                        \
    }                                                 \
    if ((chunks) > 2) {                               \
      _tile_loadd(1, (k) + 64, (stride));             \
      _tile_dpbf16ps(C, 1, 6);                        \
    }                                                 \
    if ((chunks) > 3) {                               \
      _tile_loadd(2, (k) + 96, (stride));             \
      _tile_dpbf16ps(C, 2, 7);                        \
    }                                                 \
    _tile_stored(C, (out), 64);                       \
  } while (0)

// One 32-position chunk of weighted values into C tiles 0 .. nb - 1: the weights through A tile A,
// the values' 16-dimension tiles through B0 and B1 in turn.
#define SPECDEC_PV_CHUNK(A, B0, B1, w, w_stride, v, nb) \
  do {                                                  \
    _tile_loadd(A, (w), (w_stride));                    \
    _tile_loadd(B0, (v), 64);                           \
    _tile_dpbf16ps(0, A, B0);                           \
    if ((nb) > 1) {                                     \
      _tile_loadd(B1, (v) + 256, 64);                   \
      _tile_dpbf16ps(1, A, B1);                         \
    }                                                   \
    if ((nb) > 2) {                                     \
      _tile_loadd(B0, (v) + 512, 64);                   \
      _tile_dpbf16ps(2, A, B0);                         \
    }                                                   \
    if ((nb) > 3) {                                     \
      _tile_loadd(B1, (v) + 768, 64);                   \
      _tile_dpbf16ps(3, A, B1);                         \
    }                                                   \
  } while (0)

}  // namespace

int64_t attend_rows_amx_scratch(int64_t n, int64_t d) { return layout(n, d).total; }

void attend_rows_amx(const AttendRowArgs& a) {
  configure_tiles();
  int64_t n = 0;
  for (int64_t t = 0; t < a.tokens; ++t) n = a.positions[t] + 1 > n ? a.positions[t] + 1 : n;
  const Layout l = layout(n, a.d);
  char* base = static_cast<char*>(a.scratch);
  auto* keys = reinterpret_cast<uint32_t*>(base + l.keys);
  auto* values = reinterpret_cast<uint32_t*>(base + l.values);
  auto* queries = reinterpret_cast<uint32_t*>(base + l.queries);
  auto* scores = reinterpret_cast<float*>(base + l.scores);
  auto* weights = reinterpret_cast<uint16_t*>(base + l.weights);
  auto* outputs = reinterpret_cast<float*>(base + l.outputs);
  auto* tile = reinterpret_cast<float*>(base + l.tile);
  const int64_t chunks = l.dk / 32, blocks = l.dv / 16, columns = a.tokens * a.group;
  const bool few = columns <= kFewColumns;
  // A few columns read the keys' tiles from the cache itself where 16 positions share a block and
  // a row is whole 32-dimension chunks (a tile's rows past the row's last position are other data,
  // which only fills scores no column reads; dimensions past d would meet the queries' zeros,
  // and 0 times a stale NaN is not 0). Otherwise the keys are copied into tiles, 16 positions at a
  // time as the scores need them when one group of columns reads them once, or all first when
  // several groups share them.
  const bool direct = few && chunks <= 4 && a.d % 32 == 0 && a.block_size % 16 == 0;
  const bool stream = columns <= kColumns;
  Slots key_slots(a, a.k);
  if (!stream) {
    Slots value_slots(a, a.v);
    for (int64_t p0 = 0; p0 < n; p0 += 16)
      key_tiles(a, key_slots, p0, n, chunks, !few, keys + (p0 / 16) * chunks * 256);
    for (int64_t p0 = 0; p0 < n; p0 += 32)
      value_tiles(a, value_slots, p0, n, 0, blocks, values + (p0 / 32) * blocks * 256);
  }
  const __m512i down =
      _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32(16));
  for (int64_t c0 = 0; c0 < columns; c0 += kColumns) {
    // The columns' queries in bf16 (zero rows and dimensions past the real ones): A rows, or for
    // few columns B tiles; and how far the furthest of them attends.
    const int64_t cols = columns - c0 < kColumns ? columns - c0 : kColumns;
    int64_t len[kColumns] = {}, reach = 0;
    for (int64_t c = 0; c < cols; ++c) {
      len[c] = a.positions[(c0 + c) / a.group] + 1;
      reach = len[c] > reach ? len[c] : reach;
    }
    for (int64_t ch = 0; ch < chunks; ++ch) {
      __m512i r[16];
      for (int64_t c = 0; c < kColumns; ++c) {
        const int64_t t = (c0 + c) / a.group, h = (c0 + c) % a.group;
        r[c] = c < cols ? bf16x32(a.q + t * a.q_stride + h * a.d + 32 * ch, a.d - 32 * ch) : _mm512_setzero_si512();
      }
      if (few) {
        transpose16(r);
        for (int64_t w = 0; w < 16; ++w) _mm512_store_si512(queries + ch * 256 + 16 * w, r[w]);
      } else {
        for (int64_t c = 0; c < kColumns; ++c) _mm512_store_si512(queries + c * (l.dk / 2) + 16 * ch, r[c]);
      }
    }
    const int64_t pad = round_up(reach, 32);
    memory_barrier();
    if (direct) {
      _tile_loadd(4, queries, 64);
      if (chunks > 1) _tile_loadd(5, queries + 256, 64);
      if (chunks > 2) _tile_loadd(6, queries + 512, 64);
      if (chunks > 3) _tile_loadd(7, queries + 768, 64);
    }
    // Scores of 16 positions at a time, each C element over the dimensions' chunks in order.
    for (int64_t p0 = 0; p0 < reach; p0 += 16) {
      float* t = tile + (p0 / 16 % 2) * 256;
      if (direct) {
        const uint16_t* k =
            a.k + (static_cast<int64_t>(a.blocks[p0 / a.block_size]) * a.block_size + p0 % a.block_size) * a.stride;
        if (p0 / 16 % 2 == 0) {
          SPECDEC_FEW_SCORES(0, k, a.stride * 2, chunks, t);
        } else {
          SPECDEC_FEW_SCORES(3, k, a.stride * 2, chunks, t);
        }
      } else {
        // Streamed tiles go round two slots, which stay in L1.
        uint32_t* k = keys + (stream ? p0 / 16 % 2 : p0 / 16) * chunks * 256;
        if (stream) key_tiles(a, key_slots, p0, n, chunks, !few, k);
        memory_barrier();
        _tile_zero(0);
        for (int64_t ch = 0; ch < chunks; ++ch) {
          if (few) {
            _tile_loadd(1, k + ch * 256, 64);
            _tile_loadd(2, queries + ch * 256, 64);
          } else {
            _tile_loadd(1, queries + 16 * ch, l.dk * 2);
            _tile_loadd(2, k + ch * 256, 64);
          }
          _tile_dpbf16ps(0, 1, 2);
        }
        _tile_stored(0, few ? t : scores + p0, few ? 64 : l.n_pad * 4);
      }
      if (few) {
        // C is [position][column]: each real column's 16 scores gathered from it.
        memory_barrier();
        for (int64_t c = 0; c < cols; ++c)
          _mm512_store_ps(scores + c * l.n_pad + p0, _mm512_i32gather_ps(down, t + c, 4));
      }
    }
    memory_barrier();
    float inv[kColumns];
    for (int64_t c = 0; c < kColumns; ++c) {
      uint16_t* w = weights + c * l.n_pad;
      if (len[c] > 0) {
        inv[c] = softmax_column(scores + c * l.n_pad, len[c], a.scale, w, pad);
      } else {
        inv[c] = 0.0f;
        for (int64_t j = 0; j < pad; j += 16)
          _mm256_store_si256(reinterpret_cast<__m256i*>(w + j), _mm256_setzero_si256());
      }
    }
    // Weighted values, 64 dimensions (four C tiles) a pass over the positions' 32-wide chunks; one
    // group of columns copies each chunk's values of the pass just before their products, into two
    // slots that stay in L1.
    const int64_t v_slots = l.n_pad / 32 >= 2 ? 2 : 1;  // the values' tiles hold one chunk at least
    const int64_t v_slot = blocks < 4 ? blocks : 4;     // tiles a slot
    for (int64_t b0 = 0; b0 < blocks; b0 += 4) {
      const int64_t nb = blocks - b0 < 4 ? blocks - b0 : 4;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      Slots pass_slots(a, a.v);
      for (int64_t p0 = 0; p0 < pad; p0 += 32) {
        uint32_t* v = values + ((p0 / 32) * blocks + b0) * 256;
        if (stream) {
          v = values + (p0 / 32 % v_slots) * v_slot * 256;
          value_tiles(a, pass_slots, p0, n, b0, nb, v);
        }
        memory_barrier();
        if (p0 / 32 % 2 == 0) {
          SPECDEC_PV_CHUNK(4, 5, 6, weights + p0, l.n_pad * 2, v, nb);
        } else {
          SPECDEC_PV_CHUNK(7, 5, 6, weights + p0, l.n_pad * 2, v, nb);
        }
      }
      _tile_stored(0, outputs, l.dv * 4);
      if (nb > 1) _tile_stored(1, outputs + 16, l.dv * 4);
      if (nb > 2) _tile_stored(2, outputs + 32, l.dv * 4);
      if (nb > 3) _tile_stored(3, outputs + 48, l.dv * 4);
      memory_barrier();
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t t = (c0 + c) / a.group, h = (c0 + c) % a.group;
        float* o = a.out + t * a.out_stride + h * a.d;
        const __m512 s = _mm512_set1_ps(inv[c]);
        for (int64_t b = b0; b < b0 + nb; ++b) {
          const __mmask16 m = lanes(a.d - 16 * b);
          _mm512_mask_storeu_ps(o + 16 * b, m, _mm512_mul_ps(_mm512_load_ps(outputs + c * l.dv + 16 * (b - b0)), s));
        }
      }
    }
  }
}

}  // namespace specdec::cpu
