// Row-wise and element-wise kernels: embedding, RMSNorm, RoPE, SiLU·mul, add, gather, argmax,
// dtype conversion and bias. Each output depends only on its own row, so all are batch invariant.
#include <algorithm>

#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"

namespace specdec::cuda {
namespace {

template <typename T>
__global__ void embedding_kernel(const T* __restrict__ table, const int* __restrict__ ids, float* __restrict__ out,
                                 int hidden, int vocab) {
  enter_kernel();
  const int t = blockIdx.x;
  const int id = ids[t];
  const bool valid = id >= 0 && id < vocab;
  const T* row = table + static_cast<int64_t>(valid ? id : 0) * hidden;
  float* dst = out + static_cast<int64_t>(t) * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = valid ? to_float(row[i]) : 0.0f;
}

// O = float, or the 16-bit type a tensor-core GEMM reads next: the same f32 value, rounded to
// nearest even, so the bits equal rms_norm followed by launch_convert_f32.
template <typename T, typename O = float>
__global__ void rms_norm_kernel(const float* __restrict__ x, const T* __restrict__ w, float eps, O* out, int dim) {
  enter_kernel();
  __shared__ float scratch[32];
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * dim;
  O* o = out + static_cast<int64_t>(blockIdx.x) * dim;
  const float inv = rms_inverse(xr, dim, eps, scratch);
  // x and out may alias: each element is read above before this loop and written once here.
  for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = from_float<O>((xr[i] * inv) * to_float(w[i]));
}

__global__ void rope_kernel(float* x, const int* __restrict__ positions, const float* __restrict__ inv_freq,
                            float scaling, int heads, int head_dim) {
  enter_kernel();
  const int t = blockIdx.x;
  const int half = head_dim / 2;
  const float pos = static_cast<float>(positions[t]);
  for (int j = threadIdx.x; j < heads * half; j += blockDim.x) {
    const int h = j / half, i = j % half;
    const float angle = pos * inv_freq[i];
    float s, c;
    sincosf(angle, &s, &c);
    float* v = x + (static_cast<int64_t>(t) * heads + h) * head_dim;
    rotate_pair(v[i], v[i + half], c, s, scaling, v[i], v[i + half]);
  }
}

// One thread per rotated pair, kRopeHeads heads of q and k a block (threadIdx.y), every load of
// the launch issued at once: q and k heads rotated as rope_kernel does; a kv head's threads then
// store its rotated k (from their registers) and its v in the pools. With a block per token, each
// thread walked the token's heads in turn: a chain of dependent loads and stores that a one-row
// step waits for; with a block per head, a 256-row step launched ten thousand blocks of two warps.
constexpr int kRopeHeads = 4;

template <typename T>
__global__ void rope_kv_write_kernel(float* q, float* k, const float* __restrict__ v, const int* __restrict__ positions,
                                     const float* __restrict__ inv_freq, float scaling, int heads, int kv_heads,
                                     int head_dim, T* __restrict__ k_pool, T* __restrict__ v_pool,
                                     const int* __restrict__ slots, int64_t pool_slots) {
  enter_kernel();
  const int t = blockIdx.x, h = static_cast<int>(blockIdx.y * blockDim.y + threadIdx.y);
  if (h >= heads + kv_heads) return;
  const int half = head_dim / 2;
  const float pos = static_cast<float>(positions[t]);
  const bool is_k = h >= heads;
  const int kh = h - heads;
  float* x = is_k ? k + (static_cast<int64_t>(t) * kv_heads + kh) * head_dim
                  : q + (static_cast<int64_t>(t) * heads + h) * head_dim;
  const int slot = is_k ? slots[t] : -1;
  const bool store = slot >= 0 && slot < pool_slots;
  // Only a kv head's block stores: the pool row and v of a q head's block are never formed.
  const int64_t row = store ? (static_cast<int64_t>(slot) * kv_heads + kh) * head_dim : 0;
  const float* vs = store ? v + (static_cast<int64_t>(t) * kv_heads + kh) * head_dim : v;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float angle = pos * inv_freq[i];
    float s, c;
    sincosf(angle, &s, &c);
    float a, b;
    rotate_pair(x[i], x[i + half], c, s, scaling, a, b);
    x[i] = a;
    x[i + half] = b;
    if (store) {
      k_pool[row + i] = from_float<T>(a);
      k_pool[row + i + half] = from_float<T>(b);
      v_pool[row + i] = from_float<T>(vs[i]);
      v_pool[row + i + half] = from_float<T>(vs[i + half]);
    }
  }
}

__global__ void silu_mul_kernel(const float* gate, const float* up, float* out, int64_t n) {
  enter_kernel();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = silu_times(gate[i], up[i]);
  }
}

