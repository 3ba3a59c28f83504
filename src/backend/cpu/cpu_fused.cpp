// The CPU backend's fused calls (q/k/v in one pass, gate/up with the SwiGLU epilogue, a linear
// with the residual add as its epilogue, RoPE with the KV write): one thread-pool dispatch each
// instead of two to four. Every output is computed by the same kernel calls and the same scalar
// epilogue as the primitive composition, so results are bit-identical to it.
#include <algorithm>
#include <vector>

#include "backend/cpu/cpu_ops.h"

namespace specdec::cpu {
namespace {

// Columns one epilogue pass covers: a gate/up (or h) block of M × kBlock floats stays in L1
// between the kernel writing it and the epilogue reading it.
constexpr int64_t kBlock = 64;

// Multiply-adds a thread's share of a fused linear must reach before the call is split. A
// linear of one or a few rows streams its weights: 2^16 multiply-adds at one row are 128 KB of
// bf16 weights, some microseconds of one core's bandwidth, and two cores stream faster than
// one: a lower threshold than kMinChunkWork keeps a small model's decode projections from
// running on one thread.
constexpr int64_t kMinLinearChunkWork = 1 << 16;

// Runs fn over [0, units) as one dispatch split evenly between the pool's threads (chunks a
// multiple of `align`), or on the calling thread when the whole job is below two shares of
// kMinLinearChunkWork.
void parallel_even(ThreadPool& pool, int64_t units, int64_t work_per_unit, int64_t align,
                   const std::function<void(size_t, size_t)>& fn) {
  if (units <= 0) return;
  const int64_t total = units * std::max<int64_t>(work_per_unit, 1);
  parallel_parts(pool, units, std::min<int64_t>(static_cast<int64_t>(pool.size()), total / kMinLinearChunkWork), align,
                 fn);
}

float* grow(std::vector<float>& scratch, int64_t elements) {
  if (scratch.size() < static_cast<size_t>(elements)) scratch.resize(static_cast<size_t>(elements));
  return scratch.data();
}

}  // namespace

void linear_many(ThreadPool& pool, const Kernels& k, const Tensor& x, std::span<const Projection> projections) {
  Buffer x_bf16;
  std::vector<LinearArgs> args;
  std::vector<int64_t> starts;  // projection j owns columns [starts[j], starts[j + 1]) of the joint range
  args.reserve(projections.size());
  starts.push_back(0);
  for (const Projection& p : projections) {
    // x_bf16 is only shared between projections whose weights are bf16 (the rounded x is the same).
    args.push_back(linear_args(k, x, p.weight, p.bias.empty() ? nullptr : &p.bias, p.out, "linear_many", x_bf16));
    // Each projection's columns start on a multiple of 16 of the joint range, so a thread's chunk
    // (a multiple of 16) starts every projection it touches on a full register tile.
    starts.push_back(starts.back() + (args.back().N + 15) / 16 * 16);
  }
  if (args.empty() || args[0].M == 0) return;
  const int64_t M = args[0].M, K = args[0].K;
  parallel_even(pool, starts.back(), M * K, 16, [&](size_t b, size_t e) {
    for (size_t j = 0; j < args.size(); ++j) {
      const int64_t lo = std::max<int64_t>(static_cast<int64_t>(b), starts[j]) - starts[j];
      const int64_t hi = std::min<int64_t>(static_cast<int64_t>(e), starts[j] + args[j].N) - starts[j];
      if (lo < hi) k.linear(args[j], lo, hi);
    }
  });
}

void gated_linear(ThreadPool& pool, const Kernels& k, const Tensor& x, const Weight& w_gate, const Weight& w_up,
                  const Tensor& out, std::vector<float>& scratch) {
  Buffer x_bf16;
  const LinearArgs gate = linear_args(k, x, w_gate, nullptr, out, "gated_linear", x_bf16);
  // up = x · w_upᵀ goes to scratch [M, N]; the epilogue writes silu(gate) * up over the gate.
  const Tensor up_view(grow(scratch, gate.M * gate.N), DType::f32, {gate.M, gate.N});
  const LinearArgs up = linear_args(k, x, w_up, nullptr, up_view, "gated_linear", x_bf16);
  if (gate.M == 0 || gate.N == 0) return;
  const int64_t M = gate.M, N = gate.N;
  float* o = gate.out;
  const float* u = up.out;
  parallel_even(pool, N, 2 * M * gate.K, 16, [&](size_t b, size_t e) {
    for (int64_t n0 = static_cast<int64_t>(b); n0 < static_cast<int64_t>(e); n0 += kBlock) {
      const int64_t n1 = std::min<int64_t>(n0 + kBlock, static_cast<int64_t>(e));
      k.linear(gate, n0, n1);
      k.linear(up, n0, n1);
      for (int64_t m = 0; m < M; ++m) k.silu_mul(o + m * N + n0, u + m * N + n0, o + m * N + n0, n1 - n0);
    }
  });
}

void linear_add(ThreadPool& pool, const Kernels& k, const Tensor& x, const Weight& weight, const Tensor* bias,
                const Tensor& out, std::vector<float>& scratch) {
  Buffer x_bf16;
  LinearArgs a = linear_args(k, x, weight, bias, out, "linear_add", x_bf16);
  if (a.M == 0 || a.N == 0) return;
  const int64_t M = a.M, N = a.N;
  // h = x · weightᵀ (+ bias) goes to scratch [M, N], then out = out + h: the same two roundings
  // as linear into a temporary followed by add.
  float* o = a.out;
  a.out = grow(scratch, M * N);
  const float* h = a.out;
  parallel_even(pool, N, M * a.K, 16, [&](size_t b, size_t e) {
    for (int64_t n0 = static_cast<int64_t>(b); n0 < static_cast<int64_t>(e); n0 += kBlock) {
      const int64_t n1 = std::min<int64_t>(n0 + kBlock, static_cast<int64_t>(e));
      k.linear(a, n0, n1);
      for (int64_t m = 0; m < M; ++m) {
        for (int64_t n = n0; n < n1; ++n) o[m * N + n] = o[m * N + n] + h[m * N + n];
      }
    }
  });
}

void rope_kv_write(ThreadPool& pool, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& positions,
                   const Tensor& inv_freq, float scaling, const Tensor& k_pool, const Tensor& v_pool,
                   const AttentionBatch& batch) {
  check_rope(q, positions, inv_freq, "rope_kv_write", "q");
  check_rope(k, positions, inv_freq, "rope_kv_write", "k");
  SPECDEC_CHECK(q.dim(0) == k.dim(0) && q.dim(2) == k.dim(2), "rope_kv_write: q ", q.shape_string(), " and k ",
                k.shape_string(), " must have the same tokens and head_dim");
  check_kv_write(k, v, k_pool, v_pool, batch, "rope_kv_write");
  const int64_t T = q.dim(0), d = q.dim(2), half = d / 2;
  const int64_t q_heads = q.dim(1), k_heads = k.dim(1);
  const int32_t* pos = positions.ptr<int32_t>();
  float* qd = q.ptr<float>();
  float* kd = k.ptr<float>();
  // Per token: one cos/sin table for q and k, then k (rotated) and v into the pools. Tokens are
  // independent, so any split gives the same bytes.
  parallel_units(pool, T, (q_heads + k_heads) * d * 8, kMinChunkWork, 1, [&](size_t b, size_t e) {
    std::vector<float> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
    for (int64_t t = static_cast<int64_t>(b); t < static_cast<int64_t>(e); ++t) {
      rope_angles(pos[t], inv_freq.ptr<float>(), half, scaling, c.data(), s.data());
      rope_rotate(qd + t * q_heads * d, q_heads, d, c.data(), s.data());
      rope_rotate(kd + t * k_heads * d, k_heads, d, c.data(), s.data());
      kv_write_token(k, v, k_pool, v_pool, batch, t);
    }
  });
}

}  // namespace specdec::cpu
