// BPE merge loop: a linked list of symbols and a min-heap of candidate merges ordered by
// (rank, position). A popped candidate is applied only if both symbols are still alive and the
// pair still yields the same token, which reproduces "always merge the lowest-ranked pair,
// leftmost first" exactly as the `tokenizers` library does.
#include "tokenizer/bpe.h"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <queue>

#include "core/error.h"
#include "tokenizer/json_util.h"
#include "tokenizer/utf8.h"

namespace specdec {
namespace {

constexpr size_t kCacheCapacity = 1 << 16;
constexpr size_t kCacheMaxWordBytes = 256;

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

std::optional<std::string> optional_string(const nlohmann::json& model, const char* key, const std::string& where) {
  auto it = model.find(key);
  if (it == model.end() || it->is_null()) return std::nullopt;
  SPECDEC_CHECK(it->is_string(), where, ": model field \"", key, "\" must be a string or null");
  return it->get<std::string>();
}

}  // namespace

Bpe::Bpe(const nlohmann::json& model, const std::string& where) {
  const auto& vocab = model.find("vocab");
  SPECDEC_CHECK(vocab != model.end() && vocab->is_object(), where, ": model.vocab must be an object");
  // Without this every text would encode to no tokens, and the error would come later as an
  // empty prompt.
  SPECDEC_CHECK(!vocab->empty(), where, ": model.vocab is empty (a tokenizer needs at least one token)");
  int32_t max_id = -1;
  vocab_.reserve(vocab->size());
  for (const auto& [token, id] : vocab->items()) {
    SPECDEC_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < INT32_MAX, where,
                  ": model.vocab entry '", token, "' has no valid id");
    const auto i = static_cast<int32_t>(id.get<int64_t>());
    vocab_[token] = i;
    max_id = std::max(max_id, i);
  }
  // Ids number the tokens (rows of the model's embedding): a file whose largest id lies far
  // beyond its count of tokens is malformed, and the id-to-token table sized by it could take
  // gigabytes for a few hundred tokens.
  const int64_t bound = max_token_id(static_cast<int64_t>(vocab_.size()));
  SPECDEC_CHECK(max_id <= bound, where, ": model.vocab has ", vocab_.size(), " tokens but ids up to ", max_id,
                " (at most ", bound, " for that many: ids number the tokens from 0)");
  vocab_r_.resize(static_cast<size_t>(max_id + 1));
  has_id_.assign(static_cast<size_t>(max_id + 1), false);
  for (const auto& [token, id] : vocab_) {
    // Two tokens with one id would decode that id to either of them: refused by name.
    SPECDEC_CHECK(!has_id_[static_cast<size_t>(id)], where, ": model.vocab gives id ", id, " to both '",
                  vocab_r_[static_cast<size_t>(id)], "' and '", token, "'");
    vocab_r_[static_cast<size_t>(id)] = token;
    has_id_[static_cast<size_t>(id)] = true;
  }

  continuing_subword_prefix_ = optional_string(model, "continuing_subword_prefix", where).value_or("");
  end_of_word_suffix_ = optional_string(model, "end_of_word_suffix", where).value_or("");
  byte_fallback_ = json_bool(model, "byte_fallback", where, false);
  fuse_unk_ = json_bool(model, "fuse_unk", where, false);
  ignore_merges_ = json_bool(model, "ignore_merges", where, false);
  if (auto it = model.find("dropout"); it != model.end() && it->is_number()) {
    SPECDEC_CHECK(it->get<double>() == 0.0, where, ": BPE dropout is not supported (sampling at encode time)");
  }
  if (auto unk = optional_string(model, "unk_token", where)) {
    auto it = vocab_.find(*unk);
    SPECDEC_CHECK(it != vocab_.end(), where, ": unk_token '", *unk, "' is not in the vocabulary");
    unk_id_ = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = vocab_.find(std::string_view(name));
    byte_ids_[static_cast<size_t>(b)] = it == vocab_.end() ? -1 : it->second;
  }

  // Merges: "a b" strings (older files) or [a, b] pairs. Rank = position in the list.
  auto merges = model.find("merges");
  if (merges == model.end() || merges->is_null()) return;
  SPECDEC_CHECK(merges->is_array(), where, ": model.merges must be an array");
  merges_.reserve(merges->size());
  const size_t prefix_len = continuing_subword_prefix_.size();
  int32_t rank = 0;
  for (const auto& m : *merges) {
    std::string a;
    std::string b;
    if (m.is_string()) {
      const auto& s = m.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      SPECDEC_CHECK(space != std::string::npos && s.find(' ', space + 1) == std::string::npos, where,
                    ": merge ", rank, " ('", s, "') is not two tokens separated by one space");
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else {
      SPECDEC_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(), where, ": merge ", rank,
                    " must be a string \"a b\" or a pair [a, b]");
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    }
    auto ia = vocab_.find(a);
    auto ib = vocab_.find(b);
    SPECDEC_CHECK(ia != vocab_.end(), where, ": merge ", rank, " uses token '", a, "' missing from the vocabulary");
    SPECDEC_CHECK(ib != vocab_.end(), where, ": merge ", rank, " uses token '", b, "' missing from the vocabulary");
    const std::string merged = a + (b.size() >= prefix_len ? b.substr(prefix_len) : std::string());
    auto im = vocab_.find(merged);
    SPECDEC_CHECK(im != vocab_.end(), where, ": merge ", rank, " yields '", merged, "' missing from the vocabulary");
    merges_[pair_key(ia->second, ib->second)] = Merge{rank, im->second};
    ++rank;
  }
}

