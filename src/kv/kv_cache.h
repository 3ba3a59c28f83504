// KvCache: the paged attention cache. Each layer owns a K pool and a V pool of fixed-size blocks
// (block_size positions each); every sequence owns a block table naming its blocks in order.
// Capacity in blocks is the scheduler's admission currency, so allocation never throws for lack
// of space: reserve() answers false and leaves everything as it was.
//
// Prefix cache: a full block's K/V is a function of the tokens at and before it, so full blocks
// are registered under a hash chained over their prefix (parent hash + the block's tokens) and a
// new sequence whose tokens begin the same way shares them (reference counted, read-only: a
// sequence writes only past its shared blocks). A block nobody holds keeps its content and stays
// findable until it is needed for new K/V, least recently released first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <set>
#include <span>
#include <utility>
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

  // Prefix cache. For an empty sequence: attaches the cached blocks that hold the longest run of
  // whole blocks of `tokens` and returns how many tokens they cover (the sequence's length now).
  int share_prefix(SeqId seq, std::span<const int32_t> tokens);
  // Registers the sequence's full blocks not yet registered; `tokens` are the tokens at its
  // positions (at least up to its length, or fewer: only blocks that `tokens` covers count).
  void cache_full_blocks(SeqId seq, std::span<const int32_t> tokens);
  // Tokens looked up and found by share_prefix since the cache was made.
  int64_t prefix_queried_tokens() const { return prefix_queried_; }
  int64_t prefix_hit_tokens() const { return prefix_hits_; }

  // Blocks a reserve can take: free ones and cached ones nobody holds (evicted on demand).
  int free_blocks() const { return static_cast<int>(free_.size() + evictable_.size()); }
  int total_blocks() const { return num_blocks_; }
  // Blocks handed out at least once since the cache was made, and their bytes (K and V of every
  // layer). The pools are allocated untouched, so on the CPU this is the cache's share of the
  // process's resident memory: it grows with the most blocks ever held at once and with the
  // prefix cache (free blocks are taken before cached ones are evicted), up to the whole pool.
  int touched_blocks() const { return touched_blocks_; }
  size_t touched_bytes() const;
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
    std::vector<uint64_t> hashes;  // prefix hash of each registered leading full block
  };
  struct Block {
    int refs = 0;
    bool cached = false;          // registered under `hash`
    uint64_t hash = 0;
    uint64_t released_at = 0;     // when refs last fell to 0 (eviction order)
    std::vector<int32_t> tokens;  // a cached block's tokens: a hash match is checked against them
  };
  const Sequence& seq_at(SeqId seq) const;
  Sequence& seq_at(SeqId seq);
  static int blocks_for_length(int len, int block_size) { return (len + block_size - 1) / block_size; }
  uint64_t chain_hash(uint64_t parent, std::span<const int32_t> tokens) const;
  int32_t take_block();
  void drop_block(int32_t block);

  int num_layers_;
  int kv_heads_;
  int head_dim_;
  int num_blocks_;
  int block_size_;
  int touched_blocks_ = 0;       // blocks are handed out in ascending order when fresh: ids below this
  std::vector<Buffer> buffers_;  // one per layer: K pool then V pool
  std::vector<Tensor> k_pools_;
  std::vector<Tensor> v_pools_;
  // Free block ids, used as a stack; the back is handed out next. Initially 0 is on top so a
  // fresh cache hands out blocks in ascending order (deterministic placement).
  std::vector<int32_t> free_;
  std::vector<Block> blocks_;
  std::set<std::pair<uint64_t, int32_t>> evictable_;  // (released_at, block): cached, held by nobody
  std::unordered_map<uint64_t, int32_t> cached_;       // prefix hash -> block
  uint64_t clock_ = 0;
  int64_t prefix_queried_ = 0, prefix_hits_ = 0;
  std::unordered_map<SeqId, Sequence> seqs_;
  SeqId next_id_ = 0;
};

}  // namespace specdec
