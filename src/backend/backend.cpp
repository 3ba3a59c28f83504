// make_backend: picks the device's implementation.
#include "backend/backend.h"

#include "backend/cpu/cpu_backend.h"
#ifdef SPECDEC_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace specdec {

void Backend::linear_many(const Tensor& x, std::span<const Projection> projections) {
  for (const Projection& p : projections) linear(x, p.weight, p.bias.empty() ? nullptr : &p.bias, p.out);
}

namespace {

// A scratch f32 tensor shaped like `out`, in the backend's memory; `owner` keeps it.
Tensor scratch_like(Backend& backend, const Tensor& out, Buffer& owner, const char* op) {
  SPECDEC_CHECK(out.rank >= 1 && out.dtype == DType::f32, op, ": out ", out.shape_string(), " must be f32");
  owner = backend.allocate(out.bytes());
  Tensor t = out;
  t.data = owner.data();
  t.device = owner.device();
  return t;
}

}  // namespace

void Backend::gated_linear(const Tensor& x, const Weight& w_gate, const Weight& w_up, const Tensor& out) {
  Buffer owner;
  const Tensor up = scratch_like(*this, out, owner, "gated_linear");
  linear(x, w_gate, nullptr, out);
  linear(x, w_up, nullptr, up);
  silu_mul(out, up, out);
  synchronize();  // the scratch is released at the end of this scope
}

void Backend::norm_linear_many(const Tensor& x, const Tensor& norm_weight, float eps, const Tensor& normed,
                               std::span<const Projection> projections) {
  rms_norm(x, norm_weight, eps, normed);
  linear_many(normed, projections);
}

void Backend::norm_gated_linear(const Tensor& x, const Tensor& norm_weight, float eps, const Tensor& normed,
                                const Weight& w_gate, const Weight& w_up, const Tensor& out) {
  rms_norm(x, norm_weight, eps, normed);
  gated_linear(normed, w_gate, w_up, out);
}

void Backend::norm_mlp_add(const Tensor& x, const Tensor& norm_weight, float eps, const Tensor& normed,
                           const Weight& w_gate, const Weight& w_up, const Tensor& act, const Weight& w_down) {
  norm_gated_linear(x, norm_weight, eps, normed, w_gate, w_up, act);
  linear_add(act, w_down, nullptr, x);
}

void Backend::linear_add(const Tensor& x, const Weight& weight, const Tensor* bias, const Tensor& out) {
  Buffer owner;
  const Tensor h = scratch_like(*this, out, owner, "linear_add");
  linear(x, weight, bias, h);
  add(out, h, out);
  synchronize();  // the scratch is released at the end of this scope
}

void Backend::rope_kv_write(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& positions,
                            const Tensor& inv_freq, float attention_scaling, const Tensor& k_pool, const Tensor& v_pool,
                            const AttentionBatch& batch) {
  rope(q, positions, inv_freq, attention_scaling);
  rope(k, positions, inv_freq, attention_scaling);
  kv_write(k, v, k_pool, v_pool, batch);
}

void Backend::rope_kv_write_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& positions,
                                      const Tensor& inv_freq, float attention_scaling, const Tensor& k_pool,
                                      const Tensor& v_pool, const AttentionBatch& batch, float scale,
                                      const Tensor& out) {
  rope_kv_write(q, k, v, positions, inv_freq, attention_scaling, k_pool, v_pool, batch);
  attention(q, k_pool, v_pool, batch, scale, out);
}

std::unique_ptr<RecordedCalls> Backend::record(const std::function<void()>&) { return nullptr; }

std::unique_ptr<Backend> make_backend(const BackendOptions& options) {
  if (options.device == Device::cpu) return make_cpu_backend(options);
#ifdef SPECDEC_WITH_CUDA
  return make_cuda_backend(options);
#else
  fail("this build of specdec has no CUDA backend (built without the CUDA toolkit)");
#endif
}

bool cuda_available() {
#ifdef SPECDEC_WITH_CUDA
  return cuda_device_count() > 0;
#else
  return false;
#endif
}

Weight with_packed(Backend& backend, Weight weight, std::vector<Buffer>& owner) {
  Buffer storage;
  weight.packed = backend.pack_weight(weight, storage);
  if (!weight.packed.empty()) owner.push_back(std::move(storage));
  return weight;
}

}  // namespace specdec
