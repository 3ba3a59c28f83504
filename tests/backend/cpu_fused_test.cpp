// The CPU backend's fused calls (linear_many, gated_linear, linear_add, rope_kv_write) against
// the composition of primitive calls they name (Backend's default implementations), bit for bit,
// on every instruction set, at window widths 1..11 and a prefill width, with 1 and 2 threads.
#include <gtest/gtest.h>

#include <array>

#include "cpu_test_util.h"

namespace specdec::test {
namespace {

class CpuFused : public ::testing::TestWithParam<std::string> {};

constexpr std::array<int64_t, 6> kWidths = {1, 2, 4, 7, 11, 40};

HostTensor copy_of(const HostTensor& h) {
  HostTensor c(h.t.dtype, {h.t.numel()});
  std::memcpy(c.t.data, h.t.data, h.t.bytes());
  return c;
}

TEST_P(CpuFused, LinearManyEqualsSeparateLinears) {
  std::mt19937 rng(11);
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (size_t threads : {1, 2}) {
      auto backend = make_cpu(GetParam(), threads);
      const int64_t K = 512;
      std::vector<float> exact;
      // q, k, v shapes of a grouped-query layer plus an odd N that ends inside a register tile.
      std::array<HostTensor, 3> w = {random_weights(rng, dtype, {512, K}, exact),
                                     random_weights(rng, dtype, {128, K}, exact),
                                     random_weights(rng, dtype, {37, K}, exact)};
      HostTensor bias = random_f32(rng, {37});
      for (int64_t M : kWidths) {
        HostTensor x = random_f32(rng, {M, K});
        std::vector<HostTensor> fused, plain;
        std::vector<Projection> fused_p, plain_p;
        for (size_t j = 0; j < w.size(); ++j) {
          const int64_t N = w[j].t.dim(0);
          fused.emplace_back(DType::f32, std::initializer_list<int64_t>{M, N});
          plain.emplace_back(DType::f32, std::initializer_list<int64_t>{M, N});
        }
        for (size_t j = 0; j < w.size(); ++j) {
          const Tensor b = j == 2 ? bias.t : Tensor();
          fused_p.push_back(Projection{Weight(w[j].t), b, fused[j].t});
          plain_p.push_back(Projection{Weight(w[j].t), b, plain[j].t});
        }
        backend->linear_many(x.t, fused_p);
        backend->Backend::linear_many(x.t, plain_p);
        for (size_t j = 0; j < w.size(); ++j) {
          ASSERT_TRUE(same_bits(fused[j].f(), plain[j].f(), static_cast<size_t>(plain[j].numel())))
              << dtype_name(dtype) << " threads=" << threads << " M=" << M << " projection " << j;
        }
      }
    }
  }
}

TEST_P(CpuFused, GatedLinearEqualsLinearsThenSiluMul) {
  std::mt19937 rng(12);
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (size_t threads : {1, 2}) {
      auto backend = make_cpu(GetParam(), threads);
      for (int64_t I : {1024, 100}) {
        const int64_t K = 512;
        std::vector<float> exact;
        HostTensor gate = random_weights(rng, dtype, {I, K}, exact);
        HostTensor up = random_weights(rng, dtype, {I, K}, exact);
        for (int64_t M : kWidths) {
          HostTensor x = random_f32(rng, {M, K});
          HostTensor fused(DType::f32, {M, I}), plain(DType::f32, {M, I});
          backend->gated_linear(x.t, Weight(gate.t), Weight(up.t), fused.t);
          backend->Backend::gated_linear(x.t, Weight(gate.t), Weight(up.t), plain.t);
          ASSERT_TRUE(same_bits(fused.f(), plain.f(), static_cast<size_t>(plain.numel())))
              << dtype_name(dtype) << " threads=" << threads << " M=" << M << " I=" << I;
        }
      }
    }
  }
}

TEST_P(CpuFused, LinearAddEqualsLinearThenAdd) {
  std::mt19937 rng(13);
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (size_t threads : {1, 2}) {
      auto backend = make_cpu(GetParam(), threads);
      for (const auto& [N, K] : {std::pair<int64_t, int64_t>{512, 1024}, {512, 512}, {29, 70}}) {
        std::vector<float> exact;
        HostTensor w = random_weights(rng, dtype, {N, K}, exact);
        HostTensor bias = random_f32(rng, {N});
        for (int64_t M : kWidths) {
          for (bool with_bias : {false, true}) {
            HostTensor x = random_f32(rng, {M, K});
            HostTensor fused = random_f32(rng, {M, N});
            HostTensor plain = copy_of(fused);
            const Tensor plain_out = plain.t.reshape({M, N});
            backend->linear_add(x.t, Weight(w.t), with_bias ? &bias.t : nullptr, fused.t);
            backend->Backend::linear_add(x.t, Weight(w.t), with_bias ? &bias.t : nullptr, plain_out);
            ASSERT_TRUE(same_bits(fused.f(), plain.f(), static_cast<size_t>(plain.numel())))
                << dtype_name(dtype) << " threads=" << threads << " M=" << M << " N=" << N << " K=" << K
                << " bias=" << with_bias;
          }
        }
      }
    }
  }
}

