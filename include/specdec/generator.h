// specdec::Generator: text in, text out, one request at a time, over an Engine kept for the
// Generator's lifetime (the KV pool, the draft methods and their cost figures carry over).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "specdec/engine.h"

namespace specdec {

struct GenerateOptions {
  int max_tokens = 128;
  SamplingOptions sampling;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  SpeculativeOptions speculative;  // speculative.draft: an id from EngineConfig::drafts
};

struct Generation {
  std::string text;
  std::vector<int32_t> tokens;
  std::string finish_reason;  // "length", "stop", "cancelled"
  GenerationStats stats;
};

class Generator {
 public:
  // Loads the engine (Engine::Engine); throws std::runtime_error naming the cause.
  explicit Generator(const EngineConfig& config);
  ~Generator();
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  // Generates from a text prompt; on_text receives the text as it streams (on the engine's
  // thread). Throws std::runtime_error for a bad request or a request that failed.
  Generation generate(const std::string& prompt, const GenerateOptions& options,
                      const std::function<void(std::string_view)>& on_text = {});
  std::vector<int32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  std::string device_name() const;
  Engine& engine();

 private:
  std::unique_ptr<Engine> engine_;
};

}  // namespace specdec
