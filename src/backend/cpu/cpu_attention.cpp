// Paged KV writes and causal attention on the CPU: validation of the AttentionBatch, and the
// split of the work into (token, kv head, query heads) items over threads. Each (token, head)
// output is computed by the ISA's attend kernel with the same operation sequence whatever else
// is in the batch (see AttendFn), so a row's output does not depend on its neighbours, on how
// its tokens were chunked, or on the thread count.
#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_ops.h"

namespace specdec::cpu {
namespace {

void check_pool(const Tensor& pool, const AttentionBatch& batch, const char* op, const char* name) {
  check_dtype(pool, DType::f32, op, name);
  SPECDEC_CHECK(batch.block_size > 0, op, ": batch.block_size is ", batch.block_size);
  SPECDEC_CHECK(pool.rank == 4, op, ": ", name, " must be [num_blocks, block_size, kv_heads, head_dim], got ",
                pool.shape_string());
  SPECDEC_CHECK(pool.dim(1) == batch.block_size, op, ": ", name, " ", pool.shape_string(), " has block size ",
                pool.dim(1), " but the batch says ", batch.block_size);
}

void check_same_pool_shape(const Tensor& k_pool, const Tensor& v_pool, const char* op) {
  for (int i = 0; i < 4; ++i) {
    SPECDEC_CHECK(k_pool.dim(i) == v_pool.dim(i), op, ": k_pool ", k_pool.shape_string(), " and v_pool ",
                  v_pool.shape_string(), " differ");
  }
}

}  // namespace

void check_kv_write(const Tensor& k, const Tensor& v, const Tensor& k_pool, const Tensor& v_pool,
                    const AttentionBatch& batch, const char* op) {
  check_dtype(k, DType::f32, op, "k");
  check_dtype(v, DType::f32, op, "v");
  check_pool(k_pool, batch, op, "k_pool");
  check_pool(v_pool, batch, op, "v_pool");
  check_same_pool_shape(k_pool, v_pool, op);
  check_dtype(batch.slots, DType::i32, op, "batch.slots");
  const int64_t T = batch.tokens, slots = k_pool.dim(0) * k_pool.dim(1);
  const int64_t entry = k_pool.dim(2) * k_pool.dim(3);  // floats per slot
  SPECDEC_CHECK(batch.slots.numel() == T, op, ": batch.slots ", batch.slots.shape_string(), " must have ", T,
                " elements");
  SPECDEC_CHECK(k.numel() == T * entry && v.numel() == T * entry && k.dim(0) == T && v.dim(0) == T, op, ": k ",
                k.shape_string(), " and v ", v.shape_string(), " must be [", T, ", ", k_pool.dim(2), ", ",
                k_pool.dim(3), "]");
  const int32_t* slot = batch.slots.ptr<int32_t>();
  for (int64_t t = 0; t < T; ++t) {
    SPECDEC_CHECK(slot[t] >= -1 && slot[t] < slots, op, ": slot ", slot[t], " of token ", t, " outside the pool of ",
                  slots, " slots (-1: none)");
  }
}

void kv_write_token(const Tensor& k, const Tensor& v, const Tensor& k_pool, const Tensor& v_pool,
                    const AttentionBatch& batch, int64_t t) {
  const int64_t entry = k_pool.dim(2) * k_pool.dim(3);
  const int64_t slot = batch.slots.ptr<int32_t>()[t];
  if (slot < 0) return;  // a padding token: its K/V go nowhere
  const size_t bytes = static_cast<size_t>(entry) * sizeof(float);
  std::memcpy(k_pool.ptr<float>() + slot * entry, k.ptr<float>() + t * entry, bytes);
  std::memcpy(v_pool.ptr<float>() + slot * entry, v.ptr<float>() + t * entry, bytes);
}

void kv_write(const Tensor& k, const Tensor& v, const Tensor& k_pool, const Tensor& v_pool,
              const AttentionBatch& batch) {
  check_kv_write(k, v, k_pool, v_pool, batch, "kv_write");
  for (int64_t t = 0; t < batch.tokens; ++t) kv_write_token(k, v, k_pool, v_pool, batch, t);
}

void attention(ThreadPool& pool, const Kernels& kernels, const Tensor& q, const Tensor& k_pool, const Tensor& v_pool,
               const AttentionBatch& batch, float scale, const Tensor& out) {
  const char* op = "attention";
  check_dtype(q, DType::f32, op, "q");
  check_dtype(out, DType::f32, op, "out");
  check_pool(k_pool, batch, op, "k_pool");
  check_pool(v_pool, batch, op, "v_pool");
  check_same_pool_shape(k_pool, v_pool, op);
  for (const Tensor* t : {&batch.positions, &batch.row_starts, &batch.row_lens, &batch.block_table}) {
    check_dtype(*t, DType::i32, op, "batch tensor");
  }
  const int64_t T = batch.tokens, R = batch.rows, bs = batch.block_size;
  const int64_t kv_heads = k_pool.dim(2), d = k_pool.dim(3), num_blocks = k_pool.dim(0);
  SPECDEC_CHECK(q.rank == 3 && q.dim(0) == T && q.dim(2) == d, op, ": q ", q.shape_string(), " must be [", T,
                ", heads, ", d, "]");
  const int64_t heads = q.dim(1);
  SPECDEC_CHECK(heads % kv_heads == 0, op, ": ", heads, " heads are not a multiple of ", kv_heads, " kv heads");
  SPECDEC_CHECK(out.rank == 3 && out.dim(0) == T && out.dim(1) == heads && out.dim(2) == d, op, ": out ",
                out.shape_string(), " must match q ", q.shape_string());
  SPECDEC_CHECK(batch.positions.numel() == T && batch.row_starts.numel() == R + 1 && batch.row_lens.numel() == R &&
                    batch.block_table.numel() == R * static_cast<int64_t>(batch.max_blocks),
                op, ": batch tensors do not match rows = ", R, ", tokens = ", T, ", max_blocks = ", batch.max_blocks);
  const int32_t* pos = batch.positions.ptr<int32_t>();
  const int32_t* starts = batch.row_starts.ptr<int32_t>();
  const int32_t* lens = batch.row_lens.ptr<int32_t>();
  const int32_t* table = batch.block_table.ptr<int32_t>();
  SPECDEC_CHECK(starts[0] == 0 && starts[R] == T, op, ": row_starts must run from 0 to ", T);
  for (int64_t r = 0; r < R; ++r) {
    SPECDEC_CHECK(starts[r] <= starts[r + 1], op, ": row_starts decrease at row ", r);
  }
  std::vector<int32_t> token_row(static_cast<size_t>(T));
  for (int64_t r = 0; r < R; ++r) {
    const int64_t len = lens[r];
    SPECDEC_CHECK(len >= 0 && (len + bs - 1) / bs <= batch.max_blocks, op, ": row ", r, " length ", len,
                  " exceeds its block table of ", batch.max_blocks, " blocks");
    for (int64_t b = 0; b < (len + bs - 1) / bs; ++b) {
      const int32_t id = table[r * batch.max_blocks + b];
      SPECDEC_CHECK(id >= 0 && id < num_blocks, op, ": row ", r, " block ", b, " is ", id, ", outside the pool of ",
                    num_blocks, " blocks");
    }
    for (int64_t t = starts[r]; t < starts[r + 1]; ++t) {
      SPECDEC_CHECK(pos[t] >= 0 && pos[t] < len, op, ": token ", t, " of row ", r, " at position ", pos[t],
                    " is outside the row's cache of ", len, " positions");
      token_row[static_cast<size_t>(t)] = static_cast<int32_t>(r);
    }
  }
  const int64_t group = heads / kv_heads;
  const float* kp = k_pool.ptr<float>();
  const float* vp = v_pool.ptr<float>();
  const float* qp = q.ptr<float>();
  float* op_out = out.ptr<float>();
  // Work items: (token, kv head, slice of its query heads). Heads sharing a kv head go together so
  // the kernel reads each key and value once for all of them; the group is split only when there
  // would be fewer items than threads. Results do not depend on the split.
  int64_t split = 1;
  while (T * kv_heads * split < static_cast<int64_t>(pool.size()) && group % (split * 2) == 0) split *= 2;
  const int64_t per_item = group / split, items_per_token = kv_heads * split;
  const auto work = [&](size_t begin, size_t end) {
    std::vector<float> scores;
    for (size_t item = begin; item < end; ++item) {
      const int64_t t = static_cast<int64_t>(item) / items_per_token;
      const int64_t h0 = static_cast<int64_t>(item) % items_per_token * per_item;  // first query head
      AttendArgs args;
      args.n = static_cast<int64_t>(pos[t]) + 1;
      args.heads = per_item;
      scores.resize(static_cast<size_t>(args.n * per_item));
      args.q = qp + (t * heads + h0) * d;
      args.k = kp + (h0 / group) * d;
      args.v = vp + (h0 / group) * d;
      args.blocks = table + static_cast<int64_t>(token_row[static_cast<size_t>(t)]) * batch.max_blocks;
      args.block_size = bs;
      args.stride = kv_heads * d;
      args.d = d;
      args.scale = scale;
      args.scores = scores.data();
      args.out = op_out + (t * heads + h0) * d;
      kernels.attend(args);
    }
  };
  // Per item: two passes over up to max_row_len cached positions for each of its heads.
  const int64_t row_len = std::max<int64_t>(batch.max_row_len, 1);
  parallel_units(pool, T * items_per_token, 2 * row_len * d * per_item, kMinChunkWork / 4, 1, work);
}

}  // namespace specdec::cpu
