// PCRE2 wrapper. Patterns in tokenizer.json are written for Oniguruma; the subset they use
// (classes, \p{..}, lookahead, inline flags) means the same in PCRE2 with UTF and UCP set.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace specdec {

struct Regex::Compiled {
  pcre2_code* code = nullptr;  // null for a literal
  std::string pattern;         // the regex, or the literal text
  ~Compiled() { pcre2_code_free(code); }
};

namespace {

struct MatchData {
  explicit MatchData(const pcre2_code* code) : data(pcre2_match_data_create_from_pattern(code, nullptr)) {
    SPECDEC_CHECK(data != nullptr, "regex: out of memory for match data");
  }
  ~MatchData() { pcre2_match_data_free(data); }
  MatchData(const MatchData&) = delete;
  MatchData& operator=(const MatchData&) = delete;
  pcre2_match_data* data;
};

// Oniguruma's \s is Unicode White_Space; PCRE2's (with UCP) also matches U+180E. Spell the
// class out so both engines split text the same way. Inside [...] the list goes in bare.
constexpr std::string_view kWhiteSpace =
    "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

std::string with_unicode_whitespace(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size());
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[++i];
      // Appended piece by piece: g++ 12 under the sanitizers warns (-Wrestrict, falsely) on
      // `"[" + std::string(...)`.
      if (e == 's') {
        if (!in_class) out.push_back('[');
        out.append(kWhiteSpace);
        if (!in_class) out.push_back(']');
      } else if (e == 'S' && !in_class) {
        out.append("[^");
        out.append(kWhiteSpace);
        out.push_back(']');
      } else {
        out.push_back(c);
        out.push_back(e);
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out.push_back(pattern[++i]);
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out.push_back(pattern[++i]);
      continue;
    }
    if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      const size_t close = pattern.find(":]", i + 2);  // POSIX class such as [:alpha:]
      if (close != std::string_view::npos) {
        out.append(pattern.substr(i, close + 2 - i));
        i = close + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out.push_back(c);
  }
  return out;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return std::string(reinterpret_cast<const char*>(buffer));
}

}  // namespace

Regex::Regex(std::string_view pattern, std::string_view where) {
  auto compiled = std::make_shared<Compiled>();
  compiled->pattern = std::string(pattern);
  const std::string translated = with_unicode_whitespace(pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  compiled->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                 PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (compiled->code == nullptr) {
    fail(where, ": cannot compile regex '", pattern, "' at offset ", offset, ": ", pcre2_message(error));
  }
  // JIT is an optimisation only; an interpreter fallback is fine where it is unavailable.
  pcre2_jit_compile(compiled->code, PCRE2_JIT_COMPLETE);
  compiled_ = std::move(compiled);
}

Regex Regex::literal(std::string_view text) {
  auto compiled = std::make_shared<Compiled>();
  compiled->pattern = std::string(text);
  Regex re;
  re.compiled_ = std::move(compiled);
  return re;
}

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view subject) const {
  std::vector<std::pair<size_t, size_t>> out;
  if (compiled_->code == nullptr) {
    const std::string& lit = compiled_->pattern;
    if (lit.empty()) return out;
    for (size_t at = subject.find(lit); at != std::string_view::npos; at = subject.find(lit, at + lit.size())) {
      out.emplace_back(at, at + lit.size());
    }
    return out;
  }
  MatchData md(compiled_->code);
  const auto* data = reinterpret_cast<PCRE2_SPTR>(subject.data());
  size_t start = 0;
  while (start <= subject.size()) {
    const int rc = pcre2_match(compiled_->code, data, subject.size(), start, PCRE2_NO_UTF_CHECK, md.data, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) fail("regex '", compiled_->pattern, "': match failed: ", pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.data);
    const size_t b = ov[0];
    const size_t e = ov[1];
    out.emplace_back(b, e);
    if (e > b) {
      start = e;
    } else {
      if (e >= subject.size()) break;
      start = e + utf8::char_len(static_cast<unsigned char>(subject[e]));
    }
  }
  return out;
}

bool Regex::search(std::string_view subject) const {
  if (compiled_->code == nullptr) return subject.find(compiled_->pattern) != std::string_view::npos;
  MatchData md(compiled_->code);
  const int rc = pcre2_match(compiled_->code, reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(), 0,
                             PCRE2_NO_UTF_CHECK, md.data, nullptr);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) fail("regex '", compiled_->pattern, "': match failed: ", pcre2_message(rc));
  return true;
}

std::string replace_all(const Regex& pattern, std::string_view subject, std::string_view content) {
  if (pattern.compiled_->code == nullptr && subject.find(pattern.compiled_->pattern) == std::string_view::npos) {
    return std::string(subject);  // the common case when decoding token by token
  }
  std::string out;
  out.reserve(subject.size());
  size_t prev = 0;
  for (const auto& [b, e] : pattern.find_all(subject)) {
    out.append(subject.substr(prev, b - prev));
    out.append(content);
    prev = e;
  }
  out.append(subject.substr(prev));
  return out;
}

}  // namespace specdec