// out[m, j] = silu(gate[m * ld + j]) * up[m * ld + j], in f32 or rounded to 16 bits as
// launch_convert_f32 rounds (from_float<float> is exact); gate and up first rounded to R where
// R is not their own type I.
template <typename I, typename O, typename R = I>
__global__ void silu_mul_rows_kernel(const I* gate, const I* up, int64_t ld, O* out, int M, int n) {
  enter_kernel();
  const int64_t total = int64_t{M} * n;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t at = i / n * ld + i % n;
    float g = to_float(gate[at]), u = to_float(up[at]);
    if constexpr (!std::is_same_v<R, I>) g = to_float(from_float<R>(g)), u = to_float(from_float<R>(u));
    out[i] = from_float<O>(silu_times(g, u));
  }
}

// The same with gate, up and out of one type, 16 bytes of each a thread: rows of n % E == 0
// elements at 16-byte aligned addresses.
template <typename T>
__global__ void silu_mul_rows_vec_kernel(const T* gate, const T* up, int64_t ld, T* out, int M, int n) {
  enter_kernel();
  constexpr int E = 16 / sizeof(T);
  const int per_row = n / E;
  const int64_t total = int64_t{M} * per_row;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t at = i / per_row * ld + i % per_row * E;
    const uint4 g = *reinterpret_cast<const uint4*>(gate + at);
    const uint4 u = *reinterpret_cast<const uint4*>(up + at);
    const T* gs = reinterpret_cast<const T*>(&g);
    const T* us = reinterpret_cast<const T*>(&u);
    uint4 o;
    T* os = reinterpret_cast<T*>(&o);
#pragma unroll
    for (int e = 0; e < E; ++e) os[e] = from_float<T>(silu_times(to_float(gs[e]), to_float(us[e])));
    *reinterpret_cast<uint4*>(out + i * E) = o;
  }
}

__global__ void split_columns_kernel(const float* src, int M, ColumnParts p) {
  enter_kernel();
  const int width = p.n[0] + p.n[1] + p.n[2];
  const int64_t total = int64_t{M} * width;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t m = i / width;
    int c = static_cast<int>(i % width);
    // Constant indices into p only (a computed one would put the parameters in local memory).
    if (c < p.n[0]) {
      p.out[0][m * p.n[0] + c] = src[i];
    } else if ((c -= p.n[0]) < p.n[1]) {
      p.out[1][m * p.n[1] + c] = src[i];
    } else {
      c -= p.n[1];
      p.out[2][m * p.n[2] + c] = src[i];
    }
  }
}

__global__ void add_kernel(const float* a, const float* b, float* out, int64_t n) {
  enter_kernel();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = a[i] + b[i];
}

template <typename U>
__global__ void gather_kernel(const U* __restrict__ x, const int* __restrict__ indices, U* __restrict__ out,
                              int64_t row_elems, int x_rows) {
  enter_kernel();
  const int i = blockIdx.x;
  const int src = indices[i];
  const bool valid = src >= 0 && src < x_rows;
  const U* s = x + static_cast<int64_t>(valid ? src : 0) * row_elems;
  U* d = out + static_cast<int64_t>(i) * row_elems;
  for (int64_t e = threadIdx.x; e < row_elems; e += blockDim.x) d[e] = valid ? s[e] : U(0);
}

