// Pre-tokeniser implementations. Splitting follows the `tokenizers` library: a pattern yields
// matched and unmatched spans covering the text, a behaviour decides how matches join their
// neighbours, and empty spans vanish.
#include "tokenizer/pre_tokenizers.h"

#include <functional>
#include <nlohmann/json.hpp>
#include <utility>

#include "core/error.h"
#include "tokenizer/json_util.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace specdec {
namespace {

enum class Behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

struct Span {
  size_t begin;
  size_t end;
  bool flag;  // "is a match" before the behaviour is applied, "remove" after
};

using Matcher = std::function<std::vector<std::pair<size_t, size_t>>(std::string_view)>;

// Matches and the gaps between them, covering all of `text`.
std::vector<Span> cover(std::string_view text, const Matcher& matcher, bool invert) {
  std::vector<Span> spans;
  if (text.empty()) return {{0, 0, invert}};
  size_t prev = 0;
  for (const auto& [b, e] : matcher(text)) {
    if (prev != b) spans.push_back({prev, b, invert});
    spans.push_back({b, e, !invert});
    prev = e;
  }
  if (prev != text.size()) spans.push_back({prev, text.size(), invert});
  return spans;
}

std::vector<Span> apply_behavior(std::vector<Span> m, Behavior behavior) {
  std::vector<Span> out;
  bool previous_match = false;
  switch (behavior) {
    case Behavior::isolated:
      for (auto& s : m) s.flag = false;
      return m;
    case Behavior::removed:
      return m;
    case Behavior::merged_with_previous:
      for (const auto& s : m) {
        if (s.flag && !previous_match && !out.empty()) {
          out.back().end = s.end;
        } else {
          out.push_back({s.begin, s.end, false});
        }
        previous_match = s.flag;
      }
      return out;
    case Behavior::merged_with_next:
      for (auto it = m.rbegin(); it != m.rend(); ++it) {
        if (it->flag && !previous_match && !out.empty()) {
          out.back().begin = it->begin;
        } else {
          out.push_back({it->begin, it->end, false});
        }
        previous_match = it->flag;
      }
      return {out.rbegin(), out.rend()};
    case Behavior::contiguous:
      for (const auto& s : m) {
        if (s.flag == previous_match && !out.empty()) {
          out.back().end = s.end;
        } else {
          out.push_back({s.begin, s.end, false});
        }
        previous_match = s.flag;
      }
      return out;
  }
  return out;
}

void split_pieces(std::vector<Piece>& pieces, const Matcher& matcher, Behavior behavior, bool invert) {
  std::vector<Piece> out;
  out.reserve(pieces.size());
  for (auto& piece : pieces) {
    for (const Span& s : apply_behavior(cover(piece.text, matcher, invert), behavior)) {
      if (s.flag || s.begin == s.end) continue;
      out.push_back({piece.text.substr(s.begin, s.end - s.begin), piece.at_start && s.begin == 0});
    }
  }
  pieces = std::move(out);
}

Matcher regex_matcher(std::shared_ptr<const Regex> re) {
  return [re = std::move(re)](std::string_view text) { return re->find_all(text); };
}

// Each character satisfying `pred` is its own match (the library's char-predicate patterns).
Matcher char_matcher(std::function<bool(char32_t)> pred) {
  return [pred = std::move(pred)](std::string_view text) {
    std::vector<std::pair<size_t, size_t>> out;
    size_t i = 0;
    while (i < text.size()) {
      size_t len = 0;
      const char32_t cp = utf8::decode_at(text, i, &len);
      if (pred(cp)) out.emplace_back(i, i + len);
      i += len;
    }
    return out;
  };
}

Behavior parse_behavior(const std::string& name, const std::string& where) {
  if (name == "Removed") return Behavior::removed;
  if (name == "Isolated") return Behavior::isolated;
  if (name == "MergedWithPrevious") return Behavior::merged_with_previous;
  if (name == "MergedWithNext") return Behavior::merged_with_next;
  if (name == "Contiguous") return Behavior::contiguous;
  fail(where, ": unsupported split behavior '", name, "'");
}

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(Matcher matcher, Behavior behavior, bool invert)
      : matcher_(std::move(matcher)), behavior_(behavior), invert_(invert) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override { split_pieces(pieces, matcher_, behavior_, invert_); }

 private:
  Matcher matcher_;
  Behavior behavior_;
  bool invert_;
};

