// The dp4a q8/q4 GEMV (ops/gemv_quant_dp4a.cu) against an f64 evaluation of the exact
// dequantized weights times the exact x, next to today's kRows kernel on the same weights.
// dp4a rounds x to int8 per group of 32 (d = max|x| / 127), so its error bound per output
// is  F Σ_g scale_g Σ_{i in g} |q_i| · max_g|x| / 254  (x's rounding; the min term uses the
// exact Σx) plus f32 summation and the output's rounding to bf16/f16; the old kernel's is
// the last two alone. Also: x exactly on the int8 grid leaves only the f32 and output
// rounding (a wrong code/x pairing would not); KILN_CUDA_QGEMV=dp4a through the graph with
// every epilogue, SwiGLU, bias and the dequantized tiles past 8 rows; the fallback to the
// kRows kernel where x does not fit shared memory; the variable's errors. Skips without a
// GPU, except the checks that fail before touching the device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "backends/cuda/cuda_context.h"
#include "backends/cuda/ops/gemv_quant.h"
#include "core/weight_quant.h"

#include "cuda_test_util.h"

namespace kiln::cuda {
namespace {

using namespace testing;

// Unit roundoff of the output type.
double unit_roundoff(DType t) { return t == DType::kBF16 ? 0x1p-8 : 0x1p-11; }

uint16_t to_16(DType t, float v) { return t == DType::kBF16 ? f32_to_bf16(v) : f32_to_f16(v); }
float from_16(DType t, uint16_t v) { return t == DType::kBF16 ? bf16_to_f32(v) : f16_to_f32(v); }

struct Weights {
  QuantizedRows q;
  QuantImage img;
  DeviceBuffer dev;
  QuantWeightView view;
  std::vector<double> deq;  // [n, k]: F * (scale * q + min), exactly
};

// Random weights with per-row offsets (the q4 min matters) and a few tiny rows (the row
// factor matters), quantized and uploaded in the kRows layout.
Weights make_weights(int64_t n, int64_t k, QuantFormat f, std::mt19937_64& rng) {
  std::vector<float> w(size_t(n * k));
  std::uniform_real_distribution<float> u(-0.1f, 0.1f);
  for (int64_t r = 0; r < n; ++r) {
    const float off = u(rng) * 0.5f, scale = r % 7 == 3 ? 1e-5f : 1.0f;
    for (int64_t i = 0; i < k; ++i) w[size_t(r * k + i)] = (u(rng) + off) * scale;
  }
  Weights W{quantize_rows(w.data(), n, k, f), {}, {}, {}, {}};
  W.img = quant_image(W.q, QuantLayout::kRows);
  W.dev = DeviceBuffer(W.img.bytes.size());
  KILN_CUDA_CHECK(cudaMemcpy(W.dev.get(), W.img.bytes.data(), W.img.bytes.size(), cudaMemcpyHostToDevice));
  W.view = W.img.view_at(W.dev.get());
  W.deq.resize(size_t(n * k));
  const int64_t groups = k / 32;
  const size_t cb = quant_row_code_bytes(f, k);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < k; ++i) {
      const size_t gi = size_t(r * groups + i / 32);
      const double s = f16_to_f32(W.q.scales[gi]), mn = f == QuantFormat::kQ4 ? f16_to_f32(W.q.mins[gi]) : 0.0;
      W.deq[size_t(r * k + i)] =
          double(W.q.row_factor[size_t(r)]) * (s * quant_code(f, W.q.codes.get() + size_t(r) * cb, i) + mn);
    }
  return W;
}

// x [m, k] in `t`: per group a random power-of-two scale (2^-6 .. 2^3), one all-zero group
// when k > 32; or (on_grid) integers in [-127, 127] times a power of two with one ±127 per
// group, which int8 rounding keeps exactly.
std::vector<float> make_x(int64_t m, int64_t k, DType t, bool on_grid, std::mt19937_64& rng) {
  std::vector<float> x(size_t(m * k));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> e(-6, 3), q(-127, 127);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t g = 0; g < k / 32; ++g) {
      const float sc = std::ldexp(1.0f, e(rng));
      for (int64_t i = 0; i < 32; ++i) {
        float v = on_grid ? float(q(rng)) * sc : u(rng) * sc;
        if (on_grid && i == (g * 7 + r) % 32) v = (g % 2 ? -127.0f : 127.0f) * sc;
        if (!on_grid && k > 32 && g == 1) v = 0.0f;
        x[size_t(r * k + g * 32 + i)] = from_16(t, to_16(t, v));
      }
    }
  return x;
}

struct Err {
  double max_err = 0, max_y = 0, max_abs = 0, worst_vs_bound = 0;
};

// Per output (token row r, output o): the f64 value, Σ|w x|, the magnitudes the kernels
// sum in f32 (Σ F (scale |q| + |min|) |x|), and dp4a's x-rounding bound.
struct Reference {
  std::vector<double> y, abs, terms, xbound;
};

