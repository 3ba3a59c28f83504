// Reading the files the command is pointed at (a prompt, a benchmark suite) whole.
#pragma once

#include <string>

namespace specdec::cli {

// The file's bytes; throws std::runtime_error "cannot read <path>" when it cannot be opened.
std::string read_text_file(const std::string& path);

}  // namespace specdec::cli
