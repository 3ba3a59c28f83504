// The CPU backend's kernels as free functions over validated host tensors, shared by every
// instruction set (the ISA-specific inner loops come in through cpu::Kernels). Each function
// checks its inputs and throws specdec::Error naming the kernel, the tensor and the limit.
#pragma once

#include <functional>

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
// Work (element operations) a chunk must reach before it is worth a thread.
constexpr int64_t kMinChunkWork = 1 << 18;

// Rows of t: product of every dimension but the last; the last is the row length.
int64_t row_count(const Tensor& t);
int64_t row_length(const Tensor& t);

void linear(ThreadPool& pool, const Kernels& k, const Tensor& x, const Tensor& weight, const Tensor* bias,
            const Tensor& out);

void embedding(ThreadPool& pool, const Tensor& table, const Tensor& ids, const Tensor& out);
void rms_norm(ThreadPool& pool, const Tensor& x, const Tensor& weight, float eps, const Tensor& out);
void rope(ThreadPool& pool, const Tensor& x, const Tensor& positions, const Tensor& inv_freq, float scaling);
void silu_mul(ThreadPool& pool, const Tensor& gate, const Tensor& up, const Tensor& out);
void add(ThreadPool& pool, const Tensor& a, const Tensor& b, const Tensor& out);
void gather_rows(ThreadPool& pool, const Tensor& x, const Tensor& indices, const Tensor& out);
void argmax(ThreadPool& pool, const Tensor& logits, const Tensor& out);

void kv_write(const Tensor& k, const Tensor& v, const Tensor& k_pool, const Tensor& v_pool,
              const AttentionBatch& batch);
void attention(ThreadPool& pool, const Kernels& kernels, const Tensor& q, const Tensor& k_pool, const Tensor& v_pool,
               const AttentionBatch& batch, float scale, const Tensor& out);

}  // namespace specdec::cpu
