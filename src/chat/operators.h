// Python's operators and element access on template values, as jinja2 applies them: arithmetic,
// `in`, attribute and item lookup (a missing one is undefined; any use of undefined fails),
// slices, and what a for loop iterates.
#pragma once

#include <optional>
#include <string>

#include "chat/value.h"

namespace specdec::chat {

Value binary_op(const std::string& op, const Value& a, const Value& b);
bool contains(const Value& container, const Value& item);
Value get_attr(const Value& object, const std::string& name);
Value get_item(const Value& object, const Value& key);
Value slice(const Value& object, std::optional<int64_t> start, std::optional<int64_t> stop, std::optional<int64_t> step);
// The items a for loop visits: a list's elements, a dict's keys, a string's characters.
List iterate(const Value& v);
// A method of a str, list or dict bound to it, or undefined (methods.cpp).
Value bound_method(const Value& object, const std::string& name);

}  // namespace specdec::chat
