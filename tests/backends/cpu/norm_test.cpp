// Conformance of layer_norm / rms_norm and the fused residual variants against
// double-precision references over a table of shapes (dims with 8-lane tails), in place too.
#include <gtest/gtest.h>

#include <cmath>

#include "backends/cpu/kernels/kernels.h"
#include "test_util.h"

namespace kiln::cpu {
namespace {

using testing::expect_within;
using testing::for_each_isa;
using testing::random_floats;

// f32 sums over dim elements: relative error ~ dim·2⁻²⁴ in the statistics, bounded loosely.
std::vector<double> tolerance(const std::vector<double>& ref, int64_t dim) {
  std::vector<double> tol(ref.size());
  for (size_t i = 0; i < ref.size(); ++i) tol[i] = (4e-7 + double(dim) * 1e-8) * (std::fabs(ref[i]) + 1.0);
  return tol;
}

std::vector<double> ref_norm(const std::vector<float>& x, const std::vector<float>& g,
                             const std::vector<float>& b, int64_t rows, int64_t dim, float eps, bool rms) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    const float* v = x.data() + r * dim;
    double mean = 0, var = 0;
    if (!rms) {
      for (int64_t i = 0; i < dim; ++i) mean += v[i];
      mean /= dim;
    }
    for (int64_t i = 0; i < dim; ++i) var += (v[i] - mean) * (v[i] - mean);
    const double rs = 1.0 / std::sqrt(var / dim + eps);
    for (int64_t i = 0; i < dim; ++i) y[r * dim + i] = (v[i] - mean) * rs * g[i] + (rms ? 0.0 : b[i]);
  }
  return y;
}

TEST(Norm, ShapeTable) {
  const int64_t rows_list[] = {1, 3, 7, 40};
  const int64_t dims[] = {1, 7, 8, 33, 768, 4096};
  for_each_isa([&] {
    uint64_t seed = 1;
    for (int64_t rows : rows_list)
      for (int64_t dim : dims) {
        SCOPED_TRACE(::testing::Message() << "rows=" << rows << " dim=" << dim);
        auto x = random_floats(rows * dim, seed++, -3.0f, 5.0f);  // non-zero mean
        auto g = random_floats(dim, seed++, 0.5f, 1.5f);
        auto b = random_floats(dim, seed++);
        std::vector<float> y(x.size());
        layer_norm(x.data(), g.data(), b.data(), 1e-5f, rows, dim, y.data());
        auto ref = ref_norm(x, g, b, rows, dim, 1e-5f, false);
        expect_within(y, ref, tolerance(ref, dim), "layer_norm");
        rms_norm(x.data(), g.data(), 1e-6f, rows, dim, y.data());
        ref = ref_norm(x, g, b, rows, dim, 1e-6f, true);
        expect_within(y, ref, tolerance(ref, dim), "rms_norm");
        // In place.
        std::vector<float> z = x;
        rms_norm(z.data(), g.data(), 1e-6f, rows, dim, z.data());
        expect_within(z, ref, tolerance(ref, dim), "rms_norm in place");
      }
  });
}

// Per-head RMSNorm (Qwen3's q/k norm): every head of a row on its own, with one weight
// shared by the heads or one per head, and a packed row whose tail (v) is copied.
TEST(Norm, HeadRmsNorm) {
  const int64_t rows = 6, d = 36, groups = 5;
  for (int64_t tail : {int64_t(0), 2 * d}) {
    const int64_t width = groups * d + tail;
    auto x = random_floats(rows * width, 11, -3.0f, 5.0f);
    for (bool shared : {true, false}) {
      auto w = random_floats(shared ? d : groups * d, 12, 0.5f, 1.5f);
      std::vector<double> ref(x.size());
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t g = 0; g < groups; ++g) {
          std::vector<float> head(x.begin() + r * width + g * d, x.begin() + r * width + (g + 1) * d);
          std::vector<float> hw(w.begin() + (shared ? 0 : g * d), w.begin() + (shared ? 0 : g * d) + d);
          auto y = ref_norm(head, hw, hw, 1, d, 1e-6f, true);
          std::copy(y.begin(), y.end(), ref.begin() + r * width + g * d);
        }
        for (int64_t i = groups * d; i < width; ++i) ref[size_t(r * width + i)] = x[size_t(r * width + i)];
      }
      for_each_isa([&] {
        std::vector<float> y(x.size());
        head_rms_norm(x.data(), w.data(), shared ? 0 : d, 1e-6f, rows, width, groups, d, y.data());
        expect_within(y, ref, tolerance(ref, d), shared ? "head_rms_norm, shared weight" : "head_rms_norm");
        std::vector<float> z = x;  // in place
        head_rms_norm(z.data(), w.data(), shared ? 0 : d, 1e-6f, rows, width, groups, d, z.data());
        EXPECT_EQ(z, y);
      });
    }
  }
}

TEST(Norm, FusedResidual) {
  const int64_t rows = 5, dim = 100;
  auto x = random_floats(rows * dim, 1);
  auto res = random_floats(rows * dim, 2, -2.0f, 2.0f);
  auto g = random_floats(dim, 3);
  auto b = random_floats(dim, 4);
  std::vector<float> s_expect(x.size());
  for (size_t i = 0; i < x.size(); ++i) s_expect[i] = x[i] + res[i];
  for_each_isa([&] {
    for (bool rms : {true, false}) {
      std::vector<float> sum(x.size()), y(x.size());
      if (rms) add_rms_norm(x.data(), res.data(), g.data(), 1e-6f, rows, dim, sum.data(), y.data());
      else add_layer_norm(x.data(), res.data(), g.data(), b.data(), 1e-5f, rows, dim, sum.data(), y.data());
      EXPECT_EQ(sum, s_expect);
      auto ref = ref_norm(s_expect, g, b, rows, dim, rms ? 1e-6f : 1e-5f, rms);
      expect_within(y, ref, tolerance(ref, dim), rms ? "add_rms_norm" : "add_layer_norm");
      // The residual stream updated in place (sum aliases the residual).
      std::vector<float> r2 = res, y2(x.size());
      if (rms) add_rms_norm(x.data(), r2.data(), g.data(), 1e-6f, rows, dim, r2.data(), y2.data());
      else add_layer_norm(x.data(), r2.data(), g.data(), b.data(), 1e-5f, rows, dim, r2.data(), y2.data());
      EXPECT_EQ(r2, s_expect);
      EXPECT_EQ(y2, y);
    }
  });
}

}  // namespace
}  // namespace kiln::cpu
