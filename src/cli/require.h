// The command's input checks: a failed one throws std::runtime_error with a message naming the
// flag and the value, which the command prints as its one error line.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace specdec::cli {

template <typename... Args>
void require(bool ok, const Args&... message) {
  if (ok) return;
  std::ostringstream out;
  (out << ... << message);
  throw std::runtime_error(out.str());
}

}  // namespace specdec::cli