// One block a row: the fill first, then (after the block's barrier, so no fill lands on a
// scattered value) the columns at their targets.
__global__ void scatter_columns_kernel(const float* __restrict__ x, const int* __restrict__ index, float fill,
                                       float* __restrict__ out, int columns, int vocab) {
  enter_kernel();
  const int64_t r = blockIdx.x;
  float* dst = out + r * vocab;
  for (int v = threadIdx.x; v < vocab; v += blockDim.x) dst[v] = fill;
  __syncthreads();
  const float* src = x + r * columns;
  for (int c = threadIdx.x; c < columns; c += blockDim.x) {
    const int t = index[c];
    if (t >= 0 && t < vocab) dst[t] = src[c];
  }
}

// Keeps (value, index) with the larger value, the lower index on ties; NaN never wins.
__device__ __forceinline__ void argmax_merge(float& v, int& i, float ov, int oi) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

__global__ void argmax_kernel(const float* __restrict__ logits, int* __restrict__ out, int vocab) {
  enter_kernel();
  __shared__ float sv[32];
  __shared__ int si[32];
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  float best = -INFINITY;
  int best_i = vocab;     // "none yet": loses every tie against a real index
  bool nan_seen = false;  // a NaN logit: the row has no token (the host refuses it too)
  // 16-byte loads when the row is aligned (any visiting order gives the same answer: the
  // maximum with the lowest index is unique).
  const bool vec = vocab % 4 == 0 && reinterpret_cast<uintptr_t>(row) % 16 == 0;
  if (vec) {
    const float4* r4 = reinterpret_cast<const float4*>(row);
    const int n4 = vocab / 4;
#pragma unroll 4
    for (int j = threadIdx.x; j < n4; j += blockDim.x) {
      const float4 v = r4[j];
      nan_seen = nan_seen || isnan(v.x) || isnan(v.y) || isnan(v.z) || isnan(v.w);
      argmax_merge(best, best_i, v.x, 4 * j);
      argmax_merge(best, best_i, v.y, 4 * j + 1);
      argmax_merge(best, best_i, v.z, 4 * j + 2);
      argmax_merge(best, best_i, v.w, 4 * j + 3);
    }
  } else {
    for (int j = threadIdx.x; j < vocab; j += blockDim.x) {
      nan_seen = nan_seen || isnan(row[j]);
      argmax_merge(best, best_i, row[j], j);
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, off);
    const int oi = __shfl_xor_sync(0xffffffffu, best_i, off);
    argmax_merge(best, best_i, ov, oi);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    sv[warp] = best;
    si[warp] = best_i;
  }
  const bool any_nan = __syncthreads_or(nan_seen);
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) argmax_merge(best, best_i, sv[w], si[w]);
    // All -inf: index 0, as a scan that starts from the first element would give.
    out[blockIdx.x] = any_nan ? -1 : best_i >= vocab ? 0 : best_i;
  }
}

// A block's reduction of one value per thread (op: max or sum); every thread gets the result.
template <typename Op>
__device__ float block_reduce(float v, float* shared, Op op) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, off));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = static_cast<int>(blockDim.x / 32);
  __syncthreads();  // the previous reduction's readers of shared are done
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = shared[0];
  for (int w = 1; w < warps; ++w) v = op(v, shared[w]);
  return v;
}

__global__ void top_logprob_kernel(const float* __restrict__ logits, float* __restrict__ out, int vocab) {
  enter_kernel();
  __shared__ float shared[32];
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  float top = -INFINITY;
  bool nan_seen = false;
  for (int j = threadIdx.x; j < vocab; j += blockDim.x) {
    nan_seen = nan_seen || isnan(row[j]);
    top = fmaxf(top, row[j]);
  }
  const bool any_nan = __syncthreads_or(nan_seen);
  top = block_reduce(top, shared, [](float a, float b) { return fmaxf(a, b); });
  float sum = 0.0f;
  for (int j = threadIdx.x; j < vocab; j += blockDim.x) sum += __expf(row[j] - top);
  sum = block_reduce(sum, shared, [](float a, float b) { return a + b; });
  if (threadIdx.x == 0) out[blockIdx.x] = any_nan ? NAN : -logf(sum);
}

template <typename T>
__global__ void convert_kernel(const float* __restrict__ x, T* __restrict__ out, int64_t n) {
  enter_kernel();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = from_float<T>(x[i]);
}

__global__ void add_bias_kernel(float* out, const float* __restrict__ bias, int64_t n, int cols) {
  enter_kernel();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] += bias[i % cols];
}

}  // namespace