Reference reference(const Weights& W, const std::vector<float>& x, int64_t m) {
  const int64_t n = W.q.n, k = W.q.k, groups = k / 32;
  const QuantFormat f = W.q.format;
  const size_t cb = quant_row_code_bytes(f, k);
  Reference R;
  for (int64_t r = 0; r < m; ++r)
    for (int64_t o = 0; o < n; ++o) {
      double ref = 0, abs = 0, terms = 0, xbound = 0;
      const double F = W.q.row_factor[size_t(o)];
      for (int64_t g = 0; g < groups; ++g) {
        const size_t gi = size_t(o * groups + g);
        const double s = f16_to_f32(W.q.scales[gi]), mn = f == QuantFormat::kQ4 ? f16_to_f32(W.q.mins[gi]) : 0.0;
        double amax = 0, sq = 0;
        for (int64_t i = g * 32; i < g * 32 + 32; ++i) {
          const double xi = x[size_t(r * k + i)], wi = W.deq[size_t(o * k + i)];
          const int q = quant_code(f, W.q.codes.get() + size_t(o) * cb, i);
          ref += wi * xi;
          abs += std::fabs(wi * xi);
          terms += (F * s * std::abs(q) + F * std::fabs(mn)) * std::fabs(xi);
          amax = std::max(amax, std::fabs(xi));
          sq += F * s * std::abs(q);
        }
        xbound += sq * amax / 254.0;
      }
      R.y.push_back(ref), R.abs.push_back(abs), R.terms.push_back(terms), R.xbound.push_back(xbound);
    }
  return R;
}

// Runs `kernel` and checks every output against the f64 reference within its bound
// (with_x_rounding: the dp4a term). Returns the errors for the report.
Err run_and_check(QGemvKernel kernel, DType t, const Weights& W, const std::vector<float>& x, const Reference& R,
                  int64_t m, bool with_x_rounding, const std::string& what) {
  const int64_t n = W.q.n, groups = W.q.k / 32;
  std::vector<uint16_t> xh(x.size());
  for (size_t i = 0; i < x.size(); ++i) xh[i] = to_16(t, x[i]);
  DeviceBuffer xd(xh.size() * 2), yd(size_t(m * n) * 2);
  KILN_CUDA_CHECK(cudaMemcpy(xd.get(), xh.data(), xh.size() * 2, cudaMemcpyHostToDevice));
  if (kernel == QGemvKernel::kDp4a) launch_qgemv_dp4a(t, xd.get(), W.view, nullptr, yd.get(), m, n, nullptr, GemvEpilogue::kNone);
  else launch_gemv_quant(t, xd.get(), W.view, nullptr, yd.get(), m, n, nullptr, GemvEpilogue::kNone, kernel);
  std::vector<uint16_t> yh(size_t(m * n));
  KILN_CUDA_CHECK(cudaMemcpy(yh.data(), yd.get(), yh.size() * 2, cudaMemcpyDeviceToHost));
  Err e;
  int failures = 0;
  for (int64_t r = 0; r < m; ++r)
    for (int64_t o = 0; o < n; ++o) {
      const size_t i = size_t(r * n + o);
      const double ref = R.y[i];
      // f32 sums: each lane adds ~k/32/32 group terms, then 5 shuffle levels; 4x margin.
      const double f32_sums = 4.0 * 0x1p-24 * double(groups + 64) * R.terms[i];
      // x's rounding: |x - q·d| <= d/2 + |x|·(2^-22: 127/max|x| times max|x|/127 is not
      // exactly 1), within max|x|/254 · (1 + 1e-4).
      const double pre = (with_x_rounding ? R.xbound[i] * (1 + 1e-4) : 0.0) + f32_sums;
      // Output rounding, relative, and f16's subnormal spacing (tiny rows), absolute.
      const double bound = pre + unit_roundoff(t) * (std::fabs(ref) + pre) + (t == DType::kF16 ? 0x1p-25 : 1e-30);
      const double got = from_16(t, yh[i]), err = std::fabs(got - ref);
      e.max_err = std::max(e.max_err, std::isnan(got) ? INFINITY : err);
      e.max_y = std::max(e.max_y, std::fabs(ref));
      e.max_abs = std::max(e.max_abs, R.abs[i]);
      e.worst_vs_bound = std::max(e.worst_vs_bound, err / bound);
      if (!(err <= bound) && failures++ < 5)
        ADD_FAILURE() << what << " " << qgemv_kernel_name(kernel) << " row " << r << " output " << o << ": got "
                      << got << ", f64 " << ref << ", |err| " << err << " > bound " << bound;
    }
  return e;
}

