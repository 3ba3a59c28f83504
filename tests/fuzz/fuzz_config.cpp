// Fuzz target: config.json (parsed from text, as a model folder's) and generation_config.json
// (read from a folder). The first byte picks which; the rest is the file. Refusals are Errors.
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "fuzz_util.h"
#include "model/config.h"
#include "model/families/llama.h"

// The family registry (families/llama.cpp) names the decoder's factory, which pulls in the whole
// forward path and its backends. Reading a config never builds a decoder, so this target links
// a factory that must not be reached instead of that code.
std::unique_ptr<specdec::Decoder> specdec::make_llama_decoder(const ModelConfig&, BoundWeights&, Backend&) {
  std::abort();
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(specdec::fuzz::as_text(data + 1, size - 1));
  try {
    if (data[0] & 1) {
      specdec::fuzz::write_scratch("generation_config.json", text);
      (void)specdec::load_generation_config(specdec::fuzz::scratch_dir());
    } else {
      const specdec::ModelConfig c = specdec::parse_model_config(text, "config.json");
      (void)specdec::rope_inv_freq(c);
      (void)specdec::rope_attention_scaling(c);
    }
  } catch (const std::runtime_error&) {
  }
  return 0;
}
