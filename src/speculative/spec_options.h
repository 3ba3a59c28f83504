// What a request asks of speculation: which method instance drafts for it, how deep, whether the
// depth adapts, and how drafts are verified.
#pragma once

#include <string>

namespace specdec {

enum class SpecMode { exact, rejection };

struct SpecOptions {
  std::string method;     // registered draft method id; empty = plain decoding
  int max_depth = 0;      // 0 = the method's default
  bool adaptive = true;   // adapt the depth (rejection mode: on fixed prices); pause where it does not pay
  SpecMode mode = SpecMode::exact;
};

}  // namespace specdec
