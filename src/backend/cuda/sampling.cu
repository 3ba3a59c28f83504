// Token sampling on the device (Backend::sample): one block per logits row runs the host pipeline
// of sampling.cpp — temperature, top-k, top-p, min-p, then the inverse CDF in token-id order at
// the row's Philox uniform — without sorting. The thresholds of top-k and top-p come from a
// search over the order-preserving bits of the values, a fixed number of passes over the row;
// masses are summed in 2^-56 fixed point, so their sums are exact whatever the order. Every
// float sum has a fixed order for the block size, and a block reads only its own row: the token
// is deterministic and batch invariant.
//
// Speed: a row is read from the logits once (the division by the temperature), and once from a
// scratch row holding the scaled logits, which that pass overwrites with exp(scaled - max); every
// later pass reads those weights and does no division or exp. Loads go out in batches so that
// many are in flight per thread. The sums and their orders are exactly those of one pass per use.
#include <cstdint>

#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"
#include "sampling/philox.h"

namespace specdec::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// A threshold search splits its key range into this many buckets per pass (4 bits a pass).
constexpr int kBuckets = 16;
constexpr int kChunkLanes = kThreads / 32;  // chunk sums each lane of warp 0 scans in the CDF
// Loads a thread issues before it uses the first of them: with one block of few warps on an SM,
// a pass is bound by the bytes in flight (the row comes from L2), not by arithmetic.
constexpr int kBatch = 16;
constexpr uint32_t kFull = 0xffffffffu;
// Masses in fixed point: p * 2^56, so a whole distribution (sum ~1) stays far below 2^64 and a
// probability keeps ~2^-56 absolute precision (float gives p about 2^-24 relative).
constexpr double kFixedScale = 72057594037927936.0;  // 2^56

// An order-preserving map of floats to uint32 (larger value, larger key). -0 maps with +0: the
// host compares values, to which the two are equal. NaN never reaches it.
__device__ __forceinline__ uint32_t order_key(float x) {
  const uint32_t b = __float_as_uint(x == 0.0f ? 0.0f : x);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float from_order_key(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

__device__ __forceinline__ unsigned long long to_fixed(float p) {
  return __double2ull_rz(static_cast<double>(p) * kFixedScale);
}
// to_fixed(p) from p's bits, in integer arithmetic, for a finite 0 <= p < 256: p * 2^56 is exact
// in double, so rounding toward zero is a shift of the significand.
__device__ __forceinline__ unsigned long long fixed_from_bits(uint32_t b) {
  const int e = static_cast<int>(b >> 23);
  if (e == 0) return 0;  // zero or subnormal: below 2^-126
  const unsigned long long m = (b & 0x7fffffu) | 0x800000u;
  const int shift = e - 94;  // p = m * 2^(e - 150), so p * 2^56 = m * 2^(e - 94)
  if (shift >= 0) return m << shift;
  return shift > -24 ? m >> -shift : 0;
}

// f(i, a[i]) for this thread's ids i = tid, tid + kThreads, ... in increasing order, as a plain
// strided loop would call it (so sums keep their order), with kBatch loads issued ahead (the last
// batch holds fewer ids). f may overwrite a[i] (the batch is already loaded) but no other element.
template <typename F>
__device__ __forceinline__ void for_each_strided(const float* a, int vocab, const F& f) {
  for (int i = threadIdx.x; i < vocab; i += kBatch * kThreads) {
    float v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int j = i + u * kThreads;
      v[u] = j < vocab ? a[j] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int j = i + u * kThreads;
      if (j < vocab) f(j, v[u]);
    }
  }
}

// Scalars of one search or reduction, shared by the block.
struct Shared {
  double sum_scratch[kWarps];
  unsigned long long bucket[kBuckets];
  uint32_t u32_scratch[3][kWarps];
  uint32_t lo, hi;
  unsigned long long above, at;
  bool found, done;
  int token;
  float best_value[kWarps];
  int best_index[kWarps];
  double chunk[kThreads];   // each thread's sum over its chunk of the final weights
  double incl[kThreads];    // the inclusive CDF at the end of each chunk
  double group[32], base[33];
};

// Sum over the block in a fixed order: a butterfly in each warp (all lanes end equal), then the
// warp sums in warp order. All threads return it.
__device__ double block_sum(double v, Shared& sh) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFull, v, off);
  __syncthreads();  // the scratch may still be read by a previous call
  if (threadIdx.x % 32 == 0) sh.sum_scratch[threadIdx.x / 32] = v;
  __syncthreads();
  double total = 0.0;
  for (int w = 0; w < kWarps; ++w) total += sh.sum_scratch[w];
  return total;
}

