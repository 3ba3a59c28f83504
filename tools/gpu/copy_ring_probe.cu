// How fast a block's shared-memory ring fills from global memory, by the form of its copies: the
// question that bounds the batch-invariant mode's few-row kernel (docs/perf-notes.md, "An ordered
// few-row linear"): there a block received about one ring stage per memory latency whatever the
// ring's depth, and 1 KB copies streamed four times what 256-byte ones did.
//
// A [N, K] bf16 matrix (the 8B shape's o projection, 4,096 x 4,096, and its down projection,
// 4,096 x 14,336) is read once, 32 rows a block, by one producer warp into a ring of stages of KC
// k each; four consumer warps wait for each stage, read a word of each of their rows and release
// it, as the kernel's MMA warps would. Forms of the producer's copies:
//   bulk    one cp.async.bulk per row and stage (KC x 2 bytes: 256 B to 4 KB), rows padded by 16 B;
//   async16 16-byte cp.async, counted on the stage's mbarrier by cp.async.mbarrier.arrive;
//   tensor  cp.async.bulk.tensor.2d boxes of 32 rows x 256 k (16 KB), KC / 256 a stage, from a
//           tensor map (as cuBLASLt's kernels load their tiles).
// Each at a 96 KB ring (two blocks an SM) and a 200 KB ring (one), against a plain streaming
// kernel (each warp reads whole rows by 16-byte loads, as the fast mode's row kernel does) and a
// device-to-device copy measured in the same run (read + write, the bench's convention).
// Output: one line per configuration: GB/s, fraction of copy, stages, blocks resident an SM.
// Build and run (GPU host): nvcc -O2 -arch=sm_90a -std=c++17 tools/gpu/copy_ring_probe.cu -o copy_ring_probe
//   && ./copy_ring_probe
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "../../src/backend/cuda/async_copy.cuh"
#include "probe_check.h"
#include "probe_timing.cuh"

namespace {

using specdec::cuda::barrier_arrive;
using specdec::cuda::barrier_expect;
using specdec::cuda::barrier_init;
using specdec::cuda::barrier_wait;
using specdec::cuda::smem_addr;

constexpr int kRows = 32;      // weight rows a block streams
constexpr int kConsumers = 4;  // consumer warps, 8 rows each
constexpr int kMaxStages = 16;
constexpr int kBoxK = 256;  // k of a tensor-map box (its most: 256 elements)
constexpr int kBarrierBytes = 2 * kMaxStages * 8;

enum Form { bulk = 0, async16 = 1, tensor = 2 };
const char* const kFormNames[] = {"bulk", "async16", "tensor"};

// One ring: N / 32 blocks of 32 rows, chunks of KC k through `stages` stages.
template <int FORM>
__global__ void __launch_bounds__((kConsumers + 1) * 32)
    ring_kernel(const __nv_bfloat16* w, int K, int KC, int stages, const __grid_constant__ CUtensorMap map,
                float* sink) {
  extern __shared__ __align__(128) unsigned char smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem);
  uint64_t* empty = full + kMaxStages;
  unsigned char* ring = smem + kBarrierBytes;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  // Row pitch in a stage: tensor boxes land dense (32 rows x 256 k a box), the others padded.
  const int pitch = FORM == tensor ? KC * 2 : KC * 2 + 16;
  const int stage_bytes = kRows * pitch;
  const int chunks = (K + KC - 1) / KC;
  const int row0 = blockIdx.x * kRows;
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      barrier_init(&full[s], FORM == async16 ? 32 : 1);
      barrier_init(&empty[s], kConsumers);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (warp == kConsumers) {  // the producer
    for (int c = 0; c < chunks; ++c) {
      const int slot = c % stages, round = c / stages;
      if (round > 0) barrier_wait(&empty[slot], (round - 1) & 1);
      const int k0 = c * KC;
      const int k_len = min(KC, K - k0);
      unsigned char* stage = ring + slot * stage_bytes;
      if constexpr (FORM == bulk) {
        if (lane == 0) barrier_expect(&full[slot], kRows * k_len * 2);
        __syncwarp();
        const __nv_bfloat16* src = w + static_cast<int64_t>(row0 + lane) * K + k0;
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                         smem_addr(stage + lane * pitch)),
                     "l"(src), "r"(k_len * 2), "r"(smem_addr(&full[slot]))
                     : "memory");
      } else if constexpr (FORM == async16) {
        const int per_row = KC / 8, valid = k_len / 8;
        for (int p = lane; p < kRows * per_row; p += 32) {
          const int r = p / per_row, q = p % per_row;
          if (q >= valid) continue;
          const __nv_bfloat16* src = w + static_cast<int64_t>(row0 + r) * K + k0 + q * 8;
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(stage + r * pitch + q * 16)),
                       "l"(src)
                       : "memory");
        }
        asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_addr(&full[slot])) : "memory");
      } else {
        if (lane == 0) {
          const int boxes = (k_len + kBoxK - 1) / kBoxK;
          // A box past K is filled with zeros but still counts its whole size.
          barrier_expect(&full[slot], boxes * kRows * kBoxK * 2);
          for (int j = 0; j < boxes; ++j)
            asm volatile(
                "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
                "[%4];" ::"r"(smem_addr(stage + j * kRows * kBoxK * 2)),
                "l"(reinterpret_cast<uint64_t>(&map)), "r"(k0 + j * kBoxK), "r"(row0), "r"(smem_addr(&full[slot]))
                : "memory");
        }
      }
    }
    return;
  }

  // A consumer: one word of each of its 8 rows a stage, then the stage's release.
  float acc = 0.0f;
  for (int c = 0; c < chunks; ++c) {
    const int slot = c % stages;
    barrier_wait(&full[slot], (c / stages) & 1);
    if (lane < 8) {
      const int r = warp * 8 + lane;
      const unsigned char* stage = ring + slot * stage_bytes;
      // The tensor form's stage holds boxes one after another: row r of box 0.
      const int offset = FORM == tensor ? r * kBoxK * 2 : r * pitch;
      acc += __uint_as_float(*reinterpret_cast<const uint32_t*>(stage + offset));
    }
    __syncwarp();
    if (lane == 0) barrier_arrive(&empty[slot]);
  }
  if (acc == 1.2345f) sink[blockIdx.x] = acc;  // keeps the reads
}

