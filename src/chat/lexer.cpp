// The two lexing steps of a template: chunks with whitespace control, and expression tokens.
#include "chat/lexer.h"

#include <algorithm>
#include <cctype>

#include "chat/error.h"

namespace specdec::chat {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

[[noreturn]] void fail(const std::string& name, int line, const std::string& what) {
  throw TemplateError("template " + name + " line " + std::to_string(line) + ": " + what);
}

// Where the tag opened at `open` ends (the index of its closing "}}", "%}" or "#}"), skipping
// string literals so that a quoted "%}" does not close it; npos when it never closes.
size_t find_tag_end(const std::string& s, size_t open) {
  const char kind = s[open + 1];
  if (kind == '#') return s.find("#}", open + 2);
  const char close = kind == '{' ? '}' : '%';
  char quote = 0;
  for (size_t i = open + 2; i + 1 < s.size(); ++i) {
    const char c = s[i];
    if (quote) {
      if (c == '\\') ++i;
      else if (c == quote) quote = 0;
    } else if (c == '\'' || c == '"') {
      quote = c;
    } else if (c == close && s[i + 1] == '}') {
      return i;
    }
  }
  return std::string::npos;
}

// lstrip_blocks: spaces and tabs between the start of a line and a block tag are removed.
void lstrip_block(std::string& text, bool text_starts_line) {
  const size_t nl = text.rfind('\n');
  const size_t from = nl == std::string::npos ? 0 : nl + 1;
  if (nl == std::string::npos && !text_starts_line) return;
  for (size_t i = from; i < text.size(); ++i)
    if (text[i] != ' ' && text[i] != '\t') return;
  text.resize(from);
}

}  // namespace

std::vector<Chunk> split_chunks(const std::string& s, const std::string& name) {
  std::vector<Chunk> chunks;
  size_t pos = 0;
  int line = 1;
  bool strip_next = false;    // the last tag ended with "-": drop all leading whitespace
  bool newline_next = false;  // the last tag was a block or comment: drop one leading newline
  while (pos <= s.size()) {
    size_t open = pos;
    while ((open = s.find('{', open)) != std::string::npos && open + 1 < s.size() &&
           s[open + 1] != '{' && s[open + 1] != '%' && s[open + 1] != '#')
      ++open;
    if (open != std::string::npos && open + 1 >= s.size()) open = std::string::npos;
    std::string text = s.substr(pos, open == std::string::npos ? std::string::npos : open - pos);
    const int text_line = line;
    line += static_cast<int>(std::count(text.begin(), text.end(), '\n'));
    size_t start = pos;
    if (strip_next) {
      const size_t k = text.find_first_not_of(" \t\n\r\v\f");
      start += k == std::string::npos ? text.size() : k;
      text.erase(0, k == std::string::npos ? text.size() : k);
    } else if (newline_next && !text.empty() && text[0] == '\n') {
      text.erase(0, 1);
      ++start;
    }
    if (open != std::string::npos) {
      const char kind = s[open + 1];
      const char marker = open + 2 < s.size() ? s[open + 2] : 0;
      if (marker == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (kind != '{' && marker != '+') {
        lstrip_block(text, start == 0 || s[start - 1] == '\n');
      }
    }
    if (!text.empty()) chunks.push_back({Chunk::Kind::Text, text, text_line});
    if (open == std::string::npos) break;
    const size_t end = find_tag_end(s, open);
    if (end == std::string::npos) fail(name, line, "tag opened here is never closed");
    const char kind = s[open + 1];
    size_t b = open + 2, e = end;
    if (b < e && (s[b] == '-' || s[b] == '+')) ++b;
    const char right = e > b ? s[e - 1] : 0;
    if (right == '-' || right == '+') --e;
    strip_next = right == '-';
    newline_next = kind != '{' && right != '+';
    if (kind != '#')
      chunks.push_back({kind == '{' ? Chunk::Kind::Output : Chunk::Kind::Statement, s.substr(b, e - b), line});
    line += static_cast<int>(std::count(s.begin() + static_cast<long>(open), s.begin() + static_cast<long>(end), '\n'));
    pos = end + 2;
  }
  return chunks;
}

namespace {

std::string read_string(const std::string& c, size_t& i, int line, const std::string& name) {
  const char q = c[i++];
  std::string out;
  while (i < c.size() && c[i] != q) {
    char ch = c[i++];
    if (ch == '\\' && i < c.size()) {
      const char esc = c[i++];
      switch (esc) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case '0': out += '\0'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case '\n': break;
        default: out += '\\', out += esc;
      }
    } else {
      out += ch;
    }
  }
  if (i >= c.size()) fail(name, line, "unterminated string literal");
  ++i;
  return out;
}

}  // namespace

std::vector<Token> tokenize(const std::string& c, int line, const std::string& name) {
  static const char* const kOps[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                                     "(",  ")",  "[",  "]",  "{",  "}",  ",", ".", ":", "|", "="};
  std::vector<Token> out;
  size_t i = 0;
  while (i < c.size()) {
    const char ch = c[i];
    if (ch == '\n') ++line;
    if (is_space(ch)) {
      ++i;
      continue;
    }
    if (std::isalpha(static_cast<unsigned char>(ch)) || ch == '_') {
      size_t j = i;
      while (j < c.size() && (std::isalnum(static_cast<unsigned char>(c[j])) || c[j] == '_')) ++j;
      out.push_back({Token::Type::Name, c.substr(i, j - i), line});
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(ch))) {
      size_t j = i;
      bool is_float = false;
      while (j < c.size() && (std::isdigit(static_cast<unsigned char>(c[j])) || c[j] == '_')) ++j;
      if (j + 1 < c.size() && c[j] == '.' && std::isdigit(static_cast<unsigned char>(c[j + 1]))) {
        is_float = true;
        ++j;
        while (j < c.size() && std::isdigit(static_cast<unsigned char>(c[j]))) ++j;
      }
      if (j < c.size() && (c[j] == 'e' || c[j] == 'E')) {  // 1e-05, 2.5E3
        size_t k = j + 1;
        if (k < c.size() && (c[k] == '+' || c[k] == '-')) ++k;
        if (k < c.size() && std::isdigit(static_cast<unsigned char>(c[k]))) {
          is_float = true;
          j = k;
          while (j < c.size() && std::isdigit(static_cast<unsigned char>(c[j]))) ++j;
        }
      }
      std::string num = c.substr(i, j - i);
      num.erase(std::remove(num.begin(), num.end(), '_'), num.end());
      Token t{is_float ? Token::Type::Float : Token::Type::Int, num, line};
      if (is_float) t.float_value = std::stod(num);
      else t.int_value = std::stoll(num);
      out.push_back(t);
      i = j;
    } else if (ch == '\'' || ch == '"') {
      const int at = line;
      std::string str = read_string(c, i, line, name);
      out.push_back({Token::Type::String, std::move(str), at});
    } else {
      bool matched = false;
      for (const char* op : kOps) {
        const std::string o(op);
        if (c.compare(i, o.size(), o) == 0) {
          out.push_back({Token::Type::Op, o, line});
          i += o.size();
          matched = true;
          break;
        }
      }
      if (!matched) fail(name, line, std::string("unexpected character '") + ch + "'");
    }
  }
  out.push_back({Token::Type::End, "", line});
  return out;
}

}  // namespace specdec::chat
