// Shared set-up for engine tests: the bundled target and draft on the CPU backend, and helpers
// that run requests to completion. With SPECDEC_TEST_RECORD=1 the backend records and replays its
// calls as a GPU's does (recording_backend.h), so the replayed forwards run here too.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/engine_core.h"
#include "model/model.h"
#include "speculative/methods/dflash.h"
#include "speculative/methods/draft_model.h"
#include "speculative/methods/eagle3.h"
#include "speculative/methods/ngram_method.h"
#include "recording_backend.h"
#include "test_device.h"
#include "tokenizer/tokenizer.h"

namespace specdec::testing {

inline std::string source_path(const std::string& rel) { return std::string(SPECDEC_SOURCE_DIR) + "/" + rel; }

struct Bundled {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> target;
  std::shared_ptr<Model> draft;
  std::unique_ptr<Tokenizer> tokenizer;

  // The bundled models on `backend`.
  static Bundled load(std::unique_ptr<Backend> backend) {
    Bundled x;
    x.backend = std::move(backend);
    x.target = Model::load(source_path("models/target"), *x.backend);
    x.draft = std::shared_ptr<Model>(Model::load(source_path("models/draft"), *x.backend));
    x.tokenizer = std::make_unique<Tokenizer>(Tokenizer::load(source_path("models/target")));
    return x;
  }

  // The test backend's (test_device.h), loaded once.
  static Bundled& get() {
    static Bundled b = [] {
      std::unique_ptr<Backend> backend = make_backend(test_backend_options());
      if (const char* r = std::getenv("SPECDEC_TEST_RECORD"); r != nullptr && std::string(r) == "1")
        backend = std::make_unique<RecordingBackend>(std::move(backend));
      return load(std::move(backend));
    }();
    return b;
  }
};

// The bundled hidden-state drafters over the bundled target (the EAGLE-3 head is loaded once).
inline const std::shared_ptr<Eagle3Head>& bundled_eagle3_head() {
  static const std::shared_ptr<Eagle3Head> head =
      Eagle3Head::load(source_path("models/eagle3"), *Bundled::get().backend);
  return head;
}
inline std::shared_ptr<Eagle3Method> bundled_eagle3(const Eagle3Options& options) {
  return std::make_shared<Eagle3Method>(bundled_eagle3_head(), "bundled-eagle3",
                                        Bundled::get().target->config().num_layers, options);
}
inline std::shared_ptr<DflashMethod> bundled_dflash(const DflashOptions& options) {
  return std::make_shared<DflashMethod>(source_path("models/dflash"), *Bundled::get().backend, "bundled-dflash",
                                        options);
}

// An engine over the bundled target (of `b`, the test backend's by default) with both methods registered
// ("ngram" and "draft").
// With SPECDEC_TEST_OVERLAP=1 an engine left at Overlap::automatic launches its steps ahead as on
// a GPU, whatever the test backend.
inline std::unique_ptr<EngineCore> make_engine(int depth = 0, EngineOptions options = {}, Bundled& b = Bundled::get()) {
  if (options.kv_blocks == 0) options.kv_blocks = 1024;
  if (const char* o = std::getenv("SPECDEC_TEST_OVERLAP");
      o != nullptr && std::string(o) == "1" && options.overlap == Overlap::automatic)
    options.overlap = Overlap::always;
  auto engine = std::make_unique<EngineCore>(*b.target, *b.tokenizer, options);
  NgramOptions n;
  if (depth > 0) n.num_draft = depth;
  engine->add_method("ngram", std::make_shared<NgramMethod>(n));
  DraftModelOptions d;
  if (depth > 0) d.num_draft = depth;
  d.kv_blocks = 1024;
  engine->add_method("draft", std::make_shared<DraftModelMethod>(b.draft, "bundled-draft", d));
  return engine;
}

inline Request make_request(const std::vector<int32_t>& prompt, int max_tokens, float temperature = 0,
                            uint64_t seed = 0) {
  Request r;
  r.prompt = prompt;
  r.stop.max_tokens = max_tokens;
  r.stop.ignore_eos = true;
  r.sampling.temperature = temperature;
  r.sampling.seed = seed;
  return r;
}

inline RequestResult run_one(EngineCore& engine, Request r) {
  const int64_t id = engine.submit(std::move(r));
  engine.run();
  auto res = engine.take_result(id);
  EXPECT_TRUE(res.has_value());
  return *res;
}

inline std::vector<int32_t> encode(const std::string& text) { return Bundled::get().tokenizer->encode(text, false); }

// A request's tokens from plain decoding, alone in a fresh engine: what speculation must give.
inline std::vector<int32_t> plain(const std::vector<int32_t>& prompt, int n, float temperature, uint64_t seed) {
  auto engine = make_engine();
  return run_one(*engine, make_request(prompt, n, temperature, seed)).tokens;
}

}  // namespace specdec::testing
