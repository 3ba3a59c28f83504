// Python str operations over UTF-8; case mapping is ASCII-only, which is what chat templates need.
#include "chat/text.h"

#include <algorithm>
#include <cctype>

#include "chat/value.h"

namespace specdec::chat {
namespace {

bool is_py_space(const std::string& c) {
  return c == " " || c == "\t" || c == "\n" || c == "\r" || c == "\v" || c == "\f" || c == "\x1c" || c == "\x1d" ||
         c == "\x1e" || c == "\x1f" || c == "\xc2\x85" || c == "\xc2\xa0" || c == "\xe3\x80\x80";
}

}  // namespace

std::string strip(const std::string& s, const std::optional<std::string>& chars, bool left, bool right) {
  const std::vector<std::string> cs = characters(s);
  const std::vector<std::string> set = chars ? characters(*chars) : std::vector<std::string>{};
  auto strippable = [&](const std::string& c) {
    return chars ? std::find(set.begin(), set.end(), c) != set.end() : is_py_space(c);
  };
  size_t b = 0, e = cs.size();
  if (left)
    while (b < e && strippable(cs[b])) ++b;
  if (right)
    while (e > b && strippable(cs[e - 1])) --e;
  std::string out;
  for (size_t i = b; i < e; ++i) out += cs[i];
  return out;
}

std::vector<std::string> split(const std::string& s, const std::optional<std::string>& sep, int64_t maxsplit,
                               bool from_right) {
  std::vector<std::string> out;
  if (sep) {
    if (from_right && maxsplit >= 0) {
      size_t end = s.size();
      for (int64_t n = 0; n < maxsplit; ++n) {
        const size_t at = end == 0 ? std::string::npos : s.rfind(*sep, end - sep->size());
        if (at == std::string::npos || at + sep->size() > end) break;
        out.insert(out.begin(), s.substr(at + sep->size(), end - at - sep->size()));
        end = at;
      }
      out.insert(out.begin(), s.substr(0, end));
      return out;
    }
    size_t start = 0;
    for (int64_t n = 0; maxsplit < 0 || n < maxsplit; ++n) {
      const size_t at = s.find(*sep, start);
      if (at == std::string::npos || sep->empty()) break;
      out.push_back(s.substr(start, at - start));
      start = at + sep->size();
    }
    out.push_back(s.substr(start));
    return out;
  }
  const std::vector<std::string> cs = characters(s);
  std::string cur;
  bool in_word = false;
  for (size_t i = 0; i < cs.size(); ++i) {
    if (is_py_space(cs[i])) {
      if (in_word) out.push_back(cur), cur.clear(), in_word = false;
      continue;
    }
    if (!in_word && maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      std::string rest;
      for (size_t j = i; j < cs.size(); ++j) rest += cs[j];
      out.push_back(strip(rest, std::nullopt, false, true));
      return out;
    }
    cur += cs[i];
    in_word = true;
  }
  if (in_word) out.push_back(cur);
  return out;
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  if (from.empty()) return s;
  std::string out;
  size_t start = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    const size_t at = s.find(from, start);
    if (at == std::string::npos) break;
    out += s.substr(start, at - start) + to;
    start = at + from.size();
  }
  return out + s.substr(start);
}

std::string to_upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string to_lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string title_case(const std::string& s) {
  std::string out = s;
  bool start = true;
  for (char& c : out) {
    const auto u = static_cast<unsigned char>(c);
    if (std::isalpha(u)) {
      c = static_cast<char>(start ? std::toupper(u) : std::tolower(u));
      start = false;
    } else {
      start = !(std::isdigit(u) || u >= 0x80);
    }
  }
  return out;
}

std::string capitalize(const std::string& s) {
  std::string out = to_lower(s);
  if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
  return out;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace specdec::chat