void launch_embedding(const void* table, ElemType type, const int* ids, float* out, int tokens, int hidden, int vocab,
                      const Context& ctx) {
  if (tokens == 0) return;
  SPECDEC_DISPATCH_ELEM(
      type, T, launch(embedding_kernel<T>, tokens, 256, 0, ctx, static_cast<const T*>(table), ids, out, hidden, vocab));
}

namespace {
template <typename O>
void launch_rms_norm_as(const float* x, const void* weight, ElemType type, float eps, O* out, int rows, int dim,
                        const Context& ctx) {
  if (rows == 0) return;
  SPECDEC_DISPATCH_ELEM(
      type, T,
      launch(rms_norm_kernel<T, O>, rows, kNormThreads, 0, ctx, x, static_cast<const T*>(weight), eps, out, dim));
}
}  // namespace

void launch_rms_norm(const float* x, const void* weight, ElemType type, float eps, float* out, int rows, int dim,
                     const Context& ctx) {
  launch_rms_norm_as(x, weight, type, eps, out, rows, dim, ctx);
}

void launch_rms_norm_16(const float* x, const void* weight, ElemType type, float eps, void* out, ElemType out_type,
                        int rows, int dim, const Context& ctx) {
  if (out_type == ElemType::bf16)
    launch_rms_norm_as(x, weight, type, eps, static_cast<__nv_bfloat16*>(out), rows, dim, ctx);
  else
    launch_rms_norm_as(x, weight, type, eps, static_cast<__half*>(out), rows, dim, ctx);
}

void launch_rope(float* x, const int* positions, const float* inv_freq, float scaling, int tokens, int heads,
                 int head_dim, const Context& ctx) {
  if (tokens == 0) return;
  launch(rope_kernel, tokens, 256, 0, ctx, x, positions, inv_freq, scaling, heads, head_dim);
}

void launch_rope_kv_write(float* q, float* k, const float* v, const int* positions, const float* inv_freq,
                          float scaling, int tokens, int heads, int kv_heads, int head_dim, void* k_pool, void* v_pool,
                          ElemType pool_type, const int* slots, int64_t pool_slots, const Context& ctx) {
  if (tokens == 0) return;
  SPECDEC_DISPATCH_ELEM(pool_type, T,
                        launch(rope_kv_write_kernel<T>,
                               dim3(static_cast<unsigned>(tokens),
                                    static_cast<unsigned>((heads + kv_heads + kRopeHeads - 1) / kRopeHeads)),
                               dim3(static_cast<unsigned>(std::min(std::max(head_dim / 2, 32), 128)), kRopeHeads), 0,
                               ctx, q, k, v, positions, inv_freq, scaling, heads, kv_heads, head_dim,
                               static_cast<T*>(k_pool), static_cast<T*>(v_pool), slots, pool_slots));
}

void launch_silu_mul(const float* gate, const float* up, float* out, int64_t n, const Context& ctx) {
  if (n == 0) return;
  launch(silu_mul_kernel, blocks_for(n, 256), 256, 0, ctx, gate, up, out, n);
}

void launch_silu_mul_halves(const float* gu, float* out, int M, int n, const Context& ctx) {
  const int64_t total = int64_t{M} * n;
  if (total == 0) return;
  launch(silu_mul_rows_kernel<float, float>, blocks_for(total, 256), 256, 0, ctx, gu, gu + n, int64_t{2} * n, out, M,
         n);
}

void launch_silu_mul_halves_16(const float* gu, void* out, ElemType out_type, int M, int n, const Context& ctx) {
  const int64_t total = int64_t{M} * n;
  if (total == 0) return;
  SPECDEC_DISPATCH_ELEM(out_type, T,
                        launch(silu_mul_rows_kernel<float, T>, blocks_for(total, 256), 256, 0, ctx, gu, gu + n,
                               int64_t{2} * n, static_cast<T*>(out), M, n));
}

void launch_silu_mul_rounded(const float* gate, const float* up, ElemType type, float* out, int M, int n,
                             const Context& ctx) {
  const int64_t total = int64_t{M} * n;
  if (total == 0) return;
  SPECDEC_DISPATCH_ELEM(type, T,
                        launch(silu_mul_rows_kernel<float, float, T>, blocks_for(total, 256), 256, 0, ctx, gate, up,
                               int64_t{n}, out, M, n));
}

