// Reading the files the command is pointed at (a prompt, a benchmark suite) whole, with a size
// bound: a device such as /dev/zero or /dev/urandom never ends, and must not fill the memory.
#pragma once

#include <cstddef>
#include <string>

namespace specdec::cli {

// Far beyond any context a model takes (a prompt of 16 MiB is millions of tokens).
inline constexpr size_t kMaxTextFileBytes = size_t{16} << 20;

// The file's bytes. Throws std::runtime_error "cannot read <path>" when it cannot be opened, and
// an error naming `flag` and the path for a directory or a file past kMaxTextFileBytes.
std::string read_text_file(const std::string& path, const std::string& flag = "");

}  // namespace specdec::cli