// Block-wide max of a, min of b and or of c (integers: any order gives the same).
__device__ void block_max_min_or(uint32_t& a, uint32_t& b, uint32_t& c, Shared& sh) {
  a = __reduce_max_sync(kFull, a);
  b = __reduce_min_sync(kFull, b);
  c = __reduce_or_sync(kFull, c);
  __syncthreads();
  if (threadIdx.x % 32 == 0) {
    sh.u32_scratch[0][threadIdx.x / 32] = a;
    sh.u32_scratch[1][threadIdx.x / 32] = b;
    sh.u32_scratch[2][threadIdx.x / 32] = c;
  }
  __syncthreads();
  for (int w = 0; w < kWarps; ++w) {
    a = max(a, sh.u32_scratch[0][w]);
    b = min(b, sh.u32_scratch[1][w]);
    c |= sh.u32_scratch[2][w];
  }
}

// Keeps (value, index) with the larger value, the lower index on ties; NaN never wins.
__device__ __forceinline__ void argmax_merge(float& v, int& i, float ov, int oi) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

// sampling.cpp's argmax: the first maximum; a row with a NaN has no token (-1), as the host
// refuses it.
__device__ int block_argmax(const float* __restrict__ row, int vocab, Shared& sh) {
  float best = -INFINITY;
  int best_i = vocab;  // "none yet": loses every tie against a real index
  bool nan_seen = false;
  for (int j = threadIdx.x; j < vocab; j += kThreads) {
    nan_seen = nan_seen || isnan(row[j]);
    argmax_merge(best, best_i, row[j], j);
  }
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(kFull, best, off);
    const int oi = __shfl_xor_sync(kFull, best_i, off);
    argmax_merge(best, best_i, ov, oi);
  }
  if (threadIdx.x % 32 == 0) {
    sh.best_value[threadIdx.x / 32] = best;
    sh.best_index[threadIdx.x / 32] = best_i;
  }
  const bool any_nan = __syncthreads_or(nan_seen);
  for (int w = 0; w < kWarps; ++w) argmax_merge(best, best_i, sh.best_value[w], sh.best_index[w]);
  if (any_nan) return -1;
  return best_i >= vocab ? 0 : best_i;  // every logit -inf: index 0
}

// The outcome of threshold_search.
struct Threshold {
  bool found;               // false: even every element together weighs less than the target
  uint32_t key;             // the largest key K with weight(key >= K) >= target
  unsigned long long above;  // weight of the elements with key > K
  unsigned long long at;     // weight of the elements with key == K
};

