// What an Engine is loaded with: the target model folder, the device and its kernels, the KV
// cache, the scheduler's limits and the draft methods, as typed options. Text names of the
// enums (for command lines and request bodies) convert both ways here.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace specdec {

enum class DeviceKind { automatic, cpu, cuda };                      // automatic: cuda when a GPU is present
// automatic: AMX (bf16 activations) where the CPU has it and Linux grants its tile state, else best;
// best: the fastest exact (f32) kernels.
enum class CpuIsa { automatic, best, avx512, avx2, scalar, avx512_bf16, amx };
// KV cache element type: all three on the GPU; the CPU keeps bf16 where its amx kernels run, f32
// otherwise (and for f16 or f32).
enum class KvCacheType { bf16, f16, f32 };
enum class DraftKind { ngram, model };
enum class VerifyMode { exact, rejection };  // exact: output identical to plain decoding

// One draft method instance. Requests pick it by `id`; two instances of one kind (two draft
// models, two n-gram settings) live side by side under different ids.
struct DraftSpec {
  DraftKind kind = DraftKind::ngram;
  std::string id;            // empty: "ngram" for an n-gram method, the folder for a draft model
  std::string path;          // DraftKind::model: the draft checkpoint folder (the target's vocabulary)
  int num_draft_tokens = 0;  // most drafts a round proposes; 0 = the method's default
  // Hidden-state drafters, exact-mode requests. A block drafter (DFlash): each draft is checked
  // against the request's own text, and where what followed the drafts' last tokens earlier in
  // the text differs, that continuation is proposed while it has been right at least as often as
  // the drafter. (A chain drafter, EAGLE-3, sees its own drafts and follows a repeating text by
  // itself: there such swaps took rounds from it.) Both: a round whose block or chain was drafted
  // whole, and (for the chain) is the text's continuation throughout, goes on along the text, up
  // to a verify window of 16 tokens.
  bool context_lookup = true;

  static DraftSpec ngram(std::string id = {}, int num_draft_tokens = 0);
  static DraftSpec model(std::string path, std::string id = {}, int num_draft_tokens = 0);
};

struct EngineConfig {
  std::string model_dir;  // config.json, *.safetensors, tokenizer.json
  DeviceKind device = DeviceKind::automatic;
  int threads = 0;  // CPU threads, 0 = all
  CpuIsa cpu_isa = CpuIsa::automatic;
  bool batch_invariant = true;  // GPU: batch-invariant kernels (exact speculative output)
  KvCacheType kv_type = KvCacheType::bf16;
  double kv_memory_gb = 0;        // 0 = 1 GiB on the CPU; on a GPU, what is free after weights and activations
  double gpu_memory_gb = 0;       // GPU: cap on the device memory pool (weights, KV, scratch); 0 = free memory
  int max_rows = 64;              // requests decoding at once
  int max_batch_tokens = 512;     // tokens in one target forward
  // Requests that may wait beyond the rows free at submit; one more throws QueueFull. -1: no bound.
  int max_queue = -1;
  bool prefix_cache = true;       // requests share the KV of prompt prefixes already computed
  // A batch of plain decode steps launches its next step before committing this one's tokens,
  // so that the host's work between steps overlaps the device's (the output is the same).
  bool overlap = true;
  // Each time the engine runs out of work, give the heap's free pages back to the system, so that
  // a long-lived process (a server between bursts) holds what it uses rather than the highest
  // peak of every thread's allocations. Off by default: a benchmark's next request would wait
  // behind it.
  bool release_memory_when_idle = false;
  std::vector<DraftSpec> drafts;  // loaded with the engine; more may be added later

  // Throws std::runtime_error naming the first field out of range: threads above max_threads(),
  // memory sizes that are negative, not finite or above kMaxMemoryGiB (whose byte count would
  // overflow), rows or batch tokens below their minimum. Engine does this before loading.
  void validate() const;
};

// The most GiB --kv-memory / --gpu-memory may ask for: far above any machine's memory, far below
// the 2^34 GiB where a byte count overflows 64 bits.
inline constexpr double kMaxMemoryGiB = 1 << 20;

// The most CPU threads an engine starts: 8 per hardware thread (at least 64). Beyond that a pool
// only competes with itself, and tens of thousands of threads exhaust the machine's process ids.
int max_threads();
// Hardware threads of this machine (at least 1).
int hardware_threads();

// The id a spec is registered under (DraftSpec::id, or its default).
std::string draft_id(const DraftSpec& spec);

std::string_view to_string(DeviceKind v);
std::string_view to_string(CpuIsa v);
std::string_view to_string(KvCacheType v);
std::string_view to_string(DraftKind v);
std::string_view to_string(VerifyMode v);
// The inverse of to_string; nullopt for a name that is none of them.
std::optional<DeviceKind> parse_device_kind(std::string_view name);
std::optional<CpuIsa> parse_cpu_isa(std::string_view name);
std::optional<KvCacheType> parse_kv_cache_type(std::string_view name);
std::optional<VerifyMode> parse_verify_mode(std::string_view name);

}  // namespace specdec
