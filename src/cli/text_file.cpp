// read_text_file: a whole file as bytes, or an error naming it.
#include "cli/text_file.h"

#include <fstream>
#include <sstream>

#include "cli/require.h"

namespace specdec::cli {

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  require(in.good(), "cannot read ", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace specdec::cli
