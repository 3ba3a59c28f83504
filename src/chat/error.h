// The one exception a chat template raises, for bad syntax, a failed evaluation or the template's
// own raise_exception: its message names the template and the line, so that a user can find it.
#pragma once

#include <stdexcept>
#include <string>

namespace specdec::chat {

class TemplateError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An evaluation failure before the line is known; the renderer adds template name and line.
class EvalError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace specdec::chat
