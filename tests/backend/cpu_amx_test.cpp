// The opt-in AMX linear ("amx") on the shapes its tiles take (K a multiple of 32, N not a multiple
// of 16): against a double-precision reference of the bf16-rounded inputs, and bit-identical rows
// whatever the batch width, the row's place in a tile, the thread count and the N slices; shapes
// it does not take must give the avx512-bf16 linear's bits. Skipped on CPUs without AMX, where
// asking for it must fail.
#include <gtest/gtest.h>

#include <iterator>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/cpu_ops.h"
#include "cpu_test_util.h"

namespace specdec::test {
namespace {

class CpuAmx : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cpu_has_amx()) GTEST_SKIP() << "this CPU lacks AMX";
  }
};

TEST(CpuAmxSupport, RefusedWithoutAmx) {
  if (cpu_has_amx()) GTEST_SKIP() << "this CPU has AMX";
  EXPECT_THROW(make_cpu("amx", 1), Error);
}

// Every element of x rounded to bf16 and back, as linear does before the tiles.
std::vector<float> rounded(const HostTensor& x) {
  std::vector<float> r(x.f(), x.f() + x.numel());
  for (float& v : r) v = bf16_to_f32(f32_to_bf16(v));
  return r;
}

TEST_F(CpuAmx, MatchesDoubleReferenceOfTheRoundedInputs) {
  std::mt19937 rng(5);
  auto backend = make_cpu("amx", 2);
  double worst = 0;
  for (int64_t K : {32, 96, 512, 1024}) {
    for (int64_t N : {1, 15, 16, 17, 64, 100, 203}) {
      std::vector<float> w_exact;
      HostTensor w = random_weights(rng, DType::bf16, {N, K}, w_exact);
      HostTensor bias = random_f32(rng, {N});
      for (int64_t M : {1, 2, 5, 15, 16, 17, 20, 33}) {
        HostTensor x = random_f32(rng, {M, K});
        const std::vector<float> xr = rounded(x);
        for (bool with_bias : {false, true}) {
          HostTensor out(DType::f32, {M, N});
          backend->linear(x.t, Weight(w.t), with_bias ? &bias.t : nullptr, out.t);
          // Products of two bf16 are exact in f32; the K sums and the bias add round in f32: at
          // most gamma(K + 1) = (K + 1) u / (1 - (K + 1) u) of the sum of |terms|, u = 2^-24.
          const double u = std::ldexp(1.0, -24), gamma = (K + 1) * u / (1 - (K + 1) * u);
          for (int64_t m = 0; m < M; ++m) {
            for (int64_t n = 0; n < N; ++n) {
              double s = with_bias ? bias.f()[n] : 0.0, mag = with_bias ? std::fabs(bias.f()[n]) : 0.0;
              for (int64_t k = 0; k < K; ++k) {
                const double p =
                    static_cast<double>(xr[static_cast<size_t>(m * K + k)]) * w_exact[static_cast<size_t>(n * K + k)];
                s += p;
                mag += std::fabs(p);
              }
              const double err = std::fabs(out.f()[m * N + n] - s);
              worst = std::max(worst, err / mag);
              ASSERT_LE(err, gamma * mag) << "M=" << M << " N=" << N << " K=" << K << " at " << m << ", " << n;
            }
          }
        }
      }
    }
  }
  std::printf("[measure] worst |error| / sum |terms| = %.3g\n", worst);
}

// Runs the amx table's linear straight over [0, N) cut at `cuts`, as threads would split it.
void linear_in_slices(const HostTensor& x, const HostTensor& w, const HostTensor& bias, const HostTensor& out,
                      std::vector<int64_t> cuts) {
  Buffer x_bf16;
  const cpu::LinearArgs a = cpu::linear_args(cpu::amx_kernels(), x.t, Weight(w.t), &bias.t, out.t, "linear", x_bf16);
  cuts.insert(cuts.begin(), 0);
  cuts.push_back(a.N);
  for (size_t i = 0; i + 1 < cuts.size(); ++i) cpu::amx_kernels().linear(a, cuts[i], cuts[i + 1]);
}

TEST_F(CpuAmx, RowsAreBitIdenticalWhateverTheBatchThreadsAndSlices) {
  std::mt19937 rng(13);
  const int64_t rows = 40;
  // N = 203 ends in a short block; K = 300 is not a multiple of 32 (the fallback).
  for (auto [N, K] : {std::pair<int64_t, int64_t>{203, 512}, {37, 96}, {64, 1024}, {203, 300}}) {
    std::vector<float> w_exact;
    HostTensor w = random_weights(rng, DType::bf16, {N, K}, w_exact);
    HostTensor x = random_f32(rng, {rows, K});
    HostTensor bias = random_f32(rng, {N});
    HostTensor full(DType::f32, {rows, N});
    make_cpu("amx", 1)->linear(x.t, Weight(w.t), &bias.t, full.t);
    for (size_t threads : {1, 2}) {
      auto backend = make_cpu("amx", threads);
      for (int64_t M : {1, 2, 3, 5, 15, 16, 17, 20, 33, 40}) {
        for (int64_t m0 : {int64_t{0}, int64_t{1}, int64_t{3}, rows - M}) {
          if (m0 + M > rows) continue;
          HostTensor window(DType::f32, {M, N});
          backend->linear(x.t.rows(m0, M), Weight(w.t), &bias.t, window.t);
          ASSERT_TRUE(same_bits(window.f(), full.f() + m0 * N, static_cast<size_t>(M * N)))
              << "N=" << N << " K=" << K << ": " << M << " rows at " << m0 << ", " << threads << " threads";
        }
      }
    }
    // N slices that start inside a 16-row block and end inside the short last one.
    make_cpu("amx", 1);  // the tile state, before the table is called directly
    for (int64_t M : {1, 4, 17, 40}) {
      HostTensor sliced(DType::f32, {M, N});
      HostTensor xm(DType::f32, {M, K});
      std::memcpy(xm.f(), x.f(), static_cast<size_t>(M * K) * sizeof(float));
      for (const std::vector<int64_t>& cuts : {std::vector<int64_t>{5}, {16, 21}, {1, 2, 3, 35, 36}}) {
        std::fill(sliced.f(), sliced.f() + M * N, 0.0f);
        linear_in_slices(xm, w, bias, sliced, cuts);
        ASSERT_TRUE(same_bits(sliced.f(), full.f(), static_cast<size_t>(M * N)))
            << "N=" << N << " K=" << K << " M=" << M << " sliced at " << cuts[0];
      }
    }
  }
}