// The GPT-2 word pattern, used by ByteLevel when use_regex is set.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex, const std::string& where)
      : add_prefix_space_(add_prefix_space) {
    if (use_regex) matcher_ = regex_matcher(std::make_shared<const Regex>(kGpt2Pattern, where));
  }
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    if (add_prefix_space_) {
      for (auto& p : pieces) {
        if (!p.text.starts_with(' ')) p.text = std::string(1, ' ') + p.text;
      }
    }
    if (matcher_) split_pieces(pieces, matcher_, Behavior::isolated, false);
    const auto& alphabet = utf8::byte_level_alphabet();
    for (auto& p : pieces) {
      std::string mapped;
      mapped.reserve(p.text.size() * 2);
      for (char c : p.text) {
        // Inline two-byte encoding: every stand-in code point is below 0x800.
        const char32_t cp = alphabet.byte_to_char[static_cast<unsigned char>(c)];
        if (cp < 0x80) {
          mapped.push_back(static_cast<char>(cp));
        } else {
          mapped.push_back(static_cast<char>(0xC0 | (cp >> 6)));
          mapped.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
        }
      }
      p.text = std::move(mapped);
    }
  }

 private:
  bool add_prefix_space_;
  Matcher matcher_;
};

enum class PrependScheme { always, first, never };

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {
    size_t len = 0;
    const char32_t cp = utf8::decode_at(replacement_, 0, &len);
    split_matcher_ = char_matcher([cp](char32_t c) { return c == cp; });
  }
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (auto& p : pieces) {
      std::string out;
      out.reserve(p.text.size() + replacement_.size());
      for (char c : p.text) {
        if (c == ' ') {
          out += replacement_;
        } else {
          out.push_back(c);
        }
      }
      const bool prepend = scheme_ == PrependScheme::always || (scheme_ == PrependScheme::first && p.at_start);
      if (prepend && !out.starts_with(replacement_)) out.insert(0, replacement_);
      p.text = std::move(out);
    }
    if (split_) split_pieces(pieces, split_matcher_, Behavior::merged_with_next, false);
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
  Matcher split_matcher_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts) : parts_(std::move(parts)) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (const auto& p : parts_) p->pre_tokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

PrependScheme parse_prepend_scheme(const nlohmann::json& spec, const std::string& where) {
  auto it = spec.find("prepend_scheme");
  if (it == spec.end() || it->is_null()) {
    // Files older than prepend_scheme carry add_prefix_space instead.
    return json_bool(spec, "add_prefix_space", where, true) ? PrependScheme::always : PrependScheme::never;
  }
  SPECDEC_CHECK(it->is_string(), where, ": Metaspace prepend_scheme must be a string");
  const auto s = it->get<std::string>();
  if (s == "always") return PrependScheme::always;
  if (s == "first") return PrependScheme::first;
  if (s == "never") return PrependScheme::never;
  fail(where, ": unsupported Metaspace prepend_scheme '", s, "'");
}

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& spec, const std::string& where) {
  if (spec.is_null()) return nullptr;
  const std::string type = json_type(spec, where, "pre_tokenizer");
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (const auto& sub : json_array(spec, "pretokenizers", where)) {
      if (auto p = make_pre_tokenizer(sub, where)) parts.push_back(std::move(p));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(parts));
  }
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevelPreTokenizer>(json_bool(spec, "add_prefix_space", where, true),
                                                   json_bool(spec, "use_regex", where, true), where);
  }
  if (type == "Split") {
    auto re = std::make_shared<const Regex>(json_pattern(spec, where + ": pre_tokenizer Split"));
    return std::make_unique<SplitPreTokenizer>(regex_matcher(std::move(re)),
                                               parse_behavior(json_string(spec, "behavior", where), where),
                                               json_bool(spec, "invert", where, false));
  }
  if (type == "Metaspace") {
    std::string replacement = json_string(spec, "replacement", where);
    SPECDEC_CHECK(!replacement.empty() && !utf8::first_invalid(replacement), where,
                  ": Metaspace replacement must be one character");
    return std::make_unique<MetaspacePreTokenizer>(std::move(replacement), parse_prepend_scheme(spec, where),
                                                   json_bool(spec, "split", where, true));
  }
  if (type == "Whitespace") {
    auto re = std::make_shared<const Regex>(R"(\w+|[^\w\s]+)", where);
    return std::make_unique<SplitPreTokenizer>(regex_matcher(std::move(re)), Behavior::removed, true);
  }
  if (type == "WhitespaceSplit") {
    return std::make_unique<SplitPreTokenizer>(char_matcher(utf8::is_whitespace), Behavior::removed, false);
  }
  if (type == "Digits") {
    auto re = std::make_shared<const Regex>(R"(\p{N})", where);
    const bool individual = json_bool(spec, "individual_digits", where, false);
    return std::make_unique<SplitPreTokenizer>(regex_matcher(std::move(re)),
                                               individual ? Behavior::isolated : Behavior::contiguous, false);
  }
  fail(where, ": unsupported pre_tokenizer type '", type, "'");
}

}  // namespace specdec
