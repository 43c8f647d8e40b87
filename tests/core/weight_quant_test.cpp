// The shared q8/q4 formats (core/weight_quant.h): dequantized values stay within half a
// step of the weights, values already on the grid come back exactly (codes, f16 scales,
// row factor), rows of tiny weights keep their precision through the row factor, and
// bad shapes are kiln::Errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "core/weight_quant.h"

namespace kiln {
namespace {

float dequant(const QuantizedRows& q, int64_t r, int64_t i) {
  const int64_t g = i / kQuantGroup, gi = r * q.groups() + g;
  const uint8_t* codes = q.codes.get() + size_t(r) * quant_row_code_bytes(q.format, q.k);
  const float s = f16_to_f32(q.scales[size_t(gi)]), m = q.mins ? f16_to_f32(q.mins[size_t(gi)]) : 0.0f;
  return q.row_factor[r] * (s * float(quant_code(q.format, codes, i)) + m);
}

void expect_within_half_step(const std::vector<float>& w, int64_t n, int64_t k, QuantFormat f) {
  QuantizedRows q = quantize_rows(w.data(), n, k, f);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < k; ++i) {
      const int64_t gi = r * q.groups() + i / kQuantGroup;
      const double step = double(f16_to_f32(q.scales[size_t(gi)])) * q.row_factor[r];
      const double want = w[size_t(r * k + i)], got = dequant(q, r, i);
      // Half a step, plus the f16 rounding of the min (q4) and of the scale at the extreme code.
      const double tol = 0.5 * step * (1 + 1e-3) + std::fabs(want) * 1e-3;
      ASSERT_LE(std::fabs(got - want), tol) << quant_format_name(f) << " row " << r << " element " << i;
    }
}

TEST(WeightQuant, DequantizedWithinHalfAStep) {
  std::mt19937 rng(1);
  for (float mag : {1.0f, 0.02f, 1e-30f, 3e30f}) {
    std::normal_distribution<float> d(0.0f, mag);
    std::vector<float> w(size_t(5 * 96));
    for (float& v : w) v = d(rng);
    for (QuantFormat f : {QuantFormat::kQ8, QuantFormat::kQ4}) expect_within_half_step(w, 5, 96, f);
  }
}

// Weights built as F * (s * q + m) with f16-exact s, m and every group using the extreme
// codes: quantizing them gives back the same codes and scales (what makes a GGUF Q8_0 /
// Q4_1 tensor, or the same weights on two backends, the same quantized weights).
TEST(WeightQuant, GridValuesRoundTripExactly) {
  std::mt19937 rng(2);
  const int64_t k = 64;
  for (QuantFormat f : {QuantFormat::kQ8, QuantFormat::kQ4}) {
    const bool q8 = f == QuantFormat::kQ8;
    std::vector<float> w(static_cast<size_t>(k));
    std::vector<int> codes(static_cast<size_t>(k));
    std::vector<float> s = {0.25f, 0.1875f}, m = {-1.5f, 0.75f};
    for (int64_t i = 0; i < k; ++i) {
      const int64_t g = i / 32;
      int c = q8 ? int(rng() % 255) - 127 : int(rng() % 16);
      if (i % 32 == 0) c = q8 ? -127 : 0;
      if (i % 32 == 1 && !q8) c = 15;
      codes[size_t(i)] = c;
      w[size_t(i)] = 0x1p-20f * (s[size_t(g)] * float(c) + (q8 ? 0.0f : m[size_t(g)]));
    }
    QuantizedRows q = quantize_rows(w.data(), 1, k, f);
    for (int64_t i = 0; i < k; ++i) {
      EXPECT_EQ(quant_code(f, q.codes.get(), i), codes[size_t(i)]) << quant_format_name(f) << " element " << i;
      EXPECT_EQ(dequant(q, 0, i), w[size_t(i)]) << quant_format_name(f) << " element " << i;
    }
  }
}

TEST(WeightQuant, LayoutZerosAndErrors) {
  std::vector<float> w(32, 0.0f);
  w[2] = 1.0f;
  w[3] = 8.0f / 15.0f;  // code 8 on the 8-bit grid's scale too (1/15 rounded to 137 * 2^7 / 2^18)
  QuantizedRows q4 = quantize_rows(w.data(), 1, 32, QuantFormat::kQ4);
  EXPECT_EQ(q4.codes[1], uint8_t(15 | (8 << 4)));  // elements 2 (low nibble) and 3 (high) of byte 1
  std::vector<float> zeros(64, 0.0f);
  for (QuantFormat f : {QuantFormat::kQ8, QuantFormat::kQ4}) {
    QuantizedRows z = quantize_rows(zeros.data(), 2, 32, f);
    EXPECT_EQ(z.row_factor[0], 1.0f);
    for (int64_t i = 0; i < 32; ++i) EXPECT_EQ(dequant(z, 1, i), 0.0f);  // scale 0, no NaN
  }
  EXPECT_THROW(quantize_rows(zeros.data(), 1, 48, QuantFormat::kQ4), Error);
  EXPECT_THROW(quantize_rows(zeros.data(), 0, 32, QuantFormat::kQ8), Error);
}

// The row image (how a weight kept quantized travels in the graph) gives back every
// code, scale, min and row factor, and stacks along N by concatenation.
TEST(WeightQuant, RowImageRoundTripsAndStacks) {
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.f, 0.05f);
  const int64_t n = 5, k = 96;
  std::vector<float> w(size_t(n * k));
  for (float& v : w) v = nd(rng);
  for (QuantFormat f : {QuantFormat::kQ8, QuantFormat::kQ4}) {
    const QuantizedRows q = quantize_rows(w.data(), n, k, f);
    const size_t row = quant_image_row_bytes(f, k);
    EXPECT_EQ(row, quant_row_code_bytes(f, k) + size_t(k / 32) * (f == QuantFormat::kQ4 ? 4 : 2) + 4);
    std::vector<uint8_t> img(size_t(n) * row);
    quant_rows_to_image(q, img.data());
    // Rows 2..4 alone: the image's tail is their image.
    const QuantizedRows back = quant_rows_from_image(img.data(), n, k, f), tail = quant_rows_from_image(img.data() + 2 * row, 3, k, f);
    const size_t cb = quant_row_code_bytes(f, k), g = size_t(k / 32);
    EXPECT_EQ(0, std::memcmp(back.codes.get(), q.codes.get(), size_t(n) * cb));
    EXPECT_EQ(0, std::memcmp(back.scales.get(), q.scales.get(), size_t(n) * g * 2));
    if (f == QuantFormat::kQ4) EXPECT_EQ(0, std::memcmp(back.mins.get(), q.mins.get(), size_t(n) * g * 2));
    EXPECT_EQ(0, std::memcmp(back.row_factor.get(), q.row_factor.get(), size_t(n) * 4));
    EXPECT_EQ(0, std::memcmp(tail.codes.get(), q.codes.get() + 2 * cb, 3 * cb));
    EXPECT_EQ(0, std::memcmp(tail.row_factor.get(), q.row_factor.get() + 2, 3 * 4));
  }
  EXPECT_EQ(quant_format_from_name("q4", "x"), QuantFormat::kQ4);
  EXPECT_THROW(quant_format_from_name("q5", "x"), Error);
  std::vector<uint8_t> img(64);
  EXPECT_THROW(quant_rows_from_image(img.data(), 1, 40, QuantFormat::kQ8), Error);
}

