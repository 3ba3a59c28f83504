// Reading a template's source: first into chunks (text, {{ output }}, {% statement %}) with the
// whitespace control of Hugging Face's environment applied (trim_blocks, lstrip_blocks and the
// `-` markers), then a tag's inside into expression tokens.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace specdec::chat {

struct Chunk {
  enum class Kind { Text, Output, Statement };
  Kind kind;
  std::string text;  // the text, or the tag's inside without delimiters and markers
  int line;          // where it starts in the template
};

struct Token {
  enum class Type { Name, String, Int, Float, Op, End };
  Type type;
  std::string text;  // the name, the operator, or the string's decoded value
  int line;
  int64_t int_value = 0;
  double float_value = 0;
};

// Throws TemplateError (naming `name` and the line) on an unclosed tag or comment.
std::vector<Chunk> split_chunks(const std::string& source, const std::string& name);
// The tokens of one tag's inside, ending with an End token.
std::vector<Token> tokenize(const std::string& code, int line, const std::string& name);

}  // namespace specdec::chat
