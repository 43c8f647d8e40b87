// FP8 E4M3 Linear conformance: activation quantization against a brute-force nearest
// E4M3 value, and linear_fp8 against a double-precision GEMM of the decoded values
// (weights and activations quantized by independent code here), over shapes with
// row/panel/K tails, with and without bias, saturating inputs, both ISAs; plus the
// float product within E4M3's error bound.
#include <gtest/gtest.h>

#include <cmath>

#include "backends/cpu/kernels/kernels.h"
#include "core/dtype.h"
#include "core/fp8.h"
#include "core/status.h"
#include "test_util.h"

namespace kiln::cpu {
namespace {

using testing::for_each_isa;
using testing::random_floats;

// The E4M3 value nearest to v (ties: the even code), saturating at +-448: an
// exhaustive search over the spec's values, independent of core/dtype's bit arithmetic.
double nearest_e4m3(double v) {
  const double a = std::fabs(v);
  double best = 0, best_err = INFINITY;
  for (int c = 0; c < 0x7f; ++c) {
    const int e = c >> 3, m = c & 7;
    const double val = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
    const double err = std::fabs(val - std::min(a, 448.0));
    if (err < best_err || (err == best_err && (c & 1) == 0)) best = val, best_err = err;
  }
  return v < 0 ? -best : best;
}

TEST(LinearFp8, QuantizeRowsIsTheNearestE4M3Value) {
  auto x = random_floats(600, 3, -6.0f, 6.0f);
  x[0] = 100.0f;   // saturates to +448 * scale
  x[1] = -100.0f;
  x[2] = 0.0f;
  x[3] = 1e-7f;    // below the subnormal floor: zero
  const Fp8Scale s = fp8_scale_for_amax(4.0);
  std::vector<float> q(x.size());
  quantize_rows_fp8(x.data(), 6, 100, s.inv, q.data());
  for (size_t i = 0; i < x.size(); ++i)
    ASSERT_EQ(double(q[i]), nearest_e4m3(double(x[i] * s.inv))) << i << ": x=" << x[i];
  EXPECT_EQ(q[0], 448.0f);
  EXPECT_EQ(q[1], -448.0f);
  EXPECT_EQ(q[3], 0.0f);
}

struct Shape {
  int64_t t, n, k;
};

TEST(LinearFp8, MatchesDoubleReferenceOnDecodedValues) {
  for_each_isa([] {
    for (Shape sh : {Shape{1, 16, 16}, Shape{3, 40, 96}, Shape{7, 33, 50}, Shape{17, 64, 256}, Shape{5, 48, 1024}}) {
      for (bool with_bias : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "t=" << sh.t << " n=" << sh.n << " k=" << sh.k << " bias=" << with_bias);
        auto x = random_floats(size_t(sh.t * sh.k), 11, -3.0f, 3.0f);
        x[0] = 50.0f;  // past the calibrated clip: saturates
        auto w = random_floats(size_t(sh.n * sh.k), 12, -0.2f, 0.2f);
        w[1] = 0.9f;   // the per-tensor max
        auto b = random_floats(size_t(sh.n), 13, -1.0f, 1.0f);
        const double x_amax = 2.5;
        // Weight codes and scale by the definition: scale = max|w| / 448.
        double wmax = 0;
        for (float v : w) wmax = std::max(wmax, std::fabs(double(v)));
        const float w_scale = float(wmax / 448.0);
        std::vector<uint8_t> codes(w.size());
        for (size_t i = 0; i < w.size(); ++i) codes[i] = f32_to_fp8e4m3(w[i] * float(448.0 / wmax));
        std::vector<uint8_t> codes_lib(w.size());
        EXPECT_EQ(fp8_quantize_tensor(w.data(), w.size(), codes_lib.data()).scale, w_scale);
        EXPECT_EQ(codes_lib, codes);
        const Fp8Scale xs = fp8_scale_for_amax(x_amax);
        PackedFp8Weight pw = pack_weight_fp8(codes.data(), sh.n, sh.k, w_scale);
        std::vector<float> y(size_t(sh.t * sh.n));
        linear_fp8(x.data(), sh.t, sh.k, pw, xs.scale, xs.inv, with_bias ? b.data() : nullptr, y.data());
        std::vector<double> xq(x.size()), ref(y.size()), tol(y.size());
        for (size_t i = 0; i < x.size(); ++i) xq[i] = nearest_e4m3(double(x[i] * xs.inv));
        for (int64_t r = 0; r < sh.t; ++r)
          for (int64_t j = 0; j < sh.n; ++j) {
            double acc = 0, mag = 0;
            for (int64_t i = 0; i < sh.k; ++i) {
              const double xv = xq[size_t(r * sh.k + i)];
              const double wv = double(fp8e4m3_to_f32(codes[size_t(j * sh.k + i)]));
              acc += xv * wv;
              mag += std::fabs(xv * wv);
            }
            const double s = double(xs.scale) * double(w_scale);
            ref[size_t(r * sh.n + j)] = acc * s + (with_bias ? double(b[size_t(j)]) : 0.0);
            // f32 accumulation over k terms plus the rescale and bias roundings.
            tol[size_t(r * sh.n + j)] = (double(sh.k) * 6e-8 + 1e-6) * mag * s + 1e-6;
          }
        testing::expect_within(y, ref, tol, "linear_fp8");
      }
    }
  });
}

TEST(LinearFp8, CloseToTheFloatProduct) {
  const int64_t t = 8, n = 64, k = 512;
  auto x = random_floats(size_t(t * k), 21, -1.0f, 1.0f);
  auto w = random_floats(size_t(n * k), 22, -0.1f, 0.1f);
  std::vector<uint8_t> codes(w.size());
  const Fp8Scale ws = fp8_quantize_tensor(w.data(), w.size(), codes.data());
  const Fp8Scale xs = fp8_scale_for_amax(1.0);
  PackedFp8Weight pw = pack_weight_fp8(codes.data(), n, k, ws.scale);
  std::vector<float> y(size_t(t * n));
  linear_fp8(x.data(), t, k, pw, xs.scale, xs.inv, nullptr, y.data());
  double err2 = 0, ref2 = 0;
  for (int64_t r = 0; r < t; ++r)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t i = 0; i < k; ++i) acc += double(x[size_t(r * k + i)]) * double(w[size_t(j * k + i)]);
      err2 += (y[size_t(r * n + j)] - acc) * (y[size_t(r * n + j)] - acc);
      ref2 += acc * acc;
    }
  // Each operand carries at most 1/16 relative rounding error (3 mantissa bits, uniform
  // data: ~2.5% RMS each); the errors of a sum of 512 products partly cancel.
  EXPECT_LT(std::sqrt(err2 / ref2), 0.05);
  EXPECT_GT(std::sqrt(err2 / ref2), 1e-4);  // it is quantized
}

TEST(LinearFp8, RejectsNaNWeightCodesAndBadShapes) {
  std::vector<uint8_t> codes(32, 0x38);
  codes[7] = 0x7f;
  EXPECT_THROW(pack_weight_fp8(codes.data(), 2, 16, 1.0f), Error);
  EXPECT_THROW(pack_weight_fp8(codes.data(), 0, 16, 1.0f), Error);
  codes[7] = 0x38;
  PackedFp8Weight pw = pack_weight_fp8(codes.data(), 2, 16, 1.0f);
  std::vector<float> x(15, 1.0f), y(2);
  EXPECT_THROW(linear_fp8(x.data(), 1, 15, pw, 1.0f, 1.0f, nullptr, y.data()), Error);
}

}  // namespace
}  // namespace kiln::cpu
