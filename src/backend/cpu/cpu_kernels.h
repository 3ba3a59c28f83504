// The per-instruction-set kernel table of the CPU backend: one implementation per ISA (scalar,
// AVX2+FMA, AVX-512, AMX), chosen once at backend creation. Only the hot loops live behind this table;
// validation, threading and the cheap element-wise kernels are shared (cpu_ops.cpp,
// cpu_attention.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace specdec::cpu {

// out[m, n] = x[m, :] · w[n, :] (+ bias[n]) for one call of linear. Row-major, unpadded.
struct LinearArgs {
  const float* x = nullptr;  // [M, K]
  const void* w = nullptr;   // [N, K] of wdtype (f32, bf16 or f16)
  DType wdtype = DType::f32;
  const float* bias = nullptr;        // [N] or null
  float* out = nullptr;               // [M, N]
  const uint16_t* x_bf16 = nullptr;   // x rounded to bf16 [M, K], for kernels that ask for it
  const uint16_t* x_tiles = nullptr;  // x_bf16 in the AMX tile layout (below), for kernels that ask for it
  const uint16_t* w_packed = nullptr;  // bf16 w in the packed layout (kPackRows), for kernels that ask for it
  int64_t M = 0;
  int64_t N = 0;
  int64_t K = 0;
};

// The packed layout of a bf16 weight [N, K] (LinearArgs::w_packed, Weight::packed), defined for K a
// multiple of kPackK: rows in groups of kPackRows (N padded with zero rows to a whole group), each
// group stored chunk by chunk over K, chunk c holding columns [c kPackK, (c + 1) kPackK) of the
// group's rows one after another. A tile over a group's rows then reads one sequential stream, as
// a walk over one row-major row does; rows read side by side in the row-major layout are as many
// streams, each a row long, which the hardware prefetchers of some cores (AMD Zen 4) do not follow.
constexpr int64_t kPackRows = 4;
constexpr int64_t kPackK = 32;
constexpr int64_t packed_rows(int64_t N) { return (N + kPackRows - 1) / kPackRows * kPackRows; }
// w [N, K] bf16 into packed [packed_rows(N), K] (K a multiple of kPackK).
void pack_bf16_rows(const uint16_t* w, int64_t N, int64_t K, uint16_t* packed);

// Invariant every implementation keeps: out[m, n] is a pure function of (x[m, :], w[n, :],
// bias[n], K). The sequence of floating-point operations for one output (lane assignment over K,
// tail handling, reduction tree) does not depend on M, on m's place in a register tile, or on
// the [n_begin, n_end) split, so results are batch- and thread-count-invariant.
using LinearFn = void (*)(const LinearArgs& args, int64_t n_begin, int64_t n_end);

// One token's causal attention for `heads` consecutive query heads that share one kv head, over
// a paged cache: cache position j (0 <= j < n) lives in slot
// blocks[j / block_size] * block_size + j % block_size, whose key is at k + slot * stride (k
// already points at the kv head), likewise its value. Query head g is at q + g * d, its output
// at out + g * d.
struct AttendArgs {
  const float* q = nullptr;  // [heads, d]
  const float* k = nullptr;
  const float* v = nullptr;
  const int32_t* blocks = nullptr;
  int64_t block_size = 0;
  int64_t stride = 0;  // floats between consecutive slots (kv_heads * d)
  int64_t d = 0;
  int64_t n = 0;  // positions attended: 0 .. n - 1
  int64_t heads = 1;
  float scale = 1.0f;
  float* scores = nullptr;  // scratch [heads, n]
  float* out = nullptr;     // [heads, d]
};
// Invariant: each head's output is a pure function of (its q, the n keys and values, scale):
// scores in position order, their max, exp and their sum with a lane assignment fixed by the
// position index, then the weighted values accumulated in position order. How many heads share
// a call, and which other tokens exist, change nothing: outputs are batch-, chunking- and
// thread-invariant.
using AttendFn = void (*)(const AttendArgs& args);

// All of one row's tokens in a call against one kv head of a bf16 KV cache, for kernels that share
// work between the row's tokens (AMX tiles): token i's query heads are q + i * q_stride + h * d
// (h < group), its outputs out + i * out_stride + h * d, and it attends positions 0 ..
// positions[i]. The pools are [blocks, block_size, kv_heads, d] bf16, k and v offset to the head.
struct AttendRowArgs {
  const float* q = nullptr;
  int64_t q_stride = 0;
  const int32_t* positions = nullptr;  // [tokens]
  int64_t tokens = 0;
  int64_t group = 1;  // query heads on the kv head
  const uint16_t* k = nullptr;
  const uint16_t* v = nullptr;
  const int32_t* blocks = nullptr;
  int64_t block_size = 0;
  int64_t stride = 0;  // elements between consecutive slots (kv_heads * d)
  int64_t d = 0;
  float scale = 1.0f;
  float* out = nullptr;
  int64_t out_stride = 0;
  void* scratch = nullptr;  // AttendRowsScratchFn(max position + 1, d) bytes, 64-byte aligned
};
// Invariant: each (token, head) output is a pure function of (its q, keys and values 0 .. its
// position, scale): the other tokens of the call, their positions and how the row's tokens are
// split into calls change nothing, so a verify window's outputs are a decode step's bits.
using AttendRowsFn = void (*)(const AttendRowArgs& args);
// Scratch bytes attend_rows wants for positions 0 .. n - 1 at head size d.
using AttendRowsScratchFn = int64_t (*)(int64_t n, int64_t d);

