// Helpers for tests that need a small hand-written tokenizer.json: write it into a fresh
// temporary folder and load it.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <unistd.h>
#include <vector>

#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace specdec::testing {

// A temporary folder removed when the object goes out of scope.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("specdec_tok_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream out(path_ / name, std::ios::binary);
    out << text;
  }

 private:
  std::filesystem::path path_;
};

// A BPE tokenizer.json with the given vocabulary (token -> id) and merges; the other
// components are filled in by the caller.
inline nlohmann::json bpe_json(const nlohmann::json& vocab, const nlohmann::json& merges) {
  nlohmann::json j;
  j["version"] = "1.0";
  j["added_tokens"] = nlohmann::json::array();
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = nullptr;
  j["post_processor"] = nullptr;
  j["decoder"] = nullptr;
  j["model"] = {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"fuse_unk", false},
                {"byte_fallback", false}, {"vocab", vocab}, {"merges", merges}};
  return j;
}

// A vocabulary holding the 256 byte-level alphabet characters with ids 0..255, plus `extra`
// tokens numbered from 256 on.
inline nlohmann::json byte_level_vocab(const std::vector<std::string>& extra) {
  nlohmann::json v = nlohmann::json::object();
  const auto& alphabet = utf8::byte_level_alphabet();
  for (int b = 0; b < 256; ++b) v[alphabet.byte_to_utf8[static_cast<size_t>(b)]] = b;
  int id = 256;
  for (const auto& t : extra) v[t] = id++;
  return v;
}

inline Tokenizer load_json(const TempDir& dir, const nlohmann::json& j) {
  dir.write("tokenizer.json", j.dump());
  return Tokenizer::load(dir.path());
}

}  // namespace specdec::testing
