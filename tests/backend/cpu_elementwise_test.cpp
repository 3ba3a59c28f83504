// The CPU backend's row-local kernels on every instruction set this CPU has: embedding, rms_norm,
// rope, silu_mul, add, gather_rows, argmax, top_logprob, copy, allocate, against double-precision
// references; and the backend's identity (name, ISA selection, refusals).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu_test_util.h"

namespace specdec::test {
namespace {

class CpuElementwise : public ::testing::TestWithParam<std::string> {};

TEST_P(CpuElementwise, NameDeviceAndKvType) {
  auto backend = make_cpu(GetParam(), 2);
  EXPECT_EQ(backend->name(), "cpu-" + GetParam() + " (2 threads)");
  EXPECT_EQ(backend->device(), Device::cpu);
  EXPECT_EQ(backend->kv_dtype(), DType::f32);
  EXPECT_EQ(make_cpu(GetParam(), 1)->name(), "cpu-" + GetParam() + " (1 thread)");
}

TEST(CpuBackend, DefaultIsTheFastestIsaAndUnknownOnesAreRefused) {
  // "best": the fastest exact kernels; the default: AMX where the CPU has it (and Linux grants its
  // tile state, as it does wherever AMX runs at all), else the AVX-512 BF16 dot products where it
  // has them, else best.
  const std::string best = cpu_isas().back();
  EXPECT_EQ(make_cpu("best", 3)->name(), "cpu-" + best + " (3 threads)");
  const std::vector<std::string> linear = cpu_linear_isas();
  const bool bf16 = std::find(linear.begin(), linear.end(), "avx512-bf16") != linear.end();
  const std::string fastest = cpu_has_amx() ? "amx" : bf16 ? "avx512-bf16" : best;
  EXPECT_EQ(make_cpu("", 3)->name(), "cpu-" + fastest + " (3 threads)");
  EXPECT_THROW(make_cpu("sse9", 1), Error);
  for (const char* isa : {"avx2", "avx512"}) {
    const auto have = cpu_isas();
    if (std::find(have.begin(), have.end(), isa) == have.end()) {
      EXPECT_THROW(make_cpu(isa, 1), Error) << isa;
    }
  }
}

TEST_P(CpuElementwise, RmsNormMatchesReference) {
  std::mt19937 rng(1);
  auto backend = make_cpu(GetParam(), 2);
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (int64_t D : {1, 37, 512}) {
      const int64_t rows = 5;
      HostTensor x = random_f32(rng, {rows, D});
      std::vector<float> w_exact;
      HostTensor w = random_weights(rng, dtype, {D}, w_exact);
      HostTensor out(DType::f32, {rows, D});
      const float eps = 1e-5f;
      backend->rms_norm(x.t, w.t, eps, out.t);
      for (int64_t r = 0; r < rows; ++r) {
        double ss = 0;
        for (int64_t i = 0; i < D; ++i) ss += static_cast<double>(x.f()[r * D + i]) * x.f()[r * D + i];
        const double inv = 1.0 / std::sqrt(ss / static_cast<double>(D) + eps);
        for (int64_t i = 0; i < D; ++i) {
          const double ref = x.f()[r * D + i] * inv * w_exact[static_cast<size_t>(i)];
          ASSERT_NEAR(out.f()[r * D + i], ref, 1e-5 * std::fabs(ref)) << dtype_name(dtype) << " D=" << D;
        }
      }
      // In place gives the same bits.
      backend->rms_norm(x.t, w.t, eps, x.t);
      ASSERT_TRUE(same_bits(x.f(), out.f(), static_cast<size_t>(rows * D)));
    }
  }
}

TEST_P(CpuElementwise, RopeRotatesHalvesLikeTransformers) {
  std::mt19937 rng(2);
  auto backend = make_cpu(GetParam(), 2);
  const int64_t T = 6, heads = 3, d = 10, half = d / 2;
  HostTensor x = random_f32(rng, {T, heads, d});
  std::vector<float> orig(x.f(), x.f() + x.numel());
  HostTensor pos(DType::i32, {T});
  for (int64_t t = 0; t < T; ++t) pos.i()[t] = static_cast<int32_t>(rng() % 4000);
  HostTensor inv_freq(DType::f32, {half});
  for (int64_t i = 0; i < half; ++i) inv_freq.f()[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / d));
  const float scaling = 1.25f;
  backend->rope(x.t, pos.t, inv_freq.t, scaling);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < half; ++i) {
        const float angle = static_cast<float>(pos.i()[t]) * inv_freq.f()[i];  // f32 product, as specified
        const double c = std::cos(static_cast<double>(angle)) * scaling,
                     s = std::sin(static_cast<double>(angle)) * scaling;
        const double x1 = orig[static_cast<size_t>((t * heads + h) * d + i)];
        const double x2 = orig[static_cast<size_t>((t * heads + h) * d + i + half)];
        const double bound = 1e-5 * (std::fabs(x1 * c) + std::fabs(x2 * s));
        EXPECT_NEAR(x.f()[(t * heads + h) * d + i], x1 * c - x2 * s, bound);
        EXPECT_NEAR(x.f()[(t * heads + h) * d + i + half], x2 * c + x1 * s, bound);
      }
    }
  }
}

