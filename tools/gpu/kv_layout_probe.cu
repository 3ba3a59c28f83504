// How fast decode attention can read a paged KV cache, by the layout of a pool block: the question
// left by the tile decode kernel, which reads K/V at 79 % of the DRAM's peak (89 % of the copy
// bandwidth) at 256 rows of the 8B shape whether six or eight warps share an SM
// (docs/perf-notes.md, "Open").
//
// Pools of the 8B decode shape: R rows of L cached positions, 8 kv heads of 128 dims in bf16,
// blocks of 16 positions. One warp per (row, kv head) walks the row's 64-position tiles as the
// tile decode kernel does: its K and V tiles copied into shared memory by 16-byte cp.async (lane
// l takes piece l % 16 of positions l / 16 + 2k), the next tile's K issued once this tile's K is
// used and its V once this tile's V is used, with only a light read of each tile in between (no
// products): what is left is the memory system's rate for this access pattern. Layouts:
//   position-major  [block][position][kv head][dim] (the engine's): a head's position is 256
//                   bytes, its neighbours 2 KB apart;
//   head-major      [block][kv head][position][dim]: a head's 16 positions of a block are 4 KB
//                   in one piece.
// Each with the rows' blocks in order and shuffled (a pool after many requests), against a
// plain streaming read of the same bytes and a device-to-device copy measured in the same run
// (read + write, the bench's convention).
// Build and run (GPU host): nvcc -O2 -arch=sm_90a -std=c++17 tools/gpu/kv_layout_probe.cu -o kv_layout_probe
//   && ./kv_layout_probe
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "probe_check.h"
#include "probe_timing.cuh"

