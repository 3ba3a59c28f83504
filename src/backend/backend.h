// The kernel set a Llama-family transformer needs, per device. Backends know no model: the
// model layer composes these calls, and never branches on which backend runs them.
//
// Conventions for every kernel:
// - Tensors are contiguous row-major views in this backend's memory (Tensor::device matches).
// - Activations are f32. Weights may be f32, bf16 or f16; a linear layer's weight comes as a
//   Weight (dense today: a backend throws, naming the call, for a format it cannot read). Ids,
//   positions and indices are i32.
// - "Rows" of a tensor are its leading dimensions flattened; the last dimension is the row.
// - Batch invariance: a row's result never depends on which other rows are in the call or on
//   how many there are (the reduction order for one output is fixed). The CPU backend always
//   honours this; a GPU backend honours it when created with batch_invariant = true.
// - Calls are ordered (a backend may run them asynchronously; synchronize() waits).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/cuda_tuning.h"
#include "core/tensor.h"
#include "core/weight.h"
#include "sampling/sample_row.h"

namespace specdec {

// One forward's ragged batch, as the attention kernels see it: R rows, T new tokens in all.
// Row r owns tokens [row_starts[r], row_starts[r+1]) and, after kv_write, its cache holds
// row_lens[r] positions; its token t (at absolute position positions[t]) attends causally to
// cache positions [0, positions[t]]. All tensors are i32 in the backend's memory.
struct AttentionBatch {
  Tensor positions;    // [T]
  Tensor slots;        // [T]: pool slot = block_id * block_size + offset, where token t's K/V go (-1: nowhere)
  Tensor row_starts;   // [R + 1]
  Tensor row_lens;     // [R]
  Tensor block_table;  // [R, max_blocks]: block ids of each row's cache, in order
  int rows = 0;
  int tokens = 0;
  int max_blocks = 0;
  int block_size = 16;
  int max_row_len = 0;     // max of row_lens (sizes split-K work on GPUs)
  int max_row_tokens = 0;  // max new tokens of one row
};

// One output of Backend::linear_many: out = x · weightᵀ (+ bias, when not empty).
struct Projection {
  Weight weight;  // [N, K]
  Tensor bias;    // [N] f32, or empty
  Tensor out;     // [M, N] f32
};

// A recorded sequence of backend calls (Backend::record).
class RecordedCalls {
 public:
  virtual ~RecordedCalls() = default;
  // Enqueues the recorded calls again. False (and nothing enqueued) when the recording no longer
  // holds, e.g. the backend moved an internal buffer it used: record again.
  virtual bool replay() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual Device device() const = 0;
  // e.g. "cpu-avx512 (2 threads)" or "cuda H200"
  virtual std::string name() const = 0;
  // Element type of the KV pools this backend's attention reads and writes.
  virtual DType kv_dtype() const = 0;

  virtual Buffer allocate(size_t bytes) = 0;
  // Bytes this backend may still allocate, for sizing caches from what is left; 0 where the
  // backend sets no bound of its own (host memory).
  virtual size_t memory_available() const { return 0; }
  // Byte boundary on which a weight this backend reads in place (host memory) must start to be
  // read at full speed; 0 when any start does. The model copies a checkpoint tensor that starts
  // elsewhere (safetensors aligns its tensors to 8 bytes only) into memory of its own.
  virtual size_t weight_alignment() const { return 0; }
  // A dense linear weight laid out the way this backend's linear reads it fastest, in `storage`
  // (allocated here), for Weight::packed; an empty tensor where the backend reads `weight.data`
  // as it is. The same products in the same order either way: a packed weight changes no bits.
  virtual Tensor pack_weight(const Weight& weight, Buffer& storage) {
    (void)weight;
    (void)storage;
    return {};
  }
  // Copies src to dst (same dtype and element count); either may be host memory (Device::cpu).
  // Returns once a host source has been read (the caller may reuse it at once) and once a host
  // destination holds the data; a device-to-device copy may still be queued on return.
  virtual void copy(const Tensor& src, const Tensor& dst) = 0;
  virtual void synchronize() = 0;

  // ---- Results fetched while later calls run ----

  // Whether calls are queued and run while the host goes on (a GPU's), rather than as they come.
  virtual bool queues_calls() const { return false; }

  // Host memory that copy_to_staging fills without the host waiting (page-locked on a GPU).
  virtual Buffer allocate_staging(size_t bytes) { return Buffer::host(bytes); }
  // Queues a copy from this backend's memory into memory from allocate_staging and returns at
  // once; the data is there after wait_for(fence()) taken after the call. A backend that runs
  // calls as they come copies before returning.
  virtual void copy_to_staging(const Tensor& src, const Tensor& dst) { copy(src, dst); }
  // A point in this backend's order of calls: wait_for(it) returns once every call queued before
  // it has finished (and no later one is waited for). 0 where calls run as they come.
  virtual uint64_t fence() { return 0; }
  virtual void wait_for(uint64_t fence) { (void)fence; }

