// The named builtins a template reaches with `|` (filters), `is` (tests), and tojson's Python
// json.dumps layout. Each registry is built once, on first use.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "chat/value.h"

namespace specdec::chat {

using FilterFn = std::function<Value(const Value& subject, const CallArgs& args)>;
using TestFn = std::function<bool(const Value& subject, const CallArgs& args)>;

const FilterFn* find_filter(const std::string& name);  // nullptr when there is none
const TestFn* find_test(const std::string& name);

// Python's json.dumps(v, ensure_ascii=False, indent=indent, sort_keys=sort_keys), as Hugging
// Face's tojson calls it: ", " and ": " separators without indent, "," and ": " with.
std::string to_json(const Value& v, std::optional<int> indent, bool sort_keys = false);

}  // namespace specdec::chat
