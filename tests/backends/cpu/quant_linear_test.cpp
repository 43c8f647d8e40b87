// Weight-only quantized linear (kQ8 / kQ4 storage): both ISAs against a reference that
// quantizes independently (per 32-value group and output, round
// to nearest; q8 symmetric, q4 with a per-group min) and multiplies in double; and the
// quantization error against the exact
// f32 weights stays within the rounding bound of the format.
#include <gtest/gtest.h>

#include <cmath>

#include "core/dtype.h"
#include "core/status.h"
#include "test_util.h"

namespace kiln::cpu {
namespace {

using testing::expect_within;
using testing::for_each_isa;
using testing::random_floats;

// q8: symmetric, scale = max|w| / 127. q4: asymmetric, scale = (max - min) / 15. Scales
// and mins are stored as f16 relative to a power-of-two row factor F that puts the row's
// largest scale or |min| in [2^14, 2^15]; codes round against the stored values.
std::vector<double> dequantized(const std::vector<float>& w, int64_t n, int64_t k, bool q8) {
  std::vector<double> d(w.size());
  for (int64_t r = 0; r < n; ++r) {
    std::vector<float> scale, offset;
    float big = 0;
    for (int64_t g = 0; g < k; g += 32) {
      const float* v = w.data() + r * k + g;
      float lo = v[0], hi = v[0], amax = 0;
      for (int64_t i = 0; i < 32; ++i) lo = std::min(lo, v[i]), hi = std::max(hi, v[i]), amax = std::max(amax, std::fabs(v[i]));
      scale.push_back(q8 ? amax / 127.0f : (hi - lo) / 15.0f);
      offset.push_back(q8 ? 0.0f : lo);
      big = std::max({big, scale.back(), std::fabs(offset.back())});
    }
    float f = 1;
    while (big > 0 && big / f > 32768.0f) f *= 2;
    while (big > 0 && big / f <= 16384.0f) f /= 2;
    for (int64_t g = 0; g < k; g += 32) {
      const float* v = w.data() + r * k + g;
      const float s = f16_to_f32(f32_to_f16(scale[size_t(g / 32)] / f)) * f;
      const float m = f16_to_f32(f32_to_f16(offset[size_t(g / 32)] / f)) * f;
      for (int64_t i = 0; i < 32; ++i) {
        float q = s > 0 ? std::nearbyint((v[i] - m) / s) : 0.0f;
        q = q8 ? std::clamp(q, -127.0f, 127.0f) : std::clamp(q, 0.0f, 15.0f);
        d[r * k + g + i] = double(q) * double(s) + double(m);
      }
    }
  }
  return d;
}

void check(int64_t t, int64_t n, int64_t k, WeightStorage s, uint64_t seed) {
  SCOPED_TRACE(std::string(weight_storage_name(s)) + " T=" + std::to_string(t) + " N=" +
               std::to_string(n) + " K=" + std::to_string(k));
  auto x = random_floats(size_t(t * k), seed);
  auto w = random_floats(size_t(n * k), seed + 1);
  auto bias = random_floats(size_t(n), seed + 2);
  auto dq = dequantized(w, n, k, s == WeightStorage::kQ8);
  std::vector<double> ref(size_t(t * n)), exact(size_t(t * n)), tol(size_t(t * n)), qtol(size_t(t * n));
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = bias[j], ex = bias[j], mag = std::fabs(bias[j]), qerr = 0;
      for (int64_t kk = 0; kk < k; ++kk) {
        acc += double(x[i * k + kk]) * dq[j * k + kk];
        ex += double(x[i * k + kk]) * w[j * k + kk];
        mag += std::fabs(double(x[i * k + kk]) * dq[j * k + kk]);
        qerr += std::fabs(double(x[i * k + kk]) * (dq[j * k + kk] - w[j * k + kk]));
      }
      ref[i * n + j] = acc;
      exact[i * n + j] = ex;
      // f32 summation and scaling; q4's offset term sums x (magnitude up to sum|x|*|min|).
      tol[i * n + j] = 4.0 * double(k) * 0x1p-24 * 2.0 * mag + 1e-6;
      qtol[i * n + j] = qerr + tol[i * n + j];
    }
  PackedWeight pw = pack_weight(w.data(), n, k, s);
  for_each_isa([&] {
    std::vector<float> y(size_t(t * n));
    linear(x.data(), t, k, pw, bias.data(), y.data());
    expect_within(y, ref, tol, "vs dequantized reference");
    expect_within(y, exact, qtol, "vs exact weights within the quantization error");
  });
}

TEST(QuantLinear, MatchesIndependentDequantization) {
  uint64_t seed = 100;
  for (WeightStorage s : {WeightStorage::kQ8, WeightStorage::kQ4})
    for (int64_t t : {1, 2, 3, 7, 64})
      for (auto [n, k] : {std::pair<int64_t, int64_t>{16, 32}, {50, 96}, {17, 320}, {130, 768}})
        check(t, n, k, s, seed += 7);
}

TEST(QuantLinear, PackingLayoutAndErrors) {
  auto w = random_floats(64 * 64, 3);
  PackedWeight q8 = pack_weight(w.data(), 64, 64, WeightStorage::kQ8);
  EXPECT_EQ(q8.bytes(), size_t(4 * 2 * (32 * 16 + 64)));  // 4 panels x 2 groups
  PackedWeight q4 = pack_weight(w.data(), 64, 64, WeightStorage::kQ4);
  EXPECT_EQ(q4.bytes(), size_t(4 * 2 * (32 * 8 + 128)));
  EXPECT_THROW(pack_weight(w.data(), 64, 48, WeightStorage::kQ4), Error);  // K % 32 != 0
  std::vector<float> zeros(32 * 16, 0.0f), x(32, 1.0f), y(16, 5.0f);
  PackedWeight z = pack_weight(zeros.data(), 16, 32, WeightStorage::kQ4);
  linear(x.data(), 1, 32, z, nullptr, y.data());
  for (float v : y) EXPECT_EQ(v, 0.0f);  // an all-zero group has scale 0, not NaN
}

}  // namespace
}  // namespace kiln::cpu
