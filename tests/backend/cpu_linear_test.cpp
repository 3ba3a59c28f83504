// linear on every instruction set this CPU has: against a double-precision reference for f32,
// bf16 and f16 weights at odd sizes, and bit-exact batch invariance (M = 1 vs 7 vs 33 rows,
// 1 vs 2 threads), including the opt-in bf16 dot-product and AMX modes (the AMX tiles' own shapes:
// cpu_amx_test.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

#include "cpu_test_util.h"

namespace specdec::test {
namespace {

class CpuLinear : public ::testing::TestWithParam<std::string> {};

// out[m, n] in double, and the sum of |terms| that bounds the f32 rounding error.
void reference(const float* x, const std::vector<float>& w, const float* bias, int64_t M, int64_t N, int64_t K,
               std::vector<double>& out, std::vector<double>& mag) {
  out.assign(static_cast<size_t>(M * N), 0.0);
  mag.assign(static_cast<size_t>(M * N), 0.0);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double s = bias ? bias[n] : 0.0, a = bias ? std::fabs(bias[n]) : 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = static_cast<double>(x[m * K + k]) * w[static_cast<size_t>(n * K + k)];
        s += p;
        a += std::fabs(p);
      }
      out[static_cast<size_t>(m * N + n)] = s;
      mag[static_cast<size_t>(m * N + n)] = a;
    }
  }
}

TEST_P(CpuLinear, MatchesDoubleReference) {
  std::mt19937 rng(7);
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (int64_t K : {1, 7, 16, 33, 100, 257}) {
      for (int64_t N : {1, 5, 13, 37}) {
        for (int64_t M = 1; M <= 9; ++M) {
          for (bool with_bias : {false, true}) {
            auto backend = make_cpu(GetParam(), 2);
            std::vector<float> w_exact;
            HostTensor w = random_weights(rng, dtype, {N, K}, w_exact);
            HostTensor x = random_f32(rng, {M, K});
            HostTensor bias = random_f32(rng, {N});
            HostTensor out(DType::f32, {M, N});
            backend->linear(x.t, Weight(w.t), with_bias ? &bias.t : nullptr, out.t);
            std::vector<double> ref, mag;
            // The bf16 modes round activations to bf16 before multiplying bf16 weights.
            std::vector<float> x_used(x.f(), x.f() + x.numel());
            if (rounds_activations(GetParam()) && dtype == DType::bf16) {
              for (float& v : x_used) v = bf16_to_f32(f32_to_bf16(v));
            }
            reference(x_used.data(), w_exact, with_bias ? bias.f() : nullptr, M, N, K, ref, mag);
            for (int64_t i = 0; i < M * N; ++i) {
              ASSERT_LE(std::fabs(out.f()[i] - ref[static_cast<size_t>(i)]), 1e-5 * mag[static_cast<size_t>(i)])
                  << dtype_name(dtype) << " M=" << M << " N=" << N << " K=" << K << " at " << i;
            }
          }
        }
      }
    }
  }
}

TEST_P(CpuLinear, RowsAreBitIdenticalWhateverTheBatchAndThreads) {
  std::mt19937 rng(11);
  const int64_t K = 300, N = 203, M = 33;
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    std::vector<float> w_exact;
    HostTensor w = random_weights(rng, dtype, {N, K}, w_exact);
    HostTensor x = random_f32(rng, {M, K});
    HostTensor bias = random_f32(rng, {N});
    for (size_t threads : {1, 2}) {
      auto backend = make_cpu(GetParam(), threads);
      HostTensor full(DType::f32, {M, N});
      backend->linear(x.t, Weight(w.t), &bias.t, full.t);
      // Every row alone.
      for (int64_t m = 0; m < M; ++m) {
        HostTensor one(DType::f32, {1, N});
        backend->linear(x.t.rows(m, 1), Weight(w.t), &bias.t, one.t);
        ASSERT_TRUE(same_bits(one.f(), full.f() + m * N, static_cast<size_t>(N)))
            << dtype_name(dtype) << " row " << m << " threads " << threads;
      }
      // Windows of 4, 5 and 7 rows at every offset, so each row sits at every place of the
      // register tiles (4 and 5 rows take their own tile shapes on some instruction sets); the
      // full 33 rows take the blocked order for many rows on AVX2.
      for (int64_t rows : {4, 5, 7}) {
        for (int64_t m0 = 0; m0 + rows <= M; ++m0) {
          HostTensor window(DType::f32, {rows, N});
          backend->linear(x.t.rows(m0, rows), Weight(w.t), &bias.t, window.t);
          ASSERT_TRUE(same_bits(window.f(), full.f() + m0 * N, static_cast<size_t>(rows * N)))
              << dtype_name(dtype) << " window of " << rows << " at " << m0 << " threads " << threads;
        }
      }
      // Against the single-thread result.
      static std::vector<float> first;
      if (threads == 1) {
        first.assign(full.f(), full.f() + M * N);
      } else {
        ASSERT_TRUE(same_bits(first.data(), full.f(), static_cast<size_t>(M * N))) << dtype_name(dtype);
      }
    }
  }
}

