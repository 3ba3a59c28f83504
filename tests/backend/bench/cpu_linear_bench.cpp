// Decode micro-benchmark of the CPU backend's linear: the weight shapes of the bundled target
// (8 layers of q/k/v/o/gate/up/down, hidden 512, MLP 1024, plus the tied 8192 × 512 LM head,
// bf16), run with M rows of activations, reporting time per forward and weight bandwidth.
// Not a test (timings assert nothing); build it by hand against the library:
//   g++ -O3 -std=c++20 -Isrc tests/backend/bench/cpu_linear_bench.cpp <build>/libspecdec.a -lpthread
// Usage: cpu_linear_bench [isa] [threads] [M] [seconds] [packed]
// packed: 1 (default) packs the weights as the engine binds them (Backend::pack_weight), 0 reads
// them row-major.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"

using namespace specdec;

// CPU time of the whole process: with one thread, the forward's own time even when the machine
// is shared and the thread gets descheduled.
static double process_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

int main(int argc, char** argv) {
  BackendOptions o;
  o.cpu_isa = argc > 1 ? argv[1] : "";
  o.threads = argc > 2 ? std::stoul(argv[2]) : 0;
  const int64_t M = argc > 3 ? std::stol(argv[3]) : 1;
  const double seconds = argc > 4 ? std::stod(argv[4]) : 2.0;
  const bool pack = argc > 5 ? std::stoi(argv[5]) != 0 : true;
  auto backend = make_backend(o);

  struct Shape {
    int64_t n, k;
  };
  std::vector<Shape> shapes;
  for (int l = 0; l < 8; ++l) {
    for (Shape s : {Shape{512, 512}, Shape{128, 512}, Shape{128, 512}, Shape{512, 512}, Shape{1024, 512},
                    Shape{1024, 512}, Shape{512, 1024}}) {
      shapes.push_back(s);
    }
  }
  shapes.push_back({8192, 512});

  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<Buffer> weights, packs;
  std::vector<Weight> bound;
  size_t weight_bytes = 0;
  bool packed = false;
  for (const Shape& s : shapes) {
    Buffer b = Buffer::host(static_cast<size_t>(s.n * s.k) * 2);
    auto* p = static_cast<uint16_t*>(b.data());
    for (int64_t i = 0; i < s.n * s.k; ++i) p[i] = f32_to_bf16(dist(rng));
    weight_bytes += b.bytes();
    Weight w(Tensor(b.data(), DType::bf16, {s.n, s.k}));
    if (pack) {
      Buffer storage;
      w.packed = backend->pack_weight(w, storage);
      packed = packed || !w.packed.empty();
      packs.push_back(std::move(storage));
    }
    bound.push_back(w);
    weights.push_back(std::move(b));
  }
  Buffer x = Buffer::host(static_cast<size_t>(M * 1024) * 4), out = Buffer::host(static_cast<size_t>(M * 8192) * 4);
  for (int64_t i = 0; i < M * 1024; ++i) static_cast<float*>(x.data())[i] = dist(rng);

  const auto forward = [&] {
    for (size_t i = 0; i < shapes.size(); ++i) {
      const Shape& s = shapes[i];
      backend->linear(Tensor(x.data(), DType::f32, {M, s.k}), bound[i], nullptr,
                      Tensor(out.data(), DType::f32, {M, s.n}));
    }
  };
  forward();
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  int runs = 0;
  double elapsed = 0;
  double best = 1e30, best_cpu = 1e30;
  do {
    const auto t0 = clock::now();
    const double c0 = process_seconds();
    forward();
    best = std::min(best, std::chrono::duration<double>(clock::now() - t0).count());
    best_cpu = std::min(best_cpu, process_seconds() - c0);
    ++runs;
    elapsed = std::chrono::duration<double>(clock::now() - start).count();
  } while (elapsed < seconds);
  // The best run is the least disturbed by other work on the machine.
  const double mean = elapsed / runs;
  std::printf(
      "%s%s M=%lld: best %.3f ms, mean %.3f ms per forward (%d runs), %.1f MB bf16 weights, best %.2f GB/s, "
      "%.1f GFLOP/s; best process cpu time %.3f ms\n",
      backend->name().c_str(), packed ? " packed" : "", static_cast<long long>(M), best * 1e3, mean * 1e3, runs,
      weight_bytes / 1e6, weight_bytes / best / 1e9, 2.0 * static_cast<double>(M) * (weight_bytes / 2) / best / 1e9,
      best_cpu * 1e3);
  return 0;
}
