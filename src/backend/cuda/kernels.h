// Launchers of the CUDA kernels, on raw device pointers. The backend (cuda_backend.cpp) checks
// shapes and dtypes before calling these; the .cu files hold only device code and launches, so
// they need no C++20 headers. Each launcher only enqueues work; the caller checks the launch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda_tuning.h"
#include "sampling/sample_row.h"

namespace specdec::cuda {

// Where and how a launcher enqueues: its backend's stream, and the switches its kernels follow.
// Each backend holds its own, so two backends in one process may be tuned differently.
struct Context {
  cudaStream_t stream = nullptr;
  CudaTuning tuning;
};

// Element type of weights, biases, tables and KV pools as the kernels see them.
enum class ElemType : int { f32 = 0, f16 = 1, bf16 = 2 };

// out[t, :] = table[ids[t], :] as f32; ids outside [0, V) give a row of zeros.
void launch_embedding(const void* table, ElemType type, const int* ids, float* out, int tokens, int hidden, int vocab,
                      const Context& ctx);
// One block per row, fixed reduction order.
void launch_rms_norm(const float* x, const void* weight, ElemType type, float eps, float* out, int rows, int dim,
                     const Context& ctx);
// launch_rms_norm with out in out_type (bf16 or f16), rounded to nearest even: the bits of
// launch_rms_norm then launch_convert_f32, in one pass.
void launch_rms_norm_16(const float* x, const void* weight, ElemType type, float eps, void* out, ElemType out_type,
                        int rows, int dim, const Context& ctx);
// In place on x [tokens, heads, head_dim], Hugging Face rotate_half layout.
void launch_rope(float* x, const int* positions, const float* inv_freq, float scaling, int tokens, int heads,
                 int head_dim, const Context& ctx);
void launch_silu_mul(const float* gate, const float* up, float* out, int64_t n, const Context& ctx);
// launch_silu_mul of gate and up each first rounded to `type` (bf16 or f16, nearest even): the
// bits of launch_silu_mul_rows_16 over those products had they been written in that type.
void launch_silu_mul_rounded(const float* gate, const float* up, ElemType type, float* out, int M, int n,
                             const Context& ctx);
// out[m, j] = silu(gu[m, j]) * gu[m, n + j] for rows of gu [M, 2n] (gate then up, as one product
// over stacked weights writes them): launch_silu_mul's arithmetic.
void launch_silu_mul_halves(const float* gu, float* out, int M, int n, const Context& ctx);
// launch_silu_mul_halves with out in out_type (bf16 or f16), rounded to nearest even: the bits of
// launch_silu_mul_halves then launch_convert_f32, in one pass.
void launch_silu_mul_halves_16(const float* gu, void* out, ElemType out_type, int M, int n, const Context& ctx);
// out[m, j] = silu(gate[m * ld + j]) * up[m * ld + j] with gate and up in `type` (bf16 or f16) and
// out [M, n] in f32 or in `type` (out_type): the arithmetic in f32, rounded once to nearest even.
void launch_silu_mul_rows_16(const void* gate, const void* up, int64_t ld, ElemType type, void* out, ElemType out_type,
                             int M, int n, const Context& ctx);
// Columns of src [M, sum of n[j]] into out[j] [M, n[j]], in order (up to kMaxLinearSegments parts).
struct ColumnParts {
  float* out[3] = {nullptr, nullptr, nullptr};
  int n[3] = {0, 0, 0};  // 0 for parts not used
};
void launch_split_columns(const float* src, int M, const ColumnParts& parts, const Context& ctx);
void launch_add(const float* a, const float* b, float* out, int64_t n, const Context& ctx);
// rope on q [T, heads, D] and k [T, kv_heads, D] in place (as launch_rope), then k and v written
// into the pools at slots[t] (as launch_kv_write): one launch, one block per token.
void launch_rope_kv_write(float* q, float* k, const float* v, const int* positions, const float* inv_freq,
                          float scaling, int tokens, int heads, int kv_heads, int head_dim, void* k_pool, void* v_pool,
                          ElemType pool_type, const int* slots, int64_t pool_slots, const Context& ctx);
// out[i, :] = x[indices[i], :] for rows of row_bytes bytes; indices outside [0, x_rows) give zeros.
void launch_gather_rows(const void* x, const int* indices, void* out, int count, int64_t row_bytes, int x_rows,
                        const Context& ctx);
// out[i, :] = fill, then out[i, index[c]] = x[i, c] where index[c] lies in [0, vocab); one block a row.
void launch_scatter_columns(const float* x, const int* index, float fill, float* out, int rows, int columns, int vocab,
                            const Context& ctx);
// out[i] = lowest index of the maximum of logits[i, :].
void launch_argmax(const float* logits, int* out, int rows, int vocab, const Context& ctx);
void launch_top_logprob(const float* logits, float* out, int rows, int vocab, const Context& ctx);
// out (bf16 or f16) = round-to-nearest-even of x.
void launch_convert_f32(const float* x, void* out, ElemType type, int64_t n, const Context& ctx);
// out[m, n] += bias[n].
void launch_add_bias(float* out, const float* bias, int rows, int cols, const Context& ctx);

// The row-streaming linear, general form: one launch computes up to kMaxLinearSegments
// projections of the same x (weights of one type, same K), with an epilogue:
// - store:     seg[j].out[m, n] = x[m] · seg[j].w[n] + bias[n]          (any number of segments)
// - add:       seg[0].out[m, n] += x[m] · seg[0].w[n] + bias[n]         (one segment; residual add)
// - silu_gate: seg[0].out[m, n] = silu(x[m] · seg[0].w[n]) * (x[m] · seg[1].w[n])  (two segments of
//              equal n: gate and up; no bias)
// Every output's dot product is the one launch_linear_rows computes (same order), so fusing
// changes no bits of the products.
enum class LinearEpilogue : int { store = 0, add = 1, silu_gate = 2 };
constexpr int kMaxLinearSegments = 3;
struct LinearSegment {
  const void* w = nullptr;  // [n, K]
  const float* bias = nullptr;
  float* out = nullptr;  // [M, n]
  int n = 0;
};
struct LinearRowsArgs {
  const float* x = nullptr;  // [M, K]
  ElemType w_type = ElemType::bf16;
  int M = 0, K = 0;
  LinearSegment seg[kMaxLinearSegments];
  int segments = 1;
  LinearEpilogue epilogue = LinearEpilogue::store;
  // When set, x is RMS-normalised on its way in: each staged row becomes (x * inv) * norm_w with
  // inv = 1 / sqrt(sum of squares / K + norm_eps), the arithmetic of launch_rms_norm, so the
  // outputs are bit-equal to rms_norm followed by the linear. norm_w has the weights' type and
  // needs linear_rows_folds_norm(M, K).
  const void* norm_w = nullptr;
  float norm_eps = 0.0f;
};
void launch_linear_rows(const LinearRowsArgs& args, const Context& ctx);
// Whether the row-streaming kernel folds the norm (norm_w) for M rows of K: one or two rows of x
// (a decode step's tile), staged whole at once.
bool linear_rows_folds_norm(int M, int K);
// One-row calls go to a stream kernel (persistent grid, weights through cp.async) when their
// shapes allow it and ctx.tuning.stream_linear is set: how many it has served so far.
uint64_t linear_stream_launches();

// The tensor-core linear (gemm.cu): the contract of launch_linear_rows without norm_w, for 16-bit
// weights, with each element of x rounded to the weights' type for the products (f32 sums).
// Each output takes the MMA k-steps of its row and column in increasing k from zero, one
// accumulator, whatever M, the tile or the other rows: batch invariant. gemm_supports says
// whether it applies (weights bf16 or f16, K a multiple of 8, weight rows 16-byte aligned): a
// function of the weights and K alone, never of M.
bool gemm_supports(ElemType w_type, int K, const void* const* weights, int count);
void launch_gemm(const LinearRowsArgs& args, const Context& ctx);

// The fast mode's linear for a few rows (skinny_gemm.cu): x[M, K] · w[N, K]ᵀ for x and w of one
// 16-bit type, f32 sums in an order fixed by K (deterministic; the same bits at every M it
// serves, though not cuBLASLt's). skinny_gemm_supports: 16-bit type, 1 <= M <= kSkinnyMaxM, K a
// multiple of 32, x and w on 16-byte boundaries.
constexpr int kSkinnyMaxM = 16;
enum class SkinnyEpilogue : int {
  store = 0,     // columns into out[0..parts) in order, out[j] [M, n[j]] (stacked q/k/v: three)
  add = 1,       // out[0] [M, N] += the product (one part: the residual add)
  silu_gate = 2  // out[0][m, c] = silu(col c) * (col c + N/2) of [gate; up] rows (out [M, N/2])
};
struct SkinnyArgs {
  const void* x = nullptr;
  const void* w = nullptr;
  ElemType type = ElemType::bf16;
  int M = 0, N = 0, K = 0;
  SkinnyEpilogue epilogue = SkinnyEpilogue::store;
  float* out[3] = {nullptr, nullptr, nullptr};
  int n[3] = {0, 0, 0};  // store: the parts' widths, summing to N
  int parts = 1;
  // The ordered kernel only, with x null: x in f32, rounded to the weights' type by the kernel,
  // after an RMSNorm by `norm` (norm_type, eps) where norm is set; the bits of launch_convert_f32
  // or launch_rms_norm_16 and then the call. See ordered_gemm_takes_f32.
  const float* x32 = nullptr;
  const void* norm = nullptr;
  ElemType norm_type = ElemType::f32;
  float eps = 0.0f;
  // The ordered kernel's silu_gate only: each gate and up sum rounded to `type` (nearest even)
  // before the SwiGLU, as cuBLASLt rounds the products it writes in that type.
  bool round_gate_up = false;
};
bool skinny_gemm_supports(ElemType type, int M, int K, const void* x, const void* w);
void launch_skinny_gemm(const SkinnyArgs& args, const Context& ctx);
// How many skinny launches this process has made (tests check which kernel served a call).
uint64_t skinny_gemm_launches();

// The batch-invariant mode's linear for a few rows (ordered_gemm.cu): the skinny kernel's
// arguments and epilogues with the bits of cuBLASLt's algorithms that keep K in one pass (one f32
// accumulator per output over m16n8k16 steps in increasing k), so that it may serve the small M
// of that mode beside cuBLASLt at the larger ones. ordered_gemm_supports: 16-bit type,
// 1 <= M <= kOrderedMaxM, K a multiple of 16, x and w on 16-byte boundaries.
constexpr int kOrderedMaxM = 16;
bool ordered_gemm_supports(ElemType type, int M, int K, const void* x, const void* w);
// Whether the ordered kernel takes this call's x in f32 (SkinnyArgs::x32): as for
// ordered_gemm_supports, and the M rows of K, rounded, fit the block's shared memory beside the
// weight ring (one or two rows of the 8B shape's widest K, eight of 4,096).
bool ordered_gemm_takes_f32(ElemType type, int M, int K, const float* x, const void* w);
void launch_ordered_gemm(const SkinnyArgs& args, const Context& ctx);
// How many ordered launches this process has made (tests check which kernel served a call).
uint64_t ordered_gemm_launches();

// out[M, N] = x[M, K] · w[N, K]ᵀ (+ bias) with f32 accumulation. Each output is reduced in an
// order fixed by K alone (lane-strided 16-byte vectors, then a butterfly over the warp), so the
// result of one row of x never depends on M or on the other rows: batch invariant.
// bias (f32, [N]) may be null.
void launch_linear_rows(const float* x, const void* w, ElemType w_type, const float* bias, float* out, int M, int N,
                        int K, const Context& ctx);

// k, v [tokens, kv_heads, head_dim] f32 into pools [slots, kv_heads, head_dim] at slots[t]
// (negative slots are skipped; slots >= pool_slots are skipped).
void launch_kv_write(const float* k, const float* v, void* k_pool, void* v_pool, ElemType pool_type, const int* slots,
                     int tokens, int kv_heads, int head_dim, int64_t pool_slots, const Context& ctx);

struct AttentionArgs {
  const float* q = nullptr;  // [tokens, heads, head_dim]
  const void* k_pool = nullptr;
  const void* v_pool = nullptr;
  ElemType pool_type = ElemType::bf16;
  const int* positions = nullptr;
  const int* row_starts = nullptr;
  const int* row_lens = nullptr;
  const int* block_table = nullptr;
  float* out = nullptr;
  int rows = 0, tokens = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int max_blocks = 0, block_size = 0;
  int64_t pool_blocks = 0;
  float scale = 1.0f;
  // q heads of one kv group that one block serves, 1..kAttentionGroup: fewer means more blocks
  // (small launches), more means each K/V row is read once for more heads. A head's numerics do
  // not depend on it.
  int block_heads = 4;
  // A token's visible positions are cut into chunks of kAttentionChunk; each chunk's softmax
  // partial is folded into the result in chunk order. Split launch (partial_m set, max_splits
  // chunks): one block per chunk writes its partial to these [tokens, heads, max_splits]
  // (x head_dim) f32 buffers and a second kernel folds them; otherwise one block folds all the
  // chunks of its token in turn. Both give the same bits, so the choice (made from host-side
  // sizes) never breaks invariance, as long as max_row_len is not below a token's length.
  int max_splits = 1;
  float* partial_m = nullptr;
  float* partial_l = nullptr;
  float* partial_acc = nullptr;
  int* partial_len = nullptr;  // [tokens]: each token's visible length, for the merge
  // Split launch with arrivals set ([tokens, kv_heads x head groups] counters, zero between
  // launches): the last block of a (token, head group) to finish folds the partials itself, in
  // chunk order as the merge kernel does (the same bits), and resets its counter; no merge launch.
  int* arrivals = nullptr;
  // Fused decode step (rope_kv_write_attention; one new token per row): q holds the tokens'
  // unrotated q and k_new, v_new [tokens, kv_heads, head_dim] their unrotated k and v. Each block
  // rotates its q heads as it stages them and the new k of its kv head, as the rope kernel does;
  // the chunk-0 block of a kv head's first head group writes that head's k and v at slots[t]; a
  // block whose chunk holds the new slot takes the new k and v from shared memory. No earlier
  // kernel of the step writes the pools or the metadata, so the first chunk's loads are issued
  // before the wait for the previous kernel.
  const float* k_new = nullptr;
  const float* v_new = nullptr;
  const int* slots = nullptr;
  const float* inv_freq = nullptr;
  float rope_scaling = 1.0f;
};
constexpr int kAttentionChunk = 64;
// Most q heads of one kv group that one block serves (each K/V row is read once for them).
constexpr int kAttentionGroup = 4;
// One block per (token, kv head, group of up to kAttentionGroup q heads[, chunk]); online softmax
// over the row's cached positions in a fixed order. head_dim: 16, 48, 80, 112 or a multiple of
// 32 up to 256.
void launch_attention(const AttentionArgs& args, const Context& ctx);

// Cached positions per tile of the tensor-core kernels (one pass of the softmax; the tile decode
// kernel's partials are one per tile).
constexpr int kFlashKvTile = 64;

// Causal paged attention on the tensor cores (flash_attention.cu): the contract of
// launch_attention (split and fused fields ignored) with q and the probabilities rounded to bf16
// for the products. Rows may have at most max_row_tokens new tokens. fold: the tile-fold form,
// whose bits launch_tile_decode_attention reproduces (the batch-invariant mode); without it a
// little faster, batch invariant still, but not equal to the decode kernel's bits. Supported: bf16
// pools, head_dim 64, 96 or 128. Returns false, having launched nothing, where it does not apply.
bool flash_attention_supports(ElemType pool_type, int head_dim);
bool launch_flash_attention(const AttentionArgs& args, int max_row_tokens, bool fold, const Context& ctx);

// Decode steps and short windows on the tensor cores (flash_attention.cu), rows of at most
// max_row_tokens new tokens: one warp per (row, kv head, 16 of the row's (token, q head) pairs,
// 64-position tile of the history) writes the tile's softmax partial to partial_m, partial_l
// ([tokens, heads, tiles]) and partial_acc ([tokens, heads, tiles, head_dim]); a second kernel
// folds them in tile order. tiles: the room per token, normally ceil(max_row_len / 64); a token
// with more tiles has the rest folded into its last slot (close, but not the flash kernel's bits).
// With room enough, each token's bits equal launch_flash_attention's with fold. warp_fold (the
// fast mode): a warp that takes several of a row's tiles folds them into one running softmax as it
// goes and writes one partial, so a launch with fewer warps than tiles writes and rereads fewer
// partials; a token's bits then depend on how many warps the launch has (close, not the
// flash kernel's bits). A launch of 1,024 or more (row, kv head, pairs) blocks gives each one
// warp that walks all its row's tiles and folds them as it goes, in either mode: the merge's
// fold in the same order, so the same bits, with one partial a token.
// Returns false, having launched nothing, where it does not apply.
bool launch_tile_decode_attention(const AttentionArgs& args, int max_row_tokens, int tiles, bool warp_fold,
                                  const Context& ctx);

// out[i] = the token logits[i, :] draws under rows[i] (sampling.cu): the host pipeline of
// sampling.cpp in one block per row, -1 where the host would throw (a NaN logit, or no finite
// logit at temperature > 0). Deterministic and batch invariant. work: n * vocab floats of scratch
// the kernel overwrites (each row's scaled logits, then their weights).
void launch_sample(const float* logits, const SampleRow* rows, int* out, float* work, int n, int vocab,
                   const Context& ctx);

}  // namespace specdec::cuda
