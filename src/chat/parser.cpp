// Statement parsing: the chunk list into a tree of bodies, each block tag matched with its end.
#include <set>

#include "chat/error.h"
#include "chat/parser.h"

namespace specdec::chat {
namespace {

std::unique_ptr<Stmt> make(Stmt::Kind kind, int line) {
  auto s = std::make_unique<Stmt>();
  s->kind = kind;
  s->line = line;
  return s;
}

class Parser {
 public:
  Parser(std::vector<Chunk> chunks, std::string name) : chunks_(std::move(chunks)), name_(std::move(name)) {}

  Body parse_all() {
    Body body = parse_body({});
    return body;
  }

 private:
  struct Stop {
    std::string keyword;  // the tag that ended a body; empty at the end of the template
    TokenStream tokens;   // its tokens after the keyword
  };

  // Parses until one of `stops` begins a statement; that statement is consumed and returned.
  Body parse_body(const std::set<std::string>& stops, Stop* stop = nullptr) {
    Body body;
    while (pos_ < chunks_.size()) {
      const Chunk& c = chunks_[pos_++];
      if (c.kind == Chunk::Kind::Text) {
        auto s = make(Stmt::Kind::Text, c.line);
        s->text = c.text;
        body.push_back(std::move(s));
        continue;
      }
      TokenStream ts(tokenize(c.text, c.line, name_), name_);
      if (c.kind == Chunk::Kind::Output) {
        auto s = make(Stmt::Kind::Output, c.line);
        s->exprs.push_back(parse_expression(ts));
        ts.expect_end();
        body.push_back(std::move(s));
        continue;
      }
      const std::string keyword = ts.expect_identifier();
      if (stops.count(keyword)) {
        if (stop) *stop = Stop{keyword, std::move(ts)};
        return body;
      }
      // A block statement parses its bodies here again, one level deeper (and the renderer runs
      // them so): refused past kMaxBlocks levels, well before the stack would run out.
      if (++depth_ > kMaxBlocks) fail(c.line, "blocks nested more than " + std::to_string(kMaxBlocks) + " levels deep");
      body.push_back(parse_statement(keyword, ts, c.line));
      --depth_;
    }
    if (!stops.empty()) {
      std::string expected;
      for (const auto& s : stops) expected += (expected.empty() ? "" : " or ") + s;
      fail(chunks_.empty() ? 1 : chunks_.back().line, "missing " + expected + " before the end of the template");
    }
    return body;
  }

  [[noreturn]] void fail(int line, const std::string& what) const {
    throw TemplateError("template " + name_ + " line " + std::to_string(line) + ": syntax error: " + what);
  }

  std::unique_ptr<Stmt> parse_statement(const std::string& keyword, TokenStream& ts, int line) {
    if (keyword == "if") return parse_if(ts, line);
    if (keyword == "for") return parse_for(ts, line);
    if (keyword == "set") return parse_set(ts, line);
    if (keyword == "macro") return parse_macro(ts, line);
    if (keyword == "filter") return parse_filter_block(ts, line);
    if (keyword == "generation") {
      ts.expect_end();
      auto s = make(Stmt::Kind::Scope, line);
      s->bodies.push_back(parse_body({"endgeneration"}));
      return s;
    }
    if (keyword == "break" || keyword == "continue") {
      ts.expect_end();
      return make(keyword == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue, line);
    }
    fail(line, "unknown or unexpected tag '" + keyword + "'");
  }

  std::unique_ptr<Stmt> parse_if(TokenStream& ts, int line) {
    auto s = make(Stmt::Kind::If, line);
    s->exprs.push_back(parse_expression(ts));
    ts.expect_end();
    for (;;) {
      Stop stop{"", TokenStream({}, name_)};
      s->bodies.push_back(parse_body({"elif", "else", "endif"}, &stop));
      if (stop.keyword == "endif") break;
      if (stop.keyword == "else") {
        stop.tokens.expect_end();
        s->bodies.push_back(parse_body({"endif"}));
        break;
      }
      s->exprs.push_back(parse_expression(stop.tokens));
      stop.tokens.expect_end();
    }
    return s;
  }

  std::vector<std::string> parse_targets(TokenStream& ts) {
    std::vector<std::string> names;
    const bool paren = ts.accept_op("(");
    do names.push_back(ts.expect_identifier());
    while (ts.accept_op(","));
    if (paren) ts.expect_op(")");
    return names;
  }

  std::unique_ptr<Stmt> parse_for(TokenStream& ts, int line) {
    auto s = make(Stmt::Kind::For, line);
    s->names = parse_targets(ts);
    if (!ts.accept_name("in")) ts.fail("expected 'in'");
    s->exprs.push_back(parse_or_expression(ts));
    s->exprs.push_back(ts.accept_name("if") ? parse_expression(ts) : nullptr);
    ts.accept_name("recursive");
    ts.expect_end();
    Stop stop{"", TokenStream({}, name_)};
    s->bodies.push_back(parse_body({"else", "endfor"}, &stop));
    if (stop.keyword == "else") s->bodies.push_back(parse_body({"endfor"}));
    return s;
  }

  std::unique_ptr<Stmt> parse_set(TokenStream& ts, int line) {
    if (ts.peek().type == Token::Type::Name && ts.is_op(".", 1)) {
      auto s = make(Stmt::Kind::Set, line);
      s->names.push_back(ts.expect_identifier());
      ts.next();
      s->text = ts.expect_identifier();
      ts.expect_op("=");
      s->exprs.push_back(parse_expression(ts));
      ts.expect_end();
      return s;
    }
    std::vector<std::string> names = parse_targets(ts);
    if (ts.at_end() && names.size() == 1) {
      auto s = make(Stmt::Kind::SetBlock, line);
      s->names = std::move(names);
      s->bodies.push_back(parse_body({"endset"}));
      return s;
    }
    auto s = make(Stmt::Kind::Set, line);
    s->names = std::move(names);
    ts.expect_op("=");
    s->exprs.push_back(parse_expression(ts));
    ts.expect_end();
    return s;
  }

  std::unique_ptr<Stmt> parse_macro(TokenStream& ts, int line) {
    auto s = make(Stmt::Kind::Macro, line);
    s->text = ts.expect_identifier();
    ts.expect_op("(");
    while (!ts.accept_op(")")) {
      s->names.push_back(ts.expect_identifier());
      s->exprs.push_back(ts.accept_op("=") ? parse_expression(ts) : nullptr);
      if (!ts.is_op(")")) ts.expect_op(",");
    }
    ts.expect_end();
    s->bodies.push_back(parse_body({"endmacro"}));
    return s;
  }

  std::unique_ptr<Stmt> parse_filter_block(TokenStream& ts, int line) {
    auto s = make(Stmt::Kind::FilterBlock, line);
    auto subject = std::make_unique<Expr>();
    subject->kind = Expr::Kind::Name;
    subject->line = line;
    subject->name = kFilterBlockSubject;
    s->exprs.push_back(parse_filter_chain(ts, std::move(subject)));
    ts.expect_end();
    s->bodies.push_back(parse_body({"endfilter"}));
    return s;
  }

  std::vector<Chunk> chunks_;
  size_t pos_ = 0;
  std::string name_;
  static constexpr int kMaxBlocks = 100;
  int depth_ = 0;  // block statements open around the one being parsed
};

}  // namespace

Body parse_template(const std::string& source, const std::string& name) {
  return Parser(split_chunks(source, name), name).parse_all();
}

}  // namespace specdec::chat
