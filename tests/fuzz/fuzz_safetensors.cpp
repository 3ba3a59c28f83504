// Fuzz target: a .safetensors file (8-byte header length, JSON header, data) opened as a model
// shard. Every input is either accepted with tensors inside the file or refused with an Error.
#include <cstdint>
#include <stdexcept>

#include "fuzz_util.h"
#include "model/weights.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = specdec::fuzz::write_scratch("model.safetensors", specdec::fuzz::as_text(data, size));
  try {
    const auto file = specdec::SafetensorsFile::open(path);
    // Touch every byte each tensor claims: a span past the mapping would fault here.
    volatile uint8_t sum = 0;
    for (const auto& [name, tensor] : file->tensors()) {
      const auto* bytes = static_cast<const uint8_t*>(tensor.data);
      for (size_t i = 0; i < tensor.bytes(); ++i) sum = static_cast<uint8_t>(sum + bytes[i]);
    }
  } catch (const std::runtime_error&) {
  }
  return 0;
}
