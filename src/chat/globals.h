// The functions every template may call: range, namespace, dict, raise_exception, strftime_now.
#pragma once

#include <ctime>
#include <optional>

#include "chat/renderer.h"

namespace specdec::chat {

// `now`: the time strftime_now formats; unset, the local time at the call.
Frame builtin_globals(std::optional<std::tm> now);

}  // namespace specdec::chat
