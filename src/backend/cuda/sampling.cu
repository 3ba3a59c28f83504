// Token sampling on the device (Backend::sample): the host's draw (sampling/draw.h) —
// temperature, top-k, top-p, min-p, then the inverse CDF in token-id order at the row's Philox
// uniform — without sorting. Each token's weight is the host's own exp polynomial (fused
// multiply-adds, so the same bits here), its mass that weight in 2^-40 units, and every decision
// compares integer sums of masses, exact in any order: the device draws the host's token for the
// same logits, bit for bit, and a row's token does not depend on the batch or the launch. The
// thresholds of top-k and top-p come from a search over the order-preserving bits of the values,
// a fixed number of passes over the row.
//
// Speed: the pipeline is a dozen or so passes over the row, each short, so a pass is bound by
// how long one block waits for its loads. A row of 2,048 logits or more is therefore cut into
// parts, one per block of a thread-block cluster, each held in its block's shared memory: the
// logits are read from memory once and every later pass reads shared memory, the blocks
// combining each pass's partial results through distributed shared memory. Shorter rows take one
// block, which reads the logits once and keeps its work row in a scratch row. Either way the
// work values hold the scaled logits after the first pass and exp(scaled - max) after the second,
// so later passes do no division or exp, and loads go out in batches so that many are in flight
// per thread.
#include <cooperative_groups.h>

#include <climits>
#include <cstdint>

#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"
#include "sampling/draw_math.h"
#include "sampling/philox.h"

namespace specdec::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// A threshold search splits its key range into this many buckets per pass (4 bits a pass).
constexpr int kBuckets = 16;
constexpr int kChunkLanes = kThreads / 32;  // chunk sums each lane of warp 0 scans in the CDF
// Loads a thread issues before it uses the first of them: with one block of few warps on an SM,
// a pass is bound by the bytes in flight (the row comes from L2), not by arithmetic.
constexpr int kBatch = 16;
constexpr uint32_t kFull = 0xffffffffu;

// An order-preserving map of floats to uint32 (larger value, larger key). -0 maps with +0: the
// host compares values, to which the two are equal. NaN never reaches it.
__device__ __forceinline__ uint32_t order_key(float x) {
  const uint32_t b = __float_as_uint(x == 0.0f ? 0.0f : x);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float from_order_key(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// f(j, a[j]) for this thread's local indices j = tid, tid + kThreads, ... of a[0, n) in increasing
// order, as a plain strided loop would call it (so sums keep their order), with kBatch loads
// issued ahead (the last batch holds fewer). f may overwrite a[j] (the batch is already loaded)
// but no other element.
template <typename F>
__device__ __forceinline__ void for_each_strided(const float* a, int n, const F& f) {
  for (int i = threadIdx.x; i < n; i += kBatch * kThreads) {
    float v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int j = i + u * kThreads;
      v[u] = j < n ? a[j] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int j = i + u * kThreads;
      if (j < n) f(j, v[u]);
    }
  }
}

// Scalars of one search or reduction, shared by the block; x_*: what the blocks of a cluster
// exchange (two of each, used in turn: see ClusterRow).
struct Shared {
  unsigned long long sum_scratch[kWarps];
  unsigned long long bucket[kBuckets];
  uint32_t u32_scratch[3][kWarps];
  uint32_t lo, hi;
  unsigned long long above, at;
  bool found, done;
  int token;
  float best_value[kWarps];
  int best_index[kWarps];
  unsigned long long chunk[kThreads];  // each thread's sum over its chunk of the final masses
  unsigned long long incl[kThreads];   // the inclusive CDF at the end of each chunk
  unsigned long long group[32], base[33];
  unsigned long long x_sum[2];
  unsigned long long x_bucket[2][kBuckets];
  uint32_t x_u32[2][3];
  float x_best_value[2];
  int x_best_index[2];
};

// Sum over the block: a butterfly in each warp (all lanes end equal), then the warp sums. All
// threads return it.
__device__ unsigned long long block_sum(unsigned long long v, Shared& sh) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFull, v, off);
  __syncthreads();  // the scratch may still be read by a previous call
  if (threadIdx.x % 32 == 0) sh.sum_scratch[threadIdx.x / 32] = v;
  __syncthreads();
  unsigned long long total = 0;
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

