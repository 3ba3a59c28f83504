// The parsed template: expression and statement nodes. One node struct per family with a kind
// tag keeps the tree plain data that the evaluator walks; each node knows its template line.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/value.h"

namespace specdec::chat {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    Literal,    // literal
    Name,       // name
    List,       // args: items
    Tuple,      // args: items
    Dict,       // args: key, value, key, value, ...
    Attr,       // args[0].name
    Subscript,  // args[0][args[1]]
    Slice,      // args[0][args[1]:args[2]:args[3]], absent parts null
    Call,       // args[0](args[1..], kwargs)
    Filter,     // args[0] | name(args[1..], kwargs)
    Test,       // args[0] is [not] name(args[1..])
    Unary,      // name: "-", "+", "not"; args[0]
    Binary,     // name: the operator ("+", "==", "in", "not in", "and", ...); args[0], args[1]
    Ternary,    // args[1] if args[0] else args[2] (null: undefined)
  };
  Kind kind;
  int line;
  std::string name;
  Value literal;
  bool negated = false;  // Test: "is not"
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  enum class Kind {
    Text,         // text
    Output,       // {{ exprs[0] }}
    If,           // exprs: conditions; bodies: one per condition, then else if present
    For,          // names: targets; exprs[0] iterable, exprs[1] filter (may be null); bodies: body, else
    Set,          // names: targets (or name + attr); exprs[0] value
    SetBlock,     // names[0] = rendered bodies[0]
    Macro,        // name; names: params; exprs: defaults (null where none); bodies[0]
    FilterBlock,  // exprs[0]: a Filter chain whose innermost subject is the rendered bodies[0]
    Break,
    Continue,
    Scope,        // bodies[0], rendered in place ({% generation %})
  };
  Kind kind;
  int line;
  std::string text;  // Text: the text; Macro: the name; Set: the attribute of names[0] when assigned
  std::vector<std::string> names;
  std::vector<ExprPtr> exprs;
  std::vector<Body> bodies;
};

// The name given to the rendered body of a {% filter %} block; not a valid template identifier.
inline const char* const kFilterBlockSubject = "(filter block)";

}  // namespace specdec::chat
