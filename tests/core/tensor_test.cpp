// Tensor allocation, alignment, views, reshape and conversion.
#include <gtest/gtest.h>

#include "core/shape.h"
#include "core/tensor.h"

namespace kiln {

TEST(Tensor, OwningIsAlignedAndZeroed) {
  Tensor t(DType::kF32, {3, 5});
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % kTensorAlignment, 0u);
  EXPECT_EQ(t.numel(), 15);
  EXPECT_EQ(t.nbytes(), 60u);
  for (int i = 0; i < 15; ++i) EXPECT_EQ(t.data_as<float>()[i], 0.0f);
}

// Large tensors take their own mapping (no memset): still zeroed, aligned, writable, each
// one separate, converted like any other, and unmapped when the last owner goes.
TEST(Tensor, LargeOwningIsZeroedAlignedAndIndependent) {
  for (int round = 0; round < 8; ++round) {
    Tensor a(DType::kF32, {3, 1 << 21}), b(DType::kF32, {3, 1 << 21});
    ASSERT_EQ(reinterpret_cast<uintptr_t>(a.data()) % kTensorAlignment, 0u);
    const float* pa = a.data_as<float>();
    for (int64_t i = 0; i < a.numel(); i += 4099) ASSERT_EQ(pa[i], 0.0f) << i;
    ASSERT_EQ(pa[a.numel() - 1], 0.0f);
    a.data_as<float>()[a.numel() - 1] = 7.0f;
    a.data_as<float>()[0] = 3.0f;
    EXPECT_EQ(b.data_as<float>()[0], 0.0f);
    EXPECT_EQ(b.data_as<float>()[b.numel() - 1], 0.0f);
    Tensor c = a.to(DType::kF16);
    EXPECT_EQ(c.nbytes(), a.nbytes() / 2);
    EXPECT_EQ(c.to(DType::kF32).data_as<float>()[a.numel() - 1], 7.0f);
  }
}

TEST(Tensor, SliceRowsSharesMemory) {
  Tensor t(DType::kF32, {4, 2});
  for (int i = 0; i < 8; ++i) t.data_as<float>()[i] = float(i);
  Tensor s = t.slice_rows(1, 3);
  EXPECT_EQ(s.dim(0), 2);
  EXPECT_EQ(s.data_as<float>()[0], 2.0f);
  s.data_as<float>()[0] = 42.0f;
  EXPECT_EQ(t.data_as<float>()[2], 42.0f);
  EXPECT_EQ(t.reshape({8}).dim(0), 8);
}

TEST(Tensor, ConvertsDtype) {
  Tensor t(DType::kF32, {2});
  t.data_as<float>()[0] = 1.0f;
  t.data_as<float>()[1] = -0.5f;
  Tensor h = t.to(DType::kBF16);
  Tensor back = h.to(DType::kF32);
  EXPECT_EQ(back.data_as<float>()[1], -0.5f);
  EXPECT_EQ(back.shape_str(), "[2]");
}

TEST(Shape, SymbolicDims) {
  Shape s{"T", 768};
  EXPECT_FALSE(s.is_concrete());
  EXPECT_EQ(s.str(), "[T, 768]");
  Shape c = Shape::concrete({2, 3});
  EXPECT_EQ(c.numel(), 6);
}

}  // namespace kiln
