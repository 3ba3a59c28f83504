// Prompt-lookup drafting as a pure algorithm over one row's token history: find the row's
// trailing n-gram earlier in its history and propose what followed it. The order (longest n
// first, first occurrence from the start) is that of Saxena's prompt lookup and vLLM's ngram
// proposer. NgramIndex gives the same answers incrementally for long histories.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace specdec {

// Which earlier occurrence of the trailing n-gram gives the proposal: the first from the start
// (prompt lookup's), or the latest (the closest to the end, so the text as it goes now).
enum class Occurrence { first, latest };

// For n from max_ngram down to min_ngram (n < history.size()): the key is the last n tokens;
// the first occurrence of the key starting before history.size() - n (so not the suffix itself,
// though it may overlap it) gives up to num_draft tokens that followed it, never past the end
// of history. The first n that matches wins; no match (or num_draft <= 0) gives no tokens.
// Throws unless 1 <= min_ngram <= max_ngram.
// With Occurrence::latest, the latest such occurrence instead.
std::vector<int32_t> propose_ngram(std::span<const int32_t> history, int max_ngram = 3, int min_ngram = 1,
                                   int num_draft = 10, Occurrence which = Occurrence::first);

// A row's history with, for every n in [min_ngram, max_ngram], the first (or the latest)
// occurrence of each distinct n-gram, maintained as tokens are appended or truncated: a proposal
// costs O(max_ngram^2 + num_draft) whatever the history length. propose() returns exactly what
// propose_ngram(tokens(), ..., which) would; an n outside the indexed range falls back to a scan.
class NgramIndex {
 public:
  explicit NgramIndex(int max_ngram = 3, int min_ngram = 1, Occurrence which = Occurrence::first);

  void append(std::span<const int32_t> tokens);
  // Drops tokens past `length` (no-op if the history is not longer).
  void truncate(size_t length);

  std::vector<int32_t> propose(int max_ngram, int min_ngram, int num_draft) const;
  std::vector<int32_t> propose(int num_draft) const { return propose(max_, min_, num_draft); }

  size_t size() const { return tokens_.size(); }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  int max_ngram() const { return max_; }
  int min_ngram() const { return min_; }

 private:
  static constexpr uint32_t kNone = UINT32_MAX;
  // One indexed n-gram: the hash of (n, its tokens) and its first start; start == kNone marks an
  // empty slot.
  struct Slot {
    uint64_t key = 0;
    uint32_t start = kNone;
    uint32_t n = 0;
  };

  uint64_t key(size_t start, size_t n) const;
  // Indexed start (the first, or the latest) of the n-gram tokens_[start, start + n), or kNone.
  uint32_t first_start(size_t start, size_t n) const;
  // The same, given the n-gram's key.
  uint32_t find(uint64_t key, size_t start, size_t n) const;
  // The slot holding that n-gram, or slots_.size().
  size_t find_slot(uint64_t key, size_t start, size_t n) const;
  void insert(uint64_t key, uint32_t start, uint32_t n);
  // Removes the entry of the n-gram that starts at `start`, if it has one.
  void erase(uint64_t key, uint32_t start, uint32_t n);

  int max_;
  int min_;
  Occurrence which_;
  std::vector<int32_t> tokens_;
  // Occurrence::latest: previous_[n - min_][start] is the start of the n-gram at `start`'s
  // previous occurrence (kNone: the first), restored into its slot when `start` is truncated.
  std::vector<std::vector<uint32_t>> previous_;
  // Hash of (n, n-gram) -> the n-gram's first start, open addressing with linear probing (a
  // power-of-two table at most three quarters full): an append or a proposal probes a few
  // adjacent slots instead of allocating and chasing a node per n-gram, as a node-based map did
  // (3 µs of n-gram bookkeeping a decode step). Equal hashes are told apart by the tokens.
  std::vector<Slot> slots_;
  size_t used_ = 0;
};

}  // namespace specdec