// silu(g) · u over g in [-100, 100] and the special values: within 4 ulp of the double-precision
// value (each ISA's e^x, then the division and the product; results under 1e-35, where e^-g
// overflows, may be 0), inf and NaN where expf gives them,
// and the same bits whatever the row length (the vector body and its masked tail).
TEST_P(CpuElementwise, SiluIsWithinFourUlpAcrossTheRange) {
  auto backend = make_cpu(GetParam(), 1);
  std::vector<float> gv;
  for (int i = -20000; i <= 20000; ++i) gv.push_back(static_cast<float>(i) * 0.005f);
  const float inf = std::numeric_limits<float>::infinity();
  for (float special : {0.0f, -0.0f, 1e-30f, -1e-30f, 88.0f, 89.0f, -88.0f, -89.0f, 150.0f, -150.0f, inf, -inf,
                        std::numeric_limits<float>::quiet_NaN()}) {
    gv.push_back(special);
  }
  const int64_t n = static_cast<int64_t>(gv.size());
  HostTensor g(DType::f32, {1, n}), u(DType::f32, {1, n}), out(DType::f32, {1, n});
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(0.5f, 2.0f);
  for (int64_t i = 0; i < n; ++i) {
    g.f()[i] = gv[static_cast<size_t>(i)];
    u.f()[i] = dist(rng);
  }
  backend->silu_mul(g.t, u.t, out.t);
  for (int64_t i = 0; i < n; ++i) {
    const double gi = g.f()[i], ui = u.f()[i];
    const float scalar = static_cast<float>(g.f()[i] / (1.0f + std::exp(-g.f()[i])) * u.f()[i]);
    if (std::isnan(scalar) || std::isinf(scalar)) {
      ASSERT_TRUE(std::isnan(scalar) ? std::isnan(out.f()[i]) : out.f()[i] == scalar) << "g = " << gi;
      continue;
    }
    const double ref = gi / (1.0 + std::exp(-gi)) * ui;
    ASSERT_NEAR(out.f()[i], ref, std::max(4.0 * std::ldexp(std::fabs(ref), -23), 1e-35)) << "g = " << gi;
  }
  // Rows of every length up to 40 from the same values: the same bits as the long row.
  for (int64_t len = 1; len <= 40; ++len) {
    HostTensor part(DType::f32, {1, len});
    Tensor gs(g.f() + 7, DType::f32, {1, len}), us(u.f() + 7, DType::f32, {1, len});
    backend->silu_mul(gs, us, part.t);
    ASSERT_TRUE(same_bits(part.f(), out.f() + 7, static_cast<size_t>(len))) << len;
  }
}

TEST_P(CpuElementwise, SiluMulAndAdd) {
  std::mt19937 rng(3);
  auto backend = make_cpu(GetParam(), 2);
  const int64_t M = 7, I = 300;
  HostTensor g = random_f32(rng, {M, I}), u = random_f32(rng, {M, I}), out(DType::f32, {M, I});
  for (int64_t i = 0; i < g.numel(); ++i) g.f()[i] *= 8.0f;  // reach both tails of the sigmoid
  backend->silu_mul(g.t, u.t, out.t);
  for (int64_t i = 0; i < g.numel(); ++i) {
    const double gi = g.f()[i];
    const double ref = gi / (1.0 + std::exp(-gi)) * u.f()[i];
    ASSERT_NEAR(out.f()[i], ref, 1e-5 * std::fabs(ref)) << i;
  }
  backend->silu_mul(g.t, u.t, g.t);
  ASSERT_TRUE(same_bits(g.f(), out.f(), static_cast<size_t>(g.numel())));

  HostTensor a = random_f32(rng, {M, I}), b = random_f32(rng, {M, I}), sum(DType::f32, {M, I});
  backend->add(a.t, b.t, sum.t);
  for (int64_t i = 0; i < a.numel(); ++i) {
    ASSERT_EQ(sum.f()[i], static_cast<float>(static_cast<double>(a.f()[i]) + b.f()[i]));
  }
  backend->add(a.t, b.t, a.t);
  ASSERT_TRUE(same_bits(a.f(), sum.f(), static_cast<size_t>(a.numel())));
  HostTensor wrong(DType::f32, {M, I + 1});
  EXPECT_THROW(backend->add(b.t, sum.t, wrong.t), Error);
}

