// Helpers shared by the libFuzzer targets: a scratch folder per process (under /dev/shm when it
// exists, so that writing each input costs no disk), and the fixture paths the targets start from.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace specdec::fuzz {

inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    const std::filesystem::path root = std::filesystem::exists("/dev/shm") ? "/dev/shm" : "/tmp";
    std::filesystem::path d = root / ("specdec_fuzz_" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

// Writes `bytes` to `name` in the scratch folder and returns its path.
inline std::filesystem::path write_scratch(const std::string& name, std::string_view bytes) {
  const std::filesystem::path p = scratch_dir() / name;
  std::ofstream(p, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return p;
}

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

inline std::string fixture(const std::string& relative) { return std::string(SPECDEC_SOURCE_DIR) + "/" + relative; }

}  // namespace specdec::fuzz
