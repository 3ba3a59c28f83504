// KvCache: block accounting (free list, per-sequence block tables) and the per-layer pools.
// Invariant: every block id is either on the free list or in exactly one sequence's table.
#include "kv/kv_cache.h"

#include <algorithm>

#include "core/error.h"

namespace specdec {

KvCache::KvCache(Backend& backend, int num_layers, int kv_heads, int head_dim, int num_blocks, int block_size)
    : num_layers_(num_layers),
      kv_heads_(kv_heads),
      head_dim_(head_dim),
      num_blocks_(num_blocks),
      block_size_(block_size) {
  SPECDEC_CHECK(num_layers > 0 && kv_heads > 0 && head_dim > 0, "KV cache needs positive layers (", num_layers,
                "), kv heads (", kv_heads, ") and head_dim (", head_dim, ")");
  SPECDEC_CHECK(num_blocks >= 0, "KV cache block count must be >= 0, got ", num_blocks);
  SPECDEC_CHECK(block_size > 0, "KV cache block size must be > 0, got ", block_size);
  const DType dtype = backend.kv_dtype();
  const size_t pool_elems = static_cast<size_t>(num_blocks) * static_cast<size_t>(block_size) *
                            static_cast<size_t>(kv_heads) * static_cast<size_t>(head_dim);
  const size_t pool_bytes = pool_elems * dtype_size(dtype);
  buffers_.reserve(static_cast<size_t>(num_layers));
  for (int layer = 0; layer < num_layers; ++layer) {
    buffers_.push_back(backend.allocate(2 * pool_bytes));
    char* base = static_cast<char*>(buffers_.back().data());
    const Device device = buffers_.back().device();
    k_pools_.emplace_back(base, dtype, std::initializer_list<int64_t>{num_blocks, block_size, kv_heads, head_dim},
                          device);
    v_pools_.emplace_back(base + pool_bytes, dtype,
                          std::initializer_list<int64_t>{num_blocks, block_size, kv_heads, head_dim}, device);
  }
  free_.resize(static_cast<size_t>(num_blocks));
  for (int i = 0; i < num_blocks; ++i) free_[static_cast<size_t>(i)] = num_blocks - 1 - i;
}

int KvCache::blocks_for_memory(size_t bytes, int num_layers, int kv_heads, int head_dim, DType dtype,
                               int block_size) {
  SPECDEC_CHECK(num_layers > 0 && kv_heads > 0 && head_dim > 0 && block_size > 0,
                "blocks_for_memory needs positive layers, kv heads, head_dim and block size");
  const size_t per_block = 2 * static_cast<size_t>(num_layers) * static_cast<size_t>(block_size) *
                           static_cast<size_t>(kv_heads) * static_cast<size_t>(head_dim) * dtype_size(dtype);
  const size_t blocks = bytes / per_block;
  return static_cast<int>(std::min<size_t>(blocks, static_cast<size_t>(INT32_MAX)));
}

KvCache::SeqId KvCache::create() {
  while (seqs_.count(next_id_)) ++next_id_;  // ids are not reused while alive, even after wrap
  const SeqId id = next_id_;
  next_id_ = next_id_ == INT32_MAX ? 0 : next_id_ + 1;
  seqs_.emplace(id, Sequence{});
  return id;
}

void KvCache::release(SeqId seq) {
  Sequence& s = seq_at(seq);
  // Returned in reverse so the next sequence takes them back in the same order.
  for (auto it = s.blocks.rbegin(); it != s.blocks.rend(); ++it) free_.push_back(*it);
  seqs_.erase(seq);
}

int KvCache::length(SeqId seq) const { return seq_at(seq).length; }

int KvCache::capacity(SeqId seq) const { return static_cast<int>(seq_at(seq).blocks.size()) * block_size_; }

int KvCache::blocks_needed(SeqId seq, int new_len) const {
  SPECDEC_CHECK(new_len >= 0, "KV length must be >= 0, got ", new_len);
  const int have = static_cast<int>(seq_at(seq).blocks.size());
  return std::max(0, blocks_for_length(new_len, block_size_) - have);
}

bool KvCache::reserve(SeqId seq, int new_len) {
  const int need = blocks_needed(seq, new_len);
  if (need > free_blocks()) return false;
  Sequence& s = seq_at(seq);
  for (int i = 0; i < need; ++i) {
    s.blocks.push_back(free_.back());
    free_.pop_back();
  }
  return true;
}

void KvCache::truncate(SeqId seq, int len) {
  Sequence& s = seq_at(seq);
  SPECDEC_CHECK(len >= 0 && len <= s.length, "cannot truncate KV sequence ", seq, " of length ", s.length, " to ",
                len);
  s.length = len;
  const size_t keep = static_cast<size_t>(blocks_for_length(len, block_size_));
  while (s.blocks.size() > keep) {
    free_.push_back(s.blocks.back());
    s.blocks.pop_back();
  }
}

void KvCache::set_length(SeqId seq, int len) {
  Sequence& s = seq_at(seq);
  const int cap = static_cast<int>(s.blocks.size()) * block_size_;
  SPECDEC_CHECK(len >= 0 && len <= cap, "KV sequence ", seq, " length ", len, " exceeds its reserved capacity ", cap);
  s.length = len;
}

const std::vector<int32_t>& KvCache::block_table(SeqId seq) const { return seq_at(seq).blocks; }

const Tensor& KvCache::k_pool(int layer) const {
  SPECDEC_CHECK(layer >= 0 && layer < num_layers_, "KV layer ", layer, " outside [0, ", num_layers_, ")");
  return k_pools_[static_cast<size_t>(layer)];
}

const Tensor& KvCache::v_pool(int layer) const {
  SPECDEC_CHECK(layer >= 0 && layer < num_layers_, "KV layer ", layer, " outside [0, ", num_layers_, ")");
  return v_pools_[static_cast<size_t>(layer)];
}

const KvCache::Sequence& KvCache::seq_at(SeqId seq) const {
  auto it = seqs_.find(seq);
  SPECDEC_CHECK(it != seqs_.end(), "unknown KV sequence id ", seq);
  return it->second;
}

KvCache::Sequence& KvCache::seq_at(SeqId seq) {
  auto it = seqs_.find(seq);
  SPECDEC_CHECK(it != seqs_.end(), "unknown KV sequence id ", seq);
  return it->second;
}

}  // namespace specdec
