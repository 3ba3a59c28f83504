// Errors: one exception type whose message says what failed, with which input.
// Every layer throws specdec::Error; the command prints its message on one line and exits 1.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace specdec {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Concatenates any streamable values into a string: str_cat("tensor ", name, " has ", n).
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

template <typename... Args>
[[noreturn]] void fail(const Args&... args) {
  throw Error(str_cat(args...));
}

// Runs f(); an Error it throws comes back with "<who>: " in front, so that a failure deep in a
// shared path (a forward, a sampler) says which model it was in.
template <typename F>
decltype(auto) with_context(const std::string& who, F&& f) {
  try {
    return f();
  } catch (const Error& e) {
    throw Error(who + ": " + e.what());
  }
}

}  // namespace specdec

// Checks an invariant of the input and throws specdec::Error with the message if it fails.
#define SPECDEC_CHECK(cond, ...)              \
  do {                                        \
    if (!(cond)) ::specdec::fail(__VA_ARGS__); \
  } while (0)
