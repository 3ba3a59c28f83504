// Device helpers shared by the kernel files: element conversions and fixed-order reductions.
// Reductions here always combine in the same order for a given block size, which is what makes
// the kernels deterministic and batch invariant.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "backend/cuda/kernels.h"

namespace specdec::cuda {

// ---- Overlapped launches (programmatic dependent launch, sm_90) ----
// Every kernel here is started by launch(), which lets it begin while the kernel before it on the
// stream is still finishing. So each kernel calls grid_dependency_wait() before it reads what an
// earlier kernel wrote or writes what an earlier kernel reads; work before that point may only
// touch memory no kernel writes (weights). allow_dependents() lets the next kernel be scheduled
// now: its blocks start when there is room and wait in turn. Both are no-ops for a kernel
// started without the attribute (CudaTuning::overlapped_launches off, or a launch outside launch()).
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// Both, at the top of a kernel that has nothing to do before its inputs are ready. The next
// kernel may be scheduled before this one's inputs are ready: its own wait still orders it after
// this kernel's completion, and it only takes room this kernel's blocks are not using.
__device__ __forceinline__ void enter_kernel() {
  allow_dependents();
  grid_dependency_wait();
}

// kernel<<<grid, block, smem, ctx.stream>>>(args...) in thread-block clusters of `cluster` blocks
// along x (1: no clusters), allowed to overlap the previous kernel's tail (see
// grid_dependency_wait) unless ctx.tuning.overlapped_launches is off. Errors are left for the
// caller's launch check (cudaGetLastError).
template <typename... Params, typename... Args>
void launch_clustered(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, unsigned cluster,
                      const Context& ctx, Args... args) {
  cudaLaunchAttribute attribute[2];
  unsigned n = 0;
  if (ctx.tuning.overlapped_launches) {
    attribute[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster > 1) {
    attribute[n].id = cudaLaunchAttributeClusterDimension;
    attribute[n++].val.clusterDim = {cluster, 1, 1};
  }
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = ctx.stream;
  config.attrs = attribute;
  config.numAttrs = n;
  (void)cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
}

// launch_clustered without clusters: the launch every kernel here goes through.
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, const Context& ctx, Args... args) {
  launch_clustered(kernel, grid, block, smem, 1, ctx, args...);
}

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}

// Sum over the 32 lanes by a butterfly; every lane gets the same, order-fixed result.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024): warp butterflies, then the
// warp sums added in warp order by every thread. `scratch` holds 32 floats. All threads return it.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < warps; ++w) total += scratch[w];
  return total;
}

// 1 / sqrt(mean(x²) + eps) of a row of dim floats, reduced as a block of kNormThreads threads
// would: thread t takes elements t, t + kNormThreads, ... by fmaf, then a butterfly in each warp,
// then the warp sums added in warp order. The calling block may have any size that is a multiple
// of 32 (each warp takes whole virtual warps, lanes unchanged), so rms_norm_kernel and the
// kernels that fold the norm into their own blocks give the same bits. `scratch` holds
// kNormThreads / 32 floats; every thread returns the result.
constexpr int kNormThreads = 256;
__device__ __forceinline__ float rms_inverse(const float* xr, int dim, float eps, float* scratch) {
  const int lane = threadIdx.x % 32;
  __syncthreads();  // scratch may still be read by a previous call
  for (int vw = threadIdx.x / 32; vw < kNormThreads / 32; vw += blockDim.x / 32) {
    float ss = 0.0f;
    // Sixteen loads in flight before their sums, which keep the order of i.
    constexpr int kBatch = 16;
    for (int i0 = vw * 32 + lane; i0 < dim; i0 += kBatch * kNormThreads) {
      float v[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) v[j] = i0 + j * kNormThreads < dim ? xr[i0 + j * kNormThreads] : 0.0f;
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
        if (i0 + j * kNormThreads < dim) ss = fmaf(v[j], v[j], ss);
    }
    ss = warp_sum(ss);
    if (lane == 0) scratch[vw] = ss;
  }
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kNormThreads / 32; ++w) total += scratch[w];
  return 1.0f / sqrtf(total / static_cast<float>(dim) + eps);
}

