// The CPU backend's kernels as free functions over validated host tensors, shared by every
// instruction set (the ISA-specific inner loops come in through cpu::Kernels). Each function
// checks its inputs and throws specdec::Error naming the kernel, the tensor and the limit.
#pragma once

#include "backend/backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "core/thread_pool.h"

namespace specdec::cpu {

// Throws unless t is a non-empty host tensor of this dtype ("op: name must be ...").
void check_host(const Tensor& t, const char* op, const char* name);
void check_dtype(const Tensor& t, DType dtype, const char* op, const char* name);
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
void attention(ThreadPool& pool, const Kernels& kernels, const Tensor& q, const Tensor& k_pool,
               const Tensor& v_pool, const AttentionBatch& batch, float scale, const Tensor& out);

}  // namespace specdec::cpu
