// The CPU backend's kernels as free functions over validated host tensors, shared by every
// instruction set (the ISA-specific inner loops come in through cpu::Kernels). Each function
// checks its inputs and throws specdec::Error naming the kernel, the tensor and the limit.
#pragma once

#include <cmath>
#include <functional>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "core/thread_pool.h"

namespace specdec::cpu {

// Throws unless t is a non-empty host tensor of this dtype ("op: name must be ...").
void check_host(const Tensor& t, const char* op, const char* name);
void check_dtype(const Tensor& t, DType dtype, const char* op, const char* name);
// Runs fn over [0, units) on the pool in chunks of at least `min_work` (in work_per_unit's
// units) and a multiple of `align` units; small jobs stay on the calling thread, since waking
// the pool costs microseconds. Chunking never changes results: kernels keep each output's
// arithmetic inside one unit.
void parallel_units(ThreadPool& pool, int64_t units, int64_t work_per_unit, int64_t min_work, int64_t align,
                    const std::function<void(size_t, size_t)>& fn);
// Runs fn over [0, units) in `parts` chunks of equal size (a multiple of `align` units, the last
// shorter), on the calling thread when parts <= 1.
void parallel_parts(ThreadPool& pool, int64_t units, int64_t parts, int64_t align,
                    const std::function<void(size_t, size_t)>& fn);
// Work (element operations) a chunk must reach before it is worth a thread.
constexpr int64_t kMinChunkWork = 1 << 18;

// Rows of t: product of every dimension but the last; the last is the row length.
int64_t row_count(const Tensor& t);
int64_t row_length(const Tensor& t);

// Validates one linear call (errors name `op`) and fills its kernel arguments. When the kernel
// wants bf16 activations and x_bf16 is empty, x is rounded into it; a caller running several
// projections of the same x passes the same buffer so x is rounded once.
LinearArgs linear_args(const Kernels& k, const Tensor& x, const Weight& weight, const Tensor* bias, const Tensor& out,
                       const char* op, Buffer& x_bf16);
void linear(ThreadPool& pool, const Kernels& k, const Tensor& x, const Weight& weight, const Tensor* bias,
            const Tensor& out);

// RoPE pieces shared by rope and rope_kv_write: the scaled cos/sin of one position (half
// entries each), and the rotation of `heads` consecutive heads of length d in place.
void rope_angles(int32_t position, const float* inv_freq, int64_t half, float scaling, float* c, float* s);
void rope_rotate(float* x, int64_t heads, int64_t d, const float* c, const float* s);
void check_rope(const Tensor& x, const Tensor& positions, const Tensor& inv_freq, const char* op, const char* name);
// kv_write in two halves: validation of the whole call, then one token's copy into the pools.
void check_kv_write(const Tensor& k, const Tensor& v, const Tensor& k_pool, const Tensor& v_pool,
                    const AttentionBatch& batch, const char* op);
void kv_write_token(const Tensor& k, const Tensor& v, const Tensor& k_pool, const Tensor& v_pool,
                    const AttentionBatch& batch, int64_t t);

void embedding(ThreadPool& pool, const Tensor& table, const Tensor& ids, const Tensor& out);
void rms_norm(ThreadPool& pool, const Tensor& x, const Tensor& weight, float eps, const Tensor& out);
void rope(ThreadPool& pool, const Tensor& x, const Tensor& positions, const Tensor& inv_freq, float scaling);
void silu_mul(ThreadPool& pool, const Kernels& k, const Tensor& gate, const Tensor& up, const Tensor& out);
void add(ThreadPool& pool, const Tensor& a, const Tensor& b, const Tensor& out);
void gather_rows(ThreadPool& pool, const Tensor& x, const Tensor& indices, const Tensor& out);
void scatter_columns(ThreadPool& pool, const Tensor& x, const Tensor& index, float fill, const Tensor& out);
void argmax(ThreadPool& pool, const Tensor& logits, const Tensor& out);
void top_logprob(ThreadPool& pool, const Kernels& k, const Tensor& logits, const Tensor& out);
// Backend::sample: specdec::sample on every row, rows spread over the pool.
void sample(ThreadPool& pool, const Tensor& logits, const Tensor& rows, const Tensor& out);

// The fused calls (cpu_fused.cpp): the numerics of the compositions named in backend.h, in one
// pass over the pool each. `scratch` is the caller's reusable host memory.
void linear_many(ThreadPool& pool, const Kernels& k, const Tensor& x, std::span<const Projection> projections);
void gated_linear(ThreadPool& pool, const Kernels& k, const Tensor& x, const Weight& w_gate, const Weight& w_up,
                  const Tensor& out, std::vector<float>& scratch);
void linear_add(ThreadPool& pool, const Kernels& k, const Tensor& x, const Weight& weight, const Tensor* bias,
                const Tensor& out, std::vector<float>& scratch);
void rope_kv_write(ThreadPool& pool, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& positions,
                   const Tensor& inv_freq, float scaling, const Tensor& k_pool, const Tensor& v_pool,
                   const AttentionBatch& batch);

void kv_write(const Tensor& k, const Tensor& v, const Tensor& k_pool, const Tensor& v_pool,
              const AttentionBatch& batch);
void attention(ThreadPool& pool, const Kernels& kernels, const Tensor& q, const Tensor& k_pool, const Tensor& v_pool,
               const AttentionBatch& batch, float scale, const Tensor& out);

}  // namespace specdec::cpu