TEST_P(CpuFused, RopeKvWriteEqualsRopesThenKvWrite) {
  std::mt19937 rng(14);
  constexpr int64_t kHeads = 8, kKvHeads = 2, kDim = 64, kBlock = 16, kBlocks = 8;
  HostTensor inv_freq(DType::f32, {kDim / 2});
  for (int64_t i = 0; i < kDim / 2; ++i) inv_freq.f()[i] = std::pow(10000.0f, -2.0f * static_cast<float>(i) / kDim);
  for (size_t threads : {1, 2}) {
    auto backend = make_cpu(GetParam(), threads);
    for (int64_t T : kWidths) {
      // One row whose tokens continue a cache of 5 positions, written to shuffled blocks.
      HostTensor positions(DType::i32, {T}), slots(DType::i32, {T});
      for (int64_t t = 0; t < T; ++t) {
        const int64_t p = 5 + t;
        positions.i()[t] = static_cast<int32_t>(p);
        slots.i()[t] = static_cast<int32_t>(((p / kBlock) * 3 + 1) % kBlocks * kBlock + p % kBlock);
      }
      AttentionBatch batch;
      batch.positions = positions.t;
      batch.slots = slots.t;
      batch.tokens = static_cast<int>(T);
      batch.rows = 1;
      batch.block_size = static_cast<int>(kBlock);
      HostTensor q = random_f32(rng, {T, kHeads, kDim});
      HostTensor k = random_f32(rng, {T, kKvHeads, kDim});
      HostTensor v = random_f32(rng, {T, kKvHeads, kDim});
      HostTensor q2 = copy_of(q), k2 = copy_of(k);
      const Tensor q2v = q2.t.reshape({T, kHeads, kDim}), k2v = k2.t.reshape({T, kKvHeads, kDim});
      HostTensor kp = random_f32(rng, {kBlocks, kBlock, kKvHeads, kDim});
      HostTensor vp = random_f32(rng, {kBlocks, kBlock, kKvHeads, kDim});
      HostTensor kp2 = copy_of(kp), vp2 = copy_of(vp);
      const Tensor kp2v = kp2.t.reshape({kBlocks, kBlock, kKvHeads, kDim});
      const Tensor vp2v = vp2.t.reshape({kBlocks, kBlock, kKvHeads, kDim});
      backend->rope_kv_write(q.t, k.t, v.t, positions.t, inv_freq.t, 1.25f, kp.t, vp.t, batch);
      backend->Backend::rope_kv_write(q2v, k2v, v.t, positions.t, inv_freq.t, 1.25f, kp2v, vp2v, batch);
      const auto n = [](const HostTensor& h) { return static_cast<size_t>(h.numel()); };
      EXPECT_TRUE(same_bits(q.f(), q2.f(), n(q))) << "q, T=" << T << " threads=" << threads;
      EXPECT_TRUE(same_bits(k.f(), k2.f(), n(k))) << "k, T=" << T << " threads=" << threads;
      EXPECT_TRUE(same_bits(kp.f(), kp2.f(), n(kp))) << "k_pool, T=" << T << " threads=" << threads;
      EXPECT_TRUE(same_bits(vp.f(), vp2.f(), n(vp))) << "v_pool, T=" << T << " threads=" << threads;
    }
  }
}

TEST_P(CpuFused, RejectsMismatchedShapes) {
  auto backend = make_cpu(GetParam(), 2);
  std::mt19937 rng(15);
  std::vector<float> exact;
  HostTensor x = random_f32(rng, {3, 64});
  HostTensor gate = random_weights(rng, DType::f32, {32, 64}, exact);
  HostTensor up = random_weights(rng, DType::f32, {16, 64}, exact);
  HostTensor out(DType::f32, {3, 32});
  try {
    backend->gated_linear(x.t, Weight(gate.t), Weight(up.t), out.t);
    FAIL() << "gated_linear accepted w_up [16, 64] for w_gate [32, 64]";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gated_linear"), std::string::npos) << e.what();
  }
  HostTensor w = random_weights(rng, DType::f32, {32, 48}, exact);
  EXPECT_THROW(backend->linear_add(x.t, Weight(w.t), nullptr, out.t), Error);
}

INSTANTIATE_TEST_SUITE_P(Isa, CpuFused, ::testing::ValuesIn(cpu_linear_isas()), isa_name);

}  // namespace
}  // namespace specdec::test
