// Weight: a dense weight is its tensor (shape, dtype, bytes); a block-quantized one reports its
// logical [N, K] and the bytes of its codes plus its scales, and kernels that read only dense
// weights refuse it by name.
#include "core/weight.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace specdec {
namespace {

TEST(Weight, DenseIsItsTensor) {
  std::vector<uint16_t> values(6 * 8);
  const Tensor t(values.data(), DType::bf16, {6, 8});
  const Weight w(t);
  EXPECT_FALSE(w.quantized());
  EXPECT_EQ(w.dtype, DType::bf16);
  EXPECT_EQ(w.rows(), 6);
  EXPECT_EQ(w.cols(), 8);
  EXPECT_EQ(w.bytes(), t.bytes());
  EXPECT_EQ(w.dense("linear").data, t.data);
  EXPECT_TRUE(Weight().empty());
}

TEST(Weight, QuantizedCountsCodesAndScales) {
  // [64, 256] in 4-bit codes, packed eight to an i32 word, with one f16 scale per 32 columns.
  std::vector<int32_t> codes(64 * 256 / 8);
  std::vector<uint16_t> scales(64 * 256 / 32);
  Weight w;
  w.data = Tensor(codes.data(), DType::i32, {64, 256 / 8});
  w.dtype = DType::i32;  // stands in for a 4-bit code type
  w.scales = Tensor(scales.data(), DType::f16, {64, 256 / 32});
  w.group_size = 32;
  EXPECT_TRUE(w.quantized());
  EXPECT_EQ(w.rows(), 64);
  EXPECT_EQ(w.cols(), 256);
  EXPECT_EQ(w.bytes(), 64u * 256 / 2 + 64u * 8 * 2);
  try {
    w.dense("linear");
    FAIL() << "a quantized weight was read as dense";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("linear"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("quantized"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace specdec
