// Names of the public option enums, both ways, and the checks of public options that need no
// loaded model.
#include <algorithm>
#include <array>
#include <cmath>
#include <thread>
#include <utility>

#include "core/error.h"
#include "sampling/sampling.h"
#include "specdec/options.h"
#include "specdec/request.h"

namespace specdec {

namespace {

template <typename E, size_t N>
std::string_view name_of(const std::array<std::pair<E, std::string_view>, N>& names, E v) {
  for (const auto& [e, n] : names)
    if (e == v) return n;
  return "?";
}

template <typename E, size_t N>
std::optional<E> value_of(const std::array<std::pair<E, std::string_view>, N>& names, std::string_view name) {
  for (const auto& [e, n] : names)
    if (n == name) return e;
  return std::nullopt;
}

constexpr std::array<std::pair<DeviceKind, std::string_view>, 3> kDevices{
    {{DeviceKind::automatic, "auto"}, {DeviceKind::cpu, "cpu"}, {DeviceKind::cuda, "cuda"}}};
constexpr std::array<std::pair<CpuIsa, std::string_view>, 7> kIsas{{{CpuIsa::automatic, "auto"},
                                                                    {CpuIsa::best, "best"},
                                                                    {CpuIsa::avx512, "avx512"},
                                                                    {CpuIsa::avx2, "avx2"},
                                                                    {CpuIsa::scalar, "scalar"},
                                                                    {CpuIsa::avx512_bf16, "avx512-bf16"},
                                                                    {CpuIsa::amx, "amx"}}};
constexpr std::array<std::pair<KvCacheType, std::string_view>, 3> kKvTypes{
    {{KvCacheType::bf16, "bf16"}, {KvCacheType::f16, "f16"}, {KvCacheType::f32, "f32"}}};
constexpr std::array<std::pair<DraftKind, std::string_view>, 2> kDraftKinds{
    {{DraftKind::ngram, "ngram"}, {DraftKind::model, "model"}}};
constexpr std::array<std::pair<VerifyMode, std::string_view>, 2> kModes{
    {{VerifyMode::exact, "exact"}, {VerifyMode::rejection, "rejection"}}};

}  // namespace

DraftSpec DraftSpec::ngram(std::string id, int num_draft_tokens) {
  DraftSpec spec;
  spec.id = std::move(id);
  spec.num_draft_tokens = num_draft_tokens;
  return spec;
}

DraftSpec DraftSpec::model(std::string path, std::string id, int num_draft_tokens) {
  DraftSpec spec;
  spec.kind = DraftKind::model;
  spec.id = std::move(id);
  spec.path = std::move(path);
  spec.num_draft_tokens = num_draft_tokens;
  return spec;
}

std::string draft_id(const DraftSpec& spec) {
  if (!spec.id.empty()) return spec.id;
  return spec.kind == DraftKind::ngram ? "ngram" : spec.path;
}

std::string_view to_string(DeviceKind v) { return name_of(kDevices, v); }
std::string_view to_string(CpuIsa v) { return name_of(kIsas, v); }
std::string_view to_string(KvCacheType v) { return name_of(kKvTypes, v); }
std::string_view to_string(DraftKind v) { return name_of(kDraftKinds, v); }
std::string_view to_string(VerifyMode v) { return name_of(kModes, v); }

std::optional<DeviceKind> parse_device_kind(std::string_view name) { return value_of(kDevices, name); }
std::optional<CpuIsa> parse_cpu_isa(std::string_view name) { return value_of(kIsas, name); }
std::optional<KvCacheType> parse_kv_cache_type(std::string_view name) { return value_of(kKvTypes, name); }
std::optional<VerifyMode> parse_verify_mode(std::string_view name) { return value_of(kModes, name); }

std::string_view to_string(Finish finish) {
  switch (finish) {
    case Finish::length:
      return "length";
    case Finish::stop:
    case Finish::eos:
      return "stop";
    case Finish::cancelled:
      return "cancelled";
    case Finish::error:
      return "error";
    case Finish::none:
      break;
  }
  return "none";
}

void SamplingOptions::validate() const {
  // The unset fields take a model's defaults, which are in range; only what was set can fail.
  SamplingParams p;
  p.temperature = temperature.value_or(p.temperature);
  p.top_p = top_p.value_or(p.top_p);
  p.top_k = top_k.value_or(p.top_k);
  p.min_p = min_p.value_or(p.min_p);
  p.repetition_penalty = repetition_penalty.value_or(p.repetition_penalty);
  p.presence_penalty = presence_penalty;
  p.frequency_penalty = frequency_penalty;
  p.logit_bias = logit_bias;
  p.validate();
}

int hardware_threads() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

int max_threads() { return std::max(64, 8 * hardware_threads()); }

namespace {
void check_memory_gib(double gib, const char* flag) {
  // Written so that NaN fails too: every comparison with NaN is false.
  SPECDEC_CHECK(gib >= 0 && gib <= kMaxMemoryGiB, flag, " must be a number of GiB in [0, ",
                static_cast<long long>(kMaxMemoryGiB),
                "] (0 = the default), got ", gib);
}
}  // namespace

void EngineConfig::validate() const {
  SPECDEC_CHECK(threads >= 0 && threads <= max_threads(), "--threads must be in [0, ", max_threads(),
                "] (0 = one per hardware thread; this machine has ", hardware_threads(), "), got ", threads);
  check_memory_gib(kv_memory_gb, "--kv-memory");
  check_memory_gib(gpu_memory_gb, "--gpu-memory");
  SPECDEC_CHECK(max_rows >= 1, "--max-rows must be at least 1, got ", max_rows);
  SPECDEC_CHECK(max_batch_tokens >= 16, "--max-batch-tokens must be at least 16, got ", max_batch_tokens);
  SPECDEC_CHECK(max_queue >= -1, "--max-queue must be at least 0 (or -1: unbounded), got ", max_queue);
}

}  // namespace specdec