// The error table: dp4a within the int8 bound, the old kernel within f32 + rounding, both
// printed relative to max|y| and to max Σ|w||x|.
TEST(CudaQGemvDp4a, ErrorWithinTheInt8BoundAgainstF64) {
  KILN_SKIP_WITHOUT_CUDA();
  struct S { int64_t n, k; };
  std::mt19937_64 rng(11);
  std::printf("  %-4s %-2s %-12s m | dp4a err/max|y|  err/Σ|w||x|  err/bound | old err/max|y|  err/Σ|w||x|\n", "x",
              "w", "n x k");
  for (DType t : {DType::kBF16, DType::kF16})
    for (QuantFormat f : {QuantFormat::kQ4, QuantFormat::kQ8})
      for (S s : {S{1, 32}, S{37, 96}, S{130, 4128}, S{150, 4096}, S{34, 14336}}) {
        const Weights W = make_weights(s.n, s.k, f, rng);
        for (int64_t m : {1, 2, 3, 4, 5, 8}) {
          ASSERT_TRUE(qgemv_dp4a_supports(t, m, s.k));
          const std::vector<float> x = make_x(m, s.k, t, false, rng);
          const std::string what = str_cat(dtype_name(t), " ", quant_format_name(f), " ", s.n, "x", s.k, " m=", m);
          const Reference R = reference(W, x, m);
          const Err d = run_and_check(QGemvKernel::kDp4a, t, W, x, R, m, true, what);
          const Err o = run_and_check(QGemvKernel::kRows, t, W, x, R, m, false, what);
          std::printf("  %-4s %-2s %5lldx%-6lld %lld | %.2e         %.2e     %.3f     | %.2e        %.2e\n",
                      dtype_name(t), quant_format_name(f), (long long)s.n, (long long)s.k, (long long)m,
                      d.max_err / d.max_y, d.max_err / d.max_abs, d.worst_vs_bound, o.max_err / o.max_y,
                      o.max_err / o.max_abs);
        }
      }
}

// x on the int8 grid: dp4a's products are exact, so only f32 sums and output rounding remain.
TEST(CudaQGemvDp4a, ExactOnTheInt8Grid) {
  KILN_SKIP_WITHOUT_CUDA();
  std::mt19937_64 rng(12);
  for (DType t : {DType::kBF16, DType::kF16})
    for (QuantFormat f : {QuantFormat::kQ4, QuantFormat::kQ8}) {
      const Weights W = make_weights(67, 4128, f, rng);
      for (int64_t m : {1, 2, 4, 7}) {
        const std::vector<float> x = make_x(m, 4128, t, true, rng);
        const Err d = run_and_check(QGemvKernel::kDp4a, t, W, x, reference(W, x, m), m, false,
                                    str_cat(dtype_name(t), " ", quant_format_name(f), " on-grid m=", m));
        std::printf("  %s %s on-grid x m=%lld: dp4a max|err|/max|y| %.2e (%.3f of the f32+rounding bound)\n",
                    dtype_name(t), quant_format_name(f), (long long)m, d.max_err / d.max_y, d.worst_vs_bound);
      }
    }
}

// KILN_CUDA_QGEMV=dp4a through a compiled graph: bias, every epilogue, SwiGLU, token rows
// 1..8 (GEMV) and 9, 20 (dequantized tiles), against the CPU backend's q8/q4 kernels (f32
// x). Bound: the 16-bit op bound plus x's int8 rounding (worst case ~F Σ s|q| max|x| / 254,
// about 6% of max|y| on these random rows; the bound test above checks it per output).
TEST(CudaQGemvDp4a, GraphEpiloguesAndSwiGlu) {
  KILN_SKIP_WITHOUT_CUDA();
  ::setenv("KILN_CUDA_QGEMV", "dp4a", 1);
  EXPECT_EQ(qgemv_kernel(DType::kBF16), QGemvKernel::kDp4a);
  EXPECT_EQ(qgemv_kernel(DType::kF32), QGemvKernel::kRows);
  for (const std::string dt : {"bf16", "f16"})
    for (const char* q : {"q8", "q4"})
      for (const char* act : {"", "gelu_erf", "gelu_tanh", "silu", "swiglu"}) {
        std::mt19937_64 rng(uint64_t(act[0]) * 3 + q[1]);
        ir::Graph g;
        const int64_t n = 2 * 161, k = 1056;
        ir::ValueId x = g.add_input("x", DType::kF32, Shape{"T", k});
        ir::ValueId w = g.add_weight("w", random_tensor({n, k}, rng, "f32", -0.1f, 0.1f));
        ir::ValueId b = g.add_weight("b", random_tensor({n}, rng, dt));
        std::map<std::string, ir::Attr> attrs{{"precision", std::string(q)}};
        if (*act) attrs["activation"] = std::string(act);
        g.add_output("y", g.add("Linear", {x, w, b}, std::move(attrs), "linear"));
        std::vector<StepCase> steps;
        for (int64_t t : {1, 2, 3, 5, 8, 9, 20}) {
          StepCase s;
          s.inputs["x"] = random_tensor({t, k}, rng, dt);
          steps.push_back(std::move(s));
        }
        expect_backends_match_opts(g, steps, {.weight_dtype = "f32"}, {.weight_dtype = dt}, op_tolerance(dt) + 3e-2,
                                   str_cat("Linear dp4a ", dt, " ", q, *act ? "+" : "", act, " n=322 k=1056"));
      }
  ::unsetenv("KILN_CUDA_QGEMV");
}

