// KvCache: the paged attention cache. Each layer owns a K pool and a V pool of fixed-size blocks
// (block_size positions each); every sequence owns a block table naming its blocks in order.
// Capacity in blocks is the scheduler's admission currency, so allocation never throws for lack
// of space: reserve() answers false and leaves everything as it was.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "core/tensor.h"

namespace specdec {

class KvCache {
 public:
  using SeqId = int32_t;

  // Allocates 2 * num_layers pools of [num_blocks, block_size, kv_heads, head_dim] of
  // backend.kv_dtype(). The pools' contents start undefined: only written positions are read.
  KvCache(Backend& backend, int num_layers, int kv_heads, int head_dim, int num_blocks, int block_size = 16);
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  // How many blocks fit in `bytes` (K and V of every layer), at least 0.
  static int blocks_for_memory(size_t bytes, int num_layers, int kv_heads, int head_dim, DType dtype,
                               int block_size = 16);

  SeqId create();
  // Returns the sequence's blocks to the pool; the id becomes unknown.
  void release(SeqId seq);
  bool contains(SeqId seq) const { return seqs_.count(seq) != 0; }

  int length(SeqId seq) const;
  // Positions the sequence's blocks can hold (block count * block size).
  int capacity(SeqId seq) const;
  // Extra blocks the sequence needs so that its capacity covers new_len (0 if it already does).
  int blocks_needed(SeqId seq, int new_len) const;
  // Allocates blocks so that capacity >= new_len. Returns false, changing nothing, when the pool
  // has too few free blocks.
  bool reserve(SeqId seq, int new_len);
  // Rollback: length = len (<= length) and the blocks wholly past len go back to the pool.
  void truncate(SeqId seq, int len);
  // Marks positions [0, len) as written; len <= capacity. Used by the forward after writing K/V.
  void set_length(SeqId seq, int len);

  int free_blocks() const { return static_cast<int>(free_.size()); }
  int total_blocks() const { return num_blocks_; }
  int block_size() const { return block_size_; }
  int num_layers() const { return num_layers_; }
  int kv_heads() const { return kv_heads_; }
  int head_dim() const { return head_dim_; }
  size_t sequence_count() const { return seqs_.size(); }

  const std::vector<int32_t>& block_table(SeqId seq) const;
  // [num_blocks, block_size, kv_heads, head_dim] of kv_dtype, in the backend's memory.
  const Tensor& k_pool(int layer) const;
  const Tensor& v_pool(int layer) const;

 private:
  struct Sequence {
    int length = 0;
    std::vector<int32_t> blocks;
  };
  const Sequence& seq_at(SeqId seq) const;
  Sequence& seq_at(SeqId seq);
  static int blocks_for_length(int len, int block_size) { return (len + block_size - 1) / block_size; }

  int num_layers_;
  int kv_heads_;
  int head_dim_;
  int num_blocks_;
  int block_size_;
  std::vector<Buffer> buffers_;  // one per layer: K pool then V pool
  std::vector<Tensor> k_pools_;
  std::vector<Tensor> v_pools_;
  // Free block ids, used as a stack; the back is handed out next. Initially 0 is on top so a
  // fresh cache hands out blocks in ascending order (deterministic placement).
  std::vector<int32_t> free_;
  std::unordered_map<SeqId, Sequence> seqs_;
  SeqId next_id_ = 0;
};

}  // namespace specdec
