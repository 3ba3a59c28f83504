// The CUDA backend's kernel switches, one value per backend (BackendOptions::cuda). The defaults
// are the settings measured best; the others stay for debugging and for measuring what each
// optimisation buys. Plain C++17 with no includes: the kernel files (.cu) read it too.
#pragma once

namespace specdec {

// Which one-row store and add linears stream two output columns a warp instead of one.
enum class PairedColumns : int { never = 0, with_folded_norm = 1, always = 2 };

// No switch but flash_prefill, skinny_max_m, fast_whole_x_max_m, cluster_sampling and fast_drafts changes a result:
// each other alternative computes the same bits at another speed. The CUDA backend lets the SPECDEC_CUDA_* environment
// variables named here override these fields (read once, when the backend is made).
struct CudaTuning {
  // Synchronize after every call, so that an error names the call whose kernel faulted; no
  // recordings then (SPECDEC_CUDA_SYNC=1).
  bool sync_each_call = false;
  // Backend::record captures CUDA graphs; false runs every call eagerly (SPECDEC_CUDA_RECORD=0).
  bool record = true;
  // Kernels may start during the previous kernel's tail (programmatic dependent launch);
  // false runs them strictly in turn (SPECDEC_CUDA_PDL=0).
  bool overlapped_launches = true;
  // Weight vectors per row the linear kernels load before they wait for the previous kernel:
  // 0 none, 1 one, 2 all of their first loop iteration's (SPECDEC_CUDA_EARLY_WEIGHTS=0..2).
  int early_weights = 2;
  // One-row linears run as a persistent stream kernel; false takes the tiled row kernel
  // (SPECDEC_CUDA_STREAM_LINEAR=0).
  bool stream_linear = true;
  // SPECDEC_CUDA_PAIRED=0, 1 or 2.
  PairedColumns paired_columns = PairedColumns::with_folded_norm;
  // Decode steps rotate, cache and attend in one launch (SPECDEC_CUDA_FUSED_ATTENTION=0 splits).
  bool fused_attention = true;
  // Split attention folds its chunks in a second launch instead of in the last block of each
  // (SPECDEC_CUDA_MERGE_LAUNCH=1).
  bool merge_launch = false;
  // Attention on the tensor cores (flash_attention.cu): in the fast mode for batches with prefill
  // chunks (and many rows, below), in the batch-invariant mode for every batch of a bf16 cache;
  // false keeps the f32 kernel everywhere (SPECDEC_CUDA_FLASH=0). Changes results within bf16
  // rounding (q and the probabilities are rounded for the products).
  bool flash_prefill = true;
  // With flash_prefill and without tile_decode, the fast mode's decode steps and short windows
  // take the flash kernel too from this many (row, kv head) pairs on
  // (SPECDEC_CUDA_FLASH_DECODE_BLOCKS): each pair is one block over the row's whole history, so
  // fewer pairs leave SMs idle that the f32 kernel's split launch would use.
  int flash_decode_blocks = 256;
  // With flash_prefill, decode steps and windows of up to 16 tokens a row attend with one warp
  // per (row, kv head, 16 (token, q head) pairs, 64-position tile) and a fold of the tiles
  // (flash_attention.cu), in both modes; false leaves them to the kernels above in the fast mode
  // and to the flash kernel in the batch-invariant mode (SPECDEC_CUDA_TILE_DECODE=0), where both
  // give the same bits. The fast mode's one-wave fused decode (fused_attention) still comes first.
  bool tile_decode = true;
  // The fast mode's tile decode: a warp that takes several of its row's tiles (many rows, few
  // warps to spare) folds them into one running softmax and writes one partial, instead of one
  // partial a tile for the merge to fold (SPECDEC_CUDA_TILE_WARP_FOLD=0 turns it off): at 256
  // rows of 512 positions the partials are ~38 MB a layer written and reread beside ~300 MB of
  // K/V. Changes results within rounding (another order of folding) where the warp's tiles are
  // every k-th of its row, and a row's bits then depend on the launch's rows; the batch-invariant
  // mode folds in the warp only where a warp walks all its row's tiles in order (1,024 blocks or
  // more), which is the merge's own fold (docs/perf-notes.md).
  bool tile_warp_fold = true;
  // The batch-invariant mode's decode steps (one new token a row) rotate, cache and attend in one
  // tile-decode launch whose last warp of each (row, kv head) folds the tiles, instead of three
  // launches (rope and cache write, tile decode, merge); the same bits. Off by default: no
  // faster in a recorded decode step (SPECDEC_CUDA_TILE_FUSED=1; docs/perf-notes.md).
  bool tile_fused = false;
  // Batch-invariant mode runs its 16-bit linears on cuBLASLt at every M, with K never split
  // (gemm_lt.h); false takes the row-streaming kernel with f32 x instead, several times slower
  // beyond a few rows (SPECDEC_CUDA_INVARIANT_LT=0). Changes results within bf16 rounding of x.
  bool invariant_cublaslt = true;
  // Batch-invariant mode runs its 16-bit linears on the tensor-core linear (gemm.cu) at every M
  // instead of the row-streaming kernels (SPECDEC_CUDA_INVARIANT_GEMM=1). Changes results: x is
  // rounded to the weights' type for the products. Off by default: at one row it streams the
  // weights slower than the row kernel (docs/benchmarks.md), and one row is the commonest call.
  // Either way one reduction order serves every M of a backend.
  bool invariant_tensor_cores = false;
  // Projections whose weights lie one after another (q/k/v, gate/up as the model binds them) run
  // as one cuBLASLt GEMM each group; false runs one GEMM a weight (SPECDEC_CUDA_STACKED=0). In
  // the batch-invariant mode (K never split) either gives the same bits.
  bool stacked_projections = true;
  // The cuBLASLt path writes results where the next call reads them: one row's stacked q/k/v
  // straight into outputs that lie one after another, and norm_mlp_add's SwiGLU straight into
  // the down projection's 16-bit x; false keeps the column split and the rounding pass
  // (SPECDEC_CUDA_DIRECT=0). The same bits either way.
  bool direct_outputs = true;
  // The fast mode's cuBLASLt GEMMs of gate and up (past the few-row kernels) write their products
  // rounded to the weights' 16-bit type, as a 16-bit model's reference computes them, and the
  // SwiGLU reads those: half the bytes of f32 products (a 2,048-token prompt's gate and up are
  // 117 MB each a layer in f32); false keeps them in f32 (SPECDEC_CUDA_HALF_GATE_UP=0). Changes
  // results by that rounding. The batch-invariant mode has a switch of its own
  // (invariant_half_gate_up).
  bool half_gate_up = true;
  // The same rounding in the batch-invariant mode, on its cuBLASLt-path shapes (invariant_cublaslt)
  // (SPECDEC_CUDA_INVARIANT_HALF_GATE_UP=0 keeps f32 products): cuBLASLt writes the products in
  // the weights' 16-bit type, rounding each unsplit f32 sum to nearest even, and the few-row
  // kernels beside it round their sums the same way before the SwiGLU, so that a row keeps its
  // bits at every M. Changes results by that rounding.
  bool invariant_half_gate_up = true;
  // With half_gate_up, gate and up of stacked weights run as one GEMM up to this many rows
  // (SPECDEC_CUDA_HALF_STACKED_MAX_M); past it, one GEMM each. Changes results within f32
  // rounding (cuBLASLt chooses its algorithm, and so its order over K, per shape).
  int half_stacked_max_m = 256;
  // The fast mode runs its 16-bit linears of 3 to this many rows on the skinny kernel
  // (skinny_gemm.cu: the stacked projections' column split and SwiGLU in its epilogue) instead of
  // cuBLASLt (SPECDEC_CUDA_SKINNY_MAX_M, 0 to 16). Changes results within f32 rounding (another
  // order of summation over K). Off by default: a decode step of 4-16 rows measured no faster
  // with it than with cuBLASLt (docs/perf-notes.md).
  int skinny_max_m = 0;
  // The batch-invariant mode runs its cuBLASLt-path linears of up to this many rows on the
  // ordered kernel (ordered_gemm.cu: cuBLASLt's unsplit order, so the same bits; the stacked
  // projections' column split and SwiGLU in its epilogue) instead of cuBLASLt
  // (SPECDEC_CUDA_ORDERED_MAX_M, 0 to 16). Two: up to eight rows of a 4,096-wide x, two of
  // 14,336, the kernel takes x in f32 and rounds it itself, after the RMSNorm before the
  // projection, which spares the separate pass and launch that cuBLASLt needs before each of a
  // layer's linears; two rows are the most for which every linear of an 8B-shaped layer takes x
  // so. Where x comes rounded the kernel is no faster than cuBLASLt (an order that forbids
  // splitting K leaves one chain of MMAs per 8 columns walking all of K). docs/perf-notes.md has
  // the figures.
  int ordered_max_m = 2;
  // The ordered kernel's consumer warps a block for single-tile calls (SPECDEC_CUDA_ORDERED_WARPS,
  // 4 or 8): eight let an SM's five or six tiles of the stacked q/k/v run in one pass. And an
  // overlapped launch whose producer asks for its first ring of weights before it waits for the
  // kernel before it (SPECDEC_CUDA_ORDERED_EARLY=0 turns it off): one memory latency a linear
  // off the step's critical path.
  int ordered_warps = 8;
  bool ordered_early = true;
  // The fast mode's cuBLASLt-path linears of up to this many rows on the ordered kernel where it
  // takes x in f32 (rounding it and applying the RMSNorm itself, as above; eight rows of 4,096),
  // sparing the passes before them (SPECDEC_CUDA_FAST_WHOLE_X_MAX_M, 0 to 16). Off by default:
  // slower than cuBLASLt's split K at eight rows (docs/perf-notes.md). Changes results within
  // rounding (K unsplit, where cuBLASLt may split).
  int fast_whole_x_max_m = 0;
  // Kernel of the tensor-core linear: 0 chosen from M and N, 1 small tile, 2 mid, 3 large, 4 the
  // stream kernel (at most 16 rows; the small tile above) (SPECDEC_CUDA_GEMM_TILE). Every choice
  // gives the same bits.
  int gemm_tile = 0;
  // Backend::sample draws a row of 2,048 or more logits with a cluster of blocks that hold the row
  // in their shared memory, each pass a share of it; false draws every row with one block
  // (SPECDEC_CUDA_CLUSTER_SAMPLE=0). Changes results within rounding: the probability sums add
  // the blocks' partial sums in another order (still fixed, so still batch invariant).
  bool cluster_sampling = true;
  // A backend created batch invariant honours Backend::allow_fast_kernels (a drafter's calls whose
  // results decide only speed run on the fast mode's kernels); false keeps every call on the
  // batch-invariant kernels (SPECDEC_CUDA_FAST_DRAFTS=0). Drafts change, outputs do not.
  bool fast_drafts = true;
};

}  // namespace specdec
