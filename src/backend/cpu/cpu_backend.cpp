// CpuBackend: picks the kernel table for the instruction set (forced by BackendOptions::cpu_isa
// or the best the CPU supports), owns the thread pool, and forwards every Backend call to the
// validated kernels in cpu_ops.h.
#include "backend/cpu/cpu_backend.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_ops.h"

namespace specdec {
namespace {

// F16C is read from CPUID leaf 1 (ECX bit 29): clang does not take "f16c" in __builtin_cpu_supports.
bool cpu_has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
}
bool cpu_has_avx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c(); }
bool cpu_has_avx512() {
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}
bool cpu_has_avx512_bf16() { return cpu_has_avx512() && __builtin_cpu_supports("avx512bf16"); }
// AMX-BF16 and AMX-TILE: CPUID.(EAX=7, ECX=0):EDX bits 22 and 24.
bool cpu_has_amx() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return cpu_has_avx512_bf16() && __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (edx & (1u << 22)) != 0 &&
         (edx & (1u << 24)) != 0;
}

// Linux gives a process the AMX tile data state (XSAVE feature 18) only when it asks, once, for
// all its threads; a tile instruction before that kills the process with SIGILL. Returns 0 or
// the errno of the refusal (an older kernel, or a hypervisor that hides the state).
int request_amx_state() {
  static const int error = [] {
    constexpr long kArchReqXcompPerm = 0x1023;
    constexpr long kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0 ? 0 : errno;
  }();
  return error;
}

