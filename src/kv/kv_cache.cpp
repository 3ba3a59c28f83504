// KvCache: block accounting (free list, reference counts, per-sequence block tables, the prefix
// cache) and the per-layer pools. Invariant: a block with no reference is either on the free
// list or evictable (cached); a block with n references is in n sequences' tables, and when n > 1
// it is a registered full block that none of them writes.
#include "kv/kv_cache.h"

#include <algorithm>

#include "core/error.h"

namespace specdec {

namespace {

// K and V of every layer for one block of `block_size` positions.
size_t bytes_per_block(int num_layers, int kv_heads, int head_dim, DType dtype, int block_size) {
  return 2 * static_cast<size_t>(num_layers) * static_cast<size_t>(block_size) * static_cast<size_t>(kv_heads) *
         static_cast<size_t>(head_dim) * dtype_size(dtype);
}

}  // namespace

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
  blocks_.resize(static_cast<size_t>(num_blocks));
  free_.resize(static_cast<size_t>(num_blocks));
  for (int i = 0; i < num_blocks; ++i) free_[static_cast<size_t>(i)] = num_blocks - 1 - i;
}

int KvCache::blocks_for_memory(size_t bytes, int num_layers, int kv_heads, int head_dim, DType dtype,
                               int block_size) {
  SPECDEC_CHECK(num_layers > 0 && kv_heads > 0 && head_dim > 0 && block_size > 0,
                "blocks_for_memory needs positive layers, kv heads, head_dim and block size");
  const size_t blocks = bytes / bytes_per_block(num_layers, kv_heads, head_dim, dtype, block_size);
  return static_cast<int>(std::min<size_t>(blocks, static_cast<size_t>(INT32_MAX)));
}

size_t KvCache::touched_bytes() const {
  return static_cast<size_t>(touched_blocks_) *
         bytes_per_block(num_layers_, kv_heads_, head_dim_, k_pools_.front().dtype, block_size_);
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
  for (auto it = s.blocks.rbegin(); it != s.blocks.rend(); ++it) drop_block(*it);
  seqs_.erase(seq);
}

int32_t KvCache::take_block() {
  int32_t id = 0;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else {
    // Reuse the cached block released longest ago: its content is forgotten.
    id = evictable_.begin()->second;
    evictable_.erase(evictable_.begin());
    Block& b = blocks_[static_cast<size_t>(id)];
    cached_.erase(b.hash);
    b.cached = false;
    b.tokens.clear();
  }
  blocks_[static_cast<size_t>(id)].refs = 1;
  touched_blocks_ = std::max(touched_blocks_, id + 1);
  return id;
}

void KvCache::drop_block(int32_t id) {
  Block& b = blocks_[static_cast<size_t>(id)];
  if (--b.refs > 0) return;
  if (b.cached) {
    b.released_at = ++clock_;
    evictable_.emplace(b.released_at, id);
  } else {
    free_.push_back(id);
  }
}

uint64_t KvCache::chain_hash(uint64_t parent, std::span<const int32_t> tokens) const {
  // FNV-1a over the parent hash and the tokens; a match is confirmed against the stored tokens,
  // so a collision costs a miss, never a wrong block.
  uint64_t h = 1469598103934665603ull ^ parent;
  const auto mix = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  mix(parent);
  for (int32_t t : tokens) mix(static_cast<uint32_t>(t));
  return h;
}

int KvCache::share_prefix(SeqId seq, std::span<const int32_t> tokens) {
  Sequence& s = seq_at(seq);
  SPECDEC_CHECK(s.length == 0 && s.blocks.empty(), "share_prefix needs an empty sequence; ", seq, " holds ", s.length,
                " positions");
  const size_t bs = static_cast<size_t>(block_size_);
  prefix_queried_ += static_cast<int64_t>(tokens.size() / bs * bs);
  uint64_t parent = 0;
  for (size_t b = 0; (b + 1) * bs <= tokens.size(); ++b) {
    const std::span<const int32_t> block = tokens.subspan(b * bs, bs);
    const uint64_t h = chain_hash(parent, block);
    auto it = cached_.find(h);
    if (it == cached_.end()) break;
    Block& cached = blocks_[static_cast<size_t>(it->second)];
    if (!std::equal(block.begin(), block.end(), cached.tokens.begin(), cached.tokens.end())) break;
    if (cached.refs++ == 0) evictable_.erase({cached.released_at, it->second});
    s.blocks.push_back(it->second);
    s.hashes.push_back(h);
    parent = h;
  }
  s.length = static_cast<int>(s.blocks.size() * bs);
  prefix_hits_ += s.length;
  return s.length;
}

void KvCache::cache_full_blocks(SeqId seq, std::span<const int32_t> tokens) {
  Sequence& s = seq_at(seq);
  const size_t bs = static_cast<size_t>(block_size_);
  const size_t full = std::min(static_cast<size_t>(s.length), tokens.size()) / bs;
  for (size_t b = s.hashes.size(); b < full; ++b) {
    const std::span<const int32_t> block = tokens.subspan(b * bs, bs);
    const uint64_t h = chain_hash(s.hashes.empty() ? 0 : s.hashes.back(), block);
    s.hashes.push_back(h);
    // Another sequence may have registered the same content first: this copy stays private.
    if (cached_.count(h)) continue;
    Block& mine = blocks_[static_cast<size_t>(s.blocks[b])];
    mine.cached = true;
    mine.hash = h;
    mine.tokens.assign(block.begin(), block.end());
    cached_.emplace(h, s.blocks[b]);
  }
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
  for (int i = 0; i < need; ++i) s.blocks.push_back(take_block());
  return true;
}

void KvCache::truncate(SeqId seq, int len) {
  Sequence& s = seq_at(seq);
  SPECDEC_CHECK(len >= 0 && len <= s.length, "cannot truncate KV sequence ", seq, " of length ", s.length, " to ",
                len);
  // Registered blocks are never written again: a rollback into one would overwrite K/V that
  // other sequences may read. Rollbacks stop at the verified prefix, which is never registered
  // past its length, so this cannot happen unless a caller breaks that contract.
  SPECDEC_CHECK(static_cast<size_t>(len) >= s.hashes.size() * static_cast<size_t>(block_size_),
                "cannot truncate KV sequence ", seq, " to ", len, " inside its registered prefix of ",
                s.hashes.size() * static_cast<size_t>(block_size_), " positions");
  s.length = len;
  const size_t keep = static_cast<size_t>(blocks_for_length(len, block_size_));
  while (s.blocks.size() > keep) {
    drop_block(s.blocks.back());
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
