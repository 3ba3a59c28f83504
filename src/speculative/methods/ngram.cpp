// The prompt-lookup proposal, as a scan (the definition) and as an incremental index. Invariant of
// the index: for each n in range, slots_ holds exactly one entry per distinct n-gram of tokens_,
// at its lowest start (Occurrence::first) or its highest (Occurrence::latest, each start then
// linked to the occurrence before it).
#include "speculative/methods/ngram.h"

#include <algorithm>

#include "core/error.h"

namespace specdec {
namespace {

void check_range(int max_ngram, int min_ngram) {
  SPECDEC_CHECK(min_ngram >= 1 && max_ngram >= min_ngram,
                "ngram: sizes must satisfy 1 <= min_ngram <= max_ngram, got min_ngram ", min_ngram, " and max_ngram ",
                max_ngram);
}

std::vector<int32_t> follow(std::span<const int32_t> history, size_t from, int num_draft) {
  const size_t end = std::min(history.size(), from + static_cast<size_t>(num_draft));
  return std::vector<int32_t>(history.begin() + static_cast<std::ptrdiff_t>(from),
                              history.begin() + static_cast<std::ptrdiff_t>(end));
}

// The first (or latest) start i < history.size() - n whose n tokens equal the trailing n, or -1.
std::ptrdiff_t scan(std::span<const int32_t> history, size_t n, Occurrence which) {
  const size_t tail = history.size() - n;
  const auto equal_at = [&](size_t i) {
    return std::equal(history.begin() + static_cast<std::ptrdiff_t>(i),
                      history.begin() + static_cast<std::ptrdiff_t>(i + n),
                      history.begin() + static_cast<std::ptrdiff_t>(tail));
  };
  if (which == Occurrence::first) {
    for (size_t i = 0; i < tail; ++i)
      if (equal_at(i)) return static_cast<std::ptrdiff_t>(i);
  } else {
    for (size_t i = tail; i-- > 0;)
      if (equal_at(i)) return static_cast<std::ptrdiff_t>(i);
  }
  return -1;
}

uint64_t mix(uint64_t h) {  // splitmix64 finaliser
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

}  // namespace

std::vector<int32_t> propose_ngram(std::span<const int32_t> history, int max_ngram, int min_ngram, int num_draft,
                                   Occurrence which) {
  check_range(max_ngram, min_ngram);
  if (num_draft <= 0 || history.size() < 2) return {};
  const size_t longest = std::min(static_cast<size_t>(max_ngram), history.size() - 1);
  for (size_t n = longest; n >= static_cast<size_t>(min_ngram); --n) {
    const std::ptrdiff_t at = scan(history, n, which);
    if (at >= 0) return follow(history, static_cast<size_t>(at) + n, num_draft);
  }
  return {};
}

NgramIndex::NgramIndex(int max_ngram, int min_ngram, Occurrence which)
    : max_(max_ngram), min_(min_ngram), which_(which) {
  check_range(max_ngram, min_ngram);
  if (which_ == Occurrence::latest) previous_.resize(static_cast<size_t>(max_ngram - min_ngram + 1));
}

uint64_t NgramIndex::key(size_t start, size_t n) const {
  uint64_t h = mix(n);
  for (size_t i = start; i < start + n; ++i) h = mix(h ^ static_cast<uint32_t>(tokens_[i]));
  return h;
}

uint32_t NgramIndex::first_start(size_t start, size_t n) const { return find(key(start, n), start, n); }

uint32_t NgramIndex::find(uint64_t k, size_t start, size_t n) const {
  const size_t i = find_slot(k, start, n);
  return i < slots_.size() ? slots_[i].start : kNone;
}

size_t NgramIndex::find_slot(uint64_t k, size_t start, size_t n) const {
  if (slots_.empty()) return 0;
  const size_t mask = slots_.size() - 1;
  for (size_t i = k & mask; slots_[i].start != kNone; i = (i + 1) & mask) {
    const Slot& e = slots_[i];
    if (e.key == k && e.n == n &&
        std::equal(tokens_.begin() + e.start, tokens_.begin() + e.start + static_cast<std::ptrdiff_t>(n),
                   tokens_.begin() + static_cast<std::ptrdiff_t>(start))) {
      return i;
    }
  }
  return slots_.size();
}

void NgramIndex::insert(uint64_t key, uint32_t start, uint32_t n) {
  if ((used_ + 1) * 4 > slots_.size() * 3) {
    std::vector<Slot> old(std::max<size_t>(64, slots_.size() * 2));
    old.swap(slots_);
    used_ = 0;
    for (const Slot& s : old)
      if (s.start != kNone) insert(s.key, s.start, s.n);
  }
  const size_t mask = slots_.size() - 1;
  size_t i = key & mask;
  while (slots_[i].start != kNone) i = (i + 1) & mask;
  slots_[i] = Slot{key, start, n};
  ++used_;
}

void NgramIndex::erase(uint64_t key, uint32_t start, uint32_t n) {
  if (slots_.empty()) return;
  const size_t mask = slots_.size() - 1;
  size_t i = key & mask;
  while (slots_[i].start != kNone && !(slots_[i].start == start && slots_[i].n == n)) i = (i + 1) & mask;
  if (slots_[i].start == kNone) return;
  // Backward shift: every later slot of the probe run whose home is not cyclically in (i, j]
  // moves into the hole, so that no lookup stops early at it.
  for (size_t j = i;;) {
    j = (j + 1) & mask;
    if (slots_[j].start == kNone) break;
    const size_t home = slots_[j].key & mask;
    const bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
    if (stays) continue;
    slots_[i] = slots_[j];
    i = j;
  }
  slots_[i] = Slot{};
  --used_;
}

void NgramIndex::append(std::span<const int32_t> tokens) {
  SPECDEC_CHECK(tokens_.size() + tokens.size() < kNone, "ngram: history of ", tokens_.size() + tokens.size(),
                " tokens exceeds the index limit of ", kNone);
  for (int32_t token : tokens) {
    tokens_.push_back(token);
    const size_t end = tokens_.size();
    for (auto n = static_cast<size_t>(min_); n <= static_cast<size_t>(max_) && n <= end; ++n) {
      const size_t start = end - n;
      const uint64_t k = key(start, n);
      const size_t at = find_slot(k, start, n);
      if (which_ == Occurrence::latest) {
        std::vector<uint32_t>& previous = previous_[n - static_cast<size_t>(min_)];
        previous.resize(start + 1, kNone);
        previous[start] = at < slots_.size() ? slots_[at].start : kNone;
        if (at < slots_.size()) {
          slots_[at].start = static_cast<uint32_t>(start);  // same n-gram, same key: the slot stays
          continue;
        }
      }
      if (at == slots_.size()) insert(k, static_cast<uint32_t>(start), static_cast<uint32_t>(n));
    }
  }
}

void NgramIndex::truncate(size_t length) {
  // Walk back so tokens_ still holds every removed n-gram while its key is computed. First
  // occurrences: a removed n-gram has an entry at its own start only if it was the first
  // occurrence, and then no other occurrence lies below it: dropping the entry keeps the
  // invariant. Latest: a removed n-gram is its latest occurrence (later ones went first), so its
  // entry goes back to the occurrence before it, or away.
  while (tokens_.size() > length) {
    const size_t end = tokens_.size();
    for (auto n = static_cast<size_t>(min_); n <= static_cast<size_t>(max_) && n <= end; ++n) {
      const size_t start = end - n;
      const uint64_t k = key(start, n);
      if (which_ == Occurrence::latest) {
        std::vector<uint32_t>& previous = previous_[n - static_cast<size_t>(min_)];
        const uint32_t before = previous[start];
        previous.resize(start);
        if (before != kNone) {
          slots_[find_slot(k, start, n)].start = before;
          continue;
        }
      }
      erase(k, static_cast<uint32_t>(start), static_cast<uint32_t>(n));
    }
    tokens_.pop_back();
  }
}

std::vector<int32_t> NgramIndex::propose(int max_ngram, int min_ngram, int num_draft) const {
  check_range(max_ngram, min_ngram);
  const size_t length = tokens_.size();
  if (num_draft <= 0 || length < 2) return {};
  const size_t longest = std::min(static_cast<size_t>(max_ngram), length - 1);
  for (size_t n = longest; n >= static_cast<size_t>(min_ngram); --n) {
    const size_t tail = length - n;
    std::ptrdiff_t at = -1;
    if (n >= static_cast<size_t>(min_) && n <= static_cast<size_t>(max_)) {
      if (which_ == Occurrence::first) {
        // The suffix itself is indexed, so the first start is at most `tail`; equal means the
        // suffix is the only occurrence.
        const uint32_t first = first_start(tail, n);
        if (first < tail) at = first;
      } else {
        // The suffix is the latest occurrence; the one before it is linked.
        const uint32_t before = previous_[n - static_cast<size_t>(min_)][tail];
        if (before != kNone) at = before;
      }
    } else {
      at = scan(tokens_, n, which_);
    }
    if (at >= 0) return follow(tokens_, static_cast<size_t>(at) + n, num_draft);
  }
  return {};
}

}  // namespace specdec
