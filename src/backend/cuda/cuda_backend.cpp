// The CUDA backend: checks every call's tensors on the host, then enqueues the kernels of
// kernels.h (or cuBLASLt) on the backend's stream. Numerics of the two linear modes:
// - batch_invariant = true: 16-bit weights go through cuBLASLt at every M, restricted to
//   algorithms that keep K in one pass (gemm_lt.h): x rounded to the weights' type, each output
//   one f32 accumulator over K in order, so a row's bits are the same at any M and beside any
//   rows (up to CudaTuning::ordered_max_m rows, two by default, the ordered kernel of
//   ordered_gemm.cu sums in the same order instead, rounding an f32 x itself where it fits).
//   f32 weights (and
//   CudaTuning::invariant_cublaslt off) take the row-streaming kernel (linear.cu): x stays f32,
//   f32 fma in an order fixed by K, equally invariant. With CudaTuning::invariant_tensor_cores,
//   16-bit weights take the tensor-core linear (gemm.cu).
// - batch_invariant = false: M <= kSmallM uses the row-streaming kernel; larger M rounds x to
//   the weights' 16-bit type and runs the fastest cuBLASLt algorithm, K split or not (or, up to
//   CudaTuning::skinny_max_m rows, off by default, the skinny kernel of skinny_gemm.cu): results
//   then depend on M, so not batch invariant.
#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/gemm_lt.h"
#include "backend/cuda/kernels.h"

namespace specdec {
namespace {

using cuda::ElemType;

// Largest M that the fast mode sends to the row-streaming kernel (bandwidth-bound for one or two
// rows); beyond it cuBLASLt's tensor-core GEMM streams the weights faster.
constexpr int64_t kSmallM = 2;
constexpr size_t kLtWorkspaceBytes = size_t{32} << 20;
// Most rows for which projections of stacked weights run as one GEMM a group. Decode steps gain
// (fewer launches, wider GEMMs); prefill chunks, whose GEMMs are compute-bound, would only pay the
// extra pass that moves the wide output's columns to their projections.
constexpr int kStackedMaxM = 256;

void expect_cuda(const Tensor& t, const char* op, const char* what) {
  SPECDEC_CHECK(t.device == Device::cuda, op, ": ", what, " ", t.shape_string(), " must be in cuda memory, not ",
                device_name(t.device));
  SPECDEC_CHECK(t.data != nullptr || t.numel() == 0, op, ": ", what, " has no data");
}

void expect_dtype(const Tensor& t, DType dtype, const char* op, const char* what) {
  expect_cuda(t, op, what);
  SPECDEC_CHECK(t.dtype == dtype, op, ": ", what, " ", t.shape_string(), " must be ", dtype_name(dtype));
}

ElemType elem_type(const Tensor& t, const char* op, const char* what) {
  expect_cuda(t, op, what);
  switch (t.dtype) {
    case DType::f32:
      return ElemType::f32;
    case DType::f16:
      return ElemType::f16;
    case DType::bf16:
      return ElemType::bf16;
    default:
      fail(op, ": ", what, " ", t.shape_string(), " must be f32, f16 or bf16");
  }
}

int to_int(int64_t v, const char* op, const char* what) {
  SPECDEC_CHECK(v >= 0 && v <= INT32_MAX, op, ": ", what, " = ", v, " is outside the 32-bit range of the kernels");
  return static_cast<int>(v);
}

// `tuning` with the SPECDEC_CUDA_* environment variables that are set applied over it: the one
// place they are read (once, when a backend is made), kept so that one build can be debugged and
// measured switch by switch. A switch is on unless its value is "0" (SPECDEC_CUDA_SYNC: on only
// at "1"); a level is its value clamped to the field's range.
CudaTuning with_environment(CudaTuning tuning) {
  const auto set_switch = [](const char* name, bool& field) {
    if (const char* v = std::getenv(name)) field = std::strcmp(v, "0") != 0;
  };
  const auto set_level = [](const char* name, int max, int& field) {
    if (const char* v = std::getenv(name)) field = std::clamp(std::atoi(v), 0, max);
  };
  if (const char* v = std::getenv("SPECDEC_CUDA_SYNC")) tuning.sync_each_call = std::strcmp(v, "1") == 0;
  set_switch("SPECDEC_CUDA_RECORD", tuning.record);
  set_switch("SPECDEC_CUDA_PDL", tuning.overlapped_launches);
  set_level("SPECDEC_CUDA_EARLY_WEIGHTS", 2, tuning.early_weights);
  set_switch("SPECDEC_CUDA_STREAM_LINEAR", tuning.stream_linear);
  int paired = static_cast<int>(tuning.paired_columns);
  set_level("SPECDEC_CUDA_PAIRED", 2, paired);
  tuning.paired_columns = static_cast<PairedColumns>(paired);
  set_switch("SPECDEC_CUDA_FUSED_ATTENTION", tuning.fused_attention);
  set_switch("SPECDEC_CUDA_MERGE_LAUNCH", tuning.merge_launch);
  set_switch("SPECDEC_CUDA_FLASH", tuning.flash_prefill);
  set_level("SPECDEC_CUDA_FLASH_DECODE_BLOCKS", 1 << 30, tuning.flash_decode_blocks);
  set_switch("SPECDEC_CUDA_TILE_DECODE", tuning.tile_decode);
  set_switch("SPECDEC_CUDA_TILE_WARP_FOLD", tuning.tile_warp_fold);
  set_switch("SPECDEC_CUDA_INVARIANT_GEMM", tuning.invariant_tensor_cores);
  set_switch("SPECDEC_CUDA_INVARIANT_LT", tuning.invariant_cublaslt);
  set_switch("SPECDEC_CUDA_STACKED", tuning.stacked_projections);
  set_switch("SPECDEC_CUDA_DIRECT", tuning.direct_outputs);
  set_switch("SPECDEC_CUDA_HALF_GATE_UP", tuning.half_gate_up);
  set_switch("SPECDEC_CUDA_INVARIANT_HALF_GATE_UP", tuning.invariant_half_gate_up);
  set_level("SPECDEC_CUDA_HALF_STACKED_MAX_M", 1 << 30, tuning.half_stacked_max_m);
  set_switch("SPECDEC_CUDA_CLUSTER_SAMPLE", tuning.cluster_sampling);
  set_switch("SPECDEC_CUDA_FAST_DRAFTS", tuning.fast_drafts);
  set_level("SPECDEC_CUDA_GEMM_TILE", 9, tuning.gemm_tile);
  set_level("SPECDEC_CUDA_SKINNY_MAX_M", cuda::kSkinnyMaxM, tuning.skinny_max_m);
  set_level("SPECDEC_CUDA_ORDERED_MAX_M", cuda::kOrderedMaxM, tuning.ordered_max_m);
  set_level("SPECDEC_CUDA_FAST_WHOLE_X_MAX_M", cuda::kOrderedMaxM, tuning.fast_whole_x_max_m);
  set_level("SPECDEC_CUDA_ORDERED_WARPS", 8, tuning.ordered_warps);
  set_switch("SPECDEC_CUDA_ORDERED_EARLY", tuning.ordered_early);
  set_switch("SPECDEC_CUDA_TILE_FUSED", tuning.tile_fused);
  return tuning;
}

void check_tuning(const CudaTuning& t) {
  SPECDEC_CHECK(t.early_weights >= 0 && t.early_weights <= 2, "CudaTuning::early_weights = ", t.early_weights,
                " must be 0, 1 or 2");
  const int paired = static_cast<int>(t.paired_columns);
  SPECDEC_CHECK(paired >= 0 && paired <= 2, "CudaTuning::paired_columns = ", paired, " must be 0, 1 or 2");
  SPECDEC_CHECK(t.gemm_tile >= 0 && t.gemm_tile <= 9, "CudaTuning::gemm_tile = ", t.gemm_tile, " must be 0 to 9");
  SPECDEC_CHECK(t.skinny_max_m >= 0 && t.skinny_max_m <= cuda::kSkinnyMaxM,
                "CudaTuning::skinny_max_m = ", t.skinny_max_m, " must be 0 to ", cuda::kSkinnyMaxM);
  SPECDEC_CHECK(t.ordered_max_m >= 0 && t.ordered_max_m <= cuda::kOrderedMaxM,
                "CudaTuning::ordered_max_m = ", t.ordered_max_m, " must be 0 to ", cuda::kOrderedMaxM);
  SPECDEC_CHECK(t.fast_whole_x_max_m >= 0 && t.fast_whole_x_max_m <= cuda::kOrderedMaxM,
                "CudaTuning::fast_whole_x_max_m = ", t.fast_whole_x_max_m, " must be 0 to ", cuda::kOrderedMaxM);
  SPECDEC_CHECK(t.ordered_warps == 4 || t.ordered_warps == 8, "CudaTuning::ordered_warps = ", t.ordered_warps,
                " must be 4 or 8");
  SPECDEC_CHECK(t.flash_decode_blocks >= 0, "CudaTuning::flash_decode_blocks = ", t.flash_decode_blocks,
                " must not be negative");
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& options)
      : invariant_(options.batch_invariant), kv_dtype_(options.kv_dtype) {
    SPECDEC_CHECK(kv_dtype_ == DType::bf16 || kv_dtype_ == DType::f16 || kv_dtype_ == DType::f32,
                  "the CUDA backend keeps its KV cache in bf16, f16 or f32, not ", dtype_name(kv_dtype_));
    check_tuning(options.cuda);
    ctx_.tuning = options.cuda;
    int device = 0;
    SPECDEC_CUDA_CHECK(cudaGetDevice(&device));
    cudaDeviceProp prop{};
    SPECDEC_CUDA_CHECK(cudaGetDeviceProperties(&prop, device), "device ", device);
    name_ = str_cat("cuda ", prop.name, invariant_ ? " (batch-invariant)" : " (fast)");
    memory_ = cuda::DeviceMemory::create(device, options.memory_limit);
    stream_ = memory_->stream();
    ctx_.stream = stream_;
  }
  ~CudaBackend() override {
    // Stream-ordered frees of scratch memory go into the stream before it is synchronized.
    lt_workspace_ = Buffer();
    scratch_ = Buffer();
    epilogue_ = Buffer();
    wide_ = Buffer();
    arrivals_ = Buffer();
    cudaStreamSynchronize(stream_);
    for (cudaEvent_t e : events_)
      if (e) cudaEventDestroy(e);
  }

  Device device() const override { return Device::cuda; }
  std::string name() const override { return name_; }
  DType kv_dtype() const override { return kv_dtype_; }

  Buffer allocate(size_t bytes) override { return memory_->allocate(bytes); }

  // The pool's cap (the free memory at start, or --gpu-memory) less what it has handed out.
  size_t memory_available() const override {
    const size_t used = memory_->in_use();
    return used < memory_->cap() ? memory_->cap() - used : 0;
  }

