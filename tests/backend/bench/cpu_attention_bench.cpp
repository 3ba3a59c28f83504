// Decode micro-benchmark of the CPU backend's attention: R rows, each one new token attending to
// a cache of L positions (the bundled target's 8 heads, 2 kv heads, head_dim 64, blocks of 16),
// reporting time per call (one layer). Not a test; build it by hand against the library:
//   g++ -O3 -std=c++20 -Isrc tests/backend/bench/cpu_attention_bench.cpp <build>/libspecdec.a -lpthread
// Usage: cpu_attention_bench [isa] [threads] [L] [R] [seconds]
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
  Buffer kp = filled(static_cast<size_t>(num_blocks) * bs * kv_heads * d);
  Buffer vp = filled(static_cast<size_t>(num_blocks) * bs * kv_heads * d);
  Buffer q = filled(static_cast<size_t>(R) * heads * d), out = filled(static_cast<size_t>(R) * heads * d);
  std::vector<int32_t> positions(R, L - 1), slots(R), starts(R + 1), lens(R, L),
      table(static_cast<size_t>(R) * max_blocks);
  for (int r = 0; r < R; ++r) {
    starts[r + 1] = r + 1;
    for (int b = 0; b < max_blocks; ++b) table[static_cast<size_t>(r * max_blocks + b)] = r * max_blocks + b;
  }
  AttentionBatch batch;
  batch.positions = Tensor(positions.data(), DType::i32, {R});
  batch.slots = Tensor(slots.data(), DType::i32, {R});
  batch.row_starts = Tensor(starts.data(), DType::i32, {R + 1});
  batch.row_lens = Tensor(lens.data(), DType::i32, {R});
  batch.block_table = Tensor(table.data(), DType::i32, {R, max_blocks});
  batch.rows = R;
  batch.tokens = R;
  batch.max_blocks = max_blocks;
  batch.block_size = bs;
  batch.max_row_len = L;
  batch.max_row_tokens = 1;
  const Tensor kt(kp.data(), DType::f32, {num_blocks, bs, kv_heads, d}),
      vt(vp.data(), DType::f32, {num_blocks, bs, kv_heads, d});
  const Tensor qt(q.data(), DType::f32, {R, heads, d}), ot(out.data(), DType::f32, {R, heads, d});
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
  std::printf("%s attention L=%d R=%d: best %.3f ms, mean %.3f ms per call (%d runs), KV read %.2f GB/s\n",
              backend->name().c_str(), L, R, best * 1e3, elapsed / runs * 1e3, runs, kv_bytes / best / 1e9);
  return 0;
}
