// Conformance of the elementwise ops and softmax against double-precision std:: math on
// wide ranges (|x| up to 1e30), special values and tails; also checks no NaN appears.
// Bounds are relative (2e-6) plus, for gelu_tanh, the f32 conditioning of exp(-2u).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "backends/cpu/kernels/isa.h"
#include "backends/cpu/kernels/kernels.h"
#include "core/dtype.h"
#include "test_util.h"

namespace kiln::cpu {
namespace {

using testing::expect_within;
using testing::for_each_isa;
using testing::random_floats;

std::vector<float> wide_inputs() {
  std::vector<float> v;
  for (int i = -20000; i <= 20000; ++i) v.push_back(float(i) * 0.005f);  // [-100, 100]
  auto r = random_floats(10007, 7, -12.0f, 12.0f);                        // odd count: tails
  v.insert(v.end(), r.begin(), r.end());
  for (float s : {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-6f, 0.625f, -0.625f, 88.7f, -88.7f, 89.0f,
                  -89.0f, 104.0f, -104.0f, 1000.0f, -1000.0f, 1e20f, -1e20f, 1e30f, -1e30f})
    v.push_back(s);
  return v;
}

struct UnaryCase {
  const char* name;
  void (*fn)(const float*, int64_t, float*);
  std::function<double(double)> ref;
  std::function<double(double)> extra_rel;  // input-dependent conditioning, 0 if none
};

TEST(Elementwise, UnaryVsStd) {
  const auto x = wide_inputs();
  auto gelu_u = [](double v) { return 0.7978845608028654 * (v + 0.044715 * v * v * v); };
  const UnaryCase cases[] = {
      {"exp", &kiln::cpu::exp, [](double v) { return std::exp(v); }, nullptr},
      {"tanh", &kiln::cpu::tanh, [](double v) { return std::tanh(v); }, nullptr},
      {"silu", &silu, [](double v) { return v / (1.0 + std::exp(-v)); }, nullptr},
      {"gelu_erf", &gelu_erf, [](double v) { return 0.5 * v * std::erfc(-v / std::sqrt(2.0)); }, nullptr},
      // 0.5x(1+tanh u) written as x/(1+e^(-2u)) so the double reference does not cancel;
      // an f32 kernel rounds u, and exp amplifies that by |2u| (that is the extra term).
      {"gelu_tanh", &gelu_tanh, [&](double v) { return v / (1.0 + std::exp(-2.0 * gelu_u(v))); },
       [&](double v) { return std::fabs(2.0 * gelu_u(v)) * 2.4e-7; }},
  };
  for_each_isa([&] {
    for (const auto& c : cases) {
      std::vector<float> y(x.size());
      c.fn(x.data(), int64_t(x.size()), y.data());
      std::vector<double> ref(x.size()), tol(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        const double r = c.ref(x[i]);
        ref[i] = std::isinf(double(float(r))) ? double(float(r)) : r;  // f32 overflow is inf
        const double rel = 2e-6 + (c.extra_rel ? std::min(c.extra_rel(x[i]), 1.0) : 0.0);
        tol[i] = std::isinf(ref[i]) ? 0.0 : rel * std::fabs(ref[i]) + 1e-38;  // below: subnormal flush
      }
      for (size_t i = 0; i < x.size(); ++i)
        if (std::isinf(ref[i]) && y[i] == ref[i]) ref[i] = 0, y[i] = 0;  // both inf: ok
      expect_within(y, ref, tol, c.name);
    }
  });
}

// The AVX-512 activations run vec_math.h's operations 16 lanes wide: the AVX2 kernels'
// bits, element for element, at every length (masked tails included).
TEST(Elementwise, Avx512ActivationsGiveTheAvx2Bits) {
  if (!cpu_isa_supported(CpuIsa::kAvx2)) GTEST_SKIP() << "no AVX2 here";
  const CpuIsa saved = cpu_isa();
  cpu_isa_set(CpuIsa::kAvx2);
  cpu_avx512_set(true);
  if (!avx512_enabled()) {
    cpu_isa_set(saved);
    GTEST_SKIP() << "no AVX-512 here (or KILN_CPU_AVX512=0)";
  }
  const auto x = wide_inputs();
  const auto u = random_floats(x.size(), 8, -10.0f, 10.0f);
  void (*const fns[])(const float*, int64_t, float*) = {&kiln::cpu::exp, &kiln::cpu::tanh, &silu, &gelu_erf,
                                                         &gelu_tanh};
  for (int64_t n : {int64_t(1), int64_t(15), int64_t(17), int64_t(x.size())})
    for (int f = 0; f <= 5; ++f) {
      SCOPED_TRACE(::testing::Message() << "function " << f << " n=" << n);
      std::vector<float> wide(static_cast<size_t>(n)), narrow(static_cast<size_t>(n));
      auto run = [&](bool zmm, float* y) {
        cpu_avx512_set(zmm);
        if (f < 5) fns[f](x.data(), n, y);
        else swiglu(x.data(), u.data(), n, y);
      };
      run(true, wide.data());
      run(false, narrow.data());
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(f32_bits(wide[size_t(i)]), f32_bits(narrow[size_t(i)])) << "x = " << x[size_t(i)];
    }
  cpu_avx512_set(true);
  cpu_isa_set(saved);
}

TEST(Elementwise, BinaryAndSwiglu) {
  for (int64_t n : {1, 7, 8, 9, 100, 40000}) {
    auto a = random_floats(n, n, -10.0f, 10.0f);
    auto b = random_floats(n, n + 1, -10.0f, 10.0f);
    for_each_isa([&] {
      std::vector<float> y(n);
      add(a.data(), b.data(), n, y.data());
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], a[i] + b[i]);
      mul(a.data(), b.data(), n, y.data());
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], a[i] * b[i]);
      swiglu(a.data(), b.data(), n, y.data());
      std::vector<double> ref(n), tol(n);
      for (int64_t i = 0; i < n; ++i) {
        ref[i] = double(a[i]) / (1.0 + std::exp(-double(a[i]))) * b[i];
        tol[i] = 3e-6 * std::fabs(ref[i]) + 1e-38;
      }
      expect_within(y, ref, tol, "swiglu");
    });
  }
}

TEST(Elementwise, SoftmaxRows) {
  for (int64_t dim : {1, 5, 8, 13, 1000}) {
    const int64_t rows = 6;
    auto x = random_floats(rows * dim, dim, -30.0f, 30.0f);
    x[0] = 80.0f;  // a large logit must not overflow
    for_each_isa([&] {
      std::vector<float> y(x.size());
      softmax_rows(x.data(), rows, dim, y.data());
      std::vector<double> ref(x.size()), tol(x.size());
      for (int64_t r = 0; r < rows; ++r) {
        double mx = -INFINITY, sum = 0;
        for (int64_t i = 0; i < dim; ++i) mx = std::max(mx, double(x[r * dim + i]));
        for (int64_t i = 0; i < dim; ++i) sum += std::exp(x[r * dim + i] - mx);
        for (int64_t i = 0; i < dim; ++i) {
          ref[r * dim + i] = std::exp(x[r * dim + i] - mx) / sum;
          // x - max rounds in f32; exp amplifies that by |x - max|.
          tol[r * dim + i] = (2e-6 + double(dim) * 1.2e-7 + (mx - x[r * dim + i]) * 1.2e-7) * ref[r * dim + i] + 1e-38;
        }
      }
      expect_within(y, ref, tol, "softmax_rows");
    });
  }
}

}  // namespace
}  // namespace kiln::cpu