// Finds the largest key K in [lo, hi] such that the elements with key >= K weigh at least
// `target`, where visit(i, src[i], key) says whether element i takes part and with which key, and
// weight(key) gives its weight (elements with keys above hi must not exist). K and the weights
// above and at it depend only on the elements, not on [lo, hi] or how it is cut. Each pass cuts
// [lo, hi] into kBuckets buckets of a power-of-two width and keeps the one where the weight from
// above crosses the target: at most 8 passes for the full 32-bit range. Buckets are summed in each thread's own
// column of `hist` (no atomics), then over the columns: integer sums, exact in any order.
template <typename Visit, typename Weight>
__device__ Threshold threshold_search(const float* src, const Visit& visit, const Weight& weight, int vocab,
                                      uint32_t lo, uint32_t hi, unsigned long long target,
                                      unsigned long long (*hist)[kThreads], Shared& sh) {
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  unsigned long long above = 0;  // weight of the elements with key > hi
  for (;;) {
    const uint64_t span = static_cast<uint64_t>(hi) - lo;  // width - 1
    int shift = 0;
    while ((span >> shift) >= static_cast<uint64_t>(kBuckets)) ++shift;
    const int used = static_cast<int>(span >> shift) + 1;
    for (int b = 0; b < kBuckets; ++b) hist[b][tid] = 0;
    // A run of elements in one bucket (the common case: most keys share a few buckets) adds up
    // in a register and goes to the column once, rather than a shared-memory update each.
    int run_bucket = -1;
    unsigned long long run = 0;
    for_each_strided(src, vocab, [&](int i, float v) {
      uint32_t key;
      if (!visit(i, v, key) || key < lo || key > hi) return;
      const int b = static_cast<int>((key - lo) >> shift);
      if (b != run_bucket) {
        if (run_bucket >= 0) hist[run_bucket][tid] += run;
        run_bucket = b;
        run = 0;
      }
      run += weight(key);
    });
    if (run_bucket >= 0) hist[run_bucket][tid] += run;
    __syncthreads();
    for (int b = warp; b < kBuckets; b += kWarps) {
      unsigned long long s = 0;
      for (int t = lane; t < kThreads; t += 32) s += hist[b][t];
      for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(kFull, s, off);
      if (lane == 0) sh.bucket[b] = s;
    }
    __syncthreads();
    if (tid == 0) {
      unsigned long long acc = above;
      int b = used - 1;
      for (; b >= 0 && acc + sh.bucket[b] < target; --b) acc += sh.bucket[b];
      if (b < 0) {  // only on the first pass: the whole range weighs less than the target
        sh.found = false;
        sh.done = true;
      } else {
        const uint64_t first = static_cast<uint64_t>(lo) + (static_cast<uint64_t>(b) << shift);
        const uint64_t last = first + ((uint64_t{1} << shift) - 1);
        sh.found = true;
        sh.lo = static_cast<uint32_t>(first);
        sh.hi = static_cast<uint32_t>(last < hi ? last : hi);
        sh.above = acc;
        sh.at = sh.bucket[b];
        sh.done = sh.lo == sh.hi;
      }
    }
    __syncthreads();
    // Every thread reads the verdict before thread 0 can write the next one: that write comes
    // after the next pass's first __syncthreads.
    lo = sh.lo;
    hi = sh.hi;
    above = sh.above;
    if (sh.done) return Threshold{sh.found, lo, above, sh.at};
  }
}

// One row's pipeline state after top-k: its work row, which by then holds each token's e1 =
// exp(scaled - max) (0 for the tokens top-k drops), and each later filter's outcome, so any pass
// can tell whether a token is still in.
struct Row {
  const float* e1;     // the work row
  bool top_p = false;  // top-p ran: keeps p1 > p_level, and p1 == p_level up to id p_last
  float inv1 = 0.0f;   // 1 / the softmax sum after top-k (p1 = e1 * inv1)
  float p_level = 0.0f;
  int p_last = 0;
  bool min_p = false;  // min-p ran: keeps e1 * inv2 >= min_scaled
  float inv2 = 0.0f;
  float min_scaled = 0.0f;

  __device__ bool top_p_keeps(int i, float e) const {
    if (!top_p) return true;
    const float p1 = e * inv1;
    return p1 > p_level || (p1 == p_level && i <= p_last);
  }
  // e = e1[i] if token i is still in after every filter, else 0.
  __device__ float final_of(int i, float e) const {
    if (e == 0.0f || !top_p_keeps(i, e)) return 0.0f;
    if (min_p && e * inv2 < min_scaled) return 0.0f;
    return e;
  }
};

// Sum, in a fixed order, of f(i, src[i]) (a float) over the row.
template <typename F>
__device__ double sum_of(const float* src, const F& f, int vocab, Shared& sh) {
  double acc = 0.0;
  for_each_strided(src, vocab, [&](int i, float v) { acc += static_cast<double>(f(i, v)); });
  return block_sum(acc, sh);
}

__device__ __forceinline__ unsigned long long one_each(uint32_t) { return 1; }