// q4's 8-bit grid: every scale an integer 0..255 and every min an integer -127..127 times its
// super-group's powers of two (the smallest that hold its values), found back from the
// stored f16 values by q4_super_exps; rows of very different magnitudes, a shorter last
// super-group (K = 320: 8 + 2 groups), an all-zero row. Free f16 values are not on it.
TEST(WeightQuant, Q4ScalesLieOnTheirSuperGroupsGrid) {
  const int64_t n = 6, k = 320, groups = k / 32;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  std::vector<float> w(size_t(n * k));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < k; ++i)
      w[size_t(r * k + i)] =
          r == 3 ? 0.0f : std::ldexp(nd(rng), int(r * 9) - 20) * (i < 64 ? 8.0f : 1.0f);
  const QuantizedRows q = quantize_rows(w.data(), n, k, QuantFormat::kQ4);
  std::vector<QuantSuperExp> e(size_t(quant_super_groups(k)));
  ASSERT_EQ(e.size(), 2u);
  double err2 = 0, ref2 = 0;
  for (int64_t r = 0; r < n; ++r) {
    const uint16_t* s = q.scales.get() + r * groups;
    const uint16_t* m = q.mins.get() + r * groups;
    ASSERT_TRUE(q4_super_exps(s, m, groups, e.data())) << "row " << r;
    for (int64_t g = 0; g < groups; ++g) {
      const QuantSuperExp& x = e[size_t(g / kQ4SuperGroups)];
      const float sc = std::ldexp(f16_to_f32(s[g]), -x.scale),
                  mc = std::ldexp(f16_to_f32(m[g]), -x.min);
      EXPECT_EQ(sc, std::nearbyint(sc));
      EXPECT_LE(sc, 255.0f);
      EXPECT_GE(sc, r == 3 ? 0.0f : 1.0f);
      EXPECT_EQ(mc, std::nearbyint(mc));
      EXPECT_LE(std::fabs(mc), 127.0f);
    }
    // The largest scale of a super-group uses the top half of its codes (the exponent is the
    // smallest).
    if (r != 3)
      for (int64_t sg = 0; sg < 2; ++sg) {
        float top = 0;
        for (int64_t g = sg * 8; g < std::min<int64_t>(groups, sg * 8 + 8); ++g)
          top = std::max(top, f16_to_f32(s[g]));
        EXPECT_GE(std::ldexp(top, -e[size_t(sg)].scale), 128.0f)
            << "row " << r << " super-group " << sg;
      }
    std::vector<float> back(static_cast<size_t>(k));
    dequantize_rows(q, r, r + 1, back.data());
    for (int64_t i = 0; i < k; ++i) {
      err2 += std::pow(double(back[size_t(i)]) - w[size_t(r * k + i)], 2) /
              std::ldexp(1.0, int(r * 18) - 40);
      ref2 += std::pow(double(w[size_t(r * k + i)]), 2) / std::ldexp(1.0, int(r * 18) - 40);
    }
  }
  // About q4's rounding error: ~1/10 of the values' RMS for normal values in groups of 32.
  EXPECT_LT(std::sqrt(err2 / ref2), 0.15);
  // Free f16 values (a GGUF's): 1/3 of an f16 unit is no integer times a power of two in range.
  std::vector<uint16_t> s(size_t(groups), f32_to_f16(1.0f / 3.0f)),
      m(size_t(groups), f32_to_f16(-0.3f));
  EXPECT_FALSE(q4_super_exps(s.data(), m.data(), groups, e.data()));
  // The same weights on free scales: the f16 values of before the grid, which it mostly is not.
  q4_free_scales_set(true);
  const QuantizedRows f = quantize_rows(w.data(), n, k, QuantFormat::kQ4);
  q4_free_scales_set(false);
  int on_grid = 0;
  for (int64_t r = 0; r < n; ++r)
    on_grid +=
        q4_super_exps(f.scales.get() + r * groups, f.mins.get() + r * groups, groups, e.data());
  EXPECT_LE(on_grid, 1) << "only the all-zero row";
}

}  // namespace
}  // namespace kiln