// A weight the backend packs (Backend::pack_weight: the avx512-bf16 linear's row groups, bf16 with
// K a multiple of 32) gives the bits the row-major weight gives, through every call that reads
// weights, at every M, on ragged N (a group cut by the end and by the threads' ranges); the other
// kernels pack nothing.
TEST_P(CpuLinear, PackedWeightsGiveTheBitsOfTheRowMajorOnes) {
  std::mt19937 rng(23);
  const bool packs = GetParam() == "avx512-bf16";
  for (const int64_t K : {int64_t{320}, int64_t{1024}}) {
    const int64_t N = 203;
    std::vector<float> exact;
    HostTensor w = random_weights(rng, DType::bf16, {N, K}, exact);
    HostTensor w2 = random_weights(rng, DType::bf16, {N, K}, exact);
    HostTensor bias = random_f32(rng, {N});
    for (size_t threads : {1, 2}) {
      auto backend = make_cpu(GetParam(), threads);
      const Weight plain(w.t), plain2(w2.t);
      Weight packed(w.t), packed2(w2.t);
      Buffer storage, storage2;
      packed.packed = backend->pack_weight(packed, storage);
      packed2.packed = backend->pack_weight(packed2, storage2);
      ASSERT_EQ(!packed.packed.empty(), packs) << K;
      if (!packs) continue;
      EXPECT_EQ(packed.packed.dim(0), 204);
      for (int64_t M : {1, 2, 3, 4, 5, 8, 9, 12, 33}) {
        HostTensor x = random_f32(rng, {M, K});
        const auto check = [&](const char* call, const std::function<void(const Weight&, const Weight&, Tensor)>& run,
                               bool accumulates) {
          HostTensor a(DType::f32, {M, N}), b(DType::f32, {M, N});
          if (accumulates) {
            for (int64_t i = 0; i < M * N; ++i) a.f()[i] = b.f()[i] = 0.5f;
          }
          run(plain, plain2, a.t);
          run(packed, packed2, b.t);
          EXPECT_TRUE(same_bits(a.f(), b.f(), static_cast<size_t>(M * N)))
              << call << " K " << K << " M " << M << " threads " << threads;
        };
        check(
            "linear", [&](const Weight& u, const Weight&, Tensor out) { backend->linear(x.t, u, &bias.t, out); },
            false);
        check(
            "linear_add",
            [&](const Weight& u, const Weight&, Tensor out) { backend->linear_add(x.t, u, &bias.t, out); }, true);
        check(
            "gated_linear",
            [&](const Weight& u, const Weight& v, Tensor out) { backend->gated_linear(x.t, u, v, out); }, false);
        // Two projections of one x: the second's columns start mid-way through a thread's range.
        HostTensor second_a(DType::f32, {M, N}), second_b(DType::f32, {M, N});
        check(
            "linear_many",
            [&](const Weight& u, const Weight& v, Tensor out) {
              const Tensor other = u.packed.empty() ? second_a.t : second_b.t;
              const Projection p[2] = {{u, bias.t, out}, {v, Tensor(), other}};
              backend->linear_many(x.t, p);
            },
            false);
        EXPECT_TRUE(same_bits(second_a.f(), second_b.f(), static_cast<size_t>(M * N)))
            << "linear_many's second K " << K << " M " << M << " threads " << threads;
      }
    }
  }
}

TEST(CpuLinearPacked, RefusesAPackedWeightOfAnotherShape) {
  const std::vector<std::string> isas = cpu_linear_isas();
  if (std::find(isas.begin(), isas.end(), "avx512-bf16") == isas.end()) GTEST_SKIP() << "no AVX-512 BF16";
  std::mt19937 rng(5);
  std::vector<float> exact;
  HostTensor w = random_weights(rng, DType::bf16, {8, 64}, exact);
  HostTensor other = random_weights(rng, DType::bf16, {12, 64}, exact);
  auto backend = make_cpu("avx512-bf16", 1);
  Weight other_packed(other.t);
  Buffer storage;
  Weight wrong(w.t);
  wrong.packed = backend->pack_weight(other_packed, storage);
  HostTensor x = random_f32(rng, {2, 64});
  HostTensor out(DType::f32, {2, 8});
  try {
    backend->linear(x.t, wrong, nullptr, out.t);
    ADD_FAILURE() << "a packed weight of 12 rows read for 8";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not pack"), std::string::npos) << e.what();
  }
}

TEST_P(CpuLinear, RefusesBadShapesAndAliasing) {
  auto backend = make_cpu(GetParam(), 1);
  HostTensor x(DType::f32, {2, 8}), w(DType::f32, {4, 9}), out(DType::f32, {2, 4});
  EXPECT_THROW(backend->linear(x.t, Weight(w.t), nullptr, out.t), Error);
  HostTensor w2(DType::f32, {8, 8});
  EXPECT_THROW(backend->linear(x.t, Weight(w2.t), nullptr, x.t), Error);
  HostTensor wi(DType::i32, {4, 8});
  EXPECT_THROW(backend->linear(x.t, Weight(wi.t), nullptr, out.t), Error);
}

INSTANTIATE_TEST_SUITE_P(Isa, CpuLinear, ::testing::ValuesIn(cpu_linear_isas()), isa_name);

}  // namespace
}  // namespace specdec::test