  void copy(const Tensor& src, const Tensor& dst) override {
    SPECDEC_CHECK(src.dtype == dst.dtype && src.numel() == dst.numel(), "copy: ", src.shape_string(), " to ",
                  dst.shape_string(), " (dtype and element count must match)");
    const size_t bytes = src.bytes();
    if (bytes == 0) return;
    const bool from_dev = src.device == Device::cuda, to_dev = dst.device == Device::cuda;
    const cudaMemcpyKind kind = from_dev ? (to_dev ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost)
                                         : (to_dev ? cudaMemcpyHostToDevice : cudaMemcpyHostToHost);
    // Host sources are pageable: the call returns once the source has been staged, so the
    // caller may reuse it. Copies to the host wait, so the data is there when copy returns.
    SPECDEC_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, bytes, kind, stream_), "copy ", src.shape_string(), " from ",
                       device_name(src.device), " to ", device_name(dst.device));
    if (!to_dev) SPECDEC_CUDA_CHECK(cudaStreamSynchronize(stream_), "copy to host of ", bytes, " bytes");
  }

  cudaStream_t stream() const { return stream_; }
  const CudaTuning& tuning() const { return ctx_.tuning; }

  void synchronize() override { SPECDEC_CUDA_CHECK(cudaStreamSynchronize(stream_), "synchronize"); }

  bool queues_calls() const override { return true; }

  Buffer allocate_staging(size_t bytes) override {
    void* p = nullptr;
    SPECDEC_CUDA_CHECK(cudaMallocHost(&p, std::max<size_t>(bytes, 1)), "page-locked host memory of ", bytes, " bytes");
    return Buffer(p, bytes, Device::cpu, [](void* q) { cudaFreeHost(q); });
  }

  void copy_to_staging(const Tensor& src, const Tensor& dst) override {
    SPECDEC_CHECK(src.dtype == dst.dtype && src.numel() == dst.numel() && dst.device == Device::cpu,
                  "copy_to_staging: ", src.shape_string(), " to ", dst.shape_string(),
                  " (dtype and element count must match; the destination is host memory)");
    if (src.bytes() == 0) return;
    const cudaMemcpyKind kind = src.device == Device::cuda ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost;
    SPECDEC_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.bytes(), kind, stream_), "copy to staging of ",
                       src.bytes(), " bytes");
  }

  // A ring of events: a fence whose event a later fence took over waits for that later point,
  // which is still after everything the fence covers.
  uint64_t fence() override {
    const uint64_t n = ++fences_;
    cudaEvent_t& e = events_[n % events_.size()];
    if (!e) SPECDEC_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "creating a fence");
    SPECDEC_CUDA_CHECK(cudaEventRecord(e, stream_), "fence");
    return n;
  }

  void wait_for(uint64_t fence) override {
    if (fence == 0) return;
    SPECDEC_CUDA_CHECK(cudaEventSynchronize(events_[fence % events_.size()]), "waiting for queued calls");
  }

  void embedding(const Tensor& table, const Tensor& ids, const Tensor& out) override {
    const char* op = "embedding";
    const ElemType tt = elem_type(table, op, "table");
    expect_dtype(ids, DType::i32, op, "ids");
    expect_dtype(out, DType::f32, op, "out");
    SPECDEC_CHECK(table.rank == 2, op, ": table ", table.shape_string(), " must be [V, H]");
    const int64_t T = ids.numel(), H = table.dim(1);
    SPECDEC_CHECK(out.numel() == T * H && out.dim(-1) == H, op, ": out ", out.shape_string(), " must be [", T, ", ", H,
                  "]");
    cuda::launch_embedding(table.data, tt, ids.ptr<int>(), out.ptr<float>(), to_int(T, op, "tokens"),
                           to_int(H, op, "hidden"), to_int(table.dim(0), op, "vocab"), ctx_);
    check_launch(op, T, "x", H);
  }

  void rms_norm(const Tensor& x, const Tensor& weight, float eps, const Tensor& out) override {
    const char* op = "rms_norm";
    expect_dtype(out, DType::f32, op, "out");
    const ElemType wt = check_rms_norm(op, x, weight, out);
    const int64_t D = x.dim(-1);
    const int64_t rows = D == 0 ? 0 : x.numel() / D;
    cuda::launch_rms_norm(x.ptr<float>(), weight.data, wt, eps, out.ptr<float>(), to_int(rows, op, "rows"),
                          to_int(D, op, "dim"), ctx_);
    check_launch(op, rows, "x", D);
  }

  // Checks rms_norm's x and weight against out (of any dtype) and returns the weight's type.
  ElemType check_rms_norm(const char* op, const Tensor& x, const Tensor& weight, const Tensor& out) {
    expect_dtype(x, DType::f32, op, "x");
    const ElemType wt = elem_type(weight, op, "weight");
    SPECDEC_CHECK(x.rank >= 1 && weight.numel() == x.dim(-1) && out.numel() == x.numel(), op, ": x ", x.shape_string(),
                  ", weight ", weight.shape_string(), ", out ", out.shape_string(), " disagree");
    return wt;
  }

  void linear(const Tensor& x, const Weight& w, const Tensor* bias, const Tensor& out) override {
    const Tensor& weight = w.dense("linear");
    const LinearShape sh = check_linear("linear", x, weight, bias, out);
    if (tensor_cores(sh, {&weight.data, 1})) {
      const cuda::LinearSegment seg{weight.data, sh.bias, out.ptr<float>(), sh.n};
      return launch_gemm(x, {&seg, 1}, sh, cuda::LinearEpilogue::store, "linear");
    }
    if (rows_kernel(sh)) {
      const cuda::LinearSegment seg{weight.data, sh.bias, out.ptr<float>(), sh.n};
      launch_rows(x, {&seg, 1}, sh, cuda::LinearEpilogue::store, "linear");
      return;
    }
    linear_lt(x, weight, sh, out);
  }

  void linear_many(const Tensor& x, std::span<const Projection> projections) override {
    if (linear_many_rows(x, projections, nullptr, 0.0f) || linear_many_lt(x, projections, nullptr, 0.0f, x)) return;
    Backend::linear_many(x, projections);  // one linear() each
  }

  void norm_linear_many(const Tensor& x, const Tensor& norm_weight, float eps, const Tensor& normed,
                        std::span<const Projection> projections) override {
    check_normed("norm_linear_many", x, normed);
    if (linear_many_rows(x, projections, &norm_weight, eps) ||
        linear_many_lt(x, projections, &norm_weight, eps, normed))
      return;
    Backend::norm_linear_many(x, norm_weight, eps, normed, projections);
  }

  void norm_gated_linear(const Tensor& x, const Tensor& norm_weight, float eps, const Tensor& normed,
                         const Weight& gate_w, const Weight& up_w, const Tensor& out) override {
    const char* op = "norm_gated_linear";
    const Tensor& w_gate = gate_w.dense(op);
    const Tensor& w_up = up_w.dense(op);
    check_normed(op, x, normed);
    const LinearShape sh = check_linear(op, x, w_gate, nullptr, out);
    const LinearShape up = check_linear(op, x, w_up, nullptr, out);
    if (up.type == sh.type && folds_norm(sh, norm_weight)) {
      return launch_gated_rows(x, w_gate, w_up, out, sh, op, norm_weight.data, eps);
    }
    if (up.type == sh.type && !rows_kernel(sh) && !tensor_core_type(sh)) {
      if (gated_whole_x(x, &norm_weight, eps, w_gate, w_up, out, sh)) return;
      return gated_lt(lt_normed_input(x, norm_weight, eps, normed, sh), w_gate, w_up, out, sh);
    }
    Backend::norm_gated_linear(x, norm_weight, eps, normed, gate_w, up_w, out);
  }

  void norm_mlp_add(const Tensor& x, const Tensor& norm_weight, float eps, const Tensor& normed, const Weight& gate_w,
                    const Weight& up_w, const Tensor& act, const Weight& down_w) override {
    const char* op = "norm_mlp_add";
    const Tensor& w_gate = gate_w.dense(op);
    const Tensor& w_up = up_w.dense(op);
    const Tensor& w_down = down_w.dense(op);
    check_normed(op, x, normed);
    const LinearShape sh = check_linear(op, x, w_gate, nullptr, act);
    const LinearShape up = check_linear(op, x, w_up, nullptr, act);
    const LinearShape down = check_linear(op, act, w_down, nullptr, x);
    // Both halves on the cuBLASLt path, gate and up as one GEMM (or as two, where their products
    // come in 16 bits): the SwiGLU then writes the down projection's 16-bit x itself, where
    // gated_lt and linear_add would write act in f32 and round it in a pass of its own (the same
    // bits: the rounding is the same).
    const bool lt = tuning().direct_outputs && sh.type != ElemType::f32 && up.type == sh.type && down.type == sh.type &&
                    !rows_kernel(sh) && !tensor_core_type(sh) && !rows_kernel(down) && !tensor_core_type(down);
    const bool stack = gate_up_stacked(sh, w_gate, w_up);
    if (!lt || (!stack && !half_gate_up(sh)))
      return Backend::norm_mlp_add(x, norm_weight, eps, normed, gate_w, up_w, act, down_w);
    if (gated_whole_x(x, &norm_weight, eps, w_gate, w_up, act, sh)) return linear_add(act, down_w, nullptr, x);
    const void* xin = lt_normed_input(x, norm_weight, eps, normed, sh);
    LinearShape both = sh;
    both.n = 2 * sh.n;
    if (skinny(stack ? both : sh, xin, w_gate.data)) {  // the few-row kernels' SwiGLU epilogue writes act
      gated_lt(xin, w_gate, w_up, act, sh);
      return linear_add(act, down_w, nullptr, x);
    }
    // The GEMMs have read xin before the SwiGLU runs: its scratch may hold the SwiGLU's output
    // (stream order).
    const size_t act_bytes = static_cast<size_t>(sh.m) * sh.n * 2;
    if (half_gate_up(sh)) {
      const void* parts = gate_up_16(xin, w_gate, w_up, stack, sh);
      void* xh = scratch(act_bytes);
      silu_mul_parts_16(parts, stack, sh, xh, sh.type);
      return lt_gemm(xh, w_down, x, down, /*accumulate=*/true);
    }
    const Tensor gu = wide_scratch(both);
    lt_gemm(xin, stacked_weight(w_gate, both.n), gu, both);
    void* xh = scratch(act_bytes);
    cuda::launch_silu_mul_halves_16(gu.ptr<float>(), xh, sh.type, sh.m, sh.n, ctx_);
    check_launch("silu_mul (stacked gate and up, to 16-bit)", sh.m, "x", sh.n);
    lt_gemm(xh, w_down, x, down, /*accumulate=*/true);
  }

  void gated_linear(const Tensor& x, const Weight& gate_w, const Weight& up_w, const Tensor& out) override {
    const char* op = "gated_linear";
    const Tensor& w_gate = gate_w.dense(op);
    const Tensor& w_up = up_w.dense(op);
    const LinearShape sh = check_linear(op, x, w_gate, nullptr, out);
    const LinearShape up = check_linear(op, x, w_up, nullptr, out);
    SPECDEC_CHECK(up.type == sh.type, op, ": gate ", w_gate.shape_string(), " and up ", w_up.shape_string(),
                  " must share a dtype");
    const std::array<const void*, 2> ws = {w_gate.data, w_up.data};
    if (tensor_cores(sh, ws)) {
      const std::array<cuda::LinearSegment, 2> segs = {
          cuda::LinearSegment{w_gate.data, nullptr, out.ptr<float>(), sh.n},
          cuda::LinearSegment{w_up.data, nullptr, nullptr, sh.n}};
      return launch_gemm(x, segs, sh, cuda::LinearEpilogue::silu_gate, op);
    }
    if (rows_kernel(sh)) return launch_gated_rows(x, w_gate, w_up, out, sh, op);
    if (gated_whole_x(x, nullptr, 0.0f, w_gate, w_up, out, sh)) return;
    gated_lt(lt_input(x, sh), w_gate, w_up, out, sh);
  }

  void linear_add(const Tensor& x, const Weight& w, const Tensor* bias, const Tensor& out) override {
    const char* op = "linear_add";
    const Tensor& weight = w.dense(op);
    const LinearShape sh = check_linear(op, x, weight, bias, out);
    if (tensor_cores(sh, {&weight.data, 1})) {
      const cuda::LinearSegment seg{weight.data, sh.bias, out.ptr<float>(), sh.n};
      return launch_gemm(x, {&seg, 1}, sh, cuda::LinearEpilogue::add, op);
    }
    if (rows_kernel(sh)) {
      const cuda::LinearSegment seg{weight.data, sh.bias, out.ptr<float>(), sh.n};
      launch_rows(x, {&seg, 1}, sh, cuda::LinearEpilogue::add, op);
      return;
    }
    // 16-bit weights read x's rounded copy, so out may even alias x; f32 weights would read x
    // itself while the product accumulates into out, so they keep the separate add.
    if (!sh.bias && sh.type != ElemType::f32) {
      const Tensor* outs = &out;
      if (auto a = whole_x_args(x, nullptr, 0.0f, weight.data, sh, {&outs, 1})) {
        a->epilogue = cuda::SkinnyEpilogue::add;
        a->out[0] = out.ptr<float>();
        return launch_skinny(*a);
      }
      return lt_gemm(lt_input(x, sh), weight, out, sh, /*accumulate=*/true);
    }
    const Tensor tmp = epilogue_scratch(out);
    linear_lt(x, weight, sh, tmp);
    add(out, tmp, out);
  }

  void rope_kv_write(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& positions, const Tensor& inv_freq,
                     float attention_scaling, const Tensor& k_pool, const Tensor& v_pool,
                     const AttentionBatch& batch) override {
    const char* op = "rope_kv_write";
    check_rope(op, q, positions, inv_freq);
    check_rope(op, k, positions, inv_freq);
    const ElemType pt = check_kv_write(op, k, v, k_pool, v_pool, batch);
    SPECDEC_CHECK(q.dim(2) == k.dim(2), op, ": q ", q.shape_string(), " and k ", k.shape_string(),
                  " must share head_dim");
    const int64_t T = q.dim(0), heads = q.dim(1), kvh = k.dim(1), D = q.dim(2);
    cuda::launch_rope_kv_write(
        q.ptr<float>(), k.ptr<float>(), v.ptr<float>(), positions.ptr<int>(), inv_freq.ptr<float>(), attention_scaling,
        to_int(T, op, "tokens"), to_int(heads, op, "heads"), to_int(kvh, op, "kv_heads"), to_int(D, op, "head_dim"),
        k_pool.data, v_pool.data, pt, batch.slots.ptr<int>(), k_pool.dim(0) * k_pool.dim(1), ctx_);
    check_launch(op, T, "x", heads, "+", kvh, "x", D);
  }

  bool allow_fast_kernels(bool allowed) override {
    const bool before = fast_allowed_;
    fast_allowed_ = allowed && tuning().fast_drafts;
    return before;
  }

  std::unique_ptr<RecordedCalls> record(const std::function<void()>& enqueue) override {
    // Per-call synchronization cannot be recorded; without recordings every call runs eagerly.
    if (tuning().sync_each_call || !tuning().record) return nullptr;
    auto recording = std::make_unique<Recording>(stream_, generation_);
    SPECDEC_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "recording calls");
    recording_ = true;
    try {
      enqueue();
    } catch (...) {
      recording_ = false;
      cudaGraph_t abandoned = nullptr;
      cudaStreamEndCapture(stream_, &abandoned);
      if (abandoned) cudaGraphDestroy(abandoned);
      cudaGetLastError();
      throw;
    }
    recording_ = false;
    SPECDEC_CUDA_CHECK(cudaStreamEndCapture(stream_, &recording->graph),
                       "recording calls (a call inside synchronized, copied to the host or allocated?)");
    SPECDEC_CUDA_CHECK(cudaGraphInstantiate(&recording->exec, recording->graph, 0), "instantiating recorded calls");
    return recording;
  }

  void rope(const Tensor& x, const Tensor& positions, const Tensor& inv_freq, float attention_scaling) override {
    const char* op = "rope";
    check_rope(op, x, positions, inv_freq);
    const int64_t T = x.dim(0), heads = x.dim(1), D = x.dim(2);
    cuda::launch_rope(x.ptr<float>(), positions.ptr<int>(), inv_freq.ptr<float>(), attention_scaling,
                      to_int(T, op, "tokens"), to_int(heads, op, "heads"), to_int(D, op, "head_dim"), ctx_);
    check_launch(op, T, "x", heads, "x", D);
  }

  void silu_mul(const Tensor& gate, const Tensor& up, const Tensor& out) override {
    elementwise("silu_mul", gate, up, out);
    cuda::launch_silu_mul(gate.ptr<float>(), up.ptr<float>(), out.ptr<float>(), gate.numel(), ctx_);
    check_launch("silu_mul", gate.numel(), " elements");
  }

  void add(const Tensor& a, const Tensor& b, const Tensor& out) override {
    elementwise("add", a, b, out);
    cuda::launch_add(a.ptr<float>(), b.ptr<float>(), out.ptr<float>(), a.numel(), ctx_);
    check_launch("add", a.numel(), " elements");
  }

  void gather_rows(const Tensor& x, const Tensor& indices, const Tensor& out) override {
    const char* op = "gather_rows";
    expect_cuda(x, op, "x");
    expect_cuda(out, op, "out");
    expect_dtype(indices, DType::i32, op, "indices");
    SPECDEC_CHECK(x.rank >= 1 && out.dtype == x.dtype, op, ": x ", x.shape_string(), " and out ", out.shape_string(),
                  " must share a dtype");
    const int64_t rows = x.dim(0), n = indices.numel();
    const int64_t row_elems = rows == 0 ? 0 : x.numel() / rows;
    SPECDEC_CHECK(out.numel() == n * row_elems, op, ": out ", out.shape_string(), " must hold ", n, " rows of ",
                  row_elems);
    cuda::launch_gather_rows(x.data, indices.ptr<int>(), out.data, to_int(n, op, "count"),
                             row_elems * static_cast<int64_t>(dtype_size(x.dtype)), to_int(rows, op, "rows"), ctx_);
    check_launch(op, n, " rows of ", row_elems);
  }

  void scatter_columns(const Tensor& x, const Tensor& index, float fill, const Tensor& out) override {
    const char* op = "scatter_columns";
    expect_cuda(x, op, "x");
    expect_cuda(out, op, "out");
    expect_dtype(x, DType::f32, op, "x");
    expect_dtype(index, DType::i32, op, "index");
    expect_dtype(out, DType::f32, op, "out");
    const int64_t C = x.dim(-1), n = C == 0 ? 0 : x.numel() / C, V = out.dim(-1);
    SPECDEC_CHECK(index.numel() == C, op, ": index ", index.shape_string(), " must have one entry per column of x ",
                  x.shape_string());
    SPECDEC_CHECK(out.numel() == n * V, op, ": out ", out.shape_string(), " must hold ", n, " rows");
    cuda::launch_scatter_columns(x.ptr<float>(), index.ptr<int>(), fill, out.ptr<float>(), to_int(n, op, "rows"),
                                 to_int(C, op, "columns"), to_int(V, op, "vocab"), ctx_);
    check_launch(op, n, " rows of ", C);
  }

  void kv_write(const Tensor& k, const Tensor& v, const Tensor& k_pool, const Tensor& v_pool,
                const AttentionBatch& batch) override {
    const char* op = "kv_write";
    const ElemType pt = check_kv_write(op, k, v, k_pool, v_pool, batch);
    const int64_t T = k.dim(0), kvh = k.dim(1), D = k.dim(2);
    cuda::launch_kv_write(k.ptr<float>(), v.ptr<float>(), k_pool.data, v_pool.data, pt, batch.slots.ptr<int>(),
                          to_int(T, op, "tokens"), to_int(kvh, op, "kv_heads"), to_int(D, op, "head_dim"),
                          k_pool.dim(0) * k_pool.dim(1), ctx_);
    check_launch(op, T, "x", kvh, "x", D);
  }

  void attention(const Tensor& q, const Tensor& k_pool, const Tensor& v_pool, const AttentionBatch& batch, float scale,
                 const Tensor& out) override {
    const char* op = "attention";
    if (tile_decode(batch, k_pool) && attend_tiles(op, q, k_pool, v_pool, batch, scale, out)) return;
    const bool flash = flash_attention(batch, k_pool);
    const cuda::AttentionArgs a = attention_args(op, q, k_pool, v_pool, batch, scale, out, !flash);
    if (flash && cuda::launch_flash_attention(a, batch.max_row_tokens, invariant(), ctx_)) {
      check_launch("attention (tensor cores)", a.tokens, " tokens x ", a.heads, " heads x ", a.head_dim, ", rows ",
                   batch.rows, ", max_row_tokens ", batch.max_row_tokens);
      return;
    }
    launch_attention(op, flash ? attention_args(op, q, k_pool, v_pool, batch, scale, out) : a, batch);
  }

  // Whether this batch attends on the tensor-core kernel (bf16 products). A token's bits there do
  // not depend on its neighbours or on how its row's tokens are cut into calls, so the
  // batch-invariant mode takes it for every batch its pools and head size allow. The fast mode
  // takes it for a batch with prefill chunks, or enough rows that its blocks (one per row and kv
  // head, each over the row's whole history) fill the GPU by themselves
  // (CudaTuning::flash_decode_blocks); fewer rows of one or a few tokens keep the f32 kernel,
  // whose split launch spreads a long history over more SMs.
  bool flash_attention(const AttentionBatch& batch, const Tensor& k_pool) const {
    if (!tuning().flash_prefill || k_pool.rank != 4) return false;
    if (invariant())
      return k_pool.dtype == DType::bf16 &&
             cuda::flash_attention_supports(ElemType::bf16, static_cast<int>(k_pool.dim(3)));
    return batch.max_row_tokens >= kFlashMinRowTokens || batch.rows * k_pool.dim(2) >= tuning().flash_decode_blocks;
  }
  // Fewest new tokens of a row for which the fast mode attends with the tensor-core kernel.
  static constexpr int kFlashMinRowTokens = 16;

  // Whether a batch of decode steps and short windows attends one warp per (row, kv head, 16
  // (token, head) pairs, tile) (CudaTuning::tile_decode): a bf16 cache the tensor cores take, at
  // most kTileMaxRowTokens new tokens a row (past that the flash kernel's blocks of 16 tokens
  // share each K/V tile among more of them). In the batch-invariant mode both kernels give the
  // same bits.
  bool tile_decode(const AttentionBatch& batch, const Tensor& k_pool) const {
    return tuning().flash_prefill && tuning().tile_decode && batch.max_row_tokens <= kTileMaxRowTokens &&
           k_pool.rank == 4 && k_pool.dtype == DType::bf16 &&
           cuda::flash_attention_supports(ElemType::bf16, static_cast<int>(k_pool.dim(3)));
  }
  static constexpr int kTileMaxRowTokens = 16;
  // A decode step's new tokens for an attention launch that rotates and caches them itself, as
  // rope_kv_write would first (AttentionArgs::k_new).
  struct NewTokens {
    const Tensor *k, *v, *positions, *inv_freq;
    float scaling;
  };
  // The tile decode launch, with room for every tile of the longest stated row; false, having
  // launched nothing, where those partials would pass kMaxTilePartialBytes (the flash kernel then
  // walks each row's tiles in one block, to the same bits in the batch-invariant mode).
  // With `fresh` (a decode step, one new token a row; CudaTuning::tile_fused), the launch also
  // rotates q and the new k and caches k and v, as rope_kv_write would first, and its last warps
  // fold the tiles (no merge launch).
  bool attend_tiles(const char* op, const Tensor& q, const Tensor& k_pool, const Tensor& v_pool,
                    const AttentionBatch& batch, float scale, const Tensor& out, const NewTokens* fresh = nullptr) {
    constexpr size_t kMaxTilePartialBytes = size_t{512} << 20;
    cuda::AttentionArgs a = attention_args(op, q, k_pool, v_pool, batch, scale, out, false);
    if (fresh) take_new_tokens(op, q, *fresh, k_pool, v_pool, batch, a);
    const int64_t tiles =
        std::max<int64_t>(1, (int64_t{batch.max_row_len} + cuda::kFlashKvTile - 1) / cuda::kFlashKvTile);
    const size_t n = static_cast<size_t>(a.tokens) * static_cast<size_t>(a.heads) * static_cast<size_t>(tiles);
    const size_t bytes = n * (static_cast<size_t>(a.head_dim) + 2) * sizeof(float);
    if (tiles > 65535 || bytes > kMaxTilePartialBytes) return false;
    float* base = static_cast<float*>(scratch(bytes));
    a.partial_m = base;
    a.partial_l = base + n;
    a.partial_acc = base + 2 * n;
    if (fresh) {  // one counter per warp group of the launch: (row, kv head, 16 pairs)
      const int64_t pair_blocks = (int64_t{batch.max_row_tokens} * (a.heads / a.kv_heads) + 15) / 16;
      a.arrivals = arrivals(static_cast<size_t>(int64_t{a.rows} * a.kv_heads * pair_blocks));
    }
    const bool warp_fold = !invariant() && tuning().tile_warp_fold;
    if (!cuda::launch_tile_decode_attention(a, batch.max_row_tokens, static_cast<int>(tiles), warp_fold, ctx_))
      return false;
    check_launch("attention (tensor cores, tiles)", a.tokens, " tokens x ", a.heads, " heads x ", a.head_dim,
                 ", tiles ", tiles);
    return true;
  }

  void rope_kv_write_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& positions,
                               const Tensor& inv_freq, float attention_scaling, const Tensor& k_pool,
                               const Tensor& v_pool, const AttentionBatch& batch, float scale,
                               const Tensor& out) override {
    // One launch for decode steps (one new token per row) of a few rows; windows, prefill
    // chunks and large batches compose.
    const char* op = "rope_kv_write_attention";
    if (batch.max_row_tokens != 1 || batch.tokens != batch.rows) {
      return Backend::rope_kv_write_attention(q, k, v, positions, inv_freq, attention_scaling, k_pool, v_pool, batch,
                                              scale, out);
    }
    if (flash_attention(batch, k_pool) && (invariant() || !tile_decode(batch, k_pool))) {
      const NewTokens fresh{&k, &v, &positions, &inv_freq, attention_scaling};
      if (invariant() && tuning().tile_fused && tile_decode(batch, k_pool) &&
          attend_tiles(op, q, k_pool, v_pool, batch, scale, out, &fresh))
        return;
      rope_kv_write(q, k, v, positions, inv_freq, attention_scaling, k_pool, v_pool, batch);
      return attention(q, k_pool, v_pool, batch, scale, out);
    }
    cuda::AttentionArgs a = attention_args(op, q, k_pool, v_pool, batch, scale, out);
    // Fused only when the attention is one wave (then the separate launches are latency): with
    // many waves each block redoing its token's rotation costs more than the launches it saves.
    if (!tuning().fused_attention || attention_blocks(a) > kAttentionWave) {
      rope_kv_write(q, k, v, positions, inv_freq, attention_scaling, k_pool, v_pool, batch);
      if (tile_decode(batch, k_pool)) return attention(q, k_pool, v_pool, batch, scale, out);
      return launch_attention("attention", a, batch);  // the split launch `a` already holds
    }
    take_new_tokens(op, q, {&k, &v, &positions, &inv_freq, attention_scaling}, k_pool, v_pool, batch, a);
    launch_attention(op, a, batch);
  }

  void take_new_tokens(const char* op, const Tensor& q, const NewTokens& fresh, const Tensor& k_pool,
                       const Tensor& v_pool, const AttentionBatch& batch, cuda::AttentionArgs& a) {
    check_rope(op, q, *fresh.positions, *fresh.inv_freq);
    check_rope(op, *fresh.k, *fresh.positions, *fresh.inv_freq);
    check_kv_write(op, *fresh.k, *fresh.v, k_pool, v_pool, batch);
    SPECDEC_CHECK(fresh.k->dim(2) == a.head_dim && fresh.k->dim(1) == a.kv_heads, op, ": k ", fresh.k->shape_string(),
                  " and pool ", k_pool.shape_string(), " disagree");
    a.k_new = fresh.k->ptr<float>();
    a.v_new = fresh.v->ptr<float>();
    a.slots = batch.slots.ptr<int>();
    a.inv_freq = fresh.inv_freq->ptr<float>();
    a.rope_scaling = fresh.scaling;
  }

  void launch_attention(const char* op, const cuda::AttentionArgs& a, const AttentionBatch& batch) {
    cuda::launch_attention(a, ctx_);
    check_launch(op, a.tokens, " tokens x ", a.heads, " heads x ", a.head_dim, ", rows ", batch.rows, ", max_row_len ",
                 batch.max_row_len);
  }

  // Checks attention's operands and lays out its kernel arguments, choosing the split launch.
  cuda::AttentionArgs attention_args(const char* op, const Tensor& q, const Tensor& k_pool, const Tensor& v_pool,
                                     const AttentionBatch& batch, float scale, const Tensor& out,
                                     bool may_split = true) {
    expect_dtype(q, DType::f32, op, "q");
    expect_dtype(out, DType::f32, op, "out");
    const ElemType pt = pool_type(k_pool, v_pool, op);
    expect_dtype(batch.positions, DType::i32, op, "batch.positions");
    expect_dtype(batch.row_starts, DType::i32, op, "batch.row_starts");
    expect_dtype(batch.row_lens, DType::i32, op, "batch.row_lens");
    expect_dtype(batch.block_table, DType::i32, op, "batch.block_table");
    SPECDEC_CHECK(q.rank == 3 && out.numel() == q.numel(), op, ": q ", q.shape_string(), " and out ",
                  out.shape_string(), " must be [T, heads, head_dim]");
    const int64_t T = q.dim(0), heads = q.dim(1), D = q.dim(2), kvh = k_pool.dim(2);
    SPECDEC_CHECK(k_pool.dim(3) == D && kvh > 0 && heads % kvh == 0, op, ": q ", q.shape_string(), " and pool ",
                  k_pool.shape_string(), " disagree (heads must be a multiple of kv_heads)");
    SPECDEC_CHECK((D % 32 == 0 && D >= 32 && D <= 256) || D == 16 || D == 48 || D == 80 || D == 112, op, ": head_dim ",
                  D, " is not supported (16, 48, 80, 112, or a multiple of 32 up to 256)");
    SPECDEC_CHECK(batch.tokens == T, op, ": batch.tokens ", batch.tokens, " but q has ", T, " tokens");
    SPECDEC_CHECK(
        reinterpret_cast<uintptr_t>(k_pool.data) % 16 == 0 && reinterpret_cast<uintptr_t>(v_pool.data) % 16 == 0, op,
        ": KV pools must start on a 16-byte boundary (they are read with 16-byte loads)");
    SPECDEC_CHECK(k_pool.dim(0) * k_pool.dim(1) <= INT32_MAX, op, ": pool ", k_pool.shape_string(),
                  " has more than 2^31 slots");
    SPECDEC_CHECK(T == 0 || batch.rows > 0, op, ": a batch with ", T, " tokens has no rows");
    SPECDEC_CHECK(batch.block_size == k_pool.dim(1), op, ": batch.block_size ", batch.block_size,
                  " but the pool's blocks hold ", k_pool.dim(1), " positions");
    SPECDEC_CHECK(batch.positions.numel() >= T && batch.row_starts.numel() >= batch.rows + 1 &&
                      batch.row_lens.numel() >= batch.rows &&
                      batch.block_table.numel() >= int64_t{batch.rows} * batch.max_blocks,
                  op, ": batch tensors are smaller than rows = ", batch.rows, ", tokens = ", T,
                  ", max_blocks = ", batch.max_blocks);
    cuda::AttentionArgs a;
    a.q = q.ptr<float>();
    a.k_pool = k_pool.data;
    a.v_pool = v_pool.data;
    a.pool_type = pt;
    a.positions = batch.positions.ptr<int>();
    a.row_starts = batch.row_starts.ptr<int>();
    a.row_lens = batch.row_lens.ptr<int>();
    a.block_table = batch.block_table.ptr<int>();
    a.out = out.ptr<float>();
    a.rows = batch.rows;
    a.tokens = to_int(T, op, "tokens");
    a.heads = to_int(heads, op, "heads");
    a.kv_heads = to_int(kvh, op, "kv_heads");
    a.head_dim = static_cast<int>(D);
    a.max_blocks = batch.max_blocks;
    a.block_size = batch.block_size;
    a.pool_blocks = k_pool.dim(0);
    a.scale = scale;
    a.block_heads = cuda::kAttentionGroup;
    // One block per chunk (split launch) when one block per token and kv group would leave the
    // device underused (decode steps, verify windows) and the partials fit the scratch cap; long
    // prefill chunks have blocks enough. Both launches give the same bits (see kernels.h).
    constexpr int64_t kSplitBelowBlocks = 1024;
    constexpr size_t kMaxPartialBytes = size_t{128} << 20;
    const int64_t splits = (int64_t{batch.max_row_len} + cuda::kAttentionChunk - 1) / cuda::kAttentionChunk;
    const int64_t groups = (heads / kvh + cuda::kAttentionGroup - 1) / cuda::kAttentionGroup;
    const size_t n =
        static_cast<size_t>(T) * static_cast<size_t>(heads) * static_cast<size_t>(std::max<int64_t>(splits, 1));
    const size_t partial_bytes =
        n * (static_cast<size_t>(D) + 2) * sizeof(float) + static_cast<size_t>(T) * sizeof(int);
    if (may_split && splits > 1 && splits <= 65535 && T * kvh * groups < kSplitBelowBlocks &&
        partial_bytes <= kMaxPartialBytes) {
      a.max_splits = static_cast<int>(splits);
      float* base = static_cast<float*>(scratch(partial_bytes));
      a.partial_m = base;
      a.partial_l = base + n;
      a.partial_acc = base + 2 * n;
      a.partial_len = reinterpret_cast<int*>(base + 2 * n + n * static_cast<size_t>(D));
      // Small launches (batch-1 decode at short context): fewer q heads per block for more
      // blocks in flight, while they still fit one wave; a head's numerics do not depend on it.
      const auto blocks_with = [a](int block_heads) {
        cuda::AttentionArgs b = a;
        b.block_heads = block_heads;
        return attention_blocks(b);
      };
      while (a.block_heads > 1 && blocks_with(a.block_heads / 2) <= kAttentionWave) a.block_heads /= 2;
      // In one wave the last block of each (token, head group) folds the partials (one counter
      // each): a merge launch would be pure latency. With more waves the merge kernel's
      // parallel fold is cheaper than a serial one at the end of the last blocks (measured).
      if (attention_blocks(a) <= kAttentionWave && !tuning().merge_launch)
        a.arrivals = arrivals(static_cast<size_t>(attention_blocks(a) / a.max_splits));
    }
    return a;
  }

  // Blocks of an attention launch that run as one wave (a decode step of a few rows).
  static constexpr int64_t kAttentionWave = 384;

  // Blocks of an attention launch: one per token, kv head, group of block_heads q heads and
  // chunk (split launch).
  static int64_t attention_blocks(const cuda::AttentionArgs& a) {
    const int group = a.heads / a.kv_heads;
    return int64_t{a.tokens} * a.kv_heads * ((group + a.block_heads - 1) / a.block_heads) * a.max_splits;
  }

  // Zeroed arrival counters of split attention launches; each launch leaves them zero again.
  int* arrivals(size_t count) {
    const size_t bytes = count * sizeof(int);
    if (arrivals_.bytes() < bytes) {
      grow(arrivals_, bytes, "attention arrival counters");
      SPECDEC_CUDA_CHECK(cudaMemsetAsync(arrivals_.data(), 0, arrivals_.bytes(), stream_), "zeroing ", bytes,
                         " bytes of attention arrival counters");
    }
    return static_cast<int*>(arrivals_.data());
  }

  void argmax(const Tensor& logits, const Tensor& out) override {
    const char* op = "argmax";
    expect_dtype(logits, DType::f32, op, "logits");
    expect_dtype(out, DType::i32, op, "out");
    const int64_t V = logits.dim(-1), n = V == 0 ? 0 : logits.numel() / V;
    SPECDEC_CHECK(out.numel() == n, op, ": out ", out.shape_string(), " must have ", n, " elements");
    cuda::launch_argmax(logits.ptr<float>(), out.ptr<int>(), to_int(n, op, "rows"), to_int(V, op, "vocab"), ctx_);
    check_launch(op, n, "x", V);
  }

  void top_logprob(const Tensor& logits, const Tensor& out) override {
    const char* op = "top_logprob";
    expect_dtype(logits, DType::f32, op, "logits");
    expect_dtype(out, DType::f32, op, "out");
    const int64_t V = logits.dim(-1), n = V == 0 ? 0 : logits.numel() / V;
    SPECDEC_CHECK(out.numel() == n, op, ": out ", out.shape_string(), " must have ", n, " elements");
    cuda::launch_top_logprob(logits.ptr<float>(), out.ptr<float>(), to_int(n, op, "rows"), to_int(V, op, "vocab"),
                             ctx_);
    check_launch(op, n, "x", V);
  }

  void sample(const Tensor& logits, const Tensor& rows, const Tensor& out) override {
    const char* op = "sample";
    expect_dtype(logits, DType::f32, op, "logits");
    expect_dtype(rows, DType::i32, op, "rows");
    expect_dtype(out, DType::i32, op, "out");
    const int64_t V = logits.dim(-1), n = V == 0 ? 0 : logits.numel() / V;
    SPECDEC_CHECK(V > 0 || logits.numel() == 0, op, ": logits ", logits.shape_string(), " has no columns");
    SPECDEC_CHECK(rows.numel() == n * kSampleRowWords, op, ": rows ", rows.shape_string(), " must be [", n, ", ",
                  kSampleRowWords, "] (one SampleRow per logits row)");
    SPECDEC_CHECK(reinterpret_cast<uintptr_t>(rows.data) % alignof(SampleRow) == 0, op,
                  ": rows must start on an 8-byte boundary (the kernel reads whole SampleRows)");
    SPECDEC_CHECK(out.numel() == n, op, ": out ", out.shape_string(), " must have ", n, " elements");
    if (n == 0) return;
    // The kernel's work rows (scaled logits, then weights) take the shared scratch, one row of
    // floats per logits row, up to a cap; more rows go in several launches that reuse it in stream
    // order. A row's token does not depend on which launch draws it.
    constexpr size_t kMaxWorkBytes = size_t{128} << 20;
    const size_t row_bytes = static_cast<size_t>(V) * sizeof(float);
    const int64_t per_launch =
        std::min<int64_t>(n, std::max<int64_t>(1, static_cast<int64_t>(kMaxWorkBytes / row_bytes)));
    float* work = static_cast<float*>(scratch(static_cast<size_t>(per_launch) * row_bytes));
    const auto* sample_rows = static_cast<const SampleRow*>(rows.data);
    for (int64_t first = 0; first < n; first += per_launch) {
      const int64_t count = std::min(per_launch, n - first);
      cuda::launch_sample(logits.ptr<float>() + first * V, sample_rows + first, out.ptr<int>() + first, work,
                          to_int(count, op, "rows"), to_int(V, op, "vocab"), ctx_);
      check_launch(op, count, "x", V);
    }
  }

 private:
  // A recorded sequence as a CUDA graph. It holds while the backend's internal buffers
  // (scratch, cuBLASLt workspace) stay where they were when it was recorded.
  struct Recording final : RecordedCalls {
    Recording(cudaStream_t s, std::shared_ptr<const uint64_t> gen)
        : stream(s), generation(std::move(gen)), at(*generation) {}
    ~Recording() override {
      if (exec) cudaGraphExecDestroy(exec);
      if (graph) cudaGraphDestroy(graph);
    }
    bool replay() override {
      if (*generation != at) return false;
      SPECDEC_CUDA_CHECK(cudaGraphLaunch(exec, stream), "replaying recorded calls");
      return true;
    }
    cudaStream_t stream;
    std::shared_ptr<const uint64_t> generation;
    uint64_t at;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
  };

  struct LinearShape {
    int m = 0, n = 0, k = 0;
    ElemType type = ElemType::bf16;
    const float* bias = nullptr;
  };

  // Checks out[M, N] = x[M, K] · weight[N, K]ᵀ (+ bias[N]) and returns its sizes.
  LinearShape check_linear(const char* op, const Tensor& x, const Tensor& weight, const Tensor* bias,
                           const Tensor& out) {
    expect_dtype(x, DType::f32, op, "x");
    expect_dtype(out, DType::f32, op, "out");
    LinearShape sh;
    sh.type = elem_type(weight, op, "weight");
    SPECDEC_CHECK(weight.rank == 2, op, ": weight ", weight.shape_string(), " must be [N, K]");
    const int64_t N = weight.dim(0), K = weight.dim(1);
    SPECDEC_CHECK(x.rank >= 1 && x.dim(-1) == K, op, ": x ", x.shape_string(), " must end in K = ", K, " (weight ",
                  weight.shape_string(), ")");
    const int64_t M = K == 0 ? 0 : x.numel() / K;
    SPECDEC_CHECK(out.rank >= 1 && out.dim(-1) == N && out.numel() == M * N, op, ": out ", out.shape_string(),
                  " must be [", M, ", ", N, "]");
    SPECDEC_CHECK(out.data != x.data || out.numel() == 0, op, ": out must not alias x");
    if (bias && !bias->empty()) {
      expect_dtype(*bias, DType::f32, op, "bias");
      SPECDEC_CHECK(bias->numel() == N, op, ": bias ", bias->shape_string(), " must have N = ", N, " elements");
      sh.bias = bias->ptr<float>();
    }
    sh.m = to_int(M, op, "M");
    sh.n = to_int(N, op, "N");
    sh.k = to_int(K, op, "K");
    return sh;
  }

  // Checks rope's x [T, heads, head_dim] against positions [T] and inv_freq [head_dim / 2].
  void check_rope(const char* op, const Tensor& x, const Tensor& positions, const Tensor& inv_freq) {
    expect_dtype(x, DType::f32, op, "x");
    expect_dtype(positions, DType::i32, op, "positions");
    expect_dtype(inv_freq, DType::f32, op, "inv_freq");
    SPECDEC_CHECK(x.rank == 3, op, ": x ", x.shape_string(), " must be [T, heads, head_dim]");
    const int64_t T = x.dim(0), D = x.dim(2);
    SPECDEC_CHECK(D % 2 == 0 && inv_freq.numel() == D / 2 && positions.numel() == T, op, ": x ", x.shape_string(),
                  ", positions ", positions.shape_string(), ", inv_freq ", inv_freq.shape_string(), " disagree");
  }

  // Checks kv_write's k, v [T, kv_heads, head_dim] against the pools and batch.slots; returns
  // the pools' element type.
  ElemType check_kv_write(const char* op, const Tensor& k, const Tensor& v, const Tensor& k_pool, const Tensor& v_pool,
                          const AttentionBatch& batch) {
    expect_dtype(k, DType::f32, op, "k");
    expect_dtype(v, DType::f32, op, "v");
    expect_dtype(batch.slots, DType::i32, op, "batch.slots");
    const ElemType pt = pool_type(k_pool, v_pool, op);
    SPECDEC_CHECK(k.rank == 3 && v.numel() == k.numel() && v.dim(-1) == k.dim(-1), op, ": k ", k.shape_string(),
                  " and v ", v.shape_string(), " must be [T, kv_heads, head_dim]");
    SPECDEC_CHECK(k_pool.dim(2) == k.dim(1) && k_pool.dim(3) == k.dim(2), op, ": pool ", k_pool.shape_string(),
                  " does not fit k ", k.shape_string());
    SPECDEC_CHECK(batch.slots.numel() >= k.dim(0), op, ": batch.slots ", batch.slots.shape_string(), " has fewer than ",
                  k.dim(0), " entries");
    return pt;
  }

  // The row-streaming kernel serves one or two rows in fast mode (where it streams the weights
  // fastest), and in batch-invariant mode every M that cuBLASLt does not (see invariant_lt).
  bool rows_kernel(const LinearShape& sh) const {
    if (sh.k == 0) return true;
    return invariant() ? !invariant_lt(sh) : sh.m <= kSmallM;
  }
  // Whether the batch-invariant mode runs this linear on cuBLASLt with K unsplit: 16-bit weights
  // with K and N multiples of 8 (rows of x, w and out on 16-byte boundaries). Those are the shapes
  // whose row bits were measured to agree across cuBLASLt's algorithms; with N = 4,100 a row's
  // bits at M = 1 and 2 differed, so other shapes keep the row kernel.
  bool invariant_lt(const LinearShape& sh) const {
    return invariant() && tuning().invariant_cublaslt && sh.type != ElemType::f32 && sh.k % 8 == 0 && sh.n % 8 == 0 &&
           !tensor_core_type(sh);
  }

  // Whether the tensor-core linear serves weights of this type and K: for every M in
  // batch-invariant mode with CudaTuning::invariant_tensor_cores (one reduction order for every
  // M; the norm is then never folded). The fast mode keeps cuBLASLt, faster at every M above two.
  bool tensor_core_type(const LinearShape& sh) const {
    if (sh.type == ElemType::f32 || sh.k == 0 || sh.k % 8 != 0) return false;
    return invariant() && tuning().invariant_tensor_cores;
  }
  bool tensor_cores(const LinearShape& sh, std::span<const void* const> weights) const {
    return tensor_core_type(sh) && cuda::gemm_supports(sh.type, sh.k, weights.data(), static_cast<int>(weights.size()));
  }

  // The arguments both linear kernels take: x, the weights' segments and the epilogue.
  static cuda::LinearRowsArgs linear_args(const Tensor& x, std::span<const cuda::LinearSegment> segs,
                                          const LinearShape& sh, cuda::LinearEpilogue epilogue) {
    cuda::LinearRowsArgs a;
    a.x = x.ptr<float>();
    a.w_type = sh.type;
    a.M = sh.m;
    a.K = sh.k;
    a.segments = static_cast<int>(segs.size());
    a.epilogue = epilogue;
    for (size_t j = 0; j < segs.size(); ++j) a.seg[j] = segs[j];
    return a;
  }

  void launch_gemm(const Tensor& x, std::span<const cuda::LinearSegment> segs, const LinearShape& sh,
                   cuda::LinearEpilogue epilogue, const char* op) {
    cuda::launch_gemm(linear_args(x, segs, sh, epilogue), ctx_);
    check_launch(op, " (tensor-core linear) ", sh.m, "x", sh.k, " by ", sh.n, "x", sh.k, ", ", segs.size(), " weights");
  }

  // Whether the row-streaming kernel can apply rms_norm(x, norm_weight) itself for this shape: a
  // whole row of x staged at once, and the norm weight of the linear weight's type.
  bool folds_norm(const LinearShape& sh, const Tensor& norm_weight) const {
    if (norm_weight.device != Device::cuda || norm_weight.dtype == DType::i32) return false;
    return !tensor_core_type(sh) && rows_kernel(sh) && sh.m > 0 && sh.k > 0 &&
           elem_type(norm_weight, "rms_norm", "weight") == sh.type && norm_weight.numel() == sh.k &&
           cuda::linear_rows_folds_norm(sh.m, sh.k);
  }

  void check_normed(const char* op, const Tensor& x, const Tensor& normed) {
    expect_dtype(normed, DType::f32, op, "normed");
    SPECDEC_CHECK(normed.numel() == x.numel(), op, ": normed ", normed.shape_string(), " must be the size of x ",
                  x.shape_string());
  }

  // All projections of x in one launch of the row-streaming kernel (x RMS-normalised on the way
  // in when norm_weight is given); false, having done nothing, where that kernel does not apply.
  bool linear_many_rows(const Tensor& x, std::span<const Projection> projections, const Tensor* norm_weight,
                        float eps) {
    constexpr size_t kMax = cuda::kMaxLinearSegments;
    if (projections.empty() || projections.size() > kMax) return false;
    std::array<LinearShape, kMax> shapes;
    std::array<cuda::LinearSegment, kMax> segs;
    std::array<const void*, kMax> weights{};
    for (size_t j = 0; j < projections.size(); ++j) {
      const Projection& p = projections[j];
      const Tensor& weight = p.weight.dense("linear_many");
      shapes[j] = check_linear("linear_many", x, weight, p.bias.empty() ? nullptr : &p.bias, p.out);
      segs[j] = {weight.data, shapes[j].bias, p.out.ptr<float>(), shapes[j].n};
      weights[j] = weight.data;
      if (shapes[j].type != shapes[0].type) return false;
    }
    const size_t count = projections.size();
    if (tensor_cores(shapes[0], std::span(weights).first(count))) {
      // The norm is not folded into the tensor-core linear: composed, rms_norm then this.
      if (norm_weight) return false;
      launch_gemm(x, std::span(segs).first(count), shapes[0], cuda::LinearEpilogue::store, "linear_many");
      return true;
    }
    for (size_t j = 0; j < count; ++j)
      if (!rows_kernel(shapes[j])) return false;
    if (norm_weight && !folds_norm(shapes[0], *norm_weight)) return false;
    launch_rows(x, std::span(segs).first(projections.size()), shapes[0], cuda::LinearEpilogue::store, "linear_many",
                norm_weight ? norm_weight->data : nullptr, eps);
    return true;
  }

  // out = silu(x · w_gateᵀ) * (x · w_upᵀ) in one launch of the row-streaming kernel (x
  // RMS-normalised on the way in when norm_w is given).
  void launch_gated_rows(const Tensor& x, const Tensor& w_gate, const Tensor& w_up, const Tensor& out,
                         const LinearShape& sh, const char* op, const void* norm_w = nullptr, float eps = 0.0f) {
    const std::array<cuda::LinearSegment, 2> segs = {cuda::LinearSegment{w_gate.data, nullptr, out.ptr<float>(), sh.n},
                                                     cuda::LinearSegment{w_up.data, nullptr, nullptr, sh.n}};
    launch_rows(x, segs, sh, cuda::LinearEpilogue::silu_gate, op, norm_w, eps);
  }

  void launch_rows(const Tensor& x, std::span<const cuda::LinearSegment> segs, const LinearShape& sh,
                   cuda::LinearEpilogue epilogue, const char* op, const void* norm_w = nullptr, float eps = 0.0f) {
    cuda::LinearRowsArgs a = linear_args(x, segs, sh, epilogue);
    a.norm_w = norm_w;
    a.norm_eps = eps;
    cuda::launch_linear_rows(a, ctx_);
    check_launch(op, " (row-streaming kernel) ", sh.m, "x", sh.k, " by ", sh.n, "x", sh.k, ", ", segs.size(),
                 " weights");
  }

  template <typename... Args>
  void check_launch(const char* op, const Args&... sizes) {
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess)
      fail("launching ", op, " [", sizes..., "] failed: ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
    if (tuning().sync_each_call) SPECDEC_CUDA_CHECK(cudaStreamSynchronize(stream_), op, " [", sizes..., "]");
  }

  void elementwise(const char* op, const Tensor& a, const Tensor& b, const Tensor& out) {
    expect_dtype(a, DType::f32, op, "a");
    expect_dtype(b, DType::f32, op, "b");
    expect_dtype(out, DType::f32, op, "out");
    SPECDEC_CHECK(a.numel() == b.numel() && a.numel() == out.numel(), op, ": ", a.shape_string(), ", ",
                  b.shape_string(), " and out ", out.shape_string(), " must have the same size");
  }

  ElemType pool_type(const Tensor& k_pool, const Tensor& v_pool, const char* op) {
    const ElemType pt = elem_type(k_pool, op, "k_pool");
    SPECDEC_CHECK(k_pool.rank == 4 && v_pool.rank == 4 && v_pool.dtype == k_pool.dtype &&
                      v_pool.numel() == k_pool.numel() && v_pool.device == Device::cuda,
                  op, ": pools ", k_pool.shape_string(), " and ", v_pool.shape_string(),
                  " must be [num_blocks, block_size, kv_heads, head_dim] of one dtype in cuda memory");
    return pt;
  }

  // Scratch for one kernel call at a time (linear's 16-bit x, attention's split partials, the
  // sampler's work rows): calls are ordered on the stream, so reuse is safe. Grows as needed; the
  // old buffer is freed stream-ordered, after the work that used it.
  void* scratch(size_t bytes) {
    return grow(scratch_, bytes, "scratch (linear x in 16-bit, attention partials, sampling work rows)");
  }

  // A [M, N] f32 scratch shaped like out, for the fast mode's unfused epilogues.
  Tensor epilogue_scratch(const Tensor& out) {
    Tensor t = out;
    t.data = grow(epilogue_, out.bytes(), "scratch (fused linear epilogues)");
    return t;
  }

  void* grow(Buffer& buffer, size_t bytes, const char* what) {
    if (buffer.bytes() < bytes) {
      // A recording must not move buffers (the graph would keep the old address).
      SPECDEC_CHECK(!recording_, "recording calls: ", what, " would grow to ", bytes,
                    " bytes; run the calls once before recording them");
      buffer = Buffer();
      buffer = memory_->allocate(bytes, what);
      ++*generation_;
    }
    return buffer.data();
  }

  // ---- The cuBLASLt path (fast mode: M above kSmallM; batch-invariant mode: 16-bit weights) ----
  // x is rounded to the weights' 16-bit type once per call, however many weights read it, and
  // the norm before a projection writes that rounded x directly; residual adds accumulate into
  // out inside the GEMM. Each saves a pass over the activations and a launch.

  // out = x · weightᵀ (+ bias).
  void linear_lt(const Tensor& x, const Tensor& weight, const LinearShape& sh, const Tensor& out) {
    const Tensor* outs = &out;
    if (auto a = whole_x_args(x, nullptr, 0.0f, weight.data, sh, {&outs, 1})) {
      a->out[0] = out.ptr<float>();
      launch_skinny(*a);
    } else {
      lt_gemm(lt_input(x, sh), weight, out, sh);
    }
    add_bias(out, sh);
  }

  // The ordered kernel's arguments for a call whose f32 x it rounds itself (normalised first by
  // norm_weight where that is given), sparing the pass that would write the 16-bit x; none where
  // that kernel does not take the call so (cuda::ordered_gemm_takes_f32), or where the mode's
  // tuning keeps it off (ordered_max_m; in the fast mode fast_whole_x_max_m), or where one of
  // the call's outputs `outs` overlaps x (the kernel's blocks each read all of x while others
  // write). launch_skinny sends it to the ordered kernel in either mode.
  std::optional<cuda::SkinnyArgs> whole_x_args(const Tensor& x, const Tensor* norm_weight, float eps, const void* w,
                                               const LinearShape& sh, std::span<const Tensor* const> outs) const {
    const int max_m = invariant() ? tuning().ordered_max_m : tuning().fast_whole_x_max_m;
    if (sh.m > max_m || !cuda::ordered_gemm_takes_f32(sh.type, sh.m, sh.k, x.ptr<float>(), w)) return std::nullopt;
    if (std::any_of(outs.begin(), outs.end(), [&](const Tensor* out) { return overlaps(x, *out); }))
      return std::nullopt;
    cuda::SkinnyArgs a = skinny_args(nullptr, w, sh);
    a.x32 = x.ptr<float>();
    if (norm_weight) {
      a.norm = norm_weight->data;
      a.norm_type = elem_type(*norm_weight, "rms_norm", "weight");
      a.eps = eps;
    }
    return a;
  }

  // out = silu(x · w_gateᵀ) * (x · w_upᵀ), x normalised first where norm_weight is given, by the
  // ordered kernel from the f32 x (whole_x_args) over the stacked gate and up; false, having done
  // nothing, where it does not take the call.
  bool gated_whole_x(const Tensor& x, const Tensor* norm_weight, float eps, const Tensor& w_gate, const Tensor& w_up,
                     const Tensor& out, const LinearShape& sh) {
    if (const std::array<const Tensor*, 2> ws = {&w_gate, &w_up}; !stacked(sh.m, ws)) return false;
    LinearShape both = sh;
    both.n = 2 * sh.n;
    const Tensor* outs = &out;
    auto a = whole_x_args(x, norm_weight, eps, w_gate.data, both, {&outs, 1});
    if (!a) return false;
    a->epilogue = cuda::SkinnyEpilogue::silu_gate;
    a->round_gate_up = rounds_gate_up(sh, /*whole_x=*/true);
    a->out[0] = out.ptr<float>();
    launch_skinny(*a);
    return true;
  }

  // out[m, :] += bias after a GEMM that does not add it (none: nothing).
  void add_bias(const Tensor& out, const LinearShape& sh) {
    if (!sh.bias) return;
    cuda::launch_add_bias(out.ptr<float>(), sh.bias, sh.m, sh.n, ctx_);
    check_launch("linear bias", sh.m, "x", sh.n);
  }

  // What the GEMMs read for x: x itself for f32 weights, else x rounded to their type in scratch.
  const void* lt_input(const Tensor& x, const LinearShape& sh) {
    if (sh.type == ElemType::f32) return x.data;
    void* xh = scratch(static_cast<size_t>(sh.m) * sh.k * 2);
    cuda::launch_convert_f32(x.ptr<float>(), xh, sh.type, int64_t{sh.m} * sh.k, ctx_);
    check_launch("linear (x to 16-bit)", sh.m, "x", sh.k);
    return xh;
  }

  // rms_norm(x) as the GEMMs read it: written in the weights' 16-bit type in one pass (normed,
  // scratch to the caller, is then left unwritten), or into normed for f32 weights.
  const void* lt_normed_input(const Tensor& x, const Tensor& norm_weight, float eps, const Tensor& normed,
                              const LinearShape& sh) {
    if (sh.type == ElemType::f32) {
      rms_norm(x, norm_weight, eps, normed);
      return normed.data;
    }
    const char* op = "rms_norm";
    void* xh = scratch(static_cast<size_t>(sh.m) * sh.k * 2);
    // The scratch as rms_norm's out: only its size is checked.
    const ElemType nt = check_rms_norm(op, x, norm_weight, Tensor(xh, DType::bf16, {sh.m, sh.k}, Device::cuda));
    cuda::launch_rms_norm_16(x.ptr<float>(), norm_weight.data, nt, eps, xh, sh.type, sh.m, sh.k, ctx_);
    check_launch(op, " (to 16-bit) ", sh.m, "x", sh.k);
    return xh;
  }

  // Whether a few-row kernel serves this cuBLASLt-path call in cuBLASLt's place: in the
  // batch-invariant mode the ordered kernel (cuBLASLt's unsplit bits; CudaTuning::ordered_max_m),
  // in the fast mode the skinny kernel (CudaTuning::skinny_max_m). Both take the same arguments.
  bool skinny(const LinearShape& sh, const void* xin, const void* w) const {
    if (invariant()) return sh.m <= tuning().ordered_max_m && cuda::ordered_gemm_supports(sh.type, sh.m, sh.k, xin, w);
    return sh.m <= tuning().skinny_max_m && cuda::skinny_gemm_supports(sh.type, sh.m, sh.k, xin, w);
  }
  static cuda::SkinnyArgs skinny_args(const void* xin, const void* w, const LinearShape& sh) {
    cuda::SkinnyArgs a;
    a.x = xin;
    a.w = w;
    a.type = sh.type;
    a.M = sh.m;
    a.N = sh.n;
    a.K = sh.k;
    a.n[0] = sh.n;
    return a;
  }
  // The ordered kernel in the batch-invariant mode and wherever x comes in f32 (whole_x_args, in
  // either mode), else the skinny kernel.
  void launch_skinny(const cuda::SkinnyArgs& a) {
    if (invariant() || a.x32) {
      cuda::launch_ordered_gemm(a, ctx_);
      return check_launch("linear (ordered) ", a.M, "x", a.K, " by ", a.N, "x", a.K);
    }
    cuda::launch_skinny_gemm(a, ctx_);
    check_launch("linear (skinny) ", a.M, "x", a.K, " by ", a.N, "x", a.K);
  }

  // out = xin · weightᵀ, or out += xin · weightᵀ with accumulate; xin from lt_input. Decode-sized
  // calls may take a few-row kernel (see skinny), the rest cuBLASLt.
  void lt_gemm(const void* xin, const Tensor& weight, const Tensor& out, const LinearShape& sh,
               bool accumulate = false) {
    if (skinny(sh, xin, weight.data)) {
      cuda::SkinnyArgs a = skinny_args(xin, weight.data, sh);
      a.epilogue = accumulate ? cuda::SkinnyEpilogue::add : cuda::SkinnyEpilogue::store;
      a.out[0] = out.ptr<float>();
      return launch_skinny(a);
    }
    lt_run(xin, weight, out.data, /*out_16=*/false, sh, accumulate);
  }

  // The cuBLASLt call of lt_gemm, out in f32 or (out_16) in the weights' 16-bit type.
  void lt_run(const void* xin, const Tensor& weight, void* out, bool out_16, const LinearShape& sh, bool accumulate) {
    grow(lt_workspace_, kLtWorkspaceBytes, "cuBLASLt workspace");
    void* timing = nullptr;
    if (accumulate) {
      timing = grow(epilogue_, static_cast<size_t>(sh.m) * sh.n * (out_16 ? 2 : sizeof(float)),
                    "scratch (fused linear epilogues)");
    }
    if (!lt_) lt_ = std::make_unique<cuda::LtGemm>();
    const cudaDataType_t type = sh.type == ElemType::bf16  ? CUDA_R_16BF
                                : sh.type == ElemType::f16 ? CUDA_R_16F
                                                           : CUDA_R_32F;
    lt_->run(xin, weight.data, type, out, out_16 ? type : CUDA_R_32F, sh.m, sh.n, sh.k, lt_workspace_.data(),
             kLtWorkspaceBytes, stream_, /*whole_k=*/invariant(), accumulate ? 1.0f : 0.0f, timing);
    if (tuning().sync_each_call)
      SPECDEC_CUDA_CHECK(cudaStreamSynchronize(stream_), "linear (cuBLASLt) ", sh.m, "x", sh.n, "x", sh.k);
  }

  // out = silu(xin · w_gateᵀ) * (xin · w_upᵀ).
  void gated_lt(const void* xin, const Tensor& w_gate, const Tensor& w_up, const Tensor& out, const LinearShape& sh) {
    const bool stack = gate_up_stacked(sh, w_gate, w_up);
    LinearShape both = sh;
    both.n = 2 * sh.n;
    if (half_gate_up(sh) && !skinny(stack ? both : sh, xin, w_gate.data)) {
      silu_mul_parts_16(gate_up_16(xin, w_gate, w_up, stack, sh), stack, sh, out.data, ElemType::f32);
      return;
    }
    if (stack) {
      // One GEMM over both weights' rows, then the gate from each row's first half.
      if (skinny(both, xin, w_gate.data)) {  // the gate in the product's epilogue
        cuda::SkinnyArgs a = skinny_args(xin, w_gate.data, both);
        a.epilogue = cuda::SkinnyEpilogue::silu_gate;
        a.round_gate_up = rounds_gate_up(sh);
        a.out[0] = out.ptr<float>();
        return launch_skinny(a);
      }
      const Tensor gu = wide_scratch(both);
      lt_gemm(xin, stacked_weight(w_gate, both.n), gu, both);
      cuda::launch_silu_mul_halves(gu.ptr<float>(), out.ptr<float>(), sh.m, sh.n, ctx_);
      check_launch("silu_mul (stacked gate and up)", sh.m, "x", sh.n);
      return;
    }
    const Tensor tmp = epilogue_scratch(out);
    lt_gemm(xin, w_gate, out, sh);
    lt_gemm(xin, w_up, tmp, sh);
    if (rounds_gate_up(sh)) {
      cuda::launch_silu_mul_rounded(out.ptr<float>(), tmp.ptr<float>(), sh.type, out.ptr<float>(), sh.m, sh.n, ctx_);
      return check_launch("silu_mul (gate and up rounded to 16-bit)", sh.m, "x", sh.n);
    }
    silu_mul(out, tmp, out);
  }

  // CudaTuning::half_gate_up and invariant_half_gate_up: 16-bit weights' gate and up products
  // leave the cuBLASLt GEMMs rounded to that type (in the batch-invariant mode, on the shapes it
  // runs on cuBLASLt, where its few-row kernels round theirs too: rounds_gate_up).
  bool half_gate_up(const LinearShape& sh) const {
    if (sh.type == ElemType::f32) return false;
    return invariant() ? tuning().invariant_half_gate_up && invariant_lt(sh) : tuning().half_gate_up;
  }
  // Whether the ordered kernel's SwiGLU epilogue or the separate-weights SwiGLU of a few-row call
  // rounds the gate and up sums to the weights' type: where cuBLASLt's products of the same call
  // at more rows come rounded, in the batch-invariant mode (its rows keep their bits at every M),
  // or wherever the ordered kernel takes x in f32 (`whole_x`: either mode, one order of summation
  // for the fast mode's opt-in use of it too).
  bool rounds_gate_up(const LinearShape& sh, bool whole_x = false) const {
    return half_gate_up(sh) && (invariant() || whole_x);
  }
  // xin · w_gateᵀ and xin · w_upᵀ through cuBLASLt in the weights' 16-bit type, in wide scratch:
  // stacked weights as one GEMM ([M, 2n], each row's gate then its up), else two ([M, n] gate
  // then [M, n] up).
  // `stack`: gate_up_stacked, as the caller decided it.
  const void* gate_up_16(const void* xin, const Tensor& w_gate, const Tensor& w_up, bool stack, const LinearShape& sh) {
    const size_t part = up_offset_16(sh);
    auto* gu = static_cast<char*>(grow(wide_, 2 * part, "scratch (stacked projections)"));
    if (stack) {
      LinearShape both = sh;
      both.n = 2 * sh.n;
      lt_run(xin, stacked_weight(w_gate, both.n), gu, /*out_16=*/true, both, false);
    } else {
      lt_run(xin, w_gate, gu, /*out_16=*/true, sh, false);
      lt_run(xin, w_up, gu + part, /*out_16=*/true, sh, false);
    }
    return gu;
  }
  // Whether gate and up run as one GEMM: stacked, up to CudaTuning::half_stacked_max_m rows where
  // their products come in 16 bits (no pass then splits the wide product's columns).
  bool gate_up_stacked(const LinearShape& sh, const Tensor& w_gate, const Tensor& w_up) const {
    const std::array<const Tensor*, 2> ws = {&w_gate, &w_up};
    return stacked(sh.m, ws, half_gate_up(sh) ? tuning().half_stacked_max_m : kStackedMaxM);
  }
  // Where gate_up_16's separate up product starts: past the gate's, on the 256-byte boundary that
  // cuBLASLt's algorithms assume of their operands.
  static size_t up_offset_16(const LinearShape& sh) { return (static_cast<size_t>(sh.m) * sh.n * 2 + 255) / 256 * 256; }
  // out [M, n] (f32, or the weights' type) = silu(gate) * up from gate_up_16's products.
  void silu_mul_parts_16(const void* parts, bool stack, const LinearShape& sh, void* out, ElemType out_type) {
    const auto* gu = static_cast<const char*>(parts);
    const void* up = stack ? gu + static_cast<size_t>(sh.n) * 2 : gu + up_offset_16(sh);
    cuda::launch_silu_mul_rows_16(gu, up, stack ? int64_t{2} * sh.n : sh.n, sh.type, out, out_type, sh.m, sh.n, ctx_);
    check_launch("silu_mul (16-bit gate and up)", sh.m, "x", sh.n);
  }

  // Whether the weights lie one after another in memory, all of one type and K (the model binds
  // q/k/v and gate/up so: BoundWeights::adjacent), and m rows are few enough to gain from reading
  // them in one GEMM.
  bool stacked(int m, std::span<const Tensor* const> weights, int max_m = kStackedMaxM) const {
    if (!tuning().stacked_projections || m > max_m) return false;
    const Tensor* prev = nullptr;
    for (const Tensor* w : weights) {
      if (w->rank != 2) return false;
      if (prev && (w->dtype != prev->dtype || w->dim(1) != prev->dim(1) ||
                   static_cast<const char*>(prev->data) + prev->bytes() != w->data))
        return false;
      prev = w;
    }
    return weights.size() > 1;
  }
  // The first of stacked weights widened to all n of their rows.
  static Tensor stacked_weight(const Tensor& first, int n) {
    Tensor t = first;
    t.dims[0] = n;
    return t;
  }
  // Whether one row's outputs of `count` parts follow each other in memory, so that the row of
  // one GEMM over their stacked weights is theirs.
  static bool adjacent(const cuda::ColumnParts& parts, size_t count) {
    for (size_t j = 0; j + 1 < count; ++j)
      if (parts.out[j] + parts.n[j] != parts.out[j + 1]) return false;
    return true;
  }
  // [M, n] f32 scratch for one GEMM over stacked weights, before its columns go to their outputs.
  Tensor wide_scratch(const LinearShape& sh) {
    void* p = grow(wide_, static_cast<size_t>(sh.m) * sh.n * sizeof(float), "scratch (stacked projections)");
    return Tensor(p, DType::f32, {sh.m, sh.n}, Device::cuda);
  }

  // Every projection of one x (normalised first when norm_weight is given) through cuBLASLt, x
  // rounded once; false, having done nothing, where the cuBLASLt path does not apply.
  bool linear_many_lt(const Tensor& x, std::span<const Projection> projections, const Tensor* norm_weight, float eps,
                      const Tensor& normed) {
    if (projections.empty()) return false;
    std::vector<std::pair<const Tensor*, LinearShape>> linears;
    for (const Projection& p : projections) {
      const Tensor& weight = p.weight.dense("linear_many");
      const LinearShape sh = check_linear("linear_many", x, weight, p.bias.empty() ? nullptr : &p.bias, p.out);
      if (rows_kernel(sh) || tensor_core_type(sh) || (!linears.empty() && sh.type != linears[0].second.type))
        return false;
      linears.emplace_back(&weight, sh);
    }
    const LinearShape& first = linears[0].second;
    std::vector<const Tensor*> ws;
    for (const auto& linear : linears) ws.push_back(linear.first);
    const bool stack = ws.size() <= cuda::kMaxLinearSegments && stacked(first.m, ws);
    // One GEMM over the stacked weights, then each projection's columns to its output.
    LinearShape all = first;
    all.bias = nullptr;
    all.n = 0;
    cuda::ColumnParts parts;
    std::array<const Tensor*, cuda::kMaxLinearSegments> outs{};
    for (size_t j = 0; stack && j < linears.size(); ++j) {
      all.n += linears[j].second.n;
      parts.out[j] = projections[j].out.ptr<float>();
      parts.n[j] = linears[j].second.n;
      outs[j] = &projections[j].out;
    }
    // The few-row kernels write the columns to their outputs in the epilogue.
    const auto to_parts = [&](cuda::SkinnyArgs a) {
      a.parts = static_cast<int>(linears.size());
      for (int j = 0; j < a.parts; ++j) a.out[j] = parts.out[j], a.n[j] = parts.n[j];
      launch_skinny(a);
      for (size_t j = 0; j < linears.size(); ++j) add_bias(projections[j].out, linears[j].second);
      return true;
    };
    if (stack)
      if (auto a = whole_x_args(x, norm_weight, eps, linears[0].first->data, all,
                                std::span<const Tensor* const>(outs.data(), linears.size())))
        return to_parts(*a);
    const void* xin = norm_weight ? lt_normed_input(x, *norm_weight, eps, normed, first) : lt_input(x, first);
    if (stack) {
      if (skinny(all, xin, linears[0].first->data)) return to_parts(skinny_args(xin, linears[0].first->data, all));
      if (all.m == 1 && tuning().direct_outputs && adjacent(parts, linears.size())) {
        // One row whose outputs lie one after another (as the model lays out q, k and v): the
        // GEMM writes each projection's columns where they go, with no pass to split them.
        lt_gemm(xin, stacked_weight(*linears[0].first, all.n),
                Tensor(parts.out[0], DType::f32, {1, all.n}, Device::cuda), all);
      } else {
        const Tensor wide = wide_scratch(all);
        lt_gemm(xin, stacked_weight(*linears[0].first, all.n), wide, all);
        cuda::launch_split_columns(wide.ptr<float>(), all.m, parts, ctx_);
        check_launch("linear_many (columns of stacked weights)", all.m, "x", all.n);
      }
      for (size_t j = 0; j < linears.size(); ++j) add_bias(projections[j].out, linears[j].second);
      return true;
    }
    for (size_t j = 0; j < projections.size(); ++j) {
      lt_gemm(xin, *linears[j].first, projections[j].out, linears[j].second);
      add_bias(projections[j].out, linears[j].second);
    }
    return true;
  }

  // Batch invariant as created, and while a drafter allows the fast kernels (allow_fast_kernels):
  // the kernels chosen from here on follow invariant().
  bool invariant() const { return invariant_ && !fast_allowed_; }
  bool invariant_;
  bool fast_allowed_ = false;
  DType kv_dtype_;
  std::string name_;
  std::shared_ptr<cuda::DeviceMemory> memory_;
  cudaStream_t stream_ = nullptr;
  std::array<cudaEvent_t, 8> events_{};  // fence() ring
  uint64_t fences_ = 0;
  cuda::Context ctx_;  // stream_ and the tuning, as the kernel launchers take them
  std::unique_ptr<cuda::LtGemm> lt_;
  Buffer lt_workspace_;
  Buffer scratch_;
  Buffer epilogue_;
  Buffer wide_;
  Buffer arrivals_;
  std::shared_ptr<uint64_t> generation_ = std::make_shared<uint64_t>(0);  // bumped when a buffer above moves
  bool recording_ = false;
};

}  // namespace

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: report none
    return 0;
  }
  return count;
}

void* cuda_stream_of(const Backend& backend) {
  const auto* cuda = dynamic_cast<const CudaBackend*>(&backend);
  SPECDEC_CHECK(cuda != nullptr, "cuda_stream_of: backend ", backend.name(), " is not a CUDA backend");
  return static_cast<void*>(cuda->stream());
}

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options) {
  SPECDEC_CHECK(cuda_device_count() > 0, "no CUDA device is available (cudaGetDeviceCount found none)");
  BackendOptions tuned = options;
  tuned.cuda = with_environment(options.cuda);
  return std::make_unique<CudaBackend>(tuned);
}

}  // namespace specdec
