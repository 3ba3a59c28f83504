// UTF-8 helpers: decoding, validation and lossy conversion follow Rust's core::str rules so that
// decoded text is byte-identical to the `tokenizers` library's.
#include "tokenizer/utf8.h"

namespace specdec::utf8 {
namespace {

bool is_cont(unsigned char b) { return (b & 0xC0) == 0x80; }

// Length of the valid sequence at s[i] (0 if invalid) and, when invalid, the length of the
// maximal subpart to replace with one U+FFFD (always >= 1).
struct Step {
  size_t valid = 0;
  size_t invalid = 0;
};

Step step_at(std::string_view s, size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  const size_t n = s.size();
  auto at = [&](size_t k) -> int { return i + k < n ? static_cast<unsigned char>(s[i + k]) : -1; };
  if (b < 0x80) return {1, 0};
  if (b >= 0xC2 && b <= 0xDF) {
    const int c1 = at(1);
    return (c1 >= 0 && is_cont(static_cast<unsigned char>(c1))) ? Step{2, 0} : Step{0, 1};
  }
  if (b >= 0xE0 && b <= 0xEF) {
    const int c1 = at(1);
    const int lo = b == 0xE0 ? 0xA0 : 0x80;
    const int hi = b == 0xED ? 0x9F : 0xBF;
    if (c1 < lo || c1 > hi) return {0, 1};
    const int c2 = at(2);
    if (c2 < 0 || !is_cont(static_cast<unsigned char>(c2))) return {0, 2};
    return {3, 0};
  }
  if (b >= 0xF0 && b <= 0xF4) {
    const int c1 = at(1);
    const int lo = b == 0xF0 ? 0x90 : 0x80;
    const int hi = b == 0xF4 ? 0x8F : 0xBF;
    if (c1 < lo || c1 > hi) return {0, 1};
    const int c2 = at(2);
    if (c2 < 0 || !is_cont(static_cast<unsigned char>(c2))) return {0, 2};
    const int c3 = at(3);
    if (c3 < 0 || !is_cont(static_cast<unsigned char>(c3))) return {0, 3};
    return {4, 0};
  }
  return {0, 1};
}

}  // namespace

size_t char_len(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 1;
}

char32_t decode_at(std::string_view s, size_t i, size_t* len) {
  const auto b = static_cast<unsigned char>(s[i]);
  const size_t n = char_len(b);
  *len = n;
  if (n == 1) return b;
  char32_t cp = b & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return cp;
}

void append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::optional<size_t> first_invalid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const Step st = step_at(s, i);
    if (st.valid == 0) return i;
    i += st.valid;
  }
  return std::nullopt;
}

std::string from_bytes_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    const Step st = step_at(bytes, i);
    if (st.valid > 0) {
      out.append(bytes.substr(i, st.valid));
      i += st.valid;
    } else {
      out.append(kReplacement);
      i += st.invalid;
    }
  }
  return out;
}

bool ends_with_replacement(std::string_view s) { return s.ends_with(kReplacement); }

bool is_ascii(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

bool is_whitespace(char32_t cp) {
  switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0x85: case 0xA0:
    case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

const ByteLevelAlphabet& byte_level_alphabet() {
  // Built once; a constant table, the same for every tokenizer.
  static const ByteLevelAlphabet alphabet = [] {
    ByteLevelAlphabet a;
    a.char_to_byte.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t cp = printable ? static_cast<char32_t>(b) : next++;
      append(a.byte_to_utf8[static_cast<size_t>(b)], cp);
      a.byte_to_char[static_cast<size_t>(b)] = cp;
      a.char_to_byte[cp] = static_cast<int16_t>(b);
    }
    return a;
  }();
  return alphabet;
}

}  // namespace specdec::utf8
