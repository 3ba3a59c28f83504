// The KV cache's size when --kv-memory is not given on a GPU: what the device has left after the
// weights, less one forward's activations, the drafts' reserve and a margin.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "engine/engine_core.h"

namespace specdec {
namespace {

constexpr size_t kGiB = size_t{1} << 30;

// Llama-3.1-8B's shape.
ModelConfig llama8b() {
  ModelConfig c;
  c.vocab_size = 128256;
  c.hidden_size = 4096;
  c.intermediate_size = 14336;
  c.num_layers = 32;
  c.num_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.max_position = 131072;
  return c;
}

TEST(KvBudget, TakesNinetyPercentOfWhatIsLeftAfterActivationsReserveAndMargin) {
  const ModelConfig c = llama8b();
  EngineOptions o;
  o.max_batch_tokens = 512;
  o.max_rows = 64;
  // 139 GiB device, 16 GB of weights loaded.
  const size_t available = 139 * kGiB - size_t{16'060'000'000};
  const size_t kv = auto_kv_memory(available, c, o, DType::bf16);
  // Activations of this shape, by hand: 262,144 f32 bytes per token over 512 + 16 * 64 tokens,
  // plus the logits of 1,024 window positions over 128,256 tokens, twice (1.73 GiB).
  const size_t activations = 2 * (size_t{1536} * 262144 + size_t{1024} * 4 * 128256);
  EXPECT_EQ(kv, (available - activations - kGiB) / 10 * 9);
  EXPECT_GT(kv, 100 * kGiB);  // an 8B model on this device gets most of it as KV
  EXPECT_LE(kv + activations + kGiB, available);
}

TEST(KvBudget, TheDraftsReserveAndALargerTokenBudgetComeOutOfTheCache) {
  const ModelConfig c = llama8b();
  EngineOptions o;
  const size_t available = 80 * kGiB;
  const size_t base = auto_kv_memory(available, c, o, DType::bf16);
  o.kv_reserve = 10 * kGiB;
  const size_t with_drafts = auto_kv_memory(available, c, o, DType::bf16);
  EXPECT_NEAR(static_cast<double>(base - with_drafts), 9.0 * kGiB, 16.0);
  o.kv_reserve = 0;
  o.max_batch_tokens = 8192;
  EXPECT_LT(auto_kv_memory(available, c, o, DType::bf16), base);
}

TEST(KvBudget, TooLittleMemoryIsAClearErrorNamingTheOption) {
  const ModelConfig c = llama8b();
  EngineOptions o;
  o.max_batch_tokens = 4096;
  o.max_rows = 256;
  try {
    auto_kv_memory(2 * kGiB, c, o, DType::bf16);
    FAIL() << "2 GiB cannot hold the activations of 4,096 + 4,096 tokens and a KV cache";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--kv-memory"), std::string::npos) << what;
    EXPECT_NE(what.find("--max-batch-tokens 4096"), std::string::npos) << what;
  }
  // One block fits: the smallest budget that is not an error.
  o.max_batch_tokens = 16;
  o.max_rows = 1;
  EXPECT_GE(auto_kv_memory(3 * kGiB / 2, c, o, DType::bf16), size_t{2} * 32 * 16 * 8 * 128 * 2);
}

}  // namespace
}  // namespace specdec
