// Builtin global functions of Hugging Face's chat template environment.
#include "chat/globals.h"

#include "chat/error.h"

namespace specdec::chat {
namespace {

Value range(const CallArgs& a) {
  int64_t start = 0, stop = 0, step = 1;
  if (a.positional.size() == 1) stop = a.positional[0].as_int();
  else if (a.positional.size() >= 2) start = a.positional[0].as_int(), stop = a.positional[1].as_int();
  if (a.positional.size() >= 3) step = a.positional[2].as_int();
  if (a.positional.empty() || step == 0) throw EvalError("range() needs a stop and a non-zero step");
  List out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.emplace_back(i);
  return Value(std::move(out));
}

Value make_dict(const CallArgs& a, bool is_namespace) {
  Dict d;
  d.is_namespace = is_namespace;
  if (!a.positional.empty() && a.positional[0].is_dict())
    for (const auto& [k, v] : a.positional[0].dict().items) d.set(k, v);
  for (const auto& [k, v] : a.named) d.set(k, v);
  return Value(std::move(d));
}

}  // namespace

Frame builtin_globals(std::optional<std::tm> now) {
  Frame g;
  g["range"] = Value::function("range", range);
  g["namespace"] = Value::function("namespace", [](const CallArgs& a) { return make_dict(a, true); });
  g["dict"] = Value::function("dict", [](const CallArgs& a) { return make_dict(a, false); });
  g["raise_exception"] = Value::function("raise_exception", [](const CallArgs& a) -> Value {
    throw EvalError("TemplateError: " + (a.positional.empty() ? std::string() : a.positional[0].to_str()));
  });
  g["strftime_now"] = Value::function("strftime_now", [now](const CallArgs& a) {
    std::tm t{};
    if (now) {
      t = *now;
    } else {
      const std::time_t clock = std::time(nullptr);
      localtime_r(&clock, &t);
    }
    char buf[256];
    const std::string format = a.positional.empty() ? "" : a.positional[0].to_str();
    const size_t n = std::strftime(buf, sizeof buf, format.c_str(), &t);
    return Value(std::string(buf, n));
  });
  return g;
}

}  // namespace specdec::chat