TEST_P(CpuElementwise, EmbeddingWidensEveryTableType) {
  std::mt19937 rng(4);
  auto backend = make_cpu(GetParam(), 2);
  const int64_t V = 50, H = 19, T = 9;
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    std::vector<float> exact;
    HostTensor table = random_weights(rng, dtype, {V, H}, exact);
    HostTensor ids(DType::i32, {T});
    for (int64_t t = 0; t < T; ++t) ids.i()[t] = static_cast<int32_t>(rng() % V);
    HostTensor out(DType::f32, {T, H});
    backend->embedding(table.t, ids.t, out.t);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t i = 0; i < H; ++i) ASSERT_EQ(out.f()[t * H + i], exact[static_cast<size_t>(ids.i()[t] * H + i)]);
    }
    ids.i()[3] = static_cast<int32_t>(V);
    EXPECT_THROW(backend->embedding(table.t, ids.t, out.t), Error);
  }
}

TEST_P(CpuElementwise, GatherRowsAndCopy) {
  std::mt19937 rng(5);
  auto backend = make_cpu(GetParam(), 2);
  HostTensor x = random_f32(rng, {10, 13});
  HostTensor idx(DType::i32, {4});
  const int32_t picks[4] = {9, 0, 9, 4};
  std::memcpy(idx.i(), picks, sizeof(picks));
  HostTensor out(DType::f32, {4, 13});
  backend->gather_rows(x.t, idx.t, out.t);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(same_bits(out.f() + i * 13, x.f() + picks[i] * 13, 13));
  idx.i()[1] = -1;
  EXPECT_THROW(backend->gather_rows(x.t, idx.t, out.t), Error);

  Buffer buf = backend->allocate(130 * sizeof(float));
  EXPECT_EQ(buf.device(), Device::cpu);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buf.data()) % 64, 0u);
  Tensor dst = buf.view(DType::f32, {10, 13});
  backend->copy(x.t, dst);
  backend->synchronize();
  EXPECT_TRUE(same_bits(dst.ptr<float>(), x.f(), 130));
  EXPECT_THROW(backend->copy(x.t, out.t), Error);
}

TEST_P(CpuElementwise, ArgmaxTakesTheLowestIndexOnTies) {
  std::mt19937 rng(6);
  auto backend = make_cpu(GetParam(), 2);
  const int64_t n = 5, V = 1001;
  HostTensor logits = random_f32(rng, {n, V});
  logits.f()[0 * V + 17] = 5.0f;
  logits.f()[0 * V + 900] = 5.0f;
  logits.f()[1 * V + 1000] = 7.0f;
  logits.f()[2 * V + 0] = 3.0f;
  logits.f()[2 * V + 1] = 3.0f;
  HostTensor out(DType::i32, {n});
  backend->argmax(logits.t, out.t);
  for (int64_t r = 0; r < n; ++r) {
    const float* row = logits.f() + r * V;
    EXPECT_EQ(out.i()[r], std::max_element(row, row + V) - row) << r;
  }
  EXPECT_EQ(out.i()[0], 17);
  EXPECT_EQ(out.i()[1], 1000);
  EXPECT_EQ(out.i()[2], 0);
}

// A row holding a NaN has no token: -1, which the model's forward reports as an error.
TEST_P(CpuElementwise, ArgmaxMarksARowWithANaN) {
  std::mt19937 rng(7);
  auto backend = make_cpu(GetParam(), 2);
  const int64_t n = 3, V = 257;
  HostTensor logits = random_f32(rng, {n, V});
  logits.f()[0 * V + 200] = std::numeric_limits<float>::quiet_NaN();
  logits.f()[2 * V + 0] = std::numeric_limits<float>::quiet_NaN();
  HostTensor out(DType::i32, {n});
  backend->argmax(logits.t, out.t);
  EXPECT_EQ(out.i()[0], -1);
  EXPECT_GE(out.i()[1], 0);
  EXPECT_EQ(out.i()[2], -1);
}

