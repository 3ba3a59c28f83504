// Kernel benchmarks of the CUDA backend: device-to-device copy bandwidth (the practical memory
// roofline), the linear alone at decode shapes, Llama-3.1-8B-shaped decode steps at several
// batch sizes and a 2048-token prefill, in fast and batch-invariant modes. Times are CUDA events
// on the backend's stream, median of repeats after warm-up. Prints a table; writes JSON to argv[1].
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels.h"
#include "llama_step.h"

namespace specdec::bench {
namespace {

constexpr double kPeakTflops = 790.0;  // bf16 dense tensor-core peak of the target GPU

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("bench: ", what, " failed: ", cudaGetErrorString(e));
}

// Median milliseconds of `fn` on `stream` over `reps` runs after `warm` runs.
double time_ms(cudaStream_t stream, const std::function<void()>& fn, int warm, int reps) {
  for (int i = 0; i < warm; ++i) fn();
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "cudaEventCreate");
  check(cudaEventCreate(&b), "cudaEventCreate");
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    check(cudaEventRecord(a, stream), "cudaEventRecord");
    fn();
    check(cudaEventRecord(b, stream), "cudaEventRecord");
    check(cudaEventSynchronize(b), "cudaEventSynchronize");
    float t = 0;
    check(cudaEventElapsedTime(&t, a, b), "cudaEventElapsedTime");
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

cudaStream_t stream_of(Backend& be) { return static_cast<cudaStream_t>(cuda_stream_of(be)); }

struct Result {
  std::string kind, mode;
  int batch = 0, tokens = 0;
  double ms = 0, bytes = 0, flops = 0;
};

std::unique_ptr<Backend> cuda_backend(bool invariant, bool tensor_cores = false, int gemm_tile = 0,
                                      int skinny_max_m = CudaTuning{}.skinny_max_m,
                                      int ordered_max_m = CudaTuning{}.ordered_max_m) {
  BackendOptions o;
  o.cuda.skinny_max_m = skinny_max_m;
  o.cuda.ordered_max_m = ordered_max_m;
  o.device = Device::cuda;
  o.batch_invariant = invariant;
  o.cuda.invariant_tensor_cores = tensor_cores;
  o.cuda.gemm_tile = gemm_tile;
  return make_backend(o);
}

double copy_bandwidth(Backend& be) {
  const size_t bytes = size_t{2} << 30;
  Buffer a = be.allocate(bytes), b = be.allocate(bytes);
  const int64_t n = static_cast<int64_t>(bytes / 4);
  Tensor ta(a.data(), DType::f32, {n}, Device::cuda), tb(b.data(), DType::f32, {n}, Device::cuda);
  const double ms = time_ms(stream_of(be), [&] { be.copy(ta, tb); }, 3, 10);
  return 2.0 * bytes / (ms * 1e-3);  // read + write
}

// One linear at a decode shape: weight [N, K] bf16, x [M, K].
Result linear_case(Backend& be, const char* mode, int M, int N, int K) {
  Buffer w = be.allocate(size_t(N) * K * 2), x = be.allocate(size_t(M) * K * 4), out = be.allocate(size_t(M) * N * 4);
  // Contents do not change the timing; fill with a small constant (about 0.0115) so inputs are defined.
  check(cudaMemsetAsync(w.data(), 0x3c, w.bytes(), stream_of(be)), "cudaMemsetAsync");
  check(cudaMemsetAsync(x.data(), 0x3c, x.bytes(), stream_of(be)), "cudaMemsetAsync");
  const Weight tw(Tensor(w.data(), DType::bf16, {N, K}, Device::cuda));
  Tensor tx(x.data(), DType::f32, {M, K}, Device::cuda);
  Tensor to(out.data(), DType::f32, {M, N}, Device::cuda);
  Result r{"linear " + std::to_string(N) + "x" + std::to_string(K), mode, M, M, 0, 0, 0};
  // Ten calls back to back per sample, as in a forward, so launch latency is hidden.
  constexpr int kCalls = 10;
  r.ms = time_ms(stream_of(be), [&] { for (int i = 0; i < kCalls; ++i) be.linear(tx, tw, nullptr, to); }, 3, 15) / kCalls;
  r.bytes = 2.0 * N * K + 4.0 * M * K + 4.0 * M * N;
  r.flops = 2.0 * M * N * K;
  return r;
}

// A batch-B decode step at `context`, recorded once and timed as replays of the recording.
Result recorded_decode(Backend& be, const char* mode, const Shape& s, Weights& w, int B, int context, int warm,
                       int reps) {
  Step step(be, s, w, B, 1, context);
  step.run();
  const std::unique_ptr<RecordedCalls> graph = be.record([&] { step.run(); });
  SPECDEC_CHECK(graph, "the CUDA backend did not record the decode step");
  Result r{"decode ctx " + std::to_string(context) + " graph", mode, B, B, 0, 0, 0};
  r.ms = time_ms(stream_of(be), [&] { SPECDEC_CHECK(graph->replay(), "recorded decode step went stale"); }, warm,
                 reps);
  const StepCost c = decode_cost(s, B, context);
  r.bytes = c.bytes();
  r.flops = c.flops;
  return r;
}

void print_row(const Result& r, double copy_bw) {
  const double s = r.ms * 1e-3;
  const double gbps = r.bytes / s / 1e9, tflops = r.flops / s / 1e12;
  std::printf("| %-22s | %-9s | %5d | %6d | %9.3f | %9.4f | %9.0f | %8.2f | %7.1f | %6.1f%% | %7.1f | %5.1f%% |\n",
              r.kind.c_str(), r.mode.c_str(), r.batch, r.tokens, r.ms, r.ms / r.tokens, r.tokens / s, r.bytes / 1e9,
              gbps, 100.0 * r.bytes / s / copy_bw, tflops, 100.0 * tflops / kPeakTflops);
}

void write_json(const std::string& path, const std::string& device, double copy_bw, const std::vector<Result>& rs,
                const std::vector<std::string>& profile) {
  std::ofstream f(path);
  SPECDEC_CHECK(f.good(), "bench: cannot write ", path);
  f << "{\n  \"device\": \"" << device << "\",\n  \"copy_bandwidth_gbps\": " << copy_bw / 1e9
    << ",\n  \"peak_tflops_bf16\": " << kPeakTflops << ",\n  \"results\": [\n";
  for (size_t i = 0; i < rs.size(); ++i) {
    const Result& r = rs[i];
    const double s = r.ms * 1e-3;
    f << "    {\"kind\": \"" << r.kind << "\", \"mode\": \"" << r.mode << "\", \"batch\": " << r.batch
      << ", \"tokens\": " << r.tokens << ", \"ms\": " << r.ms << ", \"ms_per_token\": " << r.ms / r.tokens
      << ", \"tokens_per_s\": " << r.tokens / s << ", \"bytes\": " << r.bytes << ", \"gbps\": " << r.bytes / s / 1e9
      << ", \"fraction_of_copy_bw\": " << r.bytes / s / copy_bw << ", \"tflops\": " << r.flops / s / 1e12
      << ", \"fraction_of_peak_flops\": " << r.flops / s / 1e12 / kPeakTflops << "}"
      << (i + 1 < rs.size() ? "," : "") << "\n";
  }
  f << "  ],\n  \"profile\": [\n";
  for (size_t i = 0; i < profile.size(); ++i) f << "    " << profile[i] << (i + 1 < profile.size() ? "," : "") << "\n";
  f << "  ]\n}\n";
}

int run(int argc, char** argv) {
  const std::string json = argc > 1 ? argv[1] : "bench_kernels.json";
  // --quick: fast mode only, batch-1 linears of every decode shape and the recorded decode
  // steps at batch 1 and 8 (the loop of the decode-speed work, a few seconds).
  const bool quick = argc > 2 && std::string(argv[2]) == "--quick";
  // --linears: the 8B shape's linears alone at M = 1 .. 2048 rows in both modes (the
  // batch-invariant mode's tensor-core linear against the fast mode's kernels), then stop.
  const bool linears = argc > 2 && std::string(argv[2]) == "--linears";
  // --gemm-kernels: the tensor-core linear's kernels side by side on the 8B shape's linears: the
  // stream kernels (CudaTuning::gemm_tile 5, 6, 9) against the row kernel at 1-16 rows, the
  // default choice at 64 and 256 rows, the two large tiles (3, 7) against the fast mode at 2,048.
  const bool gemm_kernels = argc > 2 && std::string(argv[2]) == "--gemm-kernels";
  // --skinny: the fast mode's linears at 3-16 rows on the skinny kernel against cuBLASLt
  // (CudaTuning::skinny_max_m 16 and 0), then recorded decode steps at 4-16 rows both ways.
  const bool skinny = argc > 2 && std::string(argv[2]) == "--skinny";
  // --ordered: the same for the batch-invariant mode's ordered kernel at 1-16 rows against
  // cuBLASLt with K unsplit (CudaTuning::ordered_max_m 16 and 0), recorded steps at 1-16 rows.
  const bool ordered = argc > 2 && std::string(argv[2]) == "--ordered";
  // --profile: only the per-kernel times of one layer and the head, both modes, batch 1 / 8 / 32 /
  // 64 / 128 / 256.
  const bool profile = argc > 2 && std::string(argv[2]) == "--profile";
  // --attention B [MODE]: only one layer's rope + cache write + attention of a decode step at
  // batch B (fast mode, or invariant), timed over twenty calls after the step: a short run for a profiler.
  const bool attention_only = argc > 3 && std::string(argv[2]) == "--attention";
  SPECDEC_CHECK(cuda_available(), "bench: no CUDA device");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  const Shape s;
  const std::vector<int> batches = {1, 8, 32, 64, 128};
  const int context = 512, prefill = 2048;
  std::vector<Result> results;

  if (attention_only) {  // nothing else measured: no copy bandwidth, no table
    const int B = std::stoi(argv[3]);
    const bool invariant = argc > 4 && std::string(argv[4]) == "invariant";
    std::unique_ptr<Backend> be = cuda_backend(invariant);
    Weights w = make_weights(*be, s, B * ((context + s.block_size - 1) / s.block_size));
    Step step(*be, s, w, B, 1, context);
    step.run();
    auto ops = step.layer_ops(0);
    const double ms = time_ms(stream_of(*be), ops[1].run, 3, 20);
    std::printf("device: %s\nattention op, batch %d: %.1f us\n", prop.name, B, 1e3 * ms);
    return 0;
  }
  auto inv = cuda_backend(true);
  const double copy_bw = copy_bandwidth(*inv);
  std::printf("device: %s, %d SMs\ndevice-to-device copy: %.0f GB/s (read + write of 2 GiB)\n\n", prop.name,
              prop.multiProcessorCount, copy_bw / 1e9);
  std::printf("| %-22s | %-9s | %5s | %6s | %9s | %9s | %9s | %8s | %7s | %7s | %7s | %6s |\n", "case", "mode", "batch",
              "tokens", "ms", "ms/token", "tokens/s", "GB", "GB/s", "of copy", "TFLOP/s", "of peak");
  std::printf("|%s|\n", std::string(150, '-').c_str());
  auto fast = cuda_backend(false);
  if (gemm_kernels) {
    const int qd = s.heads * s.head_dim, kvd = s.kv_heads * s.head_dim;
    std::vector<std::pair<std::string, std::unique_ptr<Backend>>> tc;
    for (int tile : {0, 3, 5, 6, 7, 9}) tc.emplace_back("mma-" + std::to_string(tile), cuda_backend(true, true, tile));
    const auto backend = [&](int tile) -> Backend& {
      for (auto& [name, be] : tc)
        if (name == "mma-" + std::to_string(tile)) return *be;
      return *inv;
    };
    for (auto [N, K] : {std::pair{qd + 2 * kvd, s.hidden}, std::pair{s.hidden, qd},
                        std::pair{2 * s.intermediate, s.hidden}, std::pair{s.hidden, s.intermediate}}) {
      const auto add = [&](Backend& be, const std::string& mode, int M) {
        results.push_back(linear_case(be, mode.c_str(), M, N, K));
        print_row(results.back(), copy_bw);
      };
      for (int M : {1, 8, 16}) {
        add(*inv, "invariant", M);
        for (int tile : {5, 6, 9}) add(backend(tile), "mma-" + std::to_string(tile), M);
      }
      for (int M : {64, 256}) add(backend(0), "mma-0", M), add(*fast, "fast", M);
      for (int tile : {3, 7}) add(backend(tile), "mma-" + std::to_string(tile), 2048);
      add(*fast, "fast", 2048);
    }
    write_json(json, prop.name, copy_bw, results, {});
    return 0;
  }
  if (skinny || ordered) {
    // `fast` is the few-row kernel's backend and `lt` cuBLASLt's, in the mode measured.
    auto lt = cuda_backend(ordered, false, 0, 0, 0);
    fast = ordered ? cuda_backend(true, false, 0, 0, cuda::kOrderedMaxM)
                   : cuda_backend(false, false, 0, cuda::kSkinnyMaxM, 0);
    const char* kernel = ordered ? "ordered" : "skinny";
    const std::vector<int> rows = ordered ? std::vector<int>{1, 2, 4, 8, 16} : std::vector<int>{3, 8, 12, 16};
    const std::vector<int> steps = ordered ? std::vector<int>{1, 4, 8, 16} : std::vector<int>{4, 8, 12, 16};
    const int qd = s.heads * s.head_dim, kvd = s.kv_heads * s.head_dim;
    for (auto [N, K] : {std::pair{qd + 2 * kvd, s.hidden}, std::pair{s.hidden, qd},
                        std::pair{2 * s.intermediate, s.hidden}, std::pair{s.hidden, s.intermediate},
                        std::pair{s.vocab, s.hidden}}) {
      for (int M : rows) {
        for (auto* be : {fast.get(), lt.get()}) {
          results.push_back(linear_case(*be, be == fast.get() ? kernel : "cublaslt", M, N, K));
          print_row(results.back(), copy_bw);
        }
      }
    }
    const int pool_blocks = 16 * ((context + s.block_size - 1) / s.block_size);
    Weights w = make_weights(*fast, s, pool_blocks);
    for (int B : steps) {
      for (auto* be : {fast.get(), lt.get()}) {
        results.push_back(recorded_decode(*be, be == fast.get() ? kernel : "cublaslt", s, w, B, context, 3, 11));
        print_row(results.back(), copy_bw);
      }
    }
    write_json(json, prop.name, copy_bw, results, {});
    return 0;
  }
  if (linears) {
    auto mma = cuda_backend(true, true);  // batch-invariant on the tensor-core linear
    const int qd = s.heads * s.head_dim, kvd = s.kv_heads * s.head_dim;
    for (auto [N, K] : {std::pair{qd + 2 * kvd, s.hidden}, std::pair{s.hidden, qd},
                        std::pair{2 * s.intermediate, s.hidden}, std::pair{s.hidden, s.intermediate}}) {
      for (int M : {1, 2, 8, 16, 32, 64, 128, 256, 512, 2048}) {
        for (auto* be : {inv.get(), mma.get(), fast.get()}) {
          results.push_back(linear_case(*be, be == inv.get() ? "invariant" : be == mma.get() ? "inv-mma" : "fast", M, N, K));
          print_row(results.back(), copy_bw);
        }
      }
    }
    write_json(json, prop.name, copy_bw, results, {});
    return 0;
  }
  if (quick) {
    const int qd = s.heads * s.head_dim, kvd = s.kv_heads * s.head_dim;
    for (auto [N, K] : {std::pair{qd + 2 * kvd, s.hidden}, std::pair{s.hidden, qd},
                        std::pair{2 * s.intermediate, s.hidden}, std::pair{s.hidden, s.intermediate},
                        std::pair{s.vocab, s.hidden}}) {
      results.push_back(linear_case(*fast, "fast", 1, N, K));
      print_row(results.back(), copy_bw);
    }
    const int pool_blocks = 8 * ((context + s.block_size - 1) / s.block_size);
    Weights w = make_weights(*fast, s, pool_blocks);
    for (int B : {1, 8}) {
      results.push_back(recorded_decode(*fast, "fast", s, w, B, context, 3, 11));
      print_row(results.back(), copy_bw);
    }
    write_json(json, prop.name, copy_bw, results, {});
    return 0;
  }
  for (auto* be : {inv.get(), fast.get()}) {
    if (profile) break;
    const char* mode = be == inv.get() ? "invariant" : "fast";
    for (int M : {1, 2, 4, 8, 32, 128}) {
      results.push_back(linear_case(*be, mode, M, s.intermediate, s.hidden));
      print_row(results.back(), copy_bw);
    }
  }

  const std::vector<int> profile_batches = {1, 8, 32, 64, 128, 256};
  const int pool_rows = profile ? profile_batches.back() : batches.back();
  const int pool_blocks =
      std::max(pool_rows * ((context + s.block_size - 1) / s.block_size), (prefill + s.block_size - 1) / s.block_size);
  Weights w = make_weights(*inv, s, pool_blocks);
  for (auto* be : {inv.get(), fast.get()}) {
    if (profile) break;
    const char* mode = be == inv.get() ? "invariant" : "fast";
    for (int B : batches) {
      Step step(*be, s, w, B, 1, context);
      Result r{"decode ctx " + std::to_string(context), mode, B, B, 0, 0, 0};
      r.ms = time_ms(stream_of(*be), [&] { step.run(); }, 2, 7);
      const StepCost c = decode_cost(s, B, context);
      r.bytes = c.bytes();
      r.flops = c.flops;
      results.push_back(r);
      print_row(r, copy_bw);
    }
    for (int B : {1, 8, 32, 64, 128}) {  // the same steps replayed as one CUDA graph: launch gaps removed
      results.push_back(recorded_decode(*be, mode, s, w, B, context, 2, 7));
      print_row(results.back(), copy_bw);
    }
    Step step(*be, s, w, 1, prefill, prefill);
    Result r{"prefill " + std::to_string(prefill), mode, 1, prefill, 0, 0, 0};
    r.ms = time_ms(stream_of(*be), [&] { step.run(); }, 1, 3);
    const StepCost c = prefill_cost(s, prefill);
    r.bytes = c.bytes();
    r.flops = c.flops;
    results.push_back(r);
    print_row(r, copy_bw);
  }
  // Per-kernel times of one layer (layer 0) and the head, each kernel timed alone.
  std::printf("\nper-kernel time (us), one layer, each kernel alone; 'x32 layers' = layer sum x 32 + head\n");
  std::vector<std::string> profile_json;
  // A recorded step the decode loops above measured already (without --profile), else recorded now.
  const auto recorded_step_ms = [&](Backend& be, const char* mode, int B) {
    for (const Result& r : results)
      if (r.kind == "decode ctx " + std::to_string(context) + " graph" && r.mode == mode && r.batch == B) return r.ms;
    return recorded_decode(be, mode, s, w, B, context, 2, 7).ms;
  };
  for (auto* be : {inv.get(), fast.get()}) {
    const char* mode = be == inv.get() ? "invariant" : "fast";
    for (int B : profile ? profile_batches : std::vector<int>{1, 8, 64}) {
      Step step(*be, s, w, B, 1, context);
      step.run();
      std::string line = std::string("| ") + mode + " B=" + std::to_string(B) + " |";
      std::string js = std::string("{\"mode\": \"") + mode + "\", \"batch\": " + std::to_string(B) + ", \"us\": {";
      double layer_us = 0, head_us = 0;
      auto ops = step.layer_ops(0);
      auto head = step.head_ops();
      for (size_t i = 0; i < ops.size() + head.size(); ++i) {
        auto& op = i < ops.size() ? ops[i] : head[i - ops.size()];
        const double us = 1e3 * time_ms(stream_of(*be), op.run, 3, 15);
        (i < ops.size() ? layer_us : head_us) += us;
        char buf[96];
        std::snprintf(buf, sizeof buf, " %s %.1f |", op.name, us);
        line += buf;
        js += std::string(i ? ", " : "") + "\"" + std::to_string(i) + " " + op.name + "\": " + std::to_string(us);
      }
      char buf[160];
      // The same step recorded and replayed: what the kernels cost together, overlaps included.
      const double recorded_ms = recorded_step_ms(*be, mode, B);
      std::snprintf(buf, sizeof buf, " layer %.1f | x32 layers %.0f | recorded step %.0f |", layer_us,
                    layer_us * s.layers + head_us, 1e3 * recorded_ms);
      std::printf("%s%s\n", line.c_str(), buf);
      profile_json.push_back(js + "}, \"recorded_step_us\": " + std::to_string(1e3 * recorded_ms) + "}");
    }
  }
  write_json(json, prop.name, copy_bw, results, profile_json);
  std::printf("\nJSON written to %s\n", json.c_str());
  return 0;
}

}  // namespace
}  // namespace specdec::bench

int main(int argc, char** argv) {
  try {
    return specdec::bench::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_kernels: %s\n", e.what());
    return 1;
  }
}