// Each warp reads whole rows by 16-byte loads (8 in flight a lane), the row kernel's pattern.
__global__ void stream_kernel(const uint4* w, int64_t vectors_per_row, int rows, float* sink) {
  const int lane = threadIdx.x & 31;
  const int warps = gridDim.x * (blockDim.x / 32);
  uint32_t acc = 0;
  for (int row = blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5); row < rows; row += warps) {
    const uint4* p = w + row * vectors_per_row;
    for (int64_t v = lane; v < vectors_per_row; v += 32 * 8) {
      uint4 x[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const int64_t i = v + u * 32;
        x[u] = i < vectors_per_row ? __ldg(p + i) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < 8; ++u) acc ^= x[u].x ^ x[u].w;
    }
  }
  if (acc == 0x12345678u) sink[0] = 1.0f;
}

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

}  // namespace

int main() {
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  EncodeTiled encode = nullptr;
  cudaDriverEntryPointQueryResult found{};
  CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", reinterpret_cast<void**>(&encode), 12000,
                                      cudaEnableDefault, &found));
  if (found != cudaDriverEntryPointSuccess || encode == nullptr) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled not found\n");
    return 1;
  }

  const double copy_bw = copy_bandwidth();
  std::printf("device: %s, %d SMs; device-to-device copy %.0f GB/s (read + write)\n", prop.name,
              prop.multiProcessorCount, copy_bw / 1e9);
  std::printf("%-14s %-8s %6s %6s %6s %7s %9s %8s\n", "shape", "form", "KC", "ring", "stages", "blocks", "GB/s",
              "of copy");

  float* sink = nullptr;
  CK(cudaMalloc(&sink, 4096 * sizeof(float)));
  for (const auto& shape_nk : {std::pair{4096, 4096}, std::pair{4096, 14336}}) {
    const int N = shape_nk.first, K = shape_nk.second;
    const size_t bytes = static_cast<size_t>(N) * K * 2;
    __nv_bfloat16* w = nullptr;
    CK(cudaMalloc(&w, bytes));
    CK(cudaMemset(w, 0x3c, bytes));
    char shape[32];
    std::snprintf(shape, sizeof shape, "%dx%d", N, K);
    const auto report = [&](const char* form, int KC, int ring_kb, int stages, int blocks_per_sm, float ms) {
      const double bw = bytes / (ms * 1e-3);
      std::printf("%-14s %-8s %6d %5dK %6d %7d %9.0f %7.1f%%\n", shape, form, KC, ring_kb, stages, blocks_per_sm,
                  bw / 1e9, 100.0 * bw / copy_bw);
    };

    const int vectors = K / 8;
    report("stream", 0, 0, 0, 0, median_ms([&] {
             stream_kernel<<<prop.multiProcessorCount * 4, 256>>>(reinterpret_cast<const uint4*>(w), vectors, N, sink);
           }));

    CUtensorMap map{};
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(K), static_cast<cuuint64_t>(N)};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(K) * 2};
    const cuuint32_t box[2] = {kBoxK, kRows};
    const cuuint32_t element_strides[2] = {1, 1};
    CK(encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, w, dims, strides, box, element_strides,
              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));

    const auto run = [&](auto kernel, int form, int KC, int ring_kb) {
      const int pitch = form == tensor ? KC * 2 : KC * 2 + 16;
      const int stage_bytes = kRows * pitch;
      const int stages = std::min(kMaxStages, ring_kb * 1024 / stage_bytes);
      if (stages < 2) return;
      const int smem = kBarrierBytes + stages * stage_bytes;
      CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      int per_sm = 0;
      CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, (kConsumers + 1) * 32, smem));
      const float ms =
          median_ms([&] { kernel<<<N / kRows, (kConsumers + 1) * 32, smem>>>(w, K, KC, stages, map, sink); });
      report(kFormNames[form], KC, ring_kb, stages, per_sm, ms);
    };
    for (int ring_kb : {96, 200}) {
      for (int KC : {128, 256, 512, 1024, 2048}) run(ring_kernel<bulk>, bulk, KC, ring_kb);
      for (int KC : {128, 512}) run(ring_kernel<async16>, async16, KC, ring_kb);
      for (int KC : {256, 512, 1024}) run(ring_kernel<tensor>, tensor, KC, ring_kb);
    }
    CK(cudaFree(w));
  }
  CK(cudaFree(sink));
  return 0;
}