// sampling.cpp's top-p over p1 = e1 * inv1: the boundary level (the largest p whose tokens,
// with every more probable one, reach top_p), then how many of the tokens tied at it stay,
// lowest ids first, as the host's walk in (p desc, id asc) order keeps them.
__device__ void find_top_p(Row& r, float top_p, int vocab, unsigned long long (*hist)[kThreads], Shared& sh) {
  const float inv1 = r.inv1;
  const auto mass = [&](int, float e, uint32_t& key) {
    const float p1 = e * inv1;
    key = __float_as_uint(p1);
    return p1 > 0.0f;  // the host's order holds only positive probabilities
  };
  // The key is p1's bits, and p1 is far below 256 (e1 = exp(scaled - max) is at most about 1, and
  // inv1 at most 1 since the sum holds the maximum's exp(0)): its weight is to_fixed(p1).
  const auto fixed = [](uint32_t key) { return fixed_from_bits(key); };
  const auto target = static_cast<unsigned long long>(ceil(static_cast<double>(top_p) * kFixedScale));
  const Threshold level = threshold_search(r.e1, mass, fixed, vocab, 1u, 0x7f800000u, target, hist, sh);
  r.top_p = true;
  r.p_last = vocab - 1;
  if (!level.found) {  // rounding left the whole mass below top_p: every positive token stays
    r.p_level = __uint_as_float(1u);
    return;
  }
  r.p_level = __uint_as_float(level.key);
  // Tied tokens each added the same fixed-point mass, so the tie count is a quotient.
  unsigned long long tied;
  const unsigned long long one = to_fixed(r.p_level);
  const float pl = r.p_level;
  if (one > 0) {
    tied = level.at / one;
  } else {  // a level below 2^-56: count it
    const auto at_level = [&](int, float e) { return e * inv1 == pl ? 1.0f : 0.0f; };
    tied = static_cast<unsigned long long>(sum_of(r.e1, at_level, vocab, sh));
  }
  // The host keeps a tied token while the mass before it is below top_p: c of them, where
  // above + c * level first reaches top_p.
  const double room = static_cast<double>(top_p) - static_cast<double>(level.above) / kFixedScale;
  const double need = room / static_cast<double>(r.p_level);
  unsigned long long keep = tied;
  if (need < static_cast<double>(tied)) keep = need <= 1.0 ? 1 : static_cast<unsigned long long>(ceil(need));
  if (keep >= tied) return;
  // The keep-th lowest id among the tied tokens: the largest key vocab-1-id with keep at or above.
  const auto tie = [&](int i, float e, uint32_t& key) {
    key = static_cast<uint32_t>(vocab - 1 - i);
    return e * inv1 == pl;
  };
  const Threshold cut =
      threshold_search(r.e1, tie, one_each, vocab, 0u, static_cast<uint32_t>(vocab - 1), keep, hist, sh);
  r.p_last = vocab - 1 - static_cast<int>(cut.key);
}

// The inverse CDF over the final weights w = final e1 * inv3 in token-id order, at u * total.
// Thread t sums the weights of its contiguous chunk of ids; warp 0 turns the chunk sums into an
// inclusive CDF (lane l adds its kChunkLanes chunks in order, lane 0 adds the lanes' totals in
// order); the thread whose chunk holds the crossing walks it. The CDF is non-decreasing and ends
// exactly at the total, so some chunk with weight holds the crossing and the walk returns a
// token of positive weight (its own last one, should rounding keep the walk below the target).
__device__ int inverse_cdf(const Row& r, float inv3, float u, int vocab, Shared& sh) {
  const int tid = threadIdx.x, lane = tid % 32;
  const int chunk = (vocab + kThreads - 1) / kThreads;
  const int begin = min(vocab, tid * chunk), end = min(vocab, begin + chunk);
  double own = 0.0;
  for (int i = begin; i < end; ++i) {
    const float w = r.final_of(i, r.e1[i]) * inv3;
    if (w > 0.0f) own += static_cast<double>(w);
  }
  sh.chunk[tid] = own;
  if (tid == 0) sh.token = -1;
  __syncthreads();
  if (tid < 32) {
    double local[kChunkLanes];
    double acc = 0.0;
    for (int j = 0; j < kChunkLanes; ++j) {
      acc += sh.chunk[lane * kChunkLanes + j];
      local[j] = acc;
    }
    sh.group[lane] = acc;
    __syncwarp();
    if (lane == 0) {
      double b = 0.0;
      for (int g = 0; g < 32; ++g) {
        sh.base[g] = b;
        b += sh.group[g];
      }
      sh.base[32] = b;
    }
    __syncwarp();
    for (int j = 0; j < kChunkLanes; ++j) sh.incl[lane * kChunkLanes + j] = sh.base[lane] + local[j];
  }
  __syncthreads();
  const double total = sh.base[32];
  const double target = static_cast<double>(u) * total;
  const double before = tid == 0 ? 0.0 : sh.incl[tid - 1];
  if (total > 0.0 && sh.incl[tid] > target && before <= target) {
    double cum = before;
    int last = -1;
    for (int i = begin; i < end; ++i) {
      const float w = r.final_of(i, r.e1[i]) * inv3;
      if (!(w > 0.0f)) continue;
      cum += static_cast<double>(w);
      last = i;
      if (cum > target) break;
    }
    sh.token = last;
  }
  __syncthreads();
  return sh.token;
}

