// kv_write + attention over paged pools on every instruction set this CPU has: against a
// double-precision causal GQA reference, and bit-exact invariance of a row's outputs whether it
// runs alone or beside other rows, and whether its tokens arrive as one chunk, one by one, or in
// windows of 3 (the cache filled incrementally), with 1, 2 or 4 threads.
#include <gtest/gtest.h>

#include <numeric>

#include "cpu_test_util.h"

namespace specdec::test {
namespace {

constexpr int64_t kHeads = 12, kKvHeads = 2, kBlocks = 128, kMaxBlocks = 24;
int64_t kBlock = 4;  // positions a cache block holds in the current test
// Head dims the tests sweep: below one vector, the common 64 and 128, and ragged tails past them.
constexpr int64_t kDims[] = {20, 64, 80, 128, 136, 264};
int64_t kDim = 20;  // the head dim of the current sweep step
// The pools' element type in the current test (bf16: the amx kernels' cache).
DType g_pool_type = DType::f32;

// One sequence's data: q/k/v for each of its tokens, and its place in the pools.
struct Seq {
  int64_t len = 0;
  std::vector<float> q, k, v;   // [len, heads|kv_heads, dim]
  std::vector<int32_t> blocks;  // block table
  int64_t cached = 0;           // positions already in the pools
  std::vector<float> out;       // [len, heads, dim], filled as tokens are processed

