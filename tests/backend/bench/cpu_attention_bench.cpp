// Micro-benchmark of the CPU backend's attention: R rows, each W new tokens (a decode step at 1, a
// verify window above) at the last positions of a cache of L (the bundled target's 8 heads, 2 kv
// heads, head_dim 64, blocks of 16), reporting time per call (one layer); bf16 1 keeps the cache
// in bf16 (the amx kernels' attention). Not a test; build it by hand against the library:
//   g++ -O3 -std=c++20 -Isrc tests/backend/bench/cpu_attention_bench.cpp <build>/libspecdec.a -lpthread
// Usage: cpu_attention_bench [isa] [threads] [L] [R] [seconds] [W] [bf16]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"

using namespace specdec;

int main(int argc, char** argv) {
  BackendOptions o;
  o.cpu_isa = argc > 1 ? argv[1] : "";
  o.threads = argc > 2 ? std::stoul(argv[2]) : 0;
  const int L = argc > 3 ? std::stoi(argv[3]) : 2048;
  const int R = argc > 4 ? std::stoi(argv[4]) : 1;
  const double seconds = argc > 5 ? std::stod(argv[5]) : 2.0;
  const int W = argc > 6 ? std::stoi(argv[6]) : 1;
  const bool bf16 = argc > 7 && std::stoi(argv[7]) != 0;
  auto backend = make_backend(o);
  const int heads = 8, kv_heads = 2, d = 64, bs = 16;
  const int max_blocks = (L + bs - 1) / bs, num_blocks = max_blocks * R;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const auto filled = [&](size_t n) {
    Buffer b = Buffer::host(n * sizeof(float));
    for (size_t i = 0; i < n; ++i) static_cast<float*>(b.data())[i] = dist(rng);
    return b;
  };
  const size_t pool_elems = static_cast<size_t>(num_blocks) * bs * kv_heads * d;
  Buffer kp = filled(pool_elems), vp = filled(pool_elems);
  if (bf16) {  // the same values rounded, in the first half of each buffer
    for (Buffer* b : {&kp, &vp}) {
      const float* f = static_cast<const float*>(b->data());
      uint16_t* h = static_cast<uint16_t*>(b->data());
      for (size_t i = 0; i < pool_elems; ++i) h[i] = f32_to_bf16(f[i]);
    }
  }
  const int T = R * W;
  Buffer q = filled(static_cast<size_t>(T) * heads * d), out = filled(static_cast<size_t>(T) * heads * d);
  std::vector<int32_t> positions(T), slots(T), starts(R + 1), lens(R, L), table(static_cast<size_t>(R) * max_blocks);
  for (int r = 0; r < R; ++r) {
    starts[r + 1] = (r + 1) * W;
    for (int i = 0; i < W; ++i) positions[static_cast<size_t>(r * W + i)] = L - W + i;
    for (int b = 0; b < max_blocks; ++b) table[static_cast<size_t>(r * max_blocks + b)] = r * max_blocks + b;
  }
  AttentionBatch batch;
  batch.positions = Tensor(positions.data(), DType::i32, {T});
  batch.slots = Tensor(slots.data(), DType::i32, {T});
  batch.row_starts = Tensor(starts.data(), DType::i32, {R + 1});
  batch.row_lens = Tensor(lens.data(), DType::i32, {R});
  batch.block_table = Tensor(table.data(), DType::i32, {R, max_blocks});
  batch.rows = R;
  batch.tokens = T;
  batch.max_blocks = max_blocks;
  batch.block_size = bs;
  batch.max_row_len = L;
  batch.max_row_tokens = W;
  const DType pool_type = bf16 ? DType::bf16 : DType::f32;
  const Tensor kt(kp.data(), pool_type, {num_blocks, bs, kv_heads, d}),
      vt(vp.data(), pool_type, {num_blocks, bs, kv_heads, d});
  const Tensor qt(q.data(), DType::f32, {T, heads, d}), ot(out.data(), DType::f32, {T, heads, d});
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  double best = 1e30, elapsed = 0;
  int runs = 0;
  do {
    const auto t0 = clock::now();
    backend->attention(qt, kt, vt, batch, 0.125f, ot);
    best = std::min(best, std::chrono::duration<double>(clock::now() - t0).count());
    ++runs;
    elapsed = std::chrono::duration<double>(clock::now() - start).count();
  } while (elapsed < seconds);
  const double kv_bytes = 2.0 * R * L * kv_heads * d * sizeof(float);
  std::printf("%s attention L=%d R=%d W=%d bf16=%d: best %.3f ms, mean %.3f ms per call (%d runs), KV read %.2f GB/s\n",
              backend->name().c_str(), L, R, W, bf16 ? 1 : 0, best * 1e3, elapsed / runs * 1e3, runs,
              kv_bytes / best / 1e9);
  return 0;
}
