// Micro-benchmark of the host's sampled draw: sample() (draw.h's exact-mass passes) against the
// softmax sampler it replaced (the logits processor's stages, softmax_in_place() and
// sample_from_weights(), all still in the library), per vocabulary size and filter, on the same
// logits and keys. Prints a table and one
// JSON object. Not a test (timings assert nothing); build it by hand against the library:
//   g++ -O3 -std=c++20 -Isrc tests/sampling/bench/sampler_bench.cpp <build>/libspecdec.a -lpthread
// Usage: sampler_bench [draws per case]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "sampling/draw.h"
#include "sampling/philox.h"
#include "sampling/sampling.h"

using namespace specdec;

namespace {

// A language model's shape of logits: a broad normal body with a few tokens well above it.
std::vector<float> lm_logits(size_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> l(vocab);
  for (float& x : l) x = normal(rng);
  for (int j = 0; j < 16; ++j) l[rng() % vocab] += 8.0f + 0.5f * static_cast<float>(j);
  return l;
}

template <class F>
double median_us(int draws, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < draws; ++i) {
    const auto a = std::chrono::steady_clock::now();
    f(i);
    t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count());
  }
  std::nth_element(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(t.size() / 2), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int draws = argc > 1 ? std::max(1, std::stoi(argv[1])) : 200;
  struct Case {
    const char* name;
    int top_k;
    float top_p, min_p;
  };
  const Case cases[] = {{"T=0.8", 0, 1.0f, 0.0f},
                        {"T=0.8 top-p 0.9", 0, 0.9f, 0.0f},
                        {"T=0.8 top-k 50", 50, 1.0f, 0.0f},
                        {"T=0.8 min-p 0.05", 0, 1.0f, 0.05f}};
  std::printf("host sampler, kernels %s, median of %d draws\n", draw_kernels().name, draws);
  std::printf("%-8s %-18s %12s %12s %9s %6s\n", "vocab", "params", "softmax us", "draw us", "speedup", "same");
  std::string json = "{\"kernels\":\"" + std::string(draw_kernels().name) + "\",\"cases\":[";
  bool first = true;
  for (size_t vocab : {8192u, 32000u, 128256u, 151936u}) {
    const std::vector<float> l = lm_logits(vocab, static_cast<uint32_t>(vocab));
    for (const Case& c : cases) {
      SamplingParams p;
      p.temperature = 0.8f;
      p.top_k = c.top_k;
      p.top_p = c.top_p;
      p.min_p = c.min_p;
      p.seed = 42;
      int same = 0;
      std::vector<int32_t> old_tokens(static_cast<size_t>(draws)), new_tokens(static_cast<size_t>(draws));
      const double old_us = median_us(draws, [&](int i) {
        std::vector<float> w = l;
        LogitsProcessor(p).apply(w, {});
        softmax_in_place(w);
        old_tokens[static_cast<size_t>(i)] = sample_from_weights(w, uniform01(p.seed, static_cast<uint64_t>(i)));
      });
      const double new_us = median_us(
          draws, [&](int i) { new_tokens[static_cast<size_t>(i)] = sample(l, p, {}, {}, static_cast<uint64_t>(i)); });
      for (int i = 0; i < draws; ++i) same += old_tokens[static_cast<size_t>(i)] == new_tokens[static_cast<size_t>(i)];
      std::printf("%-8zu %-18s %12.1f %12.1f %8.1fx %5d/%d\n", vocab, c.name, old_us, new_us, old_us / new_us, same,
                  draws);
      char row[256];
      std::snprintf(row, sizeof(row),
                    "%s{\"vocab\":%zu,\"params\":\"%s\",\"softmax_us\":%.2f,\"draw_us\":%.2f,\"same\":%d,\"draws\":%d}",
                    first ? "" : ",", vocab, c.name, old_us, new_us, same, draws);
      json += row;
      first = false;
    }
  }
  // Penalties read the whole history at every draw: a repetition penalty over a history of
  // 4,000 tokens (the same table as above has no baseline for it; the draw's time alone).
  std::printf("\n%-8s %-28s %12s\n", "vocab", "params", "us");
  json += "],\"penalties\":[";
  first = true;
  for (size_t vocab : {32000u, 151936u}) {
    const std::vector<float> l = lm_logits(vocab, static_cast<uint32_t>(vocab) + 1);
    std::mt19937 rng(7);
    std::vector<int32_t> prompt(4000), generated(200);
    for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % vocab);
    for (int32_t& t : generated) t = static_cast<int32_t>(rng() % vocab);
    SamplingParams p;
    p.temperature = 0.8f;
    p.repetition_penalty = 1.1f;
    p.seed = 42;
    const double us = median_us(draws, [&](int i) { (void)sample(l, p, prompt, generated, static_cast<uint64_t>(i)); });
    std::printf("%-8zu %-28s %12.1f\n", vocab, "T=0.8 repetition 1.1, 4,200", us);
    char row[128];
    std::snprintf(row, sizeof(row), "%s{\"vocab\":%zu,\"history\":4200,\"draw_us\":%.2f}", first ? "" : ",", vocab, us);
    json += row;
    first = false;
  }
  // A token's logprob with its 20 most likely alternatives (a logprobs request, prompt logprobs).
  json += "],\"logprobs\":[";
  first = true;
  for (size_t vocab : {8192u, 151936u}) {
    const std::vector<float> l = lm_logits(vocab, static_cast<uint32_t>(vocab) + 2);
    SamplingParams p;
    const double us = median_us(draws, [&](int i) {
      (void)token_logprobs(l, p, {}, static_cast<int32_t>(static_cast<size_t>(i) % vocab), 20);
    });
    std::printf("%-8zu %-28s %12.1f\n", vocab, "logprobs, top 20", us);
    char row[128];
    std::snprintf(row, sizeof(row), "%s{\"vocab\":%zu,\"top\":20,\"us\":%.2f}", first ? "" : ",", vocab, us);
    json += row;
    first = false;
  }
  std::printf("%s]}\n", json.c_str());
}
