// A text pattern: a compiled PCRE2 regex (UTF + Unicode properties, JIT when available) or a
// literal string, used by the Split and ByteLevel pre-tokenisers, the Replace normaliser/decoder
// and added-token word checks. Immutable after construction, so one pattern may be shared by threads.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace specdec {

class Regex {
 public:
  // `where` names the file and field the pattern came from, for error messages.
  Regex(std::string_view pattern, std::string_view where);

  // A pattern matching exactly `text` (no regex syntax); matched with a plain substring search.
  static Regex literal(std::string_view text);

  // Every non-overlapping match, left to right, as [begin, end) byte offsets. Empty matches are
  // reported and the scan then moves on by one character. `subject` must be valid UTF-8.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view subject) const;

  // True when the pattern matches somewhere in `subject`.
  bool search(std::string_view subject) const;

 private:
  friend std::string replace_all(const Regex&, std::string_view, std::string_view);
  Regex() = default;
  struct Compiled;
  std::shared_ptr<const Compiled> compiled_;
};

// Replaces every match of `pattern` in `subject` with `content` (no group references).
std::string replace_all(const Regex& pattern, std::string_view subject, std::string_view content);

}  // namespace specdec