  // out[t, :] = table[ids[t], :] converted to f32. table [V, H], ids [T], out [T, H].
  virtual void embedding(const Tensor& table, const Tensor& ids, const Tensor& out) = 0;
  // out = x / sqrt(mean(x^2) + eps) * weight over the last dimension. weight [D]; in place allowed.
  virtual void rms_norm(const Tensor& x, const Tensor& weight, float eps, const Tensor& out) = 0;
  // out[M, N] = x[M, K] · weight[N, K]ᵀ (+ bias[N]). out must not alias x.
  virtual void linear(const Tensor& x, const Weight& weight, const Tensor* bias, const Tensor& out) = 0;
  // Rotates x [T, heads, head_dim] in place, Hugging Face "rotate_half" layout: for i < d/2,
  // angle = positions[t] * inv_freq[i] (f32 product), (x_i, x_{i+d/2}) rotated by it, then
  // scaled by attention_scaling. inv_freq [head_dim / 2] f32.
  virtual void rope(const Tensor& x, const Tensor& positions, const Tensor& inv_freq, float attention_scaling) = 0;
  // out = silu(gate) * up, all [M, I]; in place into gate allowed.
  virtual void silu_mul(const Tensor& gate, const Tensor& up, const Tensor& out) = 0;
  // out = a + b, same shapes; in place allowed.
  virtual void add(const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  // out[i, :] = x[indices[i], :]. x [T, H], indices [n], out [n, H].
  virtual void gather_rows(const Tensor& x, const Tensor& indices, const Tensor& out) = 0;
  // out[i, :] = fill, then out[i, index[c]] = x[i, c] for every column c whose index lies in
  // [0, V): a reduced vocabulary's logits laid out over the whole one. x [n, C] f32, index [C]
  // i32, out [n, V] f32. Columns sharing a target must hold equal values (any one is written).
  virtual void scatter_columns(const Tensor& x, const Tensor& index, float fill, const Tensor& out) = 0;

  // Writes k, v [T, kv_heads, head_dim] (f32) into the pools at batch.slots.
  // Pools are [num_blocks, block_size, kv_heads, head_dim] of kv_dtype().
  virtual void kv_write(const Tensor& k, const Tensor& v, const Tensor& k_pool, const Tensor& v_pool,
                        const AttentionBatch& batch) = 0;
  // Causal attention of q [T, heads, head_dim] over each row's cached K/V (grouped-query:
  // head h reads kv head h / (heads / kv_heads)); softmax(q·kᵀ · scale) · v into out [T, heads, head_dim].
  virtual void attention(const Tensor& q, const Tensor& k_pool, const Tensor& v_pool, const AttentionBatch& batch,
                         float scale, const Tensor& out) = 0;

  // out[i] = argmax of logits[i, :] (lowest index on ties; -1 for a row holding a NaN, which has
  // no token). logits [n, V] f32, out [n] i32.
  virtual void argmax(const Tensor& logits, const Tensor& out) = 0;
  // out[i] = log of the largest probability in softmax(logits[i, :]), -log Σ_j exp(logits[i, j] - max):
  // how sure a drafter is of its top token. logits [n, V] f32, out [n] f32; NaN for a row
  // holding a NaN. Summed in any order (it feeds a heuristic, never a token).
  virtual void top_logprob(const Tensor& logits, const Tensor& out) = 0;
  // out[i] = the token row i draws under rows[i]: specdec::sample(logits[i, :], rows[i]) (greedy
  // rows take the argmax; otherwise temperature, top-k, top-p, min-p, then the inverse CDF in id
  // order at the row's Philox uniform). logits [n, V] f32; rows [n, kSampleRowWords] i32 holding
  // n valid SampleRows (validate()); out [n] i32. The rows live in this backend's memory, so a
  // recorded call reads whatever was written into them before the replay. A host backend gives
  // exactly sample()'s tokens and throws where it throws (a NaN logit, no finite logit); a device
  // backend writes -1 for such a row instead, and may differ from sample() only where the draw
  // falls within rounding of a CDF or filter boundary (its float sums round differently).
  virtual void sample(const Tensor& logits, const Tensor& rows, const Tensor& out) = 0;

  // ---- Fused forms of the calls above. Each has the numerics of the composition it names
  // (every output is the same dot product, rounded the same way), so a backend may override it
  // to save passes and launches; the defaults here compose the primitive calls. ----

  // projections[j].out = x · projections[j].weight^T (+ bias) for every j: one pass over x.
  virtual void linear_many(const Tensor& x, std::span<const Projection> projections);
  // out = silu(x · w_gateᵀ) * (x · w_upᵀ), [M, I]: the SwiGLU MLP's first half.
  virtual void gated_linear(const Tensor& x, const Weight& w_gate, const Weight& w_up, const Tensor& out);
  // out += x · weightᵀ (+ bias): a projection added into the residual stream. out must not alias x.
  virtual void linear_add(const Tensor& x, const Weight& weight, const Tensor* bias, const Tensor& out);
  // normed = rms_norm(x, norm_weight, eps), then linear_many(normed, projections). A backend may
  // instead fold the norm into the projections' reading of x (the same arithmetic in the same
  // order, so the same bits) and leave `normed` unwritten: to the caller it is scratch.
  virtual void norm_linear_many(const Tensor& x, const Tensor& norm_weight, float eps, const Tensor& normed,
                                std::span<const Projection> projections);
  // normed = rms_norm(x, norm_weight, eps), then gated_linear(normed, w_gate, w_up, out); `normed`
  // is scratch as above.
  virtual void norm_gated_linear(const Tensor& x, const Tensor& norm_weight, float eps, const Tensor& normed,
                                 const Weight& w_gate, const Weight& w_up, const Tensor& out);
  // x += down(silu(gate(rms_norm(x))) * up(rms_norm(x))): norm_gated_linear(x, norm_weight, eps,
  // normed, w_gate, w_up, act), then linear_add(act, w_down, nullptr, x), a SwiGLU MLP added into
  // the residual stream. normed and act are scratch: a backend may hand the product to the down
  // projection in the form that projection reads, and leave act unwritten.
  virtual void norm_mlp_add(const Tensor& x, const Tensor& norm_weight, float eps, const Tensor& normed,
                            const Weight& w_gate, const Weight& w_up, const Tensor& act, const Weight& w_down);
  // rope(q), rope(k), then kv_write(k, v): the new tokens' positions applied and cached.
  virtual void rope_kv_write(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& positions,
                             const Tensor& inv_freq, float attention_scaling, const Tensor& k_pool,
                             const Tensor& v_pool, const AttentionBatch& batch);
  // rope_kv_write(q, k, v, ...), then attention(q, k_pool, v_pool, batch, scale, out): a layer's
  // new tokens rotated, cached and attended in one call. q and k are scratch afterwards (a backend
  // may rotate copies of them and leave them as they were).
  virtual void rope_kv_write_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& positions,
                                       const Tensor& inv_freq, float attention_scaling, const Tensor& k_pool,
                                       const Tensor& v_pool, const AttentionBatch& batch, float scale,
                                       const Tensor& out);