// The log of each row's top softmax probability, against closed forms and a double reference.
TEST_P(CpuElementwise, TopLogprobIsTheLogOfTheLargestProbability) {
  std::mt19937 rng(8);
  auto backend = make_cpu(GetParam(), 2);
  const int64_t n = 4, V = 1003;  // not a multiple of 8 or 16: the vector kernels' tails count
  HostTensor logits = random_f32(rng, {n, V});
  for (int64_t v = 0; v < V; ++v) logits.f()[v] = 2.5f;  // row 0 flat: every token 1 / V
  for (int64_t v = 0; v < V; ++v) logits.f()[V + v] = v < 2 ? std::log(3.0f) * static_cast<float>(v) : -1e30f;
  logits.f()[3 * V + 5] = std::numeric_limits<float>::quiet_NaN();
  HostTensor out(DType::f32, {n});
  backend->top_logprob(logits.t, out.t);
  EXPECT_NEAR(out.f()[0], -std::log(1003.0), 1e-5);
  EXPECT_NEAR(out.f()[1], std::log(0.75), 1e-6);  // probabilities 1/4 and 3/4
  const float* row = logits.f() + 2 * V;
  const double top = *std::max_element(row, row + V);
  double sum = 0;
  for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(row[v]) - top);
  EXPECT_NEAR(out.f()[2], -std::log(sum), 1e-5);
  EXPECT_TRUE(std::isnan(out.f()[3]));
}

// Inputs large enough that the kernels split rows over threads: same bits as one thread.
TEST_P(CpuElementwise, LargeInputsGiveTheSameBitsOnOneOrTwoThreads) {
  const int64_t T = 700, D = 512, heads = 8, hd = 64, V = 3000;
  std::vector<std::vector<float>> results[2];
  for (size_t threads : {1, 2}) {
    std::mt19937 rng(9);
    auto backend = make_cpu(GetParam(), threads);
    auto& res = results[threads - 1];
    HostTensor x = random_f32(rng, {T, D}), y = random_f32(rng, {T, D}), out(DType::f32, {T, D});
    std::vector<float> w_exact;
    HostTensor w = random_weights(rng, DType::bf16, {D}, w_exact);
    backend->rms_norm(x.t, w.t, 1e-6f, out.t);
    res.emplace_back(out.f(), out.f() + out.numel());
    backend->silu_mul(x.t, y.t, out.t);
    res.emplace_back(out.f(), out.f() + out.numel());
    backend->add(x.t, y.t, out.t);
    res.emplace_back(out.f(), out.f() + out.numel());
    HostTensor pos(DType::i32, {T}), inv(DType::f32, {hd / 2});
    for (int64_t t = 0; t < T; ++t) pos.i()[t] = static_cast<int32_t>(t * 3);
    for (int64_t i = 0; i < hd / 2; ++i) inv.f()[i] = static_cast<float>(std::pow(500000.0, -2.0 * i / hd));
    Tensor q = x.t.reshape({T, heads, hd});
    backend->rope(q, pos.t, inv.t, 1.0f);
    res.emplace_back(x.f(), x.f() + x.numel());
    HostTensor table = random_weights(rng, DType::f16, {V, D}, w_exact), ids(DType::i32, {T});
    for (int64_t t = 0; t < T; ++t) ids.i()[t] = static_cast<int32_t>((t * 7919) % V);
    backend->embedding(table.t, ids.t, out.t);
    res.emplace_back(out.f(), out.f() + out.numel());
    HostTensor picks(DType::i32, {T});
    for (int64_t t = 0; t < T; ++t) picks.i()[t] = static_cast<int32_t>((t * 13) % T);
    backend->gather_rows(y.t, picks.t, out.t);
    res.emplace_back(out.f(), out.f() + out.numel());
    HostTensor logits = random_f32(rng, {T, V}), am(DType::i32, {T});
    backend->argmax(logits.t, am.t);
    res.emplace_back(am.i(), am.i() + T);
    for (int64_t t = 0; t < T; ++t) {
      const float* row = logits.f() + t * V;
      ASSERT_EQ(am.i()[t], std::max_element(row, row + V) - row);
    }
  }
  ASSERT_EQ(results[0].size(), results[1].size());
  for (size_t i = 0; i < results[0].size(); ++i) {
    ASSERT_TRUE(same_bits(results[0][i].data(), results[1][i].data(), results[0][i].size())) << "kernel " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, CpuElementwise, ::testing::ValuesIn(cpu_isas()), isa_name);

}  // namespace
}  // namespace specdec::test