namespace {

constexpr int kHeads = 8, kDim = 128, kBlock = 16, kTile = 64;
constexpr int kRowBytes = kDim * 2;         // one head's position
constexpr int kPieces = kRowBytes / 16;     // 16-byte copies a position
constexpr int kLd = kDim + 8;               // staged row stride (elements), as the kernel pads
constexpr int kTileSmem = kTile * kLd * 2;  // one staged tile
constexpr int kSmem = 2 * kTileSmem;        // K and V

__device__ __forceinline__ void cp_async16(unsigned dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait_group() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Pool row (in units of one head's position) of position p of row r, head h.
template <bool kHeadMajor>
__device__ __forceinline__ int64_t pool_row(const int* table, int blocks_per_row, int r, int h, int p) {
  const int64_t block = table[static_cast<int64_t>(r) * blocks_per_row + p / kBlock];
  return kHeadMajor ? (block * kHeads + h) * kBlock + p % kBlock : (block * kBlock + p % kBlock) * kHeads + h;
}

template <bool kHeadMajor>
__global__ void __launch_bounds__(32) walk_kernel(const __nv_bfloat16* k_pool, const __nv_bfloat16* v_pool,
                                                  const int* table, int blocks_per_row, int positions, float* sink) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int lane = static_cast<int>(threadIdx.x);
  const int r = static_cast<int>(blockIdx.x) / kHeads, h = static_cast<int>(blockIdx.x) % kHeads;
  const unsigned sk = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const unsigned sv = sk + kTileSmem;
  const int piece = lane % kPieces, p0 = lane / kPieces;
  constexpr int kStride = 32 / kPieces;
  const auto stage = [&](const __nv_bfloat16* pool, unsigned dst, int tile) {
#pragma unroll 4
    for (int k = 0; k < kTile / kStride; ++k) {
      const int p = tile * kTile + p0 + k * kStride;
      const int q = min(p, positions - 1);
      const char* src = reinterpret_cast<const char*>(pool) +
                        pool_row<kHeadMajor>(table, blocks_per_row, r, h, q) * kRowBytes + piece * 16;
      cp_async16(dst + static_cast<unsigned>(((p0 + k * kStride) * kLd + piece * 8) * 2), src);
    }
    commit();
  };
  const int tiles = (positions + kTile - 1) / kTile;
  float acc = 0.0f;
  const auto touch = [&](unsigned base) {  // a word of each staged position, as the products would read
    float x;
    asm volatile("ld.shared.f32 %0, [%1];" : "=f"(x) : "r"(base + static_cast<unsigned>(lane * 2 * kLd * 2)));
    acc += x;
  };
  stage(k_pool, sk, 0);
  stage(v_pool, sv, 0);
  for (int j = 0; j < tiles; ++j) {
    wait_group<1>();  // K
    __syncwarp();
    touch(sk);
    __syncwarp();
    if (j + 1 < tiles) {
      stage(k_pool, sk, j + 1);
      wait_group<1>();  // V
    } else {
      wait_group<0>();
    }
    __syncwarp();
    touch(sv);
    __syncwarp();
    if (j + 1 < tiles) stage(v_pool, sv, j + 1);
  }
  if (acc == 1234.5f) sink[blockIdx.x] = acc;
}

__global__ void stream_kernel(const uint4* data, int64_t vectors, float* sink) {
  uint32_t acc = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < vectors;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcs(data + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) sink[0] = 1.0f;
}

}  // namespace

int main() {
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  const double copy_bw = copy_bandwidth();
  std::printf("device: %s, %d SMs; device-to-device copy %.0f GB/s (read + write)\n", prop.name,
              prop.multiProcessorCount, copy_bw / 1e9);
  std::printf("%5s %9s %-15s %-9s %9s %9s %8s\n", "rows", "positions", "layout", "blocks", "us", "GB/s", "of copy");

  const int positions = 576;  // the bench's mean context at 512-token prompts and 128 new tokens
  const int blocks_per_row = (positions + kBlock - 1) / kBlock;
  float* sink = nullptr;
  CK(cudaMalloc(&sink, 65536 * sizeof(float)));
  CK(cudaFuncSetAttribute(walk_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  CK(cudaFuncSetAttribute(walk_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  for (int rows : {256, 128}) {
    const int64_t blocks = int64_t{rows} * blocks_per_row;
    const size_t pool_bytes = static_cast<size_t>(blocks) * kBlock * kHeads * kRowBytes;
    __nv_bfloat16 *k = nullptr, *v = nullptr;
    CK(cudaMalloc(&k, pool_bytes));
    CK(cudaMalloc(&v, pool_bytes));
    CK(cudaMemset(k, 0x3c, pool_bytes));
    CK(cudaMemset(v, 0x3c, pool_bytes));
    const double bytes = 2.0 * rows * positions * kHeads * kRowBytes;  // what the walk reads
    const auto report = [&](const char* layout, const char* order, float ms) {
      const double bw = bytes / (ms * 1e-3);
      std::printf("%5d %9d %-15s %-9s %9.1f %9.0f %7.1f%%\n", rows, positions, layout, order, ms * 1e3, bw / 1e9,
                  100.0 * bw / copy_bw);
    };
    std::vector<int> order(static_cast<size_t>(blocks));
    std::iota(order.begin(), order.end(), 0);
    int* table = nullptr;
    CK(cudaMalloc(&table, order.size() * sizeof(int)));
    for (const bool shuffled : {false, true}) {
      if (shuffled) std::shuffle(order.begin(), order.end(), std::mt19937(7));
      CK(cudaMemcpy(table, order.data(), order.size() * sizeof(int), cudaMemcpyHostToDevice));
      const char* name = shuffled ? "shuffled" : "in order";
      const dim3 grid(static_cast<unsigned>(rows * kHeads));
      report("position-major", name,
             median_ms([&] { walk_kernel<false><<<grid, 32, kSmem>>>(k, v, table, blocks_per_row, positions, sink); }));
      report("head-major", name,
             median_ms([&] { walk_kernel<true><<<grid, 32, kSmem>>>(k, v, table, blocks_per_row, positions, sink); }));
    }
    const double stream_ms = median_ms([&] {
      stream_kernel<<<prop.multiProcessorCount * 8, 512>>>(reinterpret_cast<const uint4*>(k),
                                                           static_cast<int64_t>(pool_bytes / 16), sink);
      stream_kernel<<<prop.multiProcessorCount * 8, 512>>>(reinterpret_cast<const uint4*>(v),
                                                           static_cast<int64_t>(pool_bytes / 16), sink);
    });
    const double stream_bw = 2.0 * pool_bytes / (stream_ms * 1e-3);
    std::printf("%5d %9s %-15s %-9s %9.1f %9.0f %7.1f%%\n", rows, "all", "streaming read", "-", stream_ms * 1e3,
                stream_bw / 1e9, 100.0 * stream_bw / copy_bw);
    CK(cudaFree(table));
    CK(cudaFree(k));
    CK(cudaFree(v));
  }
  CK(cudaFree(sink));
  return 0;
}
