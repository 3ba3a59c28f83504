// Paged KV writes and causal attention on the CPU: validation of the AttentionBatch, and the
// split of the work over threads. An f32 cache goes to the ISA's attend kernel in (token, kv
// head, query heads) items; a bf16 cache (the amx kernels') to attend_rows in (row, token slice,
// kv head) items. Each (token, head) output is computed with the same operation sequence whatever
// else is in the batch (AttendFn, AttendRowsFn), so a row's output does not depend on its
// neighbours, on how its tokens were chunked, or on the thread count.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_ops.h"

namespace specdec::cpu {
namespace {

void check_pool(const Tensor& pool, const AttentionBatch& batch, const char* op, const char* name) {
  SPECDEC_CHECK(pool.dtype == DType::f32 || pool.dtype == DType::bf16, op, ": ", name, " must be f32 or bf16, got ",
                dtype_name(pool.dtype));
  SPECDEC_CHECK(batch.block_size > 0, op, ": batch.block_size is ", batch.block_size);
  SPECDEC_CHECK(pool.rank == 4, op, ": ", name, " must be [num_blocks, block_size, kv_heads, head_dim], got ",
                pool.shape_string());
  SPECDEC_CHECK(pool.dim(1) == batch.block_size, op, ": ", name, " ", pool.shape_string(), " has block size ",
                pool.dim(1), " but the batch says ", batch.block_size);
}

void check_same_pool_shape(const Tensor& k_pool, const Tensor& v_pool, const char* op) {
  SPECDEC_CHECK(k_pool.dtype == v_pool.dtype, op, ": k_pool is ", dtype_name(k_pool.dtype), " but v_pool ",
                dtype_name(v_pool.dtype));
  for (int i = 0; i < 4; ++i) {
    SPECDEC_CHECK(k_pool.dim(i) == v_pool.dim(i), op, ": k_pool ", k_pool.shape_string(), " and v_pool ",
                  v_pool.shape_string(), " differ");
  }
}

// Attention over a bf16 cache: the rows' tokens in slices of up to kRowSliceColumns query columns
// a kv head, each slice one attend_rows call. The slice's tokens share one pass over the row's
// keys and values up to its furthest position, and slices keep a long prompt's chunk spread over
// the threads. Results do not depend on the slicing (AttendRowsFn).
void attend_rows(ThreadPool& pool, const Kernels& kernels, const AttentionBatch& batch, int64_t kv_heads, int64_t heads,
                 int64_t d, float scale, const float* qp, const uint16_t* kp, const uint16_t* vp, float* op_out) {
  constexpr int64_t kRowSliceColumns = 64;
  const int32_t* pos = batch.positions.ptr<int32_t>();
  const int32_t* starts = batch.row_starts.ptr<int32_t>();
  const int32_t* table = batch.block_table.ptr<int32_t>();
  const int64_t group = heads / kv_heads;
  const int64_t slice = std::max<int64_t>(1, kRowSliceColumns / group);
  struct Item {
    int64_t row, first, count;
  };
  std::vector<Item> slices;
  for (int64_t r = 0; r < batch.rows; ++r) {
    for (int64_t t = starts[r]; t < starts[r + 1]; t += slice) {
      slices.push_back({r, t, std::min<int64_t>(slice, starts[r + 1] - t)});
    }
  }
  const int64_t items = static_cast<int64_t>(slices.size()) * kv_heads;
  const auto work = [&](size_t begin, size_t end) {
    // Kept by each thread across calls: a fresh buffer of this size would be mapped and faulted in
    // at every layer.
    static thread_local std::vector<char> scratch;
    for (size_t item = begin; item < end; ++item) {
      const Item& it = slices[item / static_cast<size_t>(kv_heads)];
      const int64_t h = static_cast<int64_t>(item % static_cast<size_t>(kv_heads));
      AttendRowArgs args;
      args.q = qp + (it.first * heads + h * group) * d;
      args.q_stride = heads * d;
      args.positions = pos + it.first;
      args.tokens = it.count;
      args.group = group;
      args.k = kp + h * d;
      args.v = vp + h * d;
      args.blocks = table + it.row * batch.max_blocks;
      args.block_size = batch.block_size;
      args.stride = kv_heads * d;
      args.d = d;
      args.scale = scale;
      args.out = op_out + (it.first * heads + h * group) * d;
      args.out_stride = heads * d;
      int64_t n = 0;
      for (int64_t t = 0; t < it.count; ++t) n = std::max<int64_t>(n, args.positions[t] + 1);
      const size_t bytes = static_cast<size_t>(kernels.attend_rows_scratch(n, d)) + 64;
      if (scratch.size() < bytes) scratch.resize(bytes);
      const auto address = reinterpret_cast<uintptr_t>(scratch.data());
      args.scratch = scratch.data() + ((64 - address % 64) % 64);
      kernels.attend_rows(args);
    }
  };
  // Per item: its columns against up to max_row_len positions, scores and weighted values.
  const int64_t row_len = std::max<int64_t>(batch.max_row_len, 1);
  parallel_units(pool, items, 2 * row_len * d * std::min<int64_t>(slice, batch.max_row_tokens) * group,
                 kMinChunkWork / 4, 1, work);
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
  if (k_pool.dtype == DType::bf16) {  // rounded once here; attention reads the bf16 values
    uint16_t* kd = k_pool.ptr<uint16_t>() + slot * entry;
    uint16_t* vd = v_pool.ptr<uint16_t>() + slot * entry;
    const float* ks = k.ptr<float>() + t * entry;
    const float* vs = v.ptr<float>() + t * entry;
    for (int64_t i = 0; i < entry; ++i) {
      kd[i] = f32_to_bf16(ks[i]);
      vd[i] = f32_to_bf16(vs[i]);
    }
    return;
  }
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
  const float* qp = q.ptr<float>();
  float* op_out = out.ptr<float>();
  if (k_pool.dtype == DType::bf16) {
    SPECDEC_CHECK(kernels.attend_rows != nullptr, op, ": a bf16 KV cache needs the amx kernels; the ", kernels.isa,
                  " kernels read an f32 one");
    attend_rows(pool, kernels, batch, kv_heads, heads, d, scale, qp, k_pool.ptr<uint16_t>(), v_pool.ptr<uint16_t>(),
                op_out);
    return;
  }
  const float* kp = k_pool.ptr<float>();
  const float* vp = v_pool.ptr<float>();
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