  Seq(std::mt19937& rng, int64_t n, std::vector<int32_t> table) : len(n), blocks(std::move(table)) {
    for (int64_t i = 0; i < n * kHeads * kDim; ++i) q.push_back(nonzero(rng));
    for (int64_t i = 0; i < n * kKvHeads * kDim; ++i) k.push_back(nonzero(rng) * 2.0f);
    for (int64_t i = 0; i < n * kKvHeads * kDim; ++i) v.push_back(nonzero(rng));
    out.assign(static_cast<size_t>(n * kHeads * kDim), 0.0f);
  }
};

struct Pools {
  HostTensor k{g_pool_type, {kBlocks, kBlock, kKvHeads, kDim}};
  HostTensor v{g_pool_type, {kBlocks, kBlock, kKvHeads, kDim}};
};

float scale_for_dim() { return 1.0f / std::sqrt(static_cast<float>(kDim)); }

// One forward: each (seq, count) pair brings the seq's next `count` tokens.
void step(Backend& backend, Pools& pools, const std::vector<std::pair<Seq*, int64_t>>& segs) {
  const int64_t R = static_cast<int64_t>(segs.size());
  int64_t T = 0;
  for (const auto& [s, n] : segs) T += n;
  HostTensor positions(DType::i32, {T}), slots(DType::i32, {T}), starts(DType::i32, {R + 1}), lens(DType::i32, {R}),
      table(DType::i32, {R, kMaxBlocks});
  HostTensor q(DType::f32, {T, kHeads, kDim}), k(DType::f32, {T, kKvHeads, kDim}), v(DType::f32, {T, kKvHeads, kDim});
  HostTensor out(DType::f32, {T, kHeads, kDim});
  AttentionBatch b;
  b.rows = static_cast<int>(R);
  b.tokens = static_cast<int>(T);
  b.max_blocks = static_cast<int>(kMaxBlocks);
  b.block_size = static_cast<int>(kBlock);
  int64_t t = 0;
  for (int64_t r = 0; r < R; ++r) {
    Seq& s = *segs[static_cast<size_t>(r)].first;
    const int64_t n = segs[static_cast<size_t>(r)].second;
    starts.i()[r] = static_cast<int32_t>(t);
    lens.i()[r] = static_cast<int32_t>(s.cached + n);
    for (int64_t j = 0; j < kMaxBlocks; ++j) table.i()[r * kMaxBlocks + j] = s.blocks[static_cast<size_t>(j)];
    for (int64_t i = 0; i < n; ++i, ++t) {
      const int64_t p = s.cached + i;
      positions.i()[t] = static_cast<int32_t>(p);
      slots.i()[t] = static_cast<int32_t>(s.blocks[static_cast<size_t>(p / kBlock)] * kBlock + p % kBlock);
      std::memcpy(q.f() + t * kHeads * kDim, s.q.data() + p * kHeads * kDim, kHeads * kDim * sizeof(float));
      std::memcpy(k.f() + t * kKvHeads * kDim, s.k.data() + p * kKvHeads * kDim, kKvHeads * kDim * sizeof(float));
      std::memcpy(v.f() + t * kKvHeads * kDim, s.v.data() + p * kKvHeads * kDim, kKvHeads * kDim * sizeof(float));
    }
    b.max_row_len = std::max<int>(b.max_row_len, lens.i()[r]);
    b.max_row_tokens = std::max<int>(b.max_row_tokens, static_cast<int>(n));
  }
  starts.i()[R] = static_cast<int32_t>(T);
  b.positions = positions.t;
  b.slots = slots.t;
  b.row_starts = starts.t;
  b.row_lens = lens.t;
  b.block_table = table.t;
  backend.kv_write(k.t, v.t, pools.k.t, pools.v.t, b);
  backend.attention(q.t, pools.k.t, pools.v.t, b, scale_for_dim(), out.t);
  t = 0;
  for (const auto& [s, n] : segs) {
    std::memcpy(s->out.data() + s->cached * kHeads * kDim, out.f() + t * kHeads * kDim,
                static_cast<size_t>(n * kHeads * kDim) * sizeof(float));
    s->cached += n;
    t += n;
  }
}

// Distinct blocks for each of `rows` sequences, shuffled so tables are not in pool order.
std::vector<std::vector<int32_t>> block_tables(std::mt19937& rng, int rows) {
  std::vector<int32_t> ids(kBlocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<std::vector<int32_t>> tables;
  for (int r = 0; r < rows; ++r) tables.emplace_back(ids.begin() + r * kMaxBlocks, ids.begin() + (r + 1) * kMaxBlocks);
  return tables;
}

class CpuAttention : public ::testing::TestWithParam<std::string> {};

// The operands as the kernel takes them: bf16 where the ISA rounds them (amx under bf16_operands).
double operand(float x, bool rounded) { return rounded ? bf16_to_f32(f32_to_bf16(x)) : x; }

// Every token of rows of 13, 5 and 29 positions (the last also in a call of 20 tokens), and of a
// row of `long_len` (two calls) when not 0, against the double-precision reference of the
// operands as taken; outputs within `tol` of the sum of the terms' magnitudes.
void expect_matches_reference(const std::string& isa, bool rounded, double tol, int64_t long_len) {
  for (int64_t dim : kDims) {
    kDim = dim;
    std::mt19937 rng(21);
    auto backend = make_cpu(isa, 2);
    Pools pools;
    auto tables = block_tables(rng, 4);
    Seq a(rng, 13, tables[0]), b(rng, 5, tables[1]), c(rng, 29, tables[2]),
        d(rng, std::max<int64_t>(long_len, 1), tables[3]);
    step(*backend, pools, {{&a, 6}, {&b, 5}, {&c, 20}});
    step(*backend, pools, {{&c, 9}, {&a, 7}});
    std::vector<const Seq*> checked{&a, &b, &c};
    if (long_len > 0) {
      step(*backend, pools, {{&d, long_len - 17}});
      step(*backend, pools, {{&d, 17}});
      checked.push_back(&d);
    }
    for (const Seq* s : checked) {
      for (int64_t t = 0; t < s->len; ++t) {
        for (int64_t h = 0; h < kHeads; ++h) {
          const int64_t kvh = h / (kHeads / kKvHeads);
          std::vector<double> w(static_cast<size_t>(t + 1));
          double mx = -1e300, sum = 0;
          for (int64_t j = 0; j <= t; ++j) {
            double dot = 0;
            for (int64_t i = 0; i < kDim; ++i) {
              dot += operand(s->q[static_cast<size_t>((t * kHeads + h) * kDim + i)], rounded) *
                     operand(s->k[static_cast<size_t>((j * kKvHeads + kvh) * kDim + i)], rounded);
            }
            w[static_cast<size_t>(j)] = dot * scale_for_dim();
            mx = std::max(mx, w[static_cast<size_t>(j)]);
          }
          for (double& x : w) sum += (x = std::exp(x - mx));
          for (int64_t i = 0; i < kDim; ++i) {
            double ref = 0, mag = 0;
            for (int64_t j = 0; j <= t; ++j) {
              const double term = w[static_cast<size_t>(j)] / sum *
                                  operand(s->v[static_cast<size_t>((j * kKvHeads + kvh) * kDim + i)], rounded);
              ref += term;
              mag += std::fabs(term);
            }
            ASSERT_NEAR(s->out[static_cast<size_t>((t * kHeads + h) * kDim + i)], ref, tol * mag)
                << "head_dim " << kDim << " len " << s->len << " token " << t << " head " << h << " dim " << i;
          }
        }
      }
    }
  }
}

TEST_P(CpuAttention, MatchesDoubleReference) { expect_matches_reference(GetParam(), false, 1e-5, 0); }

// One row of `len` tokens (a multiple of 3), bit for bit: alone or between other rows, as one
// chunk, one token a call or windows of 3, with 1, 2 or 4 threads.
void expect_row_invariant(const std::string& isa, int64_t len) {
  for (int64_t dim : kDims) {
    kDim = dim;
    std::vector<std::vector<float>> results;
    for (size_t threads : {1, 2, 4}) {  // 4: heads sharing a kv head get split over threads
      auto backend = make_cpu(isa, threads);
      for (int mode = 0; mode < 5; ++mode) {
        std::mt19937 rng(33);  // same data for every mode
        auto tables = block_tables(rng, 3);
        Seq row(rng, len, tables[0]), left(rng, 30, tables[1]),
            right(rng, std::max<int64_t>(9, 4 + len / 3), tables[2]);
        Pools pools;
        switch (mode) {
          case 0:  // alone, one chunk
            step(*backend, pools, {{&row, len}});
            break;
          case 1:  // one-token calls
            for (int64_t i = 0; i < len; ++i) step(*backend, pools, {{&row, 1}});
            break;
          case 2:  // windows of 3
            for (int64_t i = 0; i < len / 3; ++i) step(*backend, pools, {{&row, 3}});
            break;
          case 3:  // one chunk between two other rows
            step(*backend, pools, {{&left, 30}, {&row, len}, {&right, right.len}});
            break;
          case 4:  // windows of 3 beside rows that are decoding, then prefilling
            step(*backend, pools, {{&left, 20}, {&right, 4}});
            for (int64_t i = 0; i < len / 3; ++i)
              step(*backend, pools, {{&right, 1}, {&row, 3}, {&left, i < 2 ? 5 : 0}});
            break;
        }
        results.push_back(row.out);
      }
    }
    for (size_t i = 1; i < results.size(); ++i) {
      ASSERT_TRUE(same_bits(results[0].data(), results[i].data(), results[0].size()))
          << "head_dim " << kDim << " config " << i;
    }
  }
}

TEST_P(CpuAttention, RowOutputIgnoresNeighboursChunkingAndThreads) { expect_row_invariant(GetParam(), 12); }

TEST_P(CpuAttention, RefusesPositionsOutsideTheCache) {
  std::mt19937 rng(5);
  auto backend = make_cpu(GetParam(), 1);
  Pools pools;
  auto tables = block_tables(rng, 1);
  Seq s(rng, 4, tables[0]);
  step(*backend, pools, {{&s, 4}});
  HostTensor positions(DType::i32, {1}), slots(DType::i32, {1}), starts(DType::i32, {2}), lens(DType::i32, {1}),
      table(DType::i32, {1, kMaxBlocks}), q = random_f32(rng, {1, kHeads, kDim}), out(DType::f32, {1, kHeads, kDim});
  positions.i()[0] = 4;  // the cache holds positions 0..3 only
  slots.i()[0] = 0;
  starts.i()[0] = 0;
  starts.i()[1] = 1;
  lens.i()[0] = 4;
  std::memcpy(table.i(), s.blocks.data(), kMaxBlocks * sizeof(int32_t));
  AttentionBatch b{
      positions.t, slots.t, starts.t, lens.t, table.t, 1, 1, static_cast<int>(kMaxBlocks), static_cast<int>(kBlock),
      4,           1};
  EXPECT_THROW(backend->attention(q.t, pools.k.t, pools.v.t, b, scale_for_dim(), out.t), Error);
  positions.i()[0] = 3;
  table.i()[0] = static_cast<int32_t>(kBlocks);
  EXPECT_THROW(backend->attention(q.t, pools.k.t, pools.v.t, b, scale_for_dim(), out.t), Error);
  slots.i()[0] = static_cast<int32_t>(kBlocks * kBlock);
  HostTensor kv = random_f32(rng, {1, kKvHeads, kDim});
  EXPECT_THROW(backend->kv_write(kv.t, kv.t, pools.k.t, pools.v.t, b), Error);
}

INSTANTIATE_TEST_SUITE_P(Isa, CpuAttention, ::testing::ValuesIn(cpu_isas()), isa_name);

// A bf16 cache, which only the amx kernels read: against the reference of the rounded operands
// (q, K and V; what is left is the softmax weights' rounding, ~2^-9 of each term) and bit for bit
// across chunking, neighbours and threads, where a long row's tokens take several 32-position
// chunks and query tiles. Blocks of 4 positions here take the keys' copied tiles; blocks of 16
// (the cache's default) read them from the cache itself, as the model tests do.
class CpuAttentionBf16Cache : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { g_pool_type = DType::bf16; }
  void TearDown() override { g_pool_type = DType::f32; }
};

TEST_P(CpuAttentionBf16Cache, MatchesReferenceOfTheOperandsTaken) {
  if (GetParam() != "amx") GTEST_SKIP() << "only the amx kernels read a bf16 cache";
  for (int64_t block : {4, 16}) {
    kBlock = block;
    expect_matches_reference(GetParam(), true, 5e-3, 90);
  }
  kBlock = 4;
}

TEST_P(CpuAttentionBf16Cache, RowOutputIgnoresNeighboursChunkingAndThreads) {
  if (GetParam() != "amx") GTEST_SKIP() << "only the amx kernels read a bf16 cache";
  for (int64_t block : {4, 16}) {
    kBlock = block;
    expect_row_invariant(GetParam(), 72);
  }
  kBlock = 4;
}

TEST_P(CpuAttentionBf16Cache, OtherKernelsRefuseIt) {
  if (GetParam() == "amx") GTEST_SKIP() << "the amx kernels read it";
  kDim = 64;
  std::mt19937 rng(3);
  auto backend = make_cpu(GetParam(), 1);
  Pools pools;
  auto tables = block_tables(rng, 1);
  Seq s(rng, 4, tables[0]);
  try {
    step(*backend, pools, {{&s, 4}});
    FAIL() << "attention over a bf16 cache on " << GetParam();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs the amx kernels"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, CpuAttentionBf16Cache, ::testing::ValuesIn(cpu_linear_isas()), isa_name);

}  // namespace
}  // namespace specdec::test