__global__ void __launch_bounds__(kThreads)
    sample_kernel(const float* __restrict__ logits, const SampleRow* __restrict__ rows, int* __restrict__ out,
                  float* __restrict__ work_rows, int vocab) {
  enter_kernel();
  __shared__ unsigned long long hist[kBuckets][kThreads];
  __shared__ Shared sh;
  const SampleRow p = rows[blockIdx.x];
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  // Every branch below depends only on this row's parameters and on block-wide values, so the
  // whole block takes it together (each __syncthreads is reached by all threads or none).
  if (!(p.temperature > 0.0f)) {
    const int best = block_argmax(row, vocab, sh);
    if (threadIdx.x == 0) out[blockIdx.x] = best;
    return;
  }

  // The row's work row: the scaled logits, then their weights e1. Until the inverse CDF each
  // thread reads only the elements it wrote itself (for_each_strided's ids); the block sums
  // between order the writes before the inverse CDF reads other threads' chunks.
  float* work = work_rows + static_cast<int64_t>(blockIdx.x) * vocab;
  const float temperature = p.temperature;
  // The scaled logits (the host divides unless T is 1: the same IEEE quotient), their maximum
  // (and minimum, for top-k's range); a NaN or a non-finite maximum is what makes the host's
  // softmax throw: -1.
  uint32_t kmax = 0, kmin = kFull, nan = 0;
  for_each_strided(row, vocab, [&](int i, float l) {
    const float s = temperature == 1.0f ? l : l / temperature;
    work[i] = s;
    if (isnan(s)) {
      nan = 1;
      return;
    }
    const uint32_t k = order_key(s);
    kmax = max(kmax, k);
    kmin = min(kmin, k);
  });
  block_max_min_or(kmax, kmin, nan, sh);
  const float max_scaled = from_order_key(kmax);
  if (nan || !isfinite(max_scaled)) {
    if (threadIdx.x == 0) out[blockIdx.x] = -1;
    return;
  }

  // top-k: the k-th largest scaled logit counted with multiplicity; ties with it stay.
  uint32_t top_k_key = 0;  // top-k keeps scaled logits whose key is >= this (0 keeps all)
  if (p.top_k > 0 && p.top_k < vocab) {
    const auto count = [](int, float s, uint32_t& key) {
      key = order_key(s);
      return true;
    };
    top_k_key =
        threshold_search(work, count, one_each, vocab, kmin, kmax, static_cast<unsigned long long>(p.top_k), hist, sh)
            .key;
  }

  // e1 = exp(scaled - max) of the tokens top-k keeps, else 0 (the host's exp(-inf)), replaces
  // the scaled logit; its sum is the softmax's. Each filter's softmax is over the tokens still
  // in; the maximum never leaves, so it stays.
  double acc = 0.0;
  for_each_strided(work, vocab, [&](int i, float s) {
    const float e = order_key(s) >= top_k_key ? expf(s - max_scaled) : 0.0f;
    work[i] = e;
    acc += static_cast<double>(e);
  });
  double sum = block_sum(acc, sh);
  Row r{work};
  if (p.top_p < 1.0f) {
    r.inv1 = static_cast<float>(1.0 / sum);
    find_top_p(r, p.top_p, vocab, hist, sh);
    const auto in_top_p = [&](int i, float e) { return e != 0.0f && r.top_p_keeps(i, e) ? e : 0.0f; };
    sum = sum_of(work, in_top_p, vocab, sh);
  }
  if (p.min_p > 0.0f) {
    // The largest probability is the maximum's, exp(0) * inv2 = inv2.
    r.inv2 = static_cast<float>(1.0 / sum);
    r.min_scaled = p.min_p * r.inv2;
    r.min_p = true;
    const auto in_min_p = [&](int i, float e) { return r.final_of(i, e); };
    sum = sum_of(work, in_min_p, vocab, sh);
  }
  const float inv3 = static_cast<float>(1.0 / sum);
  const float u = uniform01(p.seed, p.position, 0);  // stream 0: RandomStream::token
  const int token = inverse_cdf(r, inv3, u, vocab, sh);
  if (threadIdx.x == 0) out[blockIdx.x] = token;
}

}  // namespace

void launch_sample(const float* logits, const SampleRow* rows, int* out, float* work, int n, int vocab,
                   const Context& ctx) {
  if (n == 0) return;
  launch(sample_kernel, n, kThreads, 0, ctx, logits, rows, out, work, vocab);
}

}  // namespace specdec::cuda
