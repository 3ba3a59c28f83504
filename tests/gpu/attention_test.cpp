// Paged attention of the CUDA backend (bf16, f16 and f32 KV) vs the scalar CPU backend (f32 KV)
// on ragged batches mixing prefill chunks, decodes over long caches and verify windows, for GQA
// groups of 1 to 12; and invariance: each token's bits alone equal its bits among neighbours.
#include <numeric>
#include <string>

#include "backend/cuda/kernels.h"
#include "gpu/gpu_test_util.h"

namespace specdec::gpu_test {
namespace {

constexpr int kBlockSize = 16;
constexpr int kPoolBlocks = 96;
constexpr int kHeads = 8;
constexpr int kKvHeads = 2;
// A bf16 cache of head size 64, 96 or 128 is attended on the tensor cores (both modes; the fast
// mode for chunks and many rows): q and the probabilities are rounded to bf16 for the products.
constexpr double kTensorCoreTol = 2e-2;

// The host description of a batch: each row's cache length and its new tokens' positions.
struct RowSpec {
  int len;
  std::vector<int32_t> positions;
  std::vector<int32_t> blocks;  // the row's block table
};

struct DeviceBatch {
  std::vector<Owned> owned;
  AttentionBatch batch;
};

DeviceBatch make_batch(Backend& be, const std::vector<RowSpec>& rows, int max_blocks) {
  std::vector<int32_t> positions, slots, starts{0}, lens, table;
  for (const auto& r : rows) {
    for (int32_t p : r.positions) {
      positions.push_back(p);
      slots.push_back(r.blocks[static_cast<size_t>(p / kBlockSize)] * kBlockSize + p % kBlockSize);
    }
    starts.push_back(static_cast<int32_t>(positions.size()));
    lens.push_back(r.len);
    for (int b = 0; b < max_blocks; ++b)
      table.push_back(b < static_cast<int>(r.blocks.size()) ? r.blocks[static_cast<size_t>(b)] : 0);
  }
  const int R = static_cast<int>(rows.size()), T = static_cast<int>(positions.size());
  DeviceBatch d;
  d.owned.push_back(upload_i32(be, positions, {T}));
  d.owned.push_back(upload_i32(be, slots, {T}));
  d.owned.push_back(upload_i32(be, starts, {R + 1}));
  d.owned.push_back(upload_i32(be, lens, {R}));
  d.owned.push_back(upload_i32(be, table, {R, max_blocks}));
  AttentionBatch& a = d.batch;
  a.positions = d.owned[0].tensor;
  a.slots = d.owned[1].tensor;
  a.row_starts = d.owned[2].tensor;
  a.row_lens = d.owned[3].tensor;
  a.block_table = d.owned[4].tensor;
  a.rows = R;
  a.tokens = T;
  a.max_blocks = max_blocks;
  a.block_size = kBlockSize;
  a.max_row_len = 0;
  a.max_row_tokens = 0;
  for (const auto& r : rows) {
    a.max_row_len = std::max(a.max_row_len, r.len);
    a.max_row_tokens = std::max(a.max_row_tokens, static_cast<int>(r.positions.size()));
  }
  return d;
}

// Rows: a prefill chunk (8 tokens ending a 40-position cache), a decode step over 1000
// positions and a verify window of 4 at the end of 20 positions. Blocks are shuffled.
std::vector<RowSpec> mixed_rows() {
  std::vector<int32_t> ids(kPoolBlocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(7));
  std::vector<RowSpec> rows = {
      {40, {32, 33, 34, 35, 36, 37, 38, 39}, {}}, {1000, {999}, {}}, {20, {16, 17, 18, 19}, {}}};
  size_t next = 0;
  for (auto& r : rows)
    for (int b = 0; b < (r.len + kBlockSize - 1) / kBlockSize; ++b) r.blocks.push_back(ids[next++]);
  return rows;
}

// A batch that writes every cached position of every row (to fill the pools).
std::vector<RowSpec> history_of(const std::vector<RowSpec>& rows) {
  std::vector<RowSpec> h = rows;
  for (auto& r : h) {
    r.positions.resize(static_cast<size_t>(r.len));
    std::iota(r.positions.begin(), r.positions.end(), 0);
  }
  return h;
}

struct Pools {
  Owned k, v;
};

Pools filled_pools(Backend& be, const std::vector<RowSpec>& rows, int D, int max_blocks) {
  Pools p{empty(be, be.kv_dtype(), {kPoolBlocks, kBlockSize, kKvHeads, D}),
          empty(be, be.kv_dtype(), {kPoolBlocks, kBlockSize, kKvHeads, D})};
  const auto hist = history_of(rows);
  DeviceBatch hb = make_batch(be, hist, max_blocks);
  const int T = hb.batch.tokens;
  Owned k =
      upload(be, random_floats(static_cast<size_t>(T) * kKvHeads * D, 11, 0.05f, 2.0f), DType::f32, {T, kKvHeads, D});
  Owned v = upload(be, random_floats(static_cast<size_t>(T) * kKvHeads * D, 12), DType::f32, {T, kKvHeads, D});
  be.kv_write(k.tensor, v.tensor, p.k.tensor, p.v.tensor, hb.batch);
  be.synchronize();
  return p;
}

std::vector<float> run_attention(Backend& be, const Pools& pools, const std::vector<RowSpec>& rows,
                                 const std::vector<float>& q, int D, int max_blocks, int max_row_len = -1) {
  DeviceBatch b = make_batch(be, rows, max_blocks);
  if (max_row_len >= 0) b.batch.max_row_len = max_row_len;
  const int T = b.batch.tokens;
  Owned qt = upload(be, q, DType::f32, {T, kHeads, D});
  Owned o = empty(be, DType::f32, {T, kHeads, D});
  be.attention(qt.tensor, pools.k.tensor, pools.v.tensor, b.batch, 1.0f / std::sqrt(static_cast<float>(D)), o.tensor);
  return download(be, o.tensor);
}

int max_blocks_of(const std::vector<RowSpec>& rows) {
  int m = 0;
  for (const auto& r : rows) m = std::max(m, static_cast<int>(r.blocks.size()));
  return m;
}

TEST(GpuAttention, MixedBatchMatchesCpu) {
  SPECDEC_REQUIRE_GPU();
  Backends b = make_backends(true);
  EXPECT_EQ(b.gpu->kv_dtype(), DType::bf16);
  const auto rows = mixed_rows();
  const int mb = max_blocks_of(rows);
  for (int D : {64, 128}) {
    const auto q = random_floats(13u * kHeads * static_cast<size_t>(D), 13, 0.05f, 2.0f);
    Pools cp = filled_pools(*b.cpu, rows, D, mb);
    Pools gp = filled_pools(*b.gpu, rows, D, mb);
    const auto want = run_attention(*b.cpu, cp, rows, q, D, mb);
    const auto got = run_attention(*b.gpu, gp, rows, q, D, mb);
    EXPECT_LE(rel_error(got, want), kTensorCoreTol) << "head_dim " << D;
  }
}

TEST(GpuAttention, RowAloneEqualsRowWithNeighbours) {
  SPECDEC_REQUIRE_GPU();
  // Attention is one kernel in both modes for these rows (at most 8 new tokens a row: the fast
  // mode's tensor-core kernel takes batches with prefill chunks of 16 or more).
  for (bool invariant : {true, false}) {
    Backends b = make_backends(invariant);
    const auto rows = mixed_rows();
    const int mb = max_blocks_of(rows), D = 128;
    const auto q = random_floats(13u * kHeads * D, 14);
    Pools gp = filled_pools(*b.gpu, rows, D, mb);
    const auto all = run_attention(*b.gpu, gp, rows, q, D, mb);
    size_t start = 0;
    for (size_t r = 0; r < rows.size(); ++r) {
      const size_t n = rows[r].positions.size() * kHeads * D;
      std::vector<float> qr(q.begin() + static_cast<ptrdiff_t>(start), q.begin() + static_cast<ptrdiff_t>(start + n));
      const auto alone = run_attention(*b.gpu, gp, {rows[r]}, qr, D, mb);
      EXPECT_TRUE(bit_equal(alone.data(), all.data() + start, n)) << "row " << r << " invariant=" << invariant;
      start += n;
    }
  }
}

// Batch-invariant mode: a prefill chunk's tokens, the same tokens as a verify window and each
// alone as a decode step give the same bits (what lets a row be re-prefilled, cached or verified
// and still continue exactly as plain decoding would).
TEST(GpuAttention, InvariantChunkEqualsItsTokensOneAtATime) {
  SPECDEC_REQUIRE_GPU();
  Backends b = make_backends(true);
  std::vector<int32_t> ids(kPoolBlocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(9));
  constexpr int kLen = 200, kFirst = 150, kNew = kLen - kFirst;
  RowSpec chunk{kLen, {}, {}};
  for (int p = kFirst; p < kLen; ++p) chunk.positions.push_back(p);
  for (int i = 0; i < (kLen + kBlockSize - 1) / kBlockSize; ++i) chunk.blocks.push_back(ids[static_cast<size_t>(i)]);
  const int mb = static_cast<int>(chunk.blocks.size());
  for (int D : {64, 128}) {
    const size_t per_token = static_cast<size_t>(kHeads) * D;
    const auto q = random_floats(kNew * per_token, 70 + static_cast<uint32_t>(D), 0.05f, 2.0f);
    Pools gp = filled_pools(*b.gpu, {chunk}, D, mb);
    const auto all = run_attention(*b.gpu, gp, {chunk}, q, D, mb);
    for (int t = 0; t < kNew; ++t) {
      const RowSpec step{kFirst + t + 1, {kFirst + t}, chunk.blocks};
      const std::vector<float> qt(q.begin() + static_cast<ptrdiff_t>(t * per_token),
                                  q.begin() + static_cast<ptrdiff_t>((t + 1) * per_token));
      const auto alone = run_attention(*b.gpu, gp, {step}, qt, D, mb);
      EXPECT_TRUE(bit_equal(alone.data(), all.data() + t * per_token, per_token)) << "D=" << D << " token " << t;
    }
    // A verify window of four tokens in the middle of the chunk.
    const int w0 = 20;
    RowSpec window{kFirst + w0 + 4, {}, chunk.blocks};
    for (int p = kFirst + w0; p < kFirst + w0 + 4; ++p) window.positions.push_back(p);
    const std::vector<float> qw(q.begin() + static_cast<ptrdiff_t>(w0 * per_token),
                                q.begin() + static_cast<ptrdiff_t>((w0 + 4) * per_token));
    const auto win = run_attention(*b.gpu, gp, {window}, qw, D, mb);
    EXPECT_TRUE(bit_equal(win.data(), all.data() + w0 * per_token, 4 * per_token)) << "D=" << D << " window";
  }
}

// max_row_len only sizes the split over positions: understated (0: no split) or overstated, the
// outputs still match the CPU; with no split or an overstated one they are identical, and for
// rows that fit one chunk (64 positions) any stated value gives the same bits.
TEST(GpuAttention, MaxRowLenOnlyChangesTheSplit) {
  SPECDEC_REQUIRE_GPU();
  Backends b = make_backends(true);
  const auto rows = mixed_rows();
  const int mb = max_blocks_of(rows), D = 64;
  const auto q = random_floats(13u * kHeads * D, 15, 0.05f, 2.0f);
  Pools cp = filled_pools(*b.cpu, rows, D, mb);
  Pools gp = filled_pools(*b.gpu, rows, D, mb);
  const auto want = run_attention(*b.cpu, cp, rows, q, D, mb);
  const auto exact = run_attention(*b.gpu, gp, rows, q, D, mb);
  for (int stated : {0, 300, 5000}) {
    const auto got = run_attention(*b.gpu, gp, rows, q, D, mb, stated);
    EXPECT_LE(rel_error(got, want), kTensorCoreTol) << "max_row_len " << stated;
    if (stated != 300) {  // 300 understates row 1 (1000 positions): close, not bit-exact
      EXPECT_TRUE(bit_equal(got.data(), exact.data(), got.size())) << "max_row_len " << stated;
    }
    // Rows 0 and 2 (40 and 20 positions) fit one chunk: bit-identical whatever the split.
    const size_t row0 = 8u * kHeads * D, row2_begin = 9u * kHeads * D, row2 = 4u * kHeads * D;
    EXPECT_TRUE(bit_equal(got.data(), exact.data(), row0)) << "max_row_len " << stated;
    EXPECT_TRUE(bit_equal(got.data() + row2_begin, exact.data() + row2_begin, row2)) << "max_row_len " << stated;
  }
}

TEST(GpuAttention, RejectsUnsupportedHeadDim) {
  SPECDEC_REQUIRE_GPU();
  Backends b = make_backends(true);
  const auto rows = mixed_rows();
  const int mb = max_blocks_of(rows);
  Owned k = empty(*b.gpu, DType::bf16, {kPoolBlocks, kBlockSize, kKvHeads, 40});
  Owned v = empty(*b.gpu, DType::bf16, {kPoolBlocks, kBlockSize, kKvHeads, 40});
  DeviceBatch db = make_batch(*b.gpu, rows, mb);
  Owned q = empty(*b.gpu, DType::f32, {13, kHeads, 40});
  Owned o = empty(*b.gpu, DType::f32, {13, kHeads, 40});
  EXPECT_THROW(b.gpu->attention(q.tensor, k.tensor, v.tensor, db.batch, 1.0f, o.tensor), Error);
}

// ---- shapes beyond the default: GQA groups, head sizes, pool types, long and short rows ----

struct Shape {
  int heads, kv_heads, D;
  DType kv;
};

std::string shape_name(const Shape& s) {
  return std::to_string(s.heads) + "/" + std::to_string(s.kv_heads) + " heads, head_dim " + std::to_string(s.D) + ", " +
         std::string(dtype_name(s.kv)) + " pool";
}

// Whether the batch-invariant mode attends this shape on the tensor cores (flash_attention.cu).
bool on_tensor_cores(const Shape& s) {
  return CudaTuning{}.flash_prefill && s.kv == DType::bf16 && cuda::flash_attention_supports(cuda::ElemType::bf16, s.D);
}

Backends backends_with_kv(DType kv, bool invariant = true, const CudaTuning& tuning = {}) {
  Backends b = make_backends(invariant);
  BackendOptions g;
  g.device = Device::cuda;
  g.batch_invariant = invariant;
  g.kv_dtype = kv;
  g.cuda = tuning;
  b.gpu = make_backend(g);
  return b;
}

// Rows of very different lengths: a decode over 1000 positions, a window of 5 over 300, a window
// ending exactly at one chunk (64), a decode one past it, a decode over a single position, a
// prefill chunk of 130 tokens and a window across a chunk boundary.
std::vector<RowSpec> ragged_rows(int pool_blocks) {
  std::vector<int32_t> ids(static_cast<size_t>(pool_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(21));
  auto span = [](int from, int to) {
    std::vector<int32_t> p(static_cast<size_t>(to - from));
    std::iota(p.begin(), p.end(), from);
    return p;
  };
  std::vector<RowSpec> rows = {{1000, {999}, {}}, {300, span(295, 300), {}}, {64, span(61, 64), {}},   {65, {64}, {}},
                               {1, {0}, {}},      {200, span(70, 200), {}},  {129, span(127, 129), {}}};
  size_t next = 0;
  for (auto& r : rows)
    for (int b = 0; b < (r.len + kBlockSize - 1) / kBlockSize; ++b) r.blocks.push_back(ids[next++]);
  return rows;
}

constexpr int kRaggedPoolBlocks = 160;

Pools filled_pools_shaped(Backend& be, const std::vector<RowSpec>& rows, const Shape& s, int max_blocks) {
  Pools p{empty(be, be.kv_dtype(), {kRaggedPoolBlocks, kBlockSize, s.kv_heads, s.D}),
          empty(be, be.kv_dtype(), {kRaggedPoolBlocks, kBlockSize, s.kv_heads, s.D})};
  DeviceBatch hb = make_batch(be, history_of(rows), max_blocks);
  const int T = hb.batch.tokens;
  const size_t n = static_cast<size_t>(T) * s.kv_heads * s.D;
  Owned k = upload(be, random_floats(n, 31, 0.05f, 2.0f), DType::f32, {T, s.kv_heads, s.D});
  Owned v = upload(be, random_floats(n, 32), DType::f32, {T, s.kv_heads, s.D});
  be.kv_write(k.tensor, v.tensor, p.k.tensor, p.v.tensor, hb.batch);
  be.synchronize();
  return p;
}

std::vector<float> run_shaped(Backend& be, const Pools& pools, const std::vector<RowSpec>& rows, const Shape& s,
                              const float* q, int max_blocks, int max_row_len = -1) {
  DeviceBatch b = make_batch(be, rows, max_blocks);
  if (max_row_len >= 0) b.batch.max_row_len = max_row_len;
  const int T = b.batch.tokens;
  const size_t n = static_cast<size_t>(T) * s.heads * s.D;
  Owned qt = upload(be, std::vector<float>(q, q + n), DType::f32, {T, s.heads, s.D});
  Owned o = empty(be, DType::f32, {T, s.heads, s.D});
  be.attention(qt.tensor, pools.k.tensor, pools.v.tensor, b.batch, 1.0f / std::sqrt(static_cast<float>(s.D)), o.tensor);
  return download(be, o.tensor);
}

// Groups of 1, 4, 8 and 12 q heads per kv head (12 needs two head groups per block column),
// head_dim 64 and 128, bf16, f16 and f32 pools.
const std::vector<Shape>& shapes() {
  static const std::vector<Shape> s = {{8, 8, 64, DType::bf16}, {32, 8, 128, DType::bf16}, {16, 2, 128, DType::f32},
                                       {12, 1, 64, DType::f32}, {8, 1, 128, DType::bf16},  {8, 2, 64, DType::f16},
                                       {4, 4, 128, DType::f32}};
  return s;
}

int tokens_of(const std::vector<RowSpec>& rows) {
  int t = 0;
  for (const auto& r : rows) t += static_cast<int>(r.positions.size());
  return t;
}

TEST(GpuAttention, RaggedRowsMatchCpuAcrossShapes) {
  SPECDEC_REQUIRE_GPU();
  const auto rows = ragged_rows(kRaggedPoolBlocks);
  const int mb = max_blocks_of(rows), T = tokens_of(rows);
  for (const Shape& s : shapes()) {
    Backends b = backends_with_kv(s.kv);
    const auto q = random_floats(static_cast<size_t>(T) * s.heads * s.D, 33, 0.05f, 2.0f);
    Pools cp = filled_pools_shaped(*b.cpu, rows, s, mb);
    Pools gp = filled_pools_shaped(*b.gpu, rows, s, mb);
    const auto want = run_shaped(*b.cpu, cp, rows, s, q.data(), mb);
    const double tol = s.kv == DType::f32 ? 1e-4 : s.kv == DType::bf16 ? kTensorCoreTol : 1e-2;
    for (int stated : {-1, 0, 5000}) {  // exact max_row_len (split launch when few blocks), none, overstated
      const auto got = run_shaped(*b.gpu, gp, rows, s, q.data(), mb, stated);
      EXPECT_LE(rel_error(got, want), tol) << shape_name(s) << ", max_row_len " << stated;
    }
  }
}

// Every token of every row, decoded alone (its row's length cut to the token's position + 1,
// its own block table, no neighbours) and in the in-block launch (max_row_len 0), gives the same
// bits as in the ragged batch: the verify window == one-at-a-time decoding identity.
TEST(GpuAttention, EveryTokenAloneEqualsItsBatchBits) {
  SPECDEC_REQUIRE_GPU();
  const auto rows = ragged_rows(kRaggedPoolBlocks);
  const int mb = max_blocks_of(rows), T = tokens_of(rows);
  for (const Shape& s : {shapes()[1], shapes()[2], shapes()[3]}) {
    Backends b = backends_with_kv(s.kv);
    const size_t per_token = static_cast<size_t>(s.heads) * s.D;
    const auto q = random_floats(static_cast<size_t>(T) * per_token, 34, 0.05f, 2.0f);
    Pools gp = filled_pools_shaped(*b.gpu, rows, s, mb);
    const auto all = run_shaped(*b.gpu, gp, rows, s, q.data(), mb);
    const auto unsplit = run_shaped(*b.gpu, gp, rows, s, q.data(), mb, 0);
    EXPECT_TRUE(bit_equal(all.data(), unsplit.data(), all.size())) << shape_name(s) << ": split vs in-block launch";
    size_t t = 0;
    for (size_t r = 0; r < rows.size(); ++r) {
      for (size_t i = 0; i < rows[r].positions.size(); ++i, ++t) {
        const int pos = rows[r].positions[i];
        // The long prefill row: its first, a middle and its last token.
        if (rows[r].positions.size() > 8 && i != 0 && i != 64 && i + 1 != rows[r].positions.size()) continue;
        RowSpec alone{pos + 1, {pos}, rows[r].blocks};
        alone.blocks.resize(static_cast<size_t>((pos + 1 + kBlockSize - 1) / kBlockSize));
        const int amb = static_cast<int>(alone.blocks.size());
        const auto got = run_shaped(*b.gpu, gp, {alone}, s, q.data() + t * per_token, amb);
        EXPECT_TRUE(bit_equal(got.data(), all.data() + t * per_token, per_token))
            << shape_name(s) << ": row " << r << " position " << pos << " alone";
        // Same token, its row at full length in the table (later positions hidden by causality).
        RowSpec full{rows[r].len, {pos}, rows[r].blocks};
        const auto got_full = run_shaped(*b.gpu, gp, {full}, s, q.data() + t * per_token, mb + 3);
        EXPECT_TRUE(bit_equal(got_full.data(), all.data() + t * per_token, per_token))
            << shape_name(s) << ": row " << r << " position " << pos << " alone, full row";
      }
    }
  }
}

// Decode steps and windows of up to 16 tokens attend one warp per (row, kv head, 16 (token, head)
// pairs, 64-position tile) and fold the tiles after (tile decode); longer windows take the flash
// kernel. Rows of 1,000, 300, 200, 129, 65 and 64 positions, GQA groups of 1 to 32, head sizes 64,
// 96 and 128: in the batch-invariant mode each step's bits and each token's bits in a 4-token
// window equal the flash kernel's for the same token in a 17-token window (what keeps verify
// windows and prefill equal to steps), with the stated max_row_len exact or overstated;
// understated (the longest rows then fold their last tiles in one slot) still close to the CPU.
// Both modes match the CPU within bf16 rounding.
TEST(GpuAttention, DecodeTilesEqualFlashWindowsAndMatchCpu) {
  SPECDEC_REQUIRE_GPU();
  constexpr int kLong = 17, kShort = 4;
  std::vector<RowSpec> steps, shorts, longs;
  for (const RowSpec& r : ragged_rows(kRaggedPoolBlocks)) {
    if (r.len < kLong) continue;
    steps.push_back({r.len, {r.len - 1}, r.blocks});
    RowSpec s{r.len, {}, r.blocks}, l{r.len, {}, r.blocks};
    for (int p = r.len - kShort; p < r.len; ++p) s.positions.push_back(p);
    for (int p = r.len - kLong; p < r.len; ++p) l.positions.push_back(p);
    shorts.push_back(s);
    longs.push_back(l);
  }
  const int mb = max_blocks_of(steps), R = static_cast<int>(steps.size());
  for (const Shape& s : {Shape{32, 8, 128, DType::bf16}, Shape{8, 1, 128, DType::bf16}, Shape{32, 1, 64, DType::bf16},
                         Shape{12, 2, 96, DType::bf16}}) {
    const size_t per_token = static_cast<size_t>(s.heads) * s.D;
    const auto ql = random_floats(static_cast<size_t>(R) * kLong * per_token, 35, 0.05f, 2.0f);
    std::vector<float> qs, q1;  // the long windows' last 4 tokens and last token
    for (int r = 0; r < R; ++r) {
      const auto end = ql.begin() + static_cast<ptrdiff_t>((r + 1) * kLong * per_token);
      qs.insert(qs.end(), end - static_cast<ptrdiff_t>(kShort * per_token), end);
      q1.insert(q1.end(), end - static_cast<ptrdiff_t>(per_token), end);
    }
    for (bool invariant : {true, false}) {
      Backends b = backends_with_kv(s.kv, invariant);
      Pools cp = filled_pools_shaped(*b.cpu, steps, s, mb);
      Pools gp = filled_pools_shaped(*b.gpu, steps, s, mb);
      const std::string what = shape_name(s) + (invariant ? ", invariant" : ", fast");
      const auto want = run_shaped(*b.cpu, cp, steps, s, q1.data(), mb);
      const auto got = run_shaped(*b.gpu, gp, steps, s, q1.data(), mb);
      EXPECT_LE(rel_error(got, want), kTensorCoreTol) << what;
      const auto under = run_shaped(*b.gpu, gp, steps, s, q1.data(), mb, 100);
      EXPECT_LE(rel_error(under, want), kTensorCoreTol) << what << ", understated max_row_len";
      const auto want_short = run_shaped(*b.cpu, cp, shorts, s, qs.data(), mb);
      const auto got_short = run_shaped(*b.gpu, gp, shorts, s, qs.data(), mb);
      EXPECT_LE(rel_error(got_short, want_short), kTensorCoreTol) << what << ", 4-token windows";
      if (!invariant) continue;
      const auto over = run_shaped(*b.gpu, gp, steps, s, q1.data(), mb, 5000);
      EXPECT_TRUE(bit_equal(over.data(), got.data(), got.size())) << what << ": overstated max_row_len";
      const auto flash = run_shaped(*b.gpu, gp, longs, s, ql.data(), mb);
      for (int r = 0; r < R; ++r) {
        const float* last = flash.data() + static_cast<size_t>((r + 1) * kLong) * per_token;
        EXPECT_TRUE(bit_equal(got.data() + static_cast<size_t>(r) * per_token, last - per_token, per_token))
            << what << ": step, row of " << steps[static_cast<size_t>(r)].len << " positions";
        EXPECT_TRUE(bit_equal(got_short.data() + static_cast<size_t>(r) * kShort * per_token,
                              last - kShort * per_token, kShort * per_token))
            << what << ": 4-token window, row of " << steps[static_cast<size_t>(r)].len << " positions";
      }
    }
  }
}

// ---- the fused decode call: rotate, cache and attend in one launch ----

// The raw bytes of a tensor in device memory, as 32-bit words (for bitwise comparison of pools).
std::vector<int32_t> raw_words(Backend& be, const Tensor& t) {
  return download_i32(be, Tensor(t.data, DType::i32, {static_cast<int64_t>(t.bytes() / 4)}, t.device));
}

// Decode rows (one new token each, at the end of rows of 1000, 65 and 1 positions: a launch of
// one wave, which the backend fuses): rope_kv_write_attention gives the bits of rope_kv_write then
// attention, in the output and in both pools, with the split launch (the last block folding the
// chunks) and the in-block launch, again on a second launch (the arrival counters are left
// ready), and for a token whose slot is invalid (it writes nothing; both read the pool as it is).
// Twice: the default kernels, then with CudaTuning::tile_fused (the invariant mode's bf16 cache:
// the tile-decode launch that rotates, caches and folds its own tiles).
TEST(GpuAttention, FusedDecodeEqualsRopeKvWriteThenAttention) {
  SPECDEC_REQUIRE_GPU();
  std::vector<RowSpec> rows;
  for (const RowSpec& r : ragged_rows(kRaggedPoolBlocks))
    if (r.len == 1000 || r.len == 65 || r.len == 1) rows.push_back({r.len, {r.len - 1}, r.blocks});
  ASSERT_EQ(rows.size(), 3u);
  const int mb = max_blocks_of(rows), T = static_cast<int>(rows.size());
  for (const Shape& s : shapes()) {
    for (bool tile_fused : {false, true}) {
      CudaTuning tuning;
      tuning.tile_fused = tile_fused;
      Backends b = backends_with_kv(s.kv, true, tuning);
      Backend& g = *b.gpu;
      const size_t nq = static_cast<size_t>(T) * s.heads * s.D, nk = static_cast<size_t>(T) * s.kv_heads * s.D;
      const auto q = random_floats(nq, 41, 0.05f, 2.0f), k = random_floats(nk, 42, 0.05f, 2.0f);
      const auto v = random_floats(nk, 43);
      std::vector<float> inv(static_cast<size_t>(s.D / 2));
      for (int i = 0; i < s.D / 2; ++i)
        inv[static_cast<size_t>(i)] = std::pow(10000.0f, -2.0f * static_cast<float>(i) / static_cast<float>(s.D));
      Owned invf = upload(g, inv, DType::f32, {s.D / 2});
      const float scale = 1.0f / std::sqrt(static_cast<float>(s.D));
      for (int stated : {-1, 0}) {  // exact max_row_len (split launch), none (in-block)
        for (bool bad_slot : {false, true}) {
          std::vector<float> out[2];
          std::vector<int32_t> kw[2], vw[2];
          for (int fused = 0; fused < 2; ++fused) {
            Pools p = filled_pools_shaped(g, rows, s, mb);
            DeviceBatch db = make_batch(g, rows, mb);
            if (stated >= 0) db.batch.max_row_len = stated;
            if (bad_slot) {
              auto slots = download_i32(g, db.batch.slots);
              slots[1] = -1;
              db.owned.push_back(upload_i32(g, slots, {T}));
              db.batch.slots = db.owned.back().tensor;
            }
            Owned qt = upload(g, q, DType::f32, {T, s.heads, s.D}), kt = upload(g, k, DType::f32, {T, s.kv_heads, s.D});
            Owned vt = upload(g, v, DType::f32, {T, s.kv_heads, s.D});
            Owned o = empty(g, DType::f32, {T, s.heads, s.D});
            const int launches = fused ? 2 : 1;
            for (int l = 0; l < launches; ++l) {
              if (l == 1) {  // the same inputs again: same bits (counters reset, same write)
                qt = upload(g, q, DType::f32, {T, s.heads, s.D});
                kt = upload(g, k, DType::f32, {T, s.kv_heads, s.D});
              }
              if (fused) {
                g.rope_kv_write_attention(qt.tensor, kt.tensor, vt.tensor, db.batch.positions, invf.tensor, 1.25f,
                                          p.k.tensor, p.v.tensor, db.batch, scale, o.tensor);
              } else {
                g.rope_kv_write(qt.tensor, kt.tensor, vt.tensor, db.batch.positions, invf.tensor, 1.25f, p.k.tensor,
                                p.v.tensor, db.batch);
                g.attention(qt.tensor, p.k.tensor, p.v.tensor, db.batch, scale, o.tensor);
              }
              if (l == 0) out[fused] = download(g, o.tensor);
              // The one-launch form (where it runs: the invariant mode attends a bf16 cache on the
              // tensor cores, after rotating q in place) rotates copies and leaves q as it was.
              if (l == 0 && fused && !on_tensor_cores(s)) {
                const auto q_after = download(g, qt.tensor);
                EXPECT_TRUE(bit_equal(q_after.data(), q.data(), q.size()))
                    << shape_name(s) << ": q was rotated in place";
              }
              if (l == 1) {
                const auto again = download(g, o.tensor);
                EXPECT_TRUE(bit_equal(again.data(), out[1].data(), again.size())) << shape_name(s) << ": second launch";
              }
            }
            kw[fused] = raw_words(g, p.k.tensor);
            vw[fused] = raw_words(g, p.v.tensor);
          }
          const std::string what = shape_name(s) + ", max_row_len " + std::to_string(stated) +
                                   (bad_slot ? ", one slot invalid" : "") + (tile_fused ? ", tile_fused" : "");
          EXPECT_TRUE(bit_equal(out[0].data(), out[1].data(), out[0].size())) << what << ": output";
          EXPECT_EQ(kw[0], kw[1]) << what << ": k pool";
          EXPECT_EQ(vw[0], vw[1]) << what << ": v pool";
        }
      }
    }
  }
}

// ---- the fast mode's tensor-core kernel (prefill chunks) and batches past the old grid limit ----

// Rows for the tensor-core kernel: a prompt of 700 tokens from position 0 (many q tiles and K/V
// tiles, the causal edge inside tiles), a chunk of 300 tokens continuing a 200-position cache, a
// chunk of 17 (a tile and one token), a decode step over 900 positions and a window of 3.
std::vector<RowSpec> prefill_rows(int pool_blocks) {
  std::vector<int32_t> ids(static_cast<size_t>(pool_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(23));
  auto span = [](int from, int to) {
    std::vector<int32_t> p(static_cast<size_t>(to - from));
    std::iota(p.begin(), p.end(), from);
    return p;
  };
  std::vector<RowSpec> rows = {{700, span(0, 700), {}},
                               {500, span(200, 500), {}},
                               {40, span(23, 40), {}},
                               {900, {899}, {}},
                               {66, span(63, 66), {}}};
  size_t next = 0;
  for (auto& r : rows)
    for (int b = 0; b < (r.len + kBlockSize - 1) / kBlockSize; ++b) r.blocks.push_back(ids[next++]);
  return rows;
}

// Attention into an output filled with NaN, so that an element the kernel never wrote fails.
std::vector<float> run_poisoned(Backend& be, const Pools& pools, const std::vector<RowSpec>& rows, const Shape& s,
                                const std::vector<float>& q, int max_blocks) {
  DeviceBatch b = make_batch(be, rows, max_blocks);
  const int T = b.batch.tokens;
  Owned qt = upload(be, q, DType::f32, {T, s.heads, s.D});
  Owned o = upload(be, std::vector<float>(q.size(), NAN), DType::f32, {T, s.heads, s.D});
  be.attention(qt.tensor, pools.k.tensor, pools.v.tensor, b.batch, 1.0f / std::sqrt(static_cast<float>(s.D)), o.tensor);
  return download(be, o.tensor);
}

Pools filled_pools_blocks(Backend& be, const std::vector<RowSpec>& rows, const Shape& s, int pool_blocks,
                          int max_blocks, uint32_t seed) {
  Pools p{empty(be, be.kv_dtype(), {pool_blocks, kBlockSize, s.kv_heads, s.D}),
          empty(be, be.kv_dtype(), {pool_blocks, kBlockSize, s.kv_heads, s.D})};
  DeviceBatch hb = make_batch(be, history_of(rows), max_blocks);
  const int T = hb.batch.tokens;
  const size_t n = static_cast<size_t>(T) * s.kv_heads * s.D;
  Owned k = upload(be, random_floats(n, seed, 0.05f, 2.0f), DType::f32, {T, s.kv_heads, s.D});
  Owned v = upload(be, random_floats(n, seed + 1), DType::f32, {T, s.kv_heads, s.D});
  be.kv_write(k.tensor, v.tensor, p.k.tensor, p.v.tensor, hb.batch);
  be.synchronize();
  return p;
}

// The fast mode's attention of `rows` (T tokens; q from `seed`, the pools from seed + 1) against
// the CPU's f32 attention: the backends and the GPU's pools (for further calls), q, the GPU's
// output and its relative error.
struct FastRun {
  Backends b;
  Pools gp;
  std::vector<float> q, got;
  double error = 0;
};

FastRun fast_against_cpu(const std::vector<RowSpec>& rows, const Shape& s, int pool_blocks, int max_blocks, int T,
                         uint32_t seed, const CudaTuning& tuning = {}) {
  FastRun r{backends_with_kv(s.kv, false, tuning), {}, {}, {}, 0};
  r.q = random_floats(static_cast<size_t>(T) * s.heads * s.D, seed, 0.05f, 2.0f);
  Pools cp = filled_pools_blocks(*r.b.cpu, rows, s, pool_blocks, max_blocks, seed + 1);
  r.gp = filled_pools_blocks(*r.b.gpu, rows, s, pool_blocks, max_blocks, seed + 1);
  const auto want = run_poisoned(*r.b.cpu, cp, rows, s, r.q, max_blocks);
  r.got = run_poisoned(*r.b.gpu, r.gp, rows, s, r.q, max_blocks);
  r.error = rel_error(r.got, want);
  return r;
}

// Fast mode, a batch with prefill chunks: the tensor-core kernel (q and the probabilities in
// bf16) matches the CPU's f32 attention within bf16 rounding for every row, the decode step and
// the short window among them included, for GQA groups of 1, 4 and 8 and head_dim 64, 96 and 128.
TEST(GpuAttention, FastModePrefillChunksMatchCpu) {
  SPECDEC_REQUIRE_GPU();
  constexpr int kPool = 160;
  const auto rows = prefill_rows(kPool);
  const int mb = max_blocks_of(rows), T = tokens_of(rows);
  for (const Shape& s : {Shape{8, 8, 64, DType::bf16}, Shape{32, 8, 128, DType::bf16}, Shape{8, 1, 128, DType::bf16},
                         Shape{12, 4, 96, DType::bf16}}) {
    const FastRun run = fast_against_cpu(rows, s, kPool, mb, T, 51);
    EXPECT_LE(run.error, 2e-2) << shape_name(s);
    const std::vector<float>& q = run.q;
    const std::vector<float>& got = run.got;
    // Each row alone: the same tiles of its own tokens, so the same bits.
    size_t start = 0;
    for (const RowSpec& r : rows) {
      const size_t n = r.positions.size() * s.heads * s.D;
      if (r.positions.size() >= 16) {
        const std::vector<float> qr(q.begin() + static_cast<ptrdiff_t>(start),
                                    q.begin() + static_cast<ptrdiff_t>(start + n));
        const auto alone = run_poisoned(*run.b.gpu, run.gp, {r}, s, qr, mb);
        EXPECT_TRUE(bit_equal(alone.data(), got.data() + start, n)) << shape_name(s) << ", row of " << r.len;
      }
      start += n;
    }
  }
}

// `count` decode rows (one new token each) over histories of 1 to 700 positions, each in its own
// blocks; `pool` is set to the blocks they use.
std::vector<RowSpec> many_decode_rows(int& pool, int count = 40) {
  std::vector<RowSpec> rows;
  pool = 0;
  for (int r = 0; r < count; ++r) {
    const int len = 1 + (r * 149) % 700;
    RowSpec row{len, {len - 1}, {}};
    for (int b = 0; b < (len + kBlockSize - 1) / kBlockSize; ++b) row.blocks.push_back(pool++);
    rows.push_back(row);
  }
  return rows;
}

// Fast mode, decode steps of many rows: on the tensor cores (the tile decode kernel, or the flash
// kernel past enough (row, kv head) blocks without it) they must match the CPU's f32 attention
// within bf16 rounding, for one kv head as for eight; and with CudaTuning::tile_warp_fold, where
// with eight kv heads each warp folds every 7th tile of its row into one partial.
TEST(GpuAttention, FastModeManyDecodeRowsMatchCpu) {
  SPECDEC_REQUIRE_GPU();
  int pool = 0;
  const auto rows = many_decode_rows(pool);
  const int mb = max_blocks_of(rows), T = tokens_of(rows);
  for (bool fold : {false, true}) {
    CudaTuning t;
    t.tile_warp_fold = fold;
    for (const Shape& s :
         {Shape{32, 8, 128, DType::bf16}, Shape{8, 8, 64, DType::bf16}, Shape{8, 1, 128, DType::bf16}}) {
      EXPECT_LE(fast_against_cpu(rows, s, pool, mb, T, 61, t).error, 2e-2) << shape_name(s) << " warp_fold=" << fold;
    }
  }
}

// Batch-invariant mode, `count` of the decode rows above with 8 kv heads, against each row alone
// (every `alone_every`-th): each row's bits must be the same both ways, and close to the CPU.
void expect_invariant_rows_equal_alone(int count, int alone_every) {
  int pool = 0;
  const auto rows = many_decode_rows(pool, count);
  const int mb = max_blocks_of(rows), T = tokens_of(rows);
  const Shape s{32, 8, 128, DType::bf16};
  Backends b = backends_with_kv(s.kv, true);
  const size_t per_token = static_cast<size_t>(s.heads) * s.D;
  const auto q = random_floats(static_cast<size_t>(T) * per_token, 71, 0.05f, 2.0f);
  Pools cp = filled_pools_blocks(*b.cpu, rows, s, pool, mb, 72);
  Pools gp = filled_pools_blocks(*b.gpu, rows, s, pool, mb, 72);
  const auto want = run_poisoned(*b.cpu, cp, rows, s, q, mb);
  const auto got = run_poisoned(*b.gpu, gp, rows, s, q, mb);
  EXPECT_LE(rel_error(got, want), kTensorCoreTol);
  for (size_t r = 0; r < rows.size(); r += static_cast<size_t>(alone_every)) {
    const std::vector<float> qr(q.begin() + static_cast<ptrdiff_t>(r * per_token),
                                q.begin() + static_cast<ptrdiff_t>((r + 1) * per_token));
    const auto alone = run_poisoned(*b.gpu, gp, {rows[r]}, s, qr, mb);
    EXPECT_TRUE(bit_equal(alone.data(), got.data() + r * per_token, per_token))
        << count << " rows: row of " << rows[r].len << " positions alone";
  }
}

// 40 rows: the tile decode launch has enough (row, kv head) warps that each takes every 7th
// tile of its row in turn (several partials a warp), where a row alone gives each tile its own
// warp.
TEST(GpuAttention, InvariantDecodeRowsEqualEachRowAlone) {
  SPECDEC_REQUIRE_GPU();
  expect_invariant_rows_equal_alone(40, 1);
}

// 128 rows: 1,024 (row, kv head) warps, each walking all its row's tiles and folding them as it
// goes into one partial a token, where alone each tile has its own warp and partial and the
// merge folds them.
TEST(GpuAttention, InvariantRowsFoldedInTheirWarpEqualEachRowAlone) {
  SPECDEC_REQUIRE_GPU();
  expect_invariant_rows_equal_alone(128, 5);
}

// More than 65,535 tokens in one call (the old kernel's grid limit on tokens): 4,100 rows of 16
// new tokens each, in both modes (the fast mode takes the tensor-core kernel here), match the CPU.
TEST(GpuAttention, MoreThan65535TokensInOneCall) {
  SPECDEC_REQUIRE_GPU();
  constexpr int kRows = 4100, kNew = 16;
  const Shape s{4, 2, 64, DType::bf16};
  std::vector<RowSpec> rows;
  for (int r = 0; r < kRows; ++r) {
    RowSpec row{kNew, {}, {r}};
    for (int p = 0; p < kNew; ++p) row.positions.push_back(p);
    rows.push_back(row);
  }
  const int T = kRows * kNew;
  ASSERT_GT(T, 65535);
  const auto q = random_floats(static_cast<size_t>(T) * s.heads * s.D, 61, 0.05f, 2.0f);
  for (bool invariant : {true, false}) {
    Backends b = backends_with_kv(s.kv, invariant);
    Pools cp = filled_pools_blocks(*b.cpu, rows, s, kRows, 1, 62);
    Pools gp = filled_pools_blocks(*b.gpu, rows, s, kRows, 1, 62);
    const auto want = run_poisoned(*b.cpu, cp, rows, s, q, 1);
    const auto got = run_poisoned(*b.gpu, gp, rows, s, q, 1);
    EXPECT_LE(rel_error(got, want), kTensorCoreTol) << "invariant=" << invariant;
  }
}

}  // namespace
}  // namespace specdec::gpu_test
