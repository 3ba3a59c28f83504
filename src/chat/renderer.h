// Rendering a parsed template: statements write to the output, expressions evaluate to values.
// Scopes follow jinja2: a for loop or macro body has its own variables, `set` writes the
// innermost scope, and a namespace() is the way to carry a value out of a loop.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "chat/ast.h"

namespace specdec::chat {

using Frame = std::unordered_map<std::string, Value>;

class Renderer {
 public:
  // globals: the functions and the caller's variables (messages, bos_token, ...).
  Renderer(std::string template_name, Frame globals);
  std::string render(const Body& body);

 private:
  enum class Flow { Normal, Break, Continue };

  Flow exec(const Body& body);
  Flow exec(const Stmt& s);
  Flow exec_statement(const Stmt& s);
  Flow exec_if(const Stmt& s);
  Flow exec_for(const Stmt& s);
  void exec_set(const Stmt& s);
  void define_macro(const Stmt& s);
  Value call_macro(const Stmt& macro, const CallArgs& args);
  std::string capture(const Body& body);  // renders body into a string rather than the output

  Value eval(const Expr& e);
  Value eval_call(const Expr& e);
  Value eval_filter(const Expr& e);
  Value eval_test(const Expr& e);
  Value eval_binary(const Expr& e);
  Value eval_literal_collection(const Expr& e);
  CallArgs eval_args(const Expr& e);

  Value lookup(const std::string& name) const;
  void assign(const std::string& name, Value v);
  void bind_targets(Frame& frame, const std::vector<std::string>& names, const Value& item);
  [[noreturn]] void fail(int line, const std::string& what) const;

  std::string name_;
  std::vector<std::shared_ptr<Frame>> frames_;  // [0] globals, [1] the template's own, then inner scopes
  // Macro calls under way. A macro may call itself (templates render nested JSON schemas so), but
  // each call recurses through the renderer: past kMaxMacroDepth the render fails, as jinja2's
  // does at Python's recursion limit, instead of exhausting the stack.
  static constexpr int kMaxMacroDepth = 64;
  int macro_depth_ = 0;
  std::string* out_ = nullptr;
};

}  // namespace specdec::chat
