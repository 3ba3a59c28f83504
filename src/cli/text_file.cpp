// read_text_file: a whole file as bytes, read in blocks up to a bound, or an error naming it.
#include "cli/text_file.h"

#include <filesystem>
#include <fstream>

#include "cli/require.h"

namespace specdec::cli {

std::string read_text_file(const std::string& path, const std::string& flag) {
  const std::string named = flag.empty() ? path : flag + " " + path;
  std::error_code ec;
  // A directory opens as a stream on Linux and reads as empty: say what it is instead.
  require(!std::filesystem::is_directory(path, ec), named, " is a directory (expected a text file)");
  std::ifstream in(path, std::ios::binary);
  require(in.good(), "cannot read ", path);
  std::string text;
  char block[1 << 16];
  // Read by blocks rather than by the file's size: devices and pipes report no size.
  while (in.read(block, sizeof block) || in.gcount() > 0) {
    text.append(block, static_cast<size_t>(in.gcount()));
    require(text.size() <= kMaxTextFileBytes, named, " is larger than the ", kMaxTextFileBytes >> 20,
            " MiB a text file may have");
  }
  require(!in.bad(), "cannot read ", path);
  return text;
}

}  // namespace specdec::cli