const cpu::Kernels& select_kernels(const std::string& isa) {
  if (isa.empty()) {
    // AMX where the CPU has it and Linux grants the tile state: a verify window or a prefill
    // chunk then stays bound by reading the weights, where the f32 kernels become bound by their
    // multiply rate after a few tokens; a one-token step is the same weight stream either way.
    // Else AVX-512 BF16's dot products where the CPU has them (AMD's Zen 4 and later): one
    // instruction takes 32 weights where the f32 kernels widen 16 and multiply them, which on
    // cores that split 512-bit operations in two is what bounds a one-token step. Both round the
    // activations to bf16, like the GPU's default linears; the exact f32 kernels stay one flag
    // away ("best").
    if (cpu_has_amx() && request_amx_state() == 0) return cpu::amx_kernels();
    if (cpu_has_avx512_bf16()) return cpu::avx512_bf16_kernels();
    return select_kernels("best");
  }
  if (isa == "best") {
    if (cpu_has_avx512()) return cpu::avx512_kernels();
    if (cpu_has_avx2()) return cpu::avx2_kernels();
    return cpu::scalar_kernels();
  }
  if (isa == "scalar") return cpu::scalar_kernels();
  if (isa == "avx2") {
    SPECDEC_CHECK(cpu_has_avx2(), "cpu_isa \"avx2\": this CPU lacks AVX2, FMA or F16C");
    return cpu::avx2_kernels();
  }
  if (isa == "avx512") {
    SPECDEC_CHECK(cpu_has_avx512(), "cpu_isa \"avx512\": this CPU lacks AVX-512 F/BW/VL/DQ");
    return cpu::avx512_kernels();
  }
  if (isa == "avx512-bf16") {
    SPECDEC_CHECK(cpu_has_avx512_bf16(), "cpu_isa \"avx512-bf16\": this CPU lacks AVX-512 BF16");
    return cpu::avx512_bf16_kernels();
  }
  if (isa == "amx") {
    SPECDEC_CHECK(cpu_has_amx(), "cpu_isa \"amx\": this CPU lacks AMX-TILE, AMX-BF16 or AVX-512 BF16");
    const int error = request_amx_state();
    SPECDEC_CHECK(error == 0, "cpu_isa \"amx\": Linux refused the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM: ",
                  std::strerror(error), ")");
    return cpu::amx_kernels();
  }
  fail("cpu_isa \"", isa,
       "\" is unknown: use \"best\", \"avx512\", \"avx2\", \"scalar\", \"avx512-bf16\", \"amx\" or empty");
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& options)
      : kernels_(select_kernels(options.cpu_isa)),
        pool_(options.threads),
        kv_dtype_(kernels_.attend_rows != nullptr && options.kv_dtype == DType::bf16 ? DType::bf16 : DType::f32) {}

  Device device() const override { return Device::cpu; }
  std::string name() const override {
    return str_cat("cpu-", kernels_.isa, " (", pool_.size(), pool_.size() == 1 ? " thread)" : " threads)");
  }
  DType kv_dtype() const override { return kv_dtype_; }

  Buffer allocate(size_t bytes) override { return Buffer::host(bytes); }
  size_t weight_alignment() const override { return kernels_.weight_alignment; }
  Tensor pack_weight(const Weight& weight, Buffer& storage) override {
    const Tensor& w = weight.data;
    if (!kernels_.packed_weights || weight.quantized() || w.dtype != DType::bf16 || w.rank != 2 ||
        w.device != Device::cpu || w.dim(1) % cpu::kPackK != 0 || w.numel() == 0) {
      return {};
    }
    const int64_t N = w.dim(0), K = w.dim(1), rows = cpu::packed_rows(N);
    storage = Buffer::host(static_cast<size_t>(rows * K) * sizeof(uint16_t));
    cpu::pack_bf16_rows(w.ptr<uint16_t>(), N, K, static_cast<uint16_t*>(storage.data()));
    return storage.view(DType::bf16, {rows, K});
  }
  void copy(const Tensor& src, const Tensor& dst) override {
    cpu::check_host(src, "copy", "src");
    cpu::check_host(dst, "copy", "dst");
    SPECDEC_CHECK(src.dtype == dst.dtype && src.numel() == dst.numel(), "copy: src ", src.shape_string(), " and dst ",
                  dst.shape_string(), " differ in dtype or element count");
    if (src.data != dst.data && src.bytes() > 0) std::memmove(dst.data, src.data, src.bytes());
  }
  void synchronize() override {}

  void embedding(const Tensor& table, const Tensor& ids, const Tensor& out) override {
    cpu::embedding(pool_, table, ids, out);
  }
  void rms_norm(const Tensor& x, const Tensor& weight, float eps, const Tensor& out) override {
    cpu::rms_norm(pool_, x, weight, eps, out);
  }
  void linear(const Tensor& x, const Weight& weight, const Tensor* bias, const Tensor& out) override {
    cpu::linear(pool_, kernels_, x, weight, bias, out);
  }
  void rope(const Tensor& x, const Tensor& positions, const Tensor& inv_freq, float attention_scaling) override {
    cpu::rope(pool_, x, positions, inv_freq, attention_scaling);
  }
  void silu_mul(const Tensor& gate, const Tensor& up, const Tensor& out) override {
    cpu::silu_mul(pool_, kernels_, gate, up, out);
  }
  void add(const Tensor& a, const Tensor& b, const Tensor& out) override { cpu::add(pool_, a, b, out); }
  void gather_rows(const Tensor& x, const Tensor& indices, const Tensor& out) override {
    cpu::gather_rows(pool_, x, indices, out);
  }
  void scatter_columns(const Tensor& x, const Tensor& index, float fill, const Tensor& out) override {
    cpu::scatter_columns(pool_, x, index, fill, out);
  }
  void kv_write(const Tensor& k, const Tensor& v, const Tensor& k_pool, const Tensor& v_pool,
                const AttentionBatch& batch) override {
    cpu::kv_write(k, v, k_pool, v_pool, batch);
  }
  void attention(const Tensor& q, const Tensor& k_pool, const Tensor& v_pool, const AttentionBatch& batch, float scale,
                 const Tensor& out) override {
    cpu::attention(pool_, kernels_, q, k_pool, v_pool, batch, scale, out);
  }
  void argmax(const Tensor& logits, const Tensor& out) override { cpu::argmax(pool_, logits, out); }
  void top_logprob(const Tensor& logits, const Tensor& out) override { cpu::top_logprob(pool_, kernels_, logits, out); }
  void sample(const Tensor& logits, const Tensor& rows, const Tensor& out) override {
    cpu::sample(pool_, logits, rows, out);
  }

  void linear_many(const Tensor& x, std::span<const Projection> projections) override {
    cpu::linear_many(pool_, kernels_, x, projections);
  }
  void gated_linear(const Tensor& x, const Weight& w_gate, const Weight& w_up, const Tensor& out) override {
    cpu::gated_linear(pool_, kernels_, x, w_gate, w_up, out, scratch_);
  }
  void linear_add(const Tensor& x, const Weight& weight, const Tensor* bias, const Tensor& out) override {
    cpu::linear_add(pool_, kernels_, x, weight, bias, out, scratch_);
  }
  void rope_kv_write(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& positions, const Tensor& inv_freq,
                     float attention_scaling, const Tensor& k_pool, const Tensor& v_pool,
                     const AttentionBatch& batch) override {
    cpu::rope_kv_write(pool_, q, k, v, positions, inv_freq, attention_scaling, k_pool, v_pool, batch);
  }

 private:
  const cpu::Kernels& kernels_;
  ThreadPool pool_;
  DType kv_dtype_;
  // Intermediate of the fused calls (up of gated_linear, h of linear_add), kept between calls so
  // a decode step allocates nothing. Calls on one backend are not concurrent.
  std::vector<float> scratch_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options) {
  SPECDEC_CHECK(options.device == Device::cpu, "make_cpu_backend: options ask for device ",
                device_name(options.device));
  return std::make_unique<CpuBackend>(options);
}

}  // namespace specdec
