// FP8 E4M3 conversions against independent references: the decoding formula of the OCP
// FP8 spec (ldexp), a brute-force nearest-value search for encoding (ties to the even
// code), and the spec's special cases (saturation to +-448, NaN, signed zero,
// subnormals); plus the per-tensor scaling helpers of core/fp8.h.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/fp8.h"

namespace kiln {
namespace {

// The spec's value of a code: (-1)^s * 2^(e-7) * (1 + m/8), subnormals 2^-6 * m/8.
double spec_value(uint8_t c) {
  const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  const double mag = e == 0 ? std::ldexp(double(m) / 8.0, -6) : std::ldexp(1.0 + double(m) / 8.0, e - 7);
  return s ? -mag : mag;
}

// Nearest finite E4M3 value by exhaustive search (ties: the even code), saturating.
uint8_t brute_force_encode(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  const double a = std::fabs(double(f));
  if (a >= 448) return sign | 0x7e;
  uint8_t best = 0;
  double best_err = INFINITY;
  for (int c = 0; c < 0x7f; ++c) {
    const double err = std::fabs(spec_value(uint8_t(c)) - a);
    if (err < best_err || (err == best_err && (c & 1) == 0)) best = uint8_t(c), best_err = err;
  }
  return sign | best;
}

TEST(Fp8E4M3, DecodesEveryCodeAsTheSpec) {
  for (int c = 0; c < 256; ++c) {
    const float v = fp8e4m3_to_f32(uint8_t(c));
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(v)) << c;
      continue;
    }
    EXPECT_EQ(double(v), spec_value(uint8_t(c))) << "code " << c;
    EXPECT_EQ(std::signbit(v), c >= 0x80) << "code " << c;
    EXPECT_EQ(fp8e4m3_table()[c], v) << "code " << c;
  }
  EXPECT_EQ(fp8e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(fp8e4m3_to_f32(0xfe), -448.0f);
  EXPECT_EQ(fp8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(fp8e4m3_to_f32(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(fp8e4m3_to_f32(0x38), 1.0f);
}

TEST(Fp8E4M3, EveryCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;  // NaN
    EXPECT_EQ(f32_to_fp8e4m3(fp8e4m3_to_f32(uint8_t(c))), c) << "code " << c;
  }
}

TEST(Fp8E4M3, TiesRoundToEvenAndNeighboursOfTiesRoundToTheNearest) {
  for (int c = 0; c < 0x7e; ++c) {
    for (uint8_t sign : {uint8_t(0), uint8_t(0x80)}) {
      const float lo = fp8e4m3_to_f32(uint8_t(sign | c)), hi = fp8e4m3_to_f32(uint8_t(sign | (c + 1)));
      const float mid = (lo + hi) / 2;  // exact: both have at most 4 significant bits
      ASSERT_EQ(double(mid), (double(lo) + double(hi)) / 2);
      const int even = (c & 1) == 0 ? c : c + 1;
      EXPECT_EQ(f32_to_fp8e4m3(mid), sign | even) << "tie between codes " << c << " and " << c + 1;
      EXPECT_EQ(f32_to_fp8e4m3(std::nextafter(mid, hi)), sign | (c + 1)) << "just past the tie above code " << c;
      EXPECT_EQ(f32_to_fp8e4m3(std::nextafter(mid, lo)), sign | c) << "just below the tie above code " << c;
    }
  }
}

TEST(Fp8E4M3, SaturatesNaNAndZeros) {
  for (float big : {448.0f, 449.0f, 463.99f, 464.0f, 465.0f, 1e6f, FLT_MAX, INFINITY}) {
    EXPECT_EQ(f32_to_fp8e4m3(big), 0x7e) << big;
    EXPECT_EQ(f32_to_fp8e4m3(-big), 0xfe) << -big;
  }
  EXPECT_EQ(f32_to_fp8e4m3(std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_EQ(f32_to_fp8e4m3(-std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_EQ(f32_to_fp8e4m3(std::numeric_limits<float>::signaling_NaN()), 0x7f);
  EXPECT_EQ(f32_to_fp8e4m3(0.0f), 0x00);
  EXPECT_EQ(f32_to_fp8e4m3(-0.0f), 0x80);
  // Half the smallest subnormal ties to zero; anything above it rounds up to 2^-9.
  const float half_min = std::ldexp(1.0f, -10);
  EXPECT_EQ(f32_to_fp8e4m3(half_min), 0x00);
  EXPECT_EQ(f32_to_fp8e4m3(-half_min), 0x80);
  EXPECT_EQ(f32_to_fp8e4m3(std::nextafter(half_min, 1.0f)), 0x01);
  EXPECT_EQ(f32_to_fp8e4m3(std::nextafter(half_min, 0.0f)), 0x00);
  EXPECT_EQ(f32_to_fp8e4m3(std::numeric_limits<float>::denorm_min()), 0x00);
  EXPECT_EQ(f32_to_fp8e4m3(-FLT_MIN), 0x80);
  // The largest subnormal rounds up into the smallest normal.
  EXPECT_EQ(f32_to_fp8e4m3(std::nextafter(std::ldexp(1.0f, -6), 0.0f)), 0x08);
}

TEST(Fp8E4M3, EncodingMatchesBruteForceSearch) {
  std::mt19937 rng(7);
  // Random bit patterns concentrated on E4M3's range (f32 exponents 2^-12 .. 2^9),
  // plus some of everything.
  std::uniform_int_distribution<uint32_t> mant(0, (1u << 23) - 1), exp_near(127 - 12, 127 + 9), any;
  for (int i = 0; i < 200000; ++i) {
    const uint32_t bits = i % 8 == 0 ? any(rng) : ((rng() & 1u) << 31) | (exp_near(rng) << 23) | mant(rng);
    const float f = f32_from_bits(bits);
    ASSERT_EQ(f32_to_fp8e4m3(f), brute_force_encode(f)) << "bits 0x" << std::hex << bits << " value " << f;
  }
}

TEST(Fp8Scale, PerTensorScaleMapsTheMaxToTheLargestCode) {
  const Fp8Scale unit = fp8_scale_for_amax(448.0);
  EXPECT_EQ(unit.scale, 1.0f);
  EXPECT_EQ(unit.inv, 1.0f);
  for (double bad : {0.0, -1.0, double(NAN), double(INFINITY)}) {
    EXPECT_EQ(fp8_scale_for_amax(bad).scale, 1.0f) << bad;
    EXPECT_EQ(fp8_scale_for_amax(bad).inv, 1.0f) << bad;
  }
  std::vector<float> w = {0.25f, -3.0f, 1e-3f, 2.9f, 0.0f, -1e-6f};
  std::vector<uint8_t> q(w.size());
  const Fp8Scale s = fp8_quantize_tensor(w.data(), w.size(), q.data());
  EXPECT_FLOAT_EQ(s.scale, 3.0f / 448.0f);
  EXPECT_EQ(q[1], 0xfe);  // -max -> -448
  for (size_t i = 0; i < w.size(); ++i) {
    EXPECT_EQ(q[i], f32_to_fp8e4m3(w[i] * s.inv)) << i;
    // 3 mantissa bits: within half a step (1/16 relative) in the normal range.
    if (std::fabs(w[i]) * s.inv >= std::ldexp(1.0f, -6)) {
      EXPECT_NEAR(fp8e4m3_to_f32(q[i]) * s.scale, w[i], std::fabs(w[i]) / 16 + 1e-9) << i;
    }
  }
  std::vector<float> zeros(5, 0.0f);
  std::vector<uint8_t> qz(5, 0xaa);
  EXPECT_EQ(fp8_quantize_tensor(zeros.data(), zeros.size(), qz.data()).scale, 1.0f);
  for (uint8_t c : qz) EXPECT_EQ(c, 0);
}

// A tensor large enough to be split over the thread pool (chunks of 2^16): the scale from
// the largest magnitude wherever it sits - here in the last chunk, then the first - and
// every code the serial conversion's.
// fp8_round_trip (the CPU emulation of a GEMM writing E4M3 output) against the spec:
// each value becomes the nearest code of the scaled grid (brute force), times the scale;
// past the clip it saturates to 448 * scale; in place gives the same. Large enough to be
// split over the thread pool.
TEST(Fp8Scale, RoundTripIsTheNearestScaledCode) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> x(200'003);
  for (float& v : x) v = nd(rng);
  x[7] = 40.0f;    // past the clip below
  x[8] = -1e-9f;   // below the smallest subnormal of the scaled grid: -0
  x[9] = 0.0f;
  const Fp8Scale s = fp8_scale_for_amax(12.5);
  std::vector<float> y(x.size());
  fp8_round_trip(x.data(), x.size(), s, y.data());
  size_t bad = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = float(spec_value(brute_force_encode(x[i] * s.inv))) * s.scale;
    bad += !(y[i] == want);
  }
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(y[7], 448.0f * s.scale);
  EXPECT_EQ(y[9], 0.0f);
  std::vector<float> z = x;
  fp8_round_trip(z.data(), z.size(), s, z.data());
  EXPECT_EQ(z, y);
}

TEST(Fp8Scale, LargeTensorSplitOverThreadsMatchesTheSerialConversion) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> w(1'000'003);
  for (float& v : w) v = nd(rng);
  for (size_t where : {w.size() - 2, size_t(5)}) {
    std::vector<float> x = w;
    x[where] = -37.5f;
    std::vector<uint8_t> q(x.size());
    const Fp8Scale s = fp8_quantize_tensor(x.data(), x.size(), q.data());
    EXPECT_FLOAT_EQ(s.scale, 37.5f / 448.0f) << where;
    EXPECT_EQ(q[where], 0xfe) << where;
    size_t bad = 0;
    for (size_t i = 0; i < x.size(); ++i) bad += q[i] != f32_to_fp8e4m3(x[i] * s.inv);
    EXPECT_EQ(bad, 0u) << where;
  }
}

}  // namespace
}  // namespace kiln