std::optional<int32_t> Bpe::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* Bpe::id_to_token(int32_t id) const {
  if (id < 0 || id >= id_end() || !has_id_[static_cast<size_t>(id)]) return nullptr;
  return &vocab_r_[static_cast<size_t>(id)];
}

const Bpe::Merge* Bpe::find_merge(int32_t left, int32_t right) const {
  auto it = merges_.find(pair_key(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

void Bpe::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto id = token_to_id(word)) {
      out.push_back(*id);
      return;
    }
  }
  const bool cacheable = word.size() < kCacheMaxWordBytes;
  if (cacheable) {
    std::lock_guard lock(cache_mutex_);
    if (auto it = cache_.find(word); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  merge_word(word, ids);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::lock_guard lock(cache_mutex_);
    if (cache_.size() >= kCacheCapacity) cache_.clear();
    cache_.emplace(std::string(word), std::move(ids));
  }
}

void Bpe::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  // 1. Initial symbols: one per character (with prefix/suffix decoration), byte-fallback
  //    tokens for characters outside the vocabulary, or the unknown token.
  std::vector<int32_t> symbols;
  symbols.reserve(word.size());
  int32_t pending_unk = -1;  // an unknown run not yet emitted (fuse_unk joins runs), or -1
  std::string piece;
  size_t i = 0;
  while (i < word.size()) {
    const size_t len = utf8::char_len(static_cast<unsigned char>(word[i]));
    const bool first = i == 0;
    const bool last = i + len >= word.size();
    piece.clear();
    if (!first) piece += continuing_subword_prefix_;
    piece.append(word.substr(i, len));
    if (last) piece += end_of_word_suffix_;
    i += len;
    if (auto id = token_to_id(piece)) {
      if (pending_unk >= 0) symbols.push_back(pending_unk);
      pending_unk = -1;
      symbols.push_back(*id);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char c : piece) all = all && byte_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all) {
        // The library emits byte tokens without flushing a pending unknown first.
        for (char c : piece) symbols.push_back(byte_ids_[static_cast<unsigned char>(c)]);
        continue;
      }
    }
    if (unk_id_) {
      if (pending_unk >= 0 && !fuse_unk_) symbols.push_back(pending_unk);
      pending_unk = *unk_id_;
    }
  }
  if (pending_unk >= 0) symbols.push_back(pending_unk);

  // 2. Merge loop over a doubly linked list.
  const int n = static_cast<int>(symbols.size());
  std::vector<int> prev(static_cast<size_t>(n));
  std::vector<int> next(static_cast<size_t>(n));
  std::vector<bool> alive(static_cast<size_t>(n), true);
  for (int k = 0; k < n; ++k) {
    prev[static_cast<size_t>(k)] = k - 1;
    next[static_cast<size_t>(k)] = k + 1 < n ? k + 1 : -1;
  }
  struct Candidate {
    int32_t rank;
    int pos;
    int32_t new_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto consider = [&](int left) {
    const int right = next[static_cast<size_t>(left)];
    if (right < 0) return;
    if (const Merge* m = find_merge(symbols[static_cast<size_t>(left)], symbols[static_cast<size_t>(right)])) {
      heap.push({m->rank, left, m->new_id});
    }
  };
  for (int k = 0; k + 1 < n; ++k) consider(k);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const auto pos = static_cast<size_t>(c.pos);
    if (!alive[pos] || next[pos] < 0) continue;
    const auto right = static_cast<size_t>(next[pos]);
    const Merge* m = find_merge(symbols[pos], symbols[right]);
    if (m == nullptr || m->new_id != c.new_id) continue;  // stale candidate
    symbols[pos] = c.new_id;
    alive[right] = false;
    next[pos] = next[right];
    if (next[right] >= 0) prev[static_cast<size_t>(next[right])] = c.pos;
    if (prev[pos] >= 0) consider(prev[pos]);
    consider(c.pos);
  }
  for (int k = 0; k >= 0 && k < n; k = next[static_cast<size_t>(k)]) out.push_back(symbols[static_cast<size_t>(k)]);
}

}  // namespace specdec