// Where a block's part of a row lies and how the parts' results combine. WholeRow: one block
// holds the row, and every combination is the block's own value. ClusterRow: the row is cut into
// kClusterBlocks consecutive parts, one a block of a thread-block cluster; each combination is
// the blocks' values in block order, read from their shared memory, so every block gets the same
// result and takes the same branches. All threads of every block call each combination.
struct WholeRow {
  __device__ bool first() const { return true; }
  __device__ unsigned long long sum(unsigned long long block_total, Shared&) { return block_total; }
  __device__ void max_min_or(uint32_t&, uint32_t&, uint32_t&, Shared&) {}
  // sh.bucket holds the block's bucket totals; afterwards the row's.
  __device__ void buckets(Shared&) {}
  // The row's first maximum (value, index) and whether any block saw a NaN.
  __device__ void argmax(float&, int&, uint32_t&, Shared&) {}
  // The CDF before this block's part (base) and after it (next), and the row's total.
  __device__ void prefix(unsigned long long block_total, unsigned long long& base, unsigned long long& next,
                         unsigned long long& total, Shared&) {
    base = 0;
    next = total = block_total;
  }
  __device__ void finish() {}
};

constexpr int kClusterBlocks = 8;  // the portable cluster size

struct ClusterRow {
  cg::cluster_group cluster = cg::this_cluster();
  // Each exchange writes slot `parity` of its x_ array, waits for the cluster, reads the other
  // blocks' slots and flips parity. A block may write a slot again only two exchanges later,
  // after a cluster barrier that every block reaches once it has read that slot: one barrier an
  // exchange suffices.
  int parity = 0;

  __device__ bool first() const { return cluster.block_rank() == 0; }
  template <typename T>
  __device__ const T& at(const T* p, int rank) const {
    return *cluster.map_shared_rank(const_cast<T*>(p), rank);
  }
  __device__ unsigned long long sum(unsigned long long block_total, Shared& sh) {
    if (threadIdx.x == 0) sh.x_sum[parity] = block_total;
    cluster.sync();
    unsigned long long total = 0;
    for (int r = 0; r < kClusterBlocks; ++r) total += at(&sh.x_sum[parity], r);
    parity ^= 1;
    return total;
  }
  __device__ void max_min_or(uint32_t& a, uint32_t& b, uint32_t& c, Shared& sh) {
    if (threadIdx.x == 0) {
      sh.x_u32[parity][0] = a;
      sh.x_u32[parity][1] = b;
      sh.x_u32[parity][2] = c;
    }
    cluster.sync();
    for (int r = 0; r < kClusterBlocks; ++r) {
      const uint32_t* x = &at(&sh.x_u32[parity][0], r);
      a = max(a, x[0]);
      b = min(b, x[1]);
      c |= x[2];
    }
    parity ^= 1;
  }
  __device__ void buckets(Shared& sh) {
    if (threadIdx.x < kBuckets) sh.x_bucket[parity][threadIdx.x] = sh.bucket[threadIdx.x];
    cluster.sync();
    if (threadIdx.x < kBuckets) {
      unsigned long long s = 0;
      for (int r = 0; r < kClusterBlocks; ++r) s += at(&sh.x_bucket[parity][threadIdx.x], r);
      sh.bucket[threadIdx.x] = s;
    }
    __syncthreads();
    parity ^= 1;
  }
  __device__ void argmax(float& v, int& i, uint32_t& nan, Shared& sh) {
    if (threadIdx.x == 0) {
      sh.x_best_value[parity] = v;
      sh.x_best_index[parity] = i;
      sh.x_u32[parity][0] = nan;
    }
    cluster.sync();
    v = -INFINITY;
    i = INT_MAX;
    for (int r = 0; r < kClusterBlocks; ++r) {
      argmax_merge(v, i, at(&sh.x_best_value[parity], r), at(&sh.x_best_index[parity], r));
      nan |= at(&sh.x_u32[parity][0], r);
    }
    parity ^= 1;
  }
  __device__ void prefix(unsigned long long block_total, unsigned long long& base, unsigned long long& next,
                         unsigned long long& total, Shared& sh) {
    if (threadIdx.x == 0) sh.x_sum[parity] = block_total;
    cluster.sync();
    const int me = static_cast<int>(cluster.block_rank());
    unsigned long long acc = 0;
    for (int r = 0; r < kClusterBlocks; ++r) {
      if (r == me) base = acc;
      acc += at(&sh.x_sum[parity], r);
      if (r == me) next = acc;
    }
    total = acc;
    parity ^= 1;
  }
  // No block may leave while another can still read its shared memory.
  __device__ void finish() { cluster.sync(); }
};

