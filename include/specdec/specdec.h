// specdec's library API: load a Hugging Face checkpoint folder and generate text, plainly or
// with lossless speculative decoding. The `specdec` command is a client of this header; it
// exposes no internal type, so programs can link the library without its internal headers.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace specdec {

struct ModelOptions {
  std::string model_dir;          // config.json, *.safetensors, tokenizer.json
  std::string device;             // "cpu", "cuda", or empty: cuda when a GPU is present
  int threads = 0;                // CPU threads, 0 = all
  std::string cpu_isa;            // "avx512", "avx2", "scalar", "avx512-bf16"; empty = best
  bool batch_invariant = true;    // GPU: batch-invariant kernels (exact speculative output)
  std::string kv_dtype = "bf16";  // GPU KV cache: bf16, f16 or f32
  double kv_memory_gb = 0;        // 0 = 1 GiB on the CPU, 16 GiB on a GPU
  double gpu_memory_gb = 0;       // GPU: cap on the device memory pool (weights, KV, scratch); 0 = free memory
  int max_rows = 64;
  int max_batch_tokens = 512;
};

// Sampling fields left negative take the model's generation_config.json defaults.
struct GenerateOptions {
  int max_tokens = 128;
  float temperature = -1;
  float top_p = -1;
  int top_k = -1;
  float min_p = -1;
  float repetition_penalty = -1;
  float presence_penalty = 0;
  float frequency_penalty = 0;
  uint64_t seed = 0;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  std::string draft;           // "", "ngram" or a draft model folder
  int num_draft_tokens = 0;    // 0 = the method's default
  bool rejection = false;      // rejection sampling instead of exact verification
  bool adaptive = true;        // adaptive depth; false = always the maximum depth
};

struct Generation {
  std::string text;
  std::vector<int32_t> tokens;
  std::string finish_reason;  // "length", "stop", "cancelled"
  int prompt_tokens = 0;
  double prefill_tokens_per_s = 0;
  double decode_tokens_per_s = 0;
  double ttft_s = 0;
  std::string speculative_json;  // telemetry, JSON; empty without a draft
  double acceptance_rate = 0;
  double mean_accepted_length = 0;
};

class Generator {
 public:
  // Loads the model, its tokenizer and sampling defaults; throws std::runtime_error naming
  // the cause (a missing file, a bad shape, an unknown architecture, ...).
  explicit Generator(const ModelOptions& options);
  ~Generator();
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  // Generates from a text prompt; on_text receives the text as it streams.
  Generation generate(const std::string& prompt, const GenerateOptions& options,
                      const std::function<void(std::string_view)>& on_text = {});
  std::vector<int32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  // e.g. "cpu-avx512 (2 threads)"
  std::string device_name() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace specdec
