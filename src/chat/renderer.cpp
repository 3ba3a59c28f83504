// Statement execution: text and output, if, for (with loop, filters, else), set, macros, filter
// blocks, loop controls.
#include "chat/renderer.h"

#include "chat/builtins.h"
#include "chat/error.h"
#include "chat/operators.h"

namespace specdec::chat {

Renderer::Renderer(std::string template_name, Frame globals) : name_(std::move(template_name)) {
  frames_.push_back(std::make_shared<Frame>(std::move(globals)));
  frames_.push_back(std::make_shared<Frame>());
}

std::string Renderer::render(const Body& body) { return capture(body); }

std::string Renderer::capture(const Body& body) {
  std::string buffer;
  std::string* saved = std::exchange(out_, &buffer);
  try {
    exec(body);
  } catch (...) {
    out_ = saved;
    throw;
  }
  out_ = saved;
  return buffer;
}

void Renderer::fail(int line, const std::string& what) const {
  throw TemplateError("template " + name_ + " line " + std::to_string(line) + ": " + what);
}

Renderer::Flow Renderer::exec(const Body& body) {
  for (const auto& s : body) {
    const Flow f = exec(*s);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

Renderer::Flow Renderer::exec(const Stmt& s) {
  // Evaluation errors learn their line here; errors from a macro body already carry theirs.
  try {
    return exec_statement(s);
  } catch (const EvalError& e) {
    fail(s.line, e.what());
  }
}

Renderer::Flow Renderer::exec_statement(const Stmt& s) {
  switch (s.kind) {
    case Stmt::Kind::Text: *out_ += s.text; return Flow::Normal;
    case Stmt::Kind::Output: *out_ += eval(*s.exprs[0]).to_str(); return Flow::Normal;
    case Stmt::Kind::If: return exec_if(s);
    case Stmt::Kind::For: return exec_for(s);
    case Stmt::Kind::Set: exec_set(s); return Flow::Normal;
    case Stmt::Kind::SetBlock: assign(s.names[0], Value(capture(s.bodies[0]))); return Flow::Normal;
    case Stmt::Kind::Macro: define_macro(s); return Flow::Normal;
    case Stmt::Kind::FilterBlock: {
      frames_.push_back(std::make_shared<Frame>());
      (*frames_.back())[kFilterBlockSubject] = Value(capture(s.bodies[0]));
      const Value v = eval(*s.exprs[0]);
      frames_.pop_back();
      *out_ += v.to_str();
      return Flow::Normal;
    }
    case Stmt::Kind::Break: return Flow::Break;
    case Stmt::Kind::Continue: return Flow::Continue;
    case Stmt::Kind::Scope: return exec(s.bodies[0]);
  }
  return Flow::Normal;
}

Renderer::Flow Renderer::exec_if(const Stmt& s) {
  for (size_t i = 0; i < s.exprs.size(); ++i)
    if (eval(*s.exprs[i]).truthy()) return exec(s.bodies[i]);
  if (s.bodies.size() > s.exprs.size()) return exec(s.bodies.back());
  return Flow::Normal;
}

void Renderer::bind_targets(Frame& frame, const std::vector<std::string>& names, const Value& item) {
  if (names.size() == 1) {
    frame[names[0]] = item;
    return;
  }
  const List parts = iterate(item);
  if (parts.size() != names.size())
    throw EvalError("ValueError: cannot unpack " + std::to_string(parts.size()) + " values into " +
                    std::to_string(names.size()) + " names");
  for (size_t i = 0; i < names.size(); ++i) frame[names[i]] = parts[i];
}

Renderer::Flow Renderer::exec_for(const Stmt& s) {
  const Value iterable = eval(*s.exprs[0]);
  if (iterable.is_none()) throw EvalError("TypeError: 'NoneType' object is not iterable");
  List items = iterate(iterable);
  if (s.exprs[1]) {  // `for x in xs if cond`: the loop (and loop.length) sees only the kept items
    List kept;
    for (const Value& item : items) {
      auto frame = std::make_shared<Frame>();
      bind_targets(*frame, s.names, item);
      frames_.push_back(frame);
      const bool keep = eval(*s.exprs[1]).truthy();
      frames_.pop_back();
      if (keep) kept.push_back(item);
    }
    items = std::move(kept);
  }
  if (items.empty()) return s.bodies.size() > 1 ? exec(s.bodies[1]) : Flow::Normal;
  const auto n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    auto frame = std::make_shared<Frame>();
    bind_targets(*frame, s.names, items[static_cast<size_t>(i)]);
    Dict loop;
    loop.set("index", Value(i + 1));
    loop.set("index0", Value(i));
    loop.set("revindex", Value(n - i));
    loop.set("revindex0", Value(n - i - 1));
    loop.set("first", Value(i == 0));
    loop.set("last", Value(i == n - 1));
    loop.set("length", Value(n));
    loop.set("previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value::undefined("there is no previous item"));
    loop.set("nextitem", i + 1 < n ? items[static_cast<size_t>(i + 1)] : Value::undefined("there is no next item"));
    loop.set("cycle", Value::function("cycle", [i](const CallArgs& a) {
               if (a.positional.empty()) throw EvalError("loop.cycle needs at least one value");
               return a.positional[static_cast<size_t>(i) % a.positional.size()];
             }));
    (*frame)["loop"] = Value(std::move(loop));
    frames_.push_back(frame);
    Flow f;
    try {
      f = exec(s.bodies[0]);
    } catch (...) {
      frames_.pop_back();
      throw;
    }
    frames_.pop_back();
    if (f == Flow::Break) break;
  }
  return Flow::Normal;
}

void Renderer::exec_set(const Stmt& s) {
  Value v = eval(*s.exprs[0]);
  if (!s.text.empty()) {  // set ns.attr = v
    Value target = lookup(s.names[0]);
    if (!target.is_dict() || !target.dict().is_namespace)
      throw EvalError("cannot assign attribute '" + s.text + "' on '" + s.names[0] + "', which is not a namespace");
    target.dict().set(s.text, std::move(v));
    return;
  }
  if (s.names.size() == 1) return assign(s.names[0], std::move(v));
  Frame parts;
  bind_targets(parts, s.names, v);
  for (auto& [k, x] : parts) assign(k, x);
}

void Renderer::define_macro(const Stmt& s) {
  const Stmt* macro = &s;
  assign(s.text, Value::function(s.text, [this, macro](const CallArgs& a) { return call_macro(*macro, a); }));
}

Value Renderer::call_macro(const Stmt& m, const CallArgs& args) {
  if (args.positional.size() > m.names.size())
    throw EvalError("macro '" + m.text + "' takes " + std::to_string(m.names.size()) + " arguments, got " +
                    std::to_string(args.positional.size()));
  if (macro_depth_ >= kMaxMacroDepth)
    throw EvalError("macro '" + m.text + "' called " + std::to_string(kMaxMacroDepth) +
                    " levels deep (a macro that calls itself without end?)");
  struct Depth {
    int& d;
    explicit Depth(int& depth) : d(++depth) {}
    ~Depth() { --d; }
  } depth(macro_depth_);
  // A macro sees the globals and the template's variables, not its caller's loop variables.
  std::vector<std::shared_ptr<Frame>> saved = {frames_[0], frames_[1], std::make_shared<Frame>()};
  std::swap(saved, frames_);
  try {
    Frame& locals = *frames_.back();
    for (size_t i = 0; i < m.names.size(); ++i) {
      if (const Value* v = args.get(i, m.names[i])) locals[m.names[i]] = *v;
      else if (m.exprs[i]) locals[m.names[i]] = eval(*m.exprs[i]);
      else locals[m.names[i]] = Value::undefined("'" + m.names[i] + "' is undefined");
    }
    Value out(capture(m.bodies[0]));
    std::swap(saved, frames_);
    return out;
  } catch (...) {
    std::swap(saved, frames_);
    throw;
  }
}

Value Renderer::lookup(const std::string& name) const {
  for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
    const auto found = (*it)->find(name);
    if (found != (*it)->end()) return found->second;
  }
  return Value::undefined("'" + name + "' is undefined");
}

void Renderer::assign(const std::string& name, Value v) { (*frames_.back())[name] = std::move(v); }

}  // namespace specdec::chat