// A block's part of a row: values at local indices [0, n), token ids base + j.
struct Part {
  float* data;
  int base, n;
};

// sampling.cpp's argmax over the row: the first maximum; a row with a NaN has no token (-1), as
// the host refuses it.
template <typename Scope>
__device__ int row_argmax(const float* __restrict__ part, int base, int n, int vocab, Scope& scope, Shared& sh) {
  float best = -INFINITY;
  int best_i = vocab;  // "none yet": loses every tie against a real index
  uint32_t nan_seen = 0;
  for (int j = threadIdx.x; j < n; j += kThreads) {
    const float v = part[j];
    nan_seen |= isnan(v) ? 1u : 0u;
    argmax_merge(best, best_i, v, base + j);
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
  uint32_t any_nan = __syncthreads_or(nan_seen) ? 1u : 0u;
  for (int w = 0; w < kWarps; ++w) argmax_merge(best, best_i, sh.best_value[w], sh.best_index[w]);
  scope.argmax(best, best_i, any_nan, sh);
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

// Finds the largest key K in [lo, hi] such that the row's elements with key >= K weigh at least
// `target`, where visit(id, value, key) says whether an element takes part and with which key,
// and weight(key) gives its weight (elements with keys above hi must not exist). K and the
// weights above and at it depend only on the elements, not on [lo, hi] or how it is cut. Each
// pass cuts [lo, hi] into kBuckets buckets of a power-of-two width and keeps the one where the
// weight from above crosses the target: at most 8 passes for the full 32-bit range. Buckets are
// summed in each thread's own column of `hist` (no atomics), then over the columns and the
// scope's blocks: integer sums, exact in any order.
template <typename Scope, typename Visit, typename Weight>
__device__ Threshold threshold_search(const Part& part, const Visit& visit, const Weight& weight, uint32_t lo,
                                      uint32_t hi, unsigned long long target, unsigned long long (*hist)[kThreads],
                                      Scope& scope, Shared& sh) {
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
    for_each_strided(part.data, part.n, [&](int j, float v) {
      uint32_t key;
      if (!visit(part.base + j, v, key) || key < lo || key > hi) return;
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
    scope.buckets(sh);
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

// One row's pipeline state after top-k: its work values, which by then hold each token's weight
// e = exp(scaled - max) (0 for the tokens top-k drops), and each later filter's outcome, so any
// pass can tell whether a token is still in.
struct Row {
  Part e;              // the work values
  bool top_p = false;  // top-p ran: keeps e > e_level, and e == e_level up to id e_last
  float e_level = 0.0f;
  int e_last = 0;
  float min_p = 0.0f;  // min-p keeps e >= min_p (the largest weight is exp(0) = 1)

  __device__ bool top_p_keeps(int i, float e) const {
    if (!top_p) return true;
    return e > e_level || (e == e_level && i <= e_last);
  }
  // e of token i if it is still in after every filter, else 0.
  __device__ float final_of(int i, float e) const {
    if (e == 0.0f || !top_p_keeps(i, e)) return 0.0f;
    return e < min_p ? 0.0f : e;
  }
};

__device__ __forceinline__ unsigned long long one_each(uint32_t) { return 1; }

// The host's top-p over the weights' masses (`total` of them): the boundary level (the largest
// weight whose tokens, with every heavier one, reach ceil(top_p * total)), then how many of the
// tokens tied at it stay, lowest ids first, as the host keeps them while the mass before each is
// below that share.
template <typename Scope>
__device__ void find_top_p(Row& r, float top_p, unsigned long long total, int vocab,
                           unsigned long long (*hist)[kThreads], Scope& scope, Shared& sh) {
  const auto mass = [](int, float e, uint32_t& key) {
    key = __float_as_uint(e);  // weights are >= 0: ordered as their bits
    return e > 0.0f;
  };
  const unsigned long long need = ceil_share(top_p, total);
  const Threshold level = threshold_search(
      r.e, mass, [](uint32_t key) { return draw_mass_of_bits(key); }, 1u, 0x7f800000u, need, hist, scope, sh);
  r.top_p = true;
  r.e_last = vocab - 1;
  const unsigned long long each = level.found ? draw_mass_of_bits(level.key) : 0;
  if (each == 0) {  // cannot happen (the heaviest token alone weighs 2^40): keep every token
    r.e_level = __uint_as_float(1u);
    return;
  }
  r.e_level = __uint_as_float(level.key);
  // Tied tokens each added the same mass, so the tie count is a quotient.
  const unsigned long long tied = level.at / each;
  const unsigned long long keep = (need - level.above + each - 1) / each;
  if (keep >= tied) return;
  // The keep-th lowest id among the tied tokens: the largest key vocab-1-id with keep at or above.
  const float el = r.e_level;
  const auto tie = [&](int i, float e, uint32_t& key) {
    key = static_cast<uint32_t>(vocab - 1 - i);
    return e == el;
  };
  const Threshold cut =
      threshold_search(r.e, tie, one_each, 0u, static_cast<uint32_t>(vocab - 1), keep, hist, scope, sh);
  r.e_last = vocab - 1 - static_cast<int>(cut.key);
}

// Returned by a block of a cluster whose part does not hold the row's token.
constexpr int kElsewhere = INT_MIN;

// The inverse CDF over the final masses in token-id order: the first token whose cumulative
// mass exceeds target = floor(u * total), u being k / 2^24. Thread t sums the masses of its
// contiguous chunk of the block's part; warp 0 turns the chunk sums into an inclusive CDF; the
// scope places the part's CDF in the row's; the thread whose chunk holds the crossing walks it.
// Integer sums: the CDF is the host's, exactly.
template <typename Scope>
__device__ int inverse_cdf(const Row& r, float u, Scope& scope, Shared& sh) {
  const int tid = threadIdx.x, lane = tid % 32;
  const Part& part = r.e;
  const int chunk = (part.n + kThreads - 1) / kThreads;
  const int begin = min(part.n, tid * chunk), end = min(part.n, begin + chunk);
  unsigned long long own = 0;
  for (int j = begin; j < end; ++j) own += draw_mass(r.final_of(part.base + j, part.data[j]));
  sh.chunk[tid] = own;
  if (tid == 0) sh.token = kElsewhere;
  __syncthreads();
  if (tid < 32) {
    unsigned long long local[kChunkLanes];
    unsigned long long acc = 0;
    for (int j = 0; j < kChunkLanes; ++j) {
      acc += sh.chunk[lane * kChunkLanes + j];
      local[j] = acc;
    }
    sh.group[lane] = acc;
    __syncwarp();
    if (lane == 0) {
      unsigned long long b = 0;
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
  const unsigned long long part_total = sh.base[32];
  unsigned long long base = 0, next = 0, total = 0;
  scope.prefix(part_total, base, next, total, sh);
  if (total == 0) return scope.first() ? -1 : kElsewhere;
  const unsigned long long target = draw_target(u, total);
  // Exactly one part holds the crossing: the parts' ranges [base, next) tile [0, total), and
  // target < total since u < 1.
  if (!(base <= target && target < next)) return kElsewhere;
  const unsigned long long t = target - base;
  const unsigned long long before = tid == 0 ? 0 : sh.incl[tid - 1];
  if (sh.incl[tid] > t && before <= t) {
    unsigned long long cum = before;
    int token = -1;
    for (int j = begin; j < end; ++j) {
      cum += draw_mass(r.final_of(part.base + j, part.data[j]));
      if (cum > t) {
        token = part.base + j;
        break;
      }
    }
    sh.token = token;
  }
  __syncthreads();
  return sh.token;
}

// The host pipeline of sampling.cpp for one row, over the scope's part of it: `row` points at
// the logits of the part, `work` at room for the part's values (where the logits may not be
// written). Returns the token, -1 where the host would refuse the row, or kElsewhere in the
// blocks of a cluster whose part does not hold the token.
template <typename Scope>
__device__ int sample_row(const float* __restrict__ row, float* work, int base, int n, int vocab, const SampleRow& p,
                          unsigned long long (*hist)[kThreads], Scope& scope, Shared& sh) {
  // Every branch below depends only on this row's parameters and on values every block of the
  // scope holds alike, so the whole scope takes it together (each barrier is reached by all
  // threads or none).
  if (!(p.temperature > 0.0f)) {
    const int best = row_argmax(row, base, n, vocab, scope, sh);
    return scope.first() ? best : kElsewhere;
  }

  // The part's work values: the scaled logits, then their weights e. Until the inverse CDF each
  // thread reads only the elements it wrote itself (for_each_strided's indices); the block sums
  // between order the writes before the inverse CDF reads other threads' chunks.
  const float temperature = p.temperature;
  // The scaled logits (the host divides unless T is 1: the same IEEE quotient), their maximum
  // (and minimum, for top-k's range); a NaN or a non-finite maximum is what makes the host's
  // softmax throw: -1.
  uint32_t kmax = 0, kmin = kFull, nan = 0;
  for_each_strided(row, n, [&](int j, float l) {
    const float s = temperature == 1.0f ? l : l / temperature;
    work[j] = s;
    if (isnan(s)) {
      nan = 1;
      return;
    }
    const uint32_t k = order_key(s);
    kmax = max(kmax, k);
    kmin = min(kmin, k);
  });
  block_max_min_or(kmax, kmin, nan, sh);
  scope.max_min_or(kmax, kmin, nan, sh);
  const float max_scaled = from_order_key(kmax);
  if (nan || !isfinite(max_scaled)) return scope.first() ? -1 : kElsewhere;

  const Part part{work, base, n};
  // top-k: the k-th largest scaled logit counted with multiplicity; ties with it stay.
  uint32_t top_k_key = 0;  // top-k keeps scaled logits whose key is >= this (0 keeps all)
  if (p.top_k > 0 && p.top_k < vocab) {
    const auto count = [](int, float s, uint32_t& key) {
      key = order_key(s);
      return true;
    };
    top_k_key =
        threshold_search(part, count, one_each, kmin, kmax, static_cast<unsigned long long>(p.top_k), hist, scope, sh)
            .key;
  }

  // e = exp(scaled - max) of the tokens top-k keeps, else 0 (the host's weight of -inf),
  // replaces the scaled logit. The maximum weighs exp(0) = 1 and survives every filter.
  unsigned long long acc = 0;
  for_each_strided(work, n, [&](int j, float s) {
    const float e = order_key(s) >= top_k_key ? draw_weight(__fsub_rn(s, max_scaled)) : 0.0f;
    work[j] = e;
    acc += draw_mass(e);
  });
  const unsigned long long total = scope.sum(block_sum(acc, sh), sh);
  Row r{part};
  if (p.top_p < 1.0f) find_top_p(r, p.top_p, total, vocab, hist, scope, sh);
  r.min_p = p.min_p;
  const float u = uniform01(p.seed, p.position, 0);  // stream 0: RandomStream::token
  return inverse_cdf(r, u, scope, sh);
}

// One block a row; the work values in the scratch rows.
__global__ void __launch_bounds__(kThreads)
    sample_kernel(const float* __restrict__ logits, const SampleRow* __restrict__ rows, int* __restrict__ out,
                  float* __restrict__ work_rows, int vocab) {
  enter_kernel();
  __shared__ unsigned long long hist[kBuckets][kThreads];
  __shared__ Shared sh;
  const SampleRow p = rows[blockIdx.x];
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  float* work = work_rows + static_cast<int64_t>(blockIdx.x) * vocab;
  WholeRow scope;
  const int token = sample_row(row, work, 0, vocab, vocab, p, hist, scope, sh);
  scope.finish();
  if (threadIdx.x == 0) out[blockIdx.x] = token;
}

// One cluster of kClusterBlocks blocks a row, block b holding ids [b * part, (b + 1) * part) of
// it in its shared memory: the row is read from memory once, and each of the pipeline's dozen
// or so passes reads a block's part from shared memory, where one block for the whole row waits
// on the L2 for each.
__global__ void __launch_bounds__(kThreads)
    sample_cluster_kernel(const float* __restrict__ logits, const SampleRow* __restrict__ rows, int* __restrict__ out,
                          int vocab, int part) {
  enter_kernel();
  extern __shared__ float work[];
  __shared__ unsigned long long hist[kBuckets][kThreads];
  __shared__ Shared sh;
  ClusterRow scope;
  const int r = static_cast<int>(blockIdx.x) / kClusterBlocks;
  const int base = static_cast<int>(scope.cluster.block_rank()) * part;
  const int n = max(0, min(part, vocab - base));
  const SampleRow p = rows[r];
  const int token =
      sample_row(logits + static_cast<int64_t>(r) * vocab + base, work, base, n, vocab, p, hist, scope, sh);
  scope.finish();
  if (threadIdx.x == 0 && token != kElsewhere) out[r] = token;
}

// Below this many logits a row is drawn by one block: its passes are short already.
constexpr int kClusterMinVocab = 2048;
// Shared memory a cluster block may take for its part of the row, beside its static arrays.
constexpr int kMaxPartBytes = 160 * 1024;

}  // namespace

void launch_sample(const float* logits, const SampleRow* rows, int* out, float* work, int n, int vocab,
                   const Context& ctx) {
  if (n == 0) return;
  const int part = (vocab + kClusterBlocks - 1) / kClusterBlocks;
  const size_t part_bytes = static_cast<size_t>(part) * sizeof(float);
  if (!ctx.tuning.cluster_sampling || vocab < kClusterMinVocab || part_bytes > kMaxPartBytes) {
    launch(sample_kernel, n, kThreads, 0, ctx, logits, rows, out, work, vocab);
    return;
  }
  static const bool sized = [] {
    return cudaFuncSetAttribute(sample_cluster_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxPartBytes) ==
           cudaSuccess;
  }();
  (void)sized;  // a failure shows as the launch's error
  launch_clustered(sample_cluster_kernel, static_cast<unsigned>(n) * kClusterBlocks, kThreads, part_bytes,
                   kClusterBlocks, ctx, logits, rows, out, vocab, part);
}

}  // namespace specdec::cuda