void launch_silu_mul_rows_16(const void* gate, const void* up, int64_t ld, ElemType type, void* out, ElemType out_type,
                             int M, int n, const Context& ctx) {
  const int64_t total = int64_t{M} * n;
  if (total == 0) return;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool wide = n % 8 == 0 && ld % 8 == 0 && aligned(gate) && aligned(up) && aligned(out);
  SPECDEC_DISPATCH_ELEM(type, T, {
    const T* g = static_cast<const T*>(gate);
    const T* u = static_cast<const T*>(up);
    if (out_type == ElemType::f32) {
      launch(silu_mul_rows_kernel<T, float>, blocks_for(total, 256), 256, 0, ctx, g, u, ld, static_cast<float*>(out), M,
             n);
    } else if (wide) {
      launch(silu_mul_rows_vec_kernel<T>, blocks_for(total / 8, 256), 256, 0, ctx, g, u, ld, static_cast<T*>(out), M,
             n);
    } else {
      launch(silu_mul_rows_kernel<T, T>, blocks_for(total, 256), 256, 0, ctx, g, u, ld, static_cast<T*>(out), M, n);
    }
  });
}

void launch_split_columns(const float* src, int M, const ColumnParts& parts, const Context& ctx) {
  const int64_t total = int64_t{M} * (parts.n[0] + parts.n[1] + parts.n[2]);
  if (total == 0) return;
  launch(split_columns_kernel, blocks_for(total, 256), 256, 0, ctx, src, M, parts);
}

void launch_add(const float* a, const float* b, float* out, int64_t n, const Context& ctx) {
  if (n == 0) return;
  launch(add_kernel, blocks_for(n, 256), 256, 0, ctx, a, b, out, n);
}

void launch_gather_rows(const void* x, const int* indices, void* out, int count, int64_t row_bytes, int x_rows,
                        const Context& ctx) {
  if (count == 0) return;
  if (row_bytes % 4 == 0) {
    launch(gather_kernel<uint32_t>, count, 256, 0, ctx, static_cast<const uint32_t*>(x), indices,
           static_cast<uint32_t*>(out), row_bytes / 4, x_rows);
  } else if (row_bytes % 2 == 0) {
    launch(gather_kernel<uint16_t>, count, 256, 0, ctx, static_cast<const uint16_t*>(x), indices,
           static_cast<uint16_t*>(out), row_bytes / 2, x_rows);
  } else {
    launch(gather_kernel<uint8_t>, count, 256, 0, ctx, static_cast<const uint8_t*>(x), indices,
           static_cast<uint8_t*>(out), row_bytes, x_rows);
  }
}

void launch_scatter_columns(const float* x, const int* index, float fill, float* out, int rows, int columns, int vocab,
                            const Context& ctx) {
  if (rows == 0) return;
  launch(scatter_columns_kernel, rows, 1024, 0, ctx, x, index, fill, out, columns, vocab);
}

void launch_argmax(const float* logits, int* out, int rows, int vocab, const Context& ctx) {
  if (rows == 0) return;
  launch(argmax_kernel, rows, 1024, 0, ctx, logits, out, vocab);
}

void launch_top_logprob(const float* logits, float* out, int rows, int vocab, const Context& ctx) {
  if (rows == 0) return;
  launch(top_logprob_kernel, rows, 256, 0, ctx, logits, out, vocab);
}

void launch_convert_f32(const float* x, void* out, ElemType type, int64_t n, const Context& ctx) {
  if (n == 0) return;
  SPECDEC_DISPATCH_ELEM(type, T,
                        launch(convert_kernel<T>, blocks_for(n, 256), 256, 0, ctx, x, static_cast<T*>(out), n));
}

void launch_add_bias(float* out, const float* bias, int rows, int cols, const Context& ctx) {
  const int64_t n = static_cast<int64_t>(rows) * cols;
  if (n == 0) return;
  launch(add_bias_kernel, blocks_for(n, 256), 256, 0, ctx, out, bias, n, cols);
}

}  // namespace specdec::cuda
