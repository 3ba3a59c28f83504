// Membership changes for a method whose rows each own one sequence (a field `seq`) of the
// method's own paged KV cache: the build-aside / swap-in contract of DraftRows, written once for
// every such method.
#pragma once

#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "kv/kv_cache.h"
#include "speculative/draft.h"

namespace specdec {

// Rows built aside in `added` join the end of `rows` on commit; dropped uncommitted, their
// sequences go back to `cache`. Both must outlive the change (they belong to the group).
template <class Row>
PreparedChange append_on_commit(std::vector<Row>& rows, std::shared_ptr<std::vector<Row>> added, KvCache& cache) {
  std::vector<Row>* into = &rows;
  KvCache* pool = &cache;
  return PreparedChange(
      [into, added] {
        for (auto& r : *added) into->push_back(std::move(r));
        added->clear();
      },
      [added, pool] {
        for (auto& r : *added) pool->release(r.seq);
      });
}

// Keeps rows `keep` (ascending indices into `rows`), in that order, and frees the sequences of
// the others.
template <class Row>
void keep_rows(std::vector<Row>& rows, std::span<const int> keep, KvCache& cache) {
  std::vector<Row> next;
  std::vector<bool> kept(rows.size(), false);
  for (int i : keep) {
    kept.at(static_cast<size_t>(i)) = true;
    next.push_back(std::move(rows[static_cast<size_t>(i)]));
  }
  for (size_t i = 0; i < rows.size(); ++i)
    if (!kept[i]) cache.release(rows[i].seq);
  rows = std::move(next);
}

}  // namespace specdec