// x too large for a CTA's shared memory (8 rows of k = 32768: 320 KiB): the kRows kernel runs.
TEST(CudaQGemvDp4a, LargeKFallsBackToTheRowsKernel) {
  KILN_SKIP_WITHOUT_CUDA();
  EXPECT_FALSE(qgemv_dp4a_supports(DType::kBF16, 8, 32768));
  EXPECT_TRUE(qgemv_dp4a_supports(DType::kBF16, 1, 32768));
  EXPECT_FALSE(qgemv_dp4a_supports(DType::kF32, 1, 64));
  std::mt19937_64 rng(13);
  const Weights W = make_weights(9, 32768, QuantFormat::kQ4, rng);
  for (int64_t m : {1, 8}) {
    const std::vector<float> x = make_x(m, 32768, DType::kBF16, false, rng);
    // Through launch_gemv_quant with kDp4a: dp4a at 1 row, the kRows kernel (bound without
    // x's rounding) at 8.
    const std::string what = str_cat("k=32768 m=", m);
    std::vector<uint16_t> xh(x.size());
    for (size_t i = 0; i < x.size(); ++i) xh[i] = f32_to_bf16(x[i]);
    DeviceBuffer xd(xh.size() * 2), y1(size_t(m * 9) * 2), y2(size_t(m * 9) * 2);
    KILN_CUDA_CHECK(cudaMemcpy(xd.get(), xh.data(), xh.size() * 2, cudaMemcpyHostToDevice));
    launch_gemv_quant(DType::kBF16, xd.get(), W.view, nullptr, y1.get(), m, 9, nullptr, GemvEpilogue::kNone,
                      QGemvKernel::kDp4a);
    launch_gemv_quant(DType::kBF16, xd.get(), W.view, nullptr, y2.get(), m, 9, nullptr, GemvEpilogue::kNone,
                      QGemvKernel::kRows);
    std::vector<uint16_t> a(size_t(m * 9)), b(size_t(m * 9));
    KILN_CUDA_CHECK(cudaMemcpy(a.data(), y1.get(), a.size() * 2, cudaMemcpyDeviceToHost));
    KILN_CUDA_CHECK(cudaMemcpy(b.data(), y2.get(), b.size() * 2, cudaMemcpyDeviceToHost));
    if (m == 8) EXPECT_EQ(a, b) << what << ": the fallback is the kRows kernel, bit for bit";
    else run_and_check(QGemvKernel::kDp4a, DType::kBF16, W, x, reference(W, x, m), m, true, what);
  }
}

// Errors that need no device: an unknown KILN_CUDA_QGEMV, a kernel for the other layout.
TEST(CudaQGemvDp4a, BadSelectionsAreErrors) {
  ::setenv("KILN_CUDA_QGEMV", "dp4", 1);
  try {
    qgemv_kernel(DType::kBF16);
    ADD_FAILURE() << "expected kInvalidArgument";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("KILN_CUDA_QGEMV='dp4'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("dp4a"), std::string::npos) << e.what();
  }
  ::unsetenv("KILN_CUDA_QGEMV");
  QuantWeightView v = quant_view_shape(QuantFormat::kQ4, 8, 64, QuantLayout::kMma);
  EXPECT_THROW(launch_gemv_quant(DType::kBF16, nullptr, v, nullptr, nullptr, 1, 8, nullptr, GemvEpilogue::kNone,
                                 QGemvKernel::kDp4a),
               Error);
  v = quant_view_shape(QuantFormat::kQ4, 8, 64, QuantLayout::kRows);
  EXPECT_THROW(launch_gemv_quant(DType::kBF16, nullptr, v, nullptr, nullptr, 1, 8, nullptr, GemvEpilogue::kNone,
                                 QGemvKernel::kMma),
               Error);
  EXPECT_STREQ(qgemv_kernel_name(QGemvKernel::kDp4a), "dp4a");
  EXPECT_EQ(qgemv_kernel_layout(QGemvKernel::kDp4a), QuantLayout::kRows);
  EXPECT_EQ(qgemv_kernel_layout(QGemvKernel::kMma), QuantLayout::kMma);
}

}  // namespace
}  // namespace kiln::cuda
