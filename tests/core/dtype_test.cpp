// DType conversions: exhaustive f16 round trip, bf16 rounding, fp8 saturation.
#include <gtest/gtest.h>
#include <vector>
#include <cstring>
#include <bit>

#include <cmath>

#include "core/dtype.h"
#include "core/status.h"

namespace kiln {

TEST(DType, F16RoundTripIsExactForEveryFiniteValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;  // inf / NaN
    float f = f16_to_f32(uint16_t(h));
    EXPECT_EQ(f32_to_f16(f), h) << "bits " << h;
  }
}

TEST(DType, F16KnownValues) {
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(f32_to_f16(1e6f), 0x7c00);           // overflow -> inf
  EXPECT_EQ(f32_to_f16(1.0f + 1.0f / 2048), 0x3c00);  // tie -> even
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(NAN))));
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125 -> even (1.0)
  EXPECT_EQ(f32_to_bf16(1.0f + 1.0f / 256), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + 3.0f / 256), 0x3f82);
}

TEST(DType, Fp8E4M3) {
  EXPECT_EQ(fp8e4m3_to_f32(f32_to_fp8e4m3(1.0f)), 1.0f);
  EXPECT_EQ(fp8e4m3_to_f32(f32_to_fp8e4m3(1000.0f)), 448.0f);  // saturates
  EXPECT_EQ(fp8e4m3_to_f32(f32_to_fp8e4m3(-0.5f)), -0.5f);
  EXPECT_TRUE(std::isnan(fp8e4m3_to_f32(0x7f)));
}

TEST(DType, NamesParse) {
  EXPECT_EQ(dtype_from_name("bfloat16"), DType::kBF16);
  EXPECT_EQ(dtype_from_name("F16"), DType::kF16);
  EXPECT_THROW(dtype_from_name("complex64"), Error);
  EXPECT_EQ(dtype_size(DType::kI64), 8u);
}

TEST(DType, ConvertBulk) {
  float src[4] = {1.5f, -2.25f, 0.0f, 3.0f};
  uint16_t half[4];
  float back[4];
  dtype_convert(src, DType::kF32, half, DType::kF16, 4);
  dtype_convert(half, DType::kF16, back, DType::kF32, 4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(back[i], src[i]);
  int64_t ids[2] = {7, -3};
  int32_t ids32[2];
  dtype_convert(ids, DType::kI64, ids32, DType::kI32, 2);
  EXPECT_EQ(ids32[0], 7);
  EXPECT_EQ(ids32[1], -3);
}

// Between f32, bf16 and f16 every conversion rounds as the element functions do (round to
// nearest even; NaN, infinities, subnormals, overflow), whichever pair is asked.
TEST(DType, ConvertBetweenFloatsRoundsAsTheElementFunctions) {
  std::vector<float> f = {0.0f, -0.0f, 1.0f / 3, -7.5e-3f, 65504.0f, 70000.0f, -1e30f, 3e-39f, 6e-8f, 1e-9f,
                          1.00390625f, 1.0029296875f, INFINITY, -INFINITY, NAN};
  for (uint32_t i = 0; i < 2000; ++i) f.push_back(std::ldexp(float(i * 2654435761u % 100003) / 100003.f - 0.5f, int(i % 60) - 30));
  const size_t n = f.size();
  std::vector<uint16_t> bf(n), hf(n);
  for (size_t i = 0; i < n; ++i) bf[i] = f32_to_bf16(f[i]), hf[i] = f32_to_f16(f[i]);
  struct Typed {
    DType d;
    const void* data;
  };
  // What element i of `from` becomes in `to`, through the scalar functions.
  auto want = [&](DType from, DType to, size_t i) -> uint32_t {
    const float v = from == DType::kF32 ? f[i] : from == DType::kBF16 ? bf16_to_f32(bf[i]) : f16_to_f32(hf[i]);
    if (to == DType::kF32) return f32_bits(v);
    return to == DType::kBF16 ? f32_to_bf16(v) : f32_to_f16(v);
  };
  for (Typed from : {Typed{DType::kF32, f.data()}, Typed{DType::kBF16, bf.data()}, Typed{DType::kF16, hf.data()}})
    for (DType to : {DType::kF32, DType::kBF16, DType::kF16}) {
      std::vector<uint8_t> out(n * dtype_size(to));
      dtype_convert(from.data, from.d, out.data(), to, n);
      for (size_t i = 0; i < n; ++i) {
        uint32_t got = 0;
        std::memcpy(&got, out.data() + i * dtype_size(to), dtype_size(to));
        const uint32_t w = want(from.d, to, i);
        const bool nan = to == DType::kF32 ? std::isnan(std::bit_cast<float>(got)) : (got & 0x7fff) > (to == DType::kBF16 ? 0x7f80u : 0x7c00u);
        if (std::isnan(f[i])) EXPECT_TRUE(nan) << dtype_name(from.d) << " -> " << dtype_name(to) << " NaN";
        else ASSERT_EQ(got, w) << dtype_name(from.d) << " -> " << dtype_name(to) << " element " << i << " (" << f[i] << ")";
      }
    }
}

}  // namespace kiln