// out[i] = silu(g[i]) * u[i] = g[i] / (1 + e^-g[i]) * u[i], i < n; out may be g or u. Element-wise,
// so every split of a row gives the same bits.
using SiluMulFn = void (*)(const float* g, const float* u, float* out, int64_t n);

// The sum over i < n of e^(x[i] - shift), in double (each term in float): the normalizer of a
// softmax whose largest logit is shift. NaN anywhere makes it NaN.
using SumExpFn = double (*)(const float* x, int64_t n, float shift);

// The AMX tile layout of bf16 activations (LinearArgs::x_tiles), defined for K a multiple of
// kTileK: tokens in blocks of 16, the last block T = M mod 16 tokens or 16; block b starts at
// element 16 b K, and holds K / kTileK chunks of T × kTileK elements, each chunk [16 column
// pairs][T tokens][2] bf16 (the pair layout of a TDPBF16PS B operand, T columns wide). One token's
// layout is its row. Tile loads read up to 64 bytes past the last chunk: the buffer has them.
constexpr int64_t kTileK = 32;
constexpr int64_t tile_activation_elements(int64_t M, int64_t K) { return M * K + 32; }
// Rounds x [M, K] to bf16 rows in x_bf16 (f32_to_bf16's rounding, bit for bit) and, when tiles is
// not null (K a multiple of kTileK), writes them in the tile layout to tiles
// (tile_activation_elements(M, K) elements, 64-byte aligned).
using PackBf16Fn = void (*)(const float* x, int64_t M, int64_t K, uint16_t* x_bf16, uint16_t* tiles);

struct Kernels {
  const char* isa;  // "scalar", "avx2", "avx512", "avx512-bf16", "amx"
  LinearFn linear;
  AttendFn attend;
  SiluMulFn silu_mul;
  SumExpFn sum_exp;
  // linear wants LinearArgs::x_bf16 filled when the weights are bf16.
  bool bf16_activations = false;
  // When set (with bf16_activations), x is rounded by this function, and linear also wants
  // LinearArgs::x_tiles when the weights are bf16 and K is a multiple of kTileK.
  PackBf16Fn pack_bf16 = nullptr;
  // Byte boundary on which linear reads a weight at full speed (0: any); Backend::weight_alignment.
  size_t weight_alignment = 0;
  // Attention over a bf16 KV cache, a row's tokens at once: q and the softmax weights rounded to
  // bf16 too, products in f32. Null: the ISA keeps its KV cache in f32 (attend).
  AttendRowsFn attend_rows = nullptr;
  AttendRowsScratchFn attend_rows_scratch = nullptr;
  // linear reads bf16 weights in the packed layout (kPackRows) where LinearArgs::w_packed is set,
  // and so wants them packed (Backend::pack_weight) where K is a multiple of kPackK.
  bool packed_weights = false;
};

// Instruction-set kernel files must not instantiate std templates or other inline functions
// with out-of-line bodies: the linker keeps one copy of each, possibly the AVX-512 one, and
// would hand it to the portable path.

// The attention kernels of each instruction set (attention_*.cpp), gathered into the tables.
void attend_scalar(const AttendArgs& args);
void attend_avx2(const AttendArgs& args);
void attend_avx512(const AttendArgs& args);
void attend_rows_amx(const AttendRowArgs& args);
int64_t attend_rows_amx_scratch(int64_t n, int64_t d);
// The vector e^x of the AVX2 and AVX-512 tables, one arithmetic: 2^n · p(r) with
// n = round(x · log2 e) and r = x − n · ln 2 (ln 2 in two parts, so r is exact to a few ulp), p the
// degree-7 Taylor polynomial of e^r on |r| ≤ ln 2 / 2 (truncation below 6e-9 relative; within 2 ulp
// of the correctly rounded e^x), evaluated by Horner from kExpPoly[0]; x clamped to ±kExpClamp
// first (NaN passes), so large x gives inf and small x gives 0, as expf does.
constexpr float kExpClamp = 110.0f;
constexpr float kExpLog2e = 1.44269504088896341f;
constexpr float kExpLn2Hi = 0.693359375f;
constexpr float kExpLn2Lo = -2.12194440e-4f;
constexpr float kExpPoly[8] = {1.0f / 5040.0f, 1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f,
                               1.0f / 6.0f,    0.5f,          1.0f,          1.0f};
constexpr int kExpPolyTerms = 8;

// silu_mul with the C library's expf (scalar table), and with that e^x on 8 and 16 lanes (AVX2
// and AVX-512 tables).
void silu_mul_scalar(const float* g, const float* u, float* out, int64_t n);
void silu_mul_avx2(const float* g, const float* u, float* out, int64_t n);
void silu_mul_avx512(const float* g, const float* u, float* out, int64_t n);
// sum_exp likewise: expf on the scalar table, that e^x on 8 and 16 lanes on the others.
double sum_exp_scalar(const float* x, int64_t n, float shift);
double sum_exp_avx2(const float* x, int64_t n, float shift);
double sum_exp_avx512(const float* x, int64_t n, float shift);

const Kernels& scalar_kernels();
const Kernels& avx2_kernels();
const Kernels& avx512_kernels();
// AVX-512 with bf16 dot products (_mm512_dpbf16_ps) for bf16 weights: activations are rounded to
// bf16, so results differ from the f32 reference. Opt-in only.
const Kernels& avx512_bf16_kernels();
// AMX tiles (TDPBF16PS) for bf16 weights whose K is a multiple of kTileK, the avx512-bf16 linear
// otherwise: activations rounded to bf16 as there. The default where the CPU has AMX; its linear
// may run only once the process holds the tile data state (the backend asks Linux for it when it
// picks this table).
const Kernels& amx_kernels();

}  // namespace specdec::cpu