TEST_F(CpuAmx, WeightsOffTheirCacheLinesGiveTheSameBits) {
  // Safetensors files put tensors on 8-byte boundaries: the kernel stages such rows through an
  // aligned copy, which must change nothing.
  std::mt19937 rng(19);
  auto backend = make_cpu("amx", 2);
  for (auto [N, K] : {std::pair<int64_t, int64_t>{203, 512}, {48, 96}}) {
    std::vector<float> w_exact;
    HostTensor w = random_weights(rng, DType::bf16, {N, K}, w_exact);
    HostTensor x = random_f32(rng, {20, K});
    HostTensor bias = random_f32(rng, {N});
    for (size_t offset : {2, 8, 62}) {
      Buffer shifted = Buffer::host(w.t.bytes() + 64);
      std::memcpy(static_cast<char*>(shifted.data()) + offset, w.t.data, w.t.bytes());
      const Tensor w_off(static_cast<char*>(shifted.data()) + offset, DType::bf16, {N, K});
      for (int64_t M : {1, 5, 20}) {
        HostTensor a(DType::f32, {M, N}), b(DType::f32, {M, N});
        backend->linear(x.t.rows(0, M), Weight(w.t), &bias.t, a.t);
        backend->linear(x.t.rows(0, M), Weight(w_off), &bias.t, b.t);
        ASSERT_TRUE(same_bits(a.f(), b.f(), static_cast<size_t>(M * N)))
            << "N=" << N << " K=" << K << " M=" << M << " offset " << offset;
      }
    }
  }
}

TEST_F(CpuAmx, PacksActivationsAsTheScalarRoundingInTheTileLayout) {
  std::mt19937 rng(3);
  // Ties to even both ways, the largest finite value (rounds to inf), infinities, NaNs, denormals.
  const float specials[] = {1.00390625f,   1.01171875f,    -1.00390625f, 3.4028235e38f, INFINITY, -INFINITY,
                            std::nanf(""), -std::nanf(""), 1e-40f,       -1e-45f,       0.0f,     -0.0f};
  for (int64_t K : {32, 64, 96}) {
    for (int64_t M : {1, 2, 3, 4, 5, 16, 17, 21}) {
      std::vector<float> x(static_cast<size_t>(M * K));
      for (size_t i = 0; i < x.size(); ++i) x[i] = i % 5 == 0 ? specials[(i / 5) % std::size(specials)] : nonzero(rng);
      std::vector<uint16_t> rows(static_cast<size_t>(M * K)),
          tiles(static_cast<size_t>(cpu::tile_activation_elements(M, K)));
      cpu::amx_kernels().pack_bf16(x.data(), M, K, rows.data(), tiles.data());
      for (int64_t m = 0; m < M; ++m) {
        const int64_t b0 = m / 16 * 16, T = std::min<int64_t>(16, M - b0), t = m - b0;
        for (int64_t k = 0; k < K; ++k) {
          const uint16_t want = f32_to_bf16(x[static_cast<size_t>(m * K + k)]);
          ASSERT_EQ(rows[static_cast<size_t>(m * K + k)], want) << "M=" << M << " K=" << K << " at " << m << ", " << k;
          // Block b0 / 16 at b0 K; chunk k / 32 of T × 32; [pair][token][2].
          const int64_t at = b0 * K + k / 32 * T * 32 + (k % 32) / 2 * 2 * T + 2 * t + k % 2;
          ASSERT_EQ(tiles[static_cast<size_t>(at)], want)
              << "tile layout, M=" << M << " K=" << K << " at " << m << ", " << k;
        }
      }
    }
  }
}

TEST_F(CpuAmx, ShapesWithoutTilesTakeTheAvx512Bf16Linear) {
  std::mt19937 rng(17);
  auto amx = make_cpu("amx", 2), bf16 = make_cpu("avx512-bf16", 2);
  for (DType dtype : {DType::bf16, DType::f32, DType::f16}) {
    for (int64_t K : {100, 300, 512}) {
      if (dtype == DType::bf16 && K % 32 == 0) continue;  // the tiles' own shape
      std::vector<float> w_exact;
      HostTensor w = random_weights(rng, dtype, {45, K}, w_exact);
      HostTensor x = random_f32(rng, {9, K});
      HostTensor a(DType::f32, {9, 45}), b(DType::f32, {9, 45});
      amx->linear(x.t, Weight(w.t), nullptr, a.t);
      bf16->linear(x.t, Weight(w.t), nullptr, b.t);
      EXPECT_TRUE(same_bits(a.f(), b.f(), 9 * 45)) << dtype_name(dtype) << " K=" << K;
    }
  }
}

}  // namespace
}  // namespace specdec::test