// silu(g) * u: the arithmetic of every SwiGLU kernel, so that they give the same bits.
__device__ __forceinline__ float silu_times(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// One RoPE pair (x_i, x_{i + d/2}) rotated by the angle with cosine c and sine s, then scaled:
// every kernel that rotates goes through this, with each rounding explicit, so they agree bit for
// bit whatever the compiler would contract.
__device__ __forceinline__ void rotate_pair(float a, float b, float c, float s, float scaling, float& out_a,
                                            float& out_b) {
  out_a = __fmul_rn(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)), scaling);
  out_b = __fmul_rn(__fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s)), scaling);
}

// One m16n8k16 tensor-core product d += a · b of 16-bit W (bf16 or f16) with f32 accumulation,
// in the PTX fragment layouts; pack rounds two floats to W's type (nearest even) for an operand
// register.
template <typename W>
struct Mma {
  static constexpr bool bf16 = std::is_same_v<W, __nv_bfloat16>;
  static_assert(bf16 || std::is_same_v<W, __half>, "Mma takes bf16 or f16");
  __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
    uint32_t bits;
    if constexpr (bf16) {
      const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
      bits = *reinterpret_cast<const uint32_t*>(&v);
    } else {
      const __half2 v = __floats2half2_rn(lo, hi);
      bits = *reinterpret_cast<const uint32_t*>(&v);
    }
    return bits;
  }
  __device__ __forceinline__ static void run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    if constexpr (bf16)
      asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
          "{%0,%1,%2,%3};"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
      asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
          "{%0,%1,%2,%3};"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// Calls f(ElemType-specific pointer type) for a runtime element type.
// Token t's k and v rows (width floats each) stored into the pools at `slot`, converted to T, by
// the threads of one block. The caller has checked 0 <= slot < pool slots.
template <typename T>
__device__ __forceinline__ void store_kv_row(const float* k, const float* v, T* k_pool, T* v_pool, int t, int slot,
                                             int width) {
  const float* ks = k + static_cast<int64_t>(t) * width;
  const float* vs = v + static_cast<int64_t>(t) * width;
  T* kd = k_pool + static_cast<int64_t>(slot) * width;
  T* vd = v_pool + static_cast<int64_t>(slot) * width;
  for (int i = threadIdx.x; i < width; i += blockDim.x) {
    kd[i] = from_float<T>(ks[i]);
    vd[i] = from_float<T>(vs[i]);
  }
}

#define SPECDEC_DISPATCH_ELEM(type, T, ...) \
  switch (type) {                           \
    case ElemType::f32: {                   \
      using T = float;                      \
      __VA_ARGS__;                          \
    } break;                                \
    case ElemType::f16: {                   \
      using T = __half;                     \
      __VA_ARGS__;                          \
    } break;                                \
    case ElemType::bf16: {                  \
      using T = __nv_bfloat16;              \
      __VA_ARGS__;                          \
    } break;                                \
  }

inline unsigned blocks_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 1048576 ? 1048576 : b));
}

// ---- The few-row linears (skinny_gemm.cu, ordered_gemm.cu) ----

// A 16-byte load that bypasses L1 (each weight byte is read once; x should keep the L1).
__device__ __forceinline__ uint4 load_stream(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// Whether the few-row linears take this call: 16-bit weights, 1 to max_m rows, K a multiple of
// k_multiple, x and w on 16-byte boundaries.
inline bool few_rows_supported(ElemType type, int M, int K, const void* x, const void* w, int max_m, int k_multiple) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return type != ElemType::f32 && M >= 1 && M <= max_m && K > 0 && K % k_multiple == 0 && aligned(x) && aligned(w);
}

// Calls launch(W{}, std::integral_constant<SkinnyEpilogue, E>{}) for the call's weight type W
// (bf16 or f16) and epilogue E.
template <typename Launch>
void for_few_rows(const SkinnyArgs& a, const Launch& launch) {
  const auto with_type = [&](auto w) {
    switch (a.epilogue) {
      case SkinnyEpilogue::store:
        return launch(w, std::integral_constant<SkinnyEpilogue, SkinnyEpilogue::store>{});
      case SkinnyEpilogue::add:
        return launch(w, std::integral_constant<SkinnyEpilogue, SkinnyEpilogue::add>{});
      case SkinnyEpilogue::silu_gate:
        return launch(w, std::integral_constant<SkinnyEpilogue, SkinnyEpilogue::silu_gate>{});
    }
  };
  if (a.type == ElemType::bf16)
    with_type(__nv_bfloat16{});
  else
    with_type(__half{});
}

}  // namespace specdec::cuda