  // ---- Replay of recorded calls (a decode step of a fixed shape, recorded once). ----

  // Records what `enqueue` does into a sequence that replay() repeats on the same buffers, or
  // returns null when this backend cannot record (the caller then just runs its calls). The
  // contract of `enqueue`: only kernel calls (no copies to or from host memory, no
  // synchronize(), no allocate()); every tensor it touches outlives the recording; new inputs
  // are written into those same buffers before each replay.
  virtual std::unique_ptr<RecordedCalls> record(const std::function<void()>& enqueue);

  // ---- Calls whose results decide only speed ----

  // A drafter's proposals that exact verification checks token by token decide how soon the
  // output comes, never what it is. While allowed, a backend created batch invariant runs the
  // calls that follow on its fast kernels (a row's results then depend on its batch, as in the
  // fast mode) where it has them. Returns the previous setting. A backend with one kernel set
  // (the CPU's) ignores it. Results that a row keeps past the round (a drafter's KV of verified
  // positions), or that rejection sampling reads (draft distributions), must not be computed
  // while allowed: they would make the output depend on the batch.
  virtual bool allow_fast_kernels(bool allowed) {
    (void)allowed;
    return false;
  }
};

// Backend::allow_fast_kernels(allowed) for a scope, restoring the previous setting after it.
class FastKernelScope {
 public:
  FastKernelScope(Backend& backend, bool allowed) : backend_(backend), before_(backend.allow_fast_kernels(allowed)) {}
  ~FastKernelScope() { backend_.allow_fast_kernels(before_); }
  FastKernelScope(const FastKernelScope&) = delete;
  FastKernelScope& operator=(const FastKernelScope&) = delete;

 private:
  Backend& backend_;
  bool before_;
};

struct BackendOptions {
  Device device = Device::cpu;
  size_t threads = 0;            // CPU: 0 = all hardware threads
  bool batch_invariant = true;   // GPU: use the batch-invariant kernels
  size_t memory_limit = 0;       // GPU: cap on the memory pool in bytes, 0 = from free memory
  // CPU: "" (AMX where the CPU has it, else "avx512-bf16" where it has AVX-512 BF16, else "best"),
  // "best" (the fastest exact f32 kernels), "avx512", "avx2", "scalar", "avx512-bf16" or "amx".
  std::string cpu_isa;
  // Element type of the KV cache: on the GPU bf16, f16 or f32; on the CPU bf16 where the AMX
  // kernels run (their attention takes bf16 operands), else f32.
  DType kv_dtype = DType::bf16;
  CudaTuning cuda;               // GPU: kernel switches, the measured best by default (cuda_tuning.h)
};

// `weight` with its packed layout where the backend has one (Backend::pack_weight), the packed
// copy's memory appended to `owner`, which must outlive the weight.
Weight with_packed(Backend& backend, Weight weight, std::vector<Buffer>& owner);

// Creates a backend; throws specdec::Error naming what is missing (e.g. no CUDA device).
std::unique_ptr<Backend> make_backend(const BackendOptions& options);
// True when this build has the CUDA backend and a device is present.
bool cuda_available();

}  // namespace specdec
