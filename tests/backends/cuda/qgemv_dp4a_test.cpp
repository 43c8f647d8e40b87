// The dp4a q8/q4 GEMV (ops/gemv_quant_dp4a.cu) against an f64 evaluation of the exact
// dequantized weights times the exact x, next to today's kRows kernel on the same weights.
// dp4a rounds x to int8 per group of 32 (d = max|x| / 127), so its error bound per output
// is  F Σ_g scale_g Σ_{i in g} |q_i| · max_g|x| / 254  (x's rounding; the min term uses the
// exact Σx) plus f32 summation and the output's rounding to bf16/f16; the old kernel's is
// the last two alone. Also: x exactly on the int8 grid leaves only the f32 and output
// rounding (a wrong code/x pairing would not); KILN_CUDA_QGEMV=dp4a through the graph with
// every epilogue, SwiGLU, bias and the skinny GEMM past 8 rows (its default 6 pinned to 9); the
// fallback to the kRows kernel where x does not fit shared memory; the variable's errors. Every
// launch variant (split-K 1/2/4/8 inside the CTA, each one-row form: load depth 2/4/8, one or two
// outputs a warp, one or two chunks a step; 1 or 4 CTAs per SM) within the
// same bound, with bias, GELU, SiLU and SwiGLU epilogues propagated through the bound (they
// must apply once, after the splits meet), odd shapes, splits with no K left, a packed-QKV-
// like and a long-K (down) shape. Skips without a GPU, except the checks that fail before
// touching the device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

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
// 1..8 (GEMV: the skinny GEMM's default from 6 rows moved to 9) and 9, 20 (the skinny GEMM),
// against the CPU backend's q8/q4 kernels (f32 x). Bound: the 16-bit op bound plus x's int8
// rounding (worst case ~F Σ s|q| max|x| / 254, about 6% of max|y| on these random rows; the bound
// test above checks it per output).
TEST(CudaQGemvDp4a, GraphEpiloguesAndSwiGlu) {
  KILN_SKIP_WITHOUT_CUDA();
  ::setenv("KILN_CUDA_QGEMV", "dp4a", 1);
  ScopedEnv gemv_to_eight("KILN_CUDA_QGEMM_SKINNY_MIN_ROWS", "9");
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

double silu(double v) { return v / (1.0 + std::exp(-v)); }
double gelu_tanh(double v) { return 0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))); }
double gelu_erf(double v) { return 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0))); }

// One launch variant with bias and epilogue `epi` against the f64 reference. The pre-
// activation bound (x's rounding + f32 sums, as in run_and_check) is carried through the
// kernel's roundings: y0 = round(v) then act(y0) rounded (|act'| <= 1.13 for GELU, 1.1 for
// SiLU; 1.2 used); SwiGLU: gate and up rounded, silu(gate) rounded, the product rounded.
// Returns the worst err / bound.
double check_variant(DType t, const Weights& W, int64_t n_out, const std::vector<float>& x, const Reference& R,
                     int64_t m, GemvEpilogue epi, const std::vector<float>& bias, const QGemvDp4aTuning& tune,
                     const std::string& what) {
  const int64_t rows = W.q.n, groups = W.q.k / 32;
  const bool swiglu = epi == GemvEpilogue::kSwiGlu;
  std::vector<uint16_t> xh(x.size()), bh(bias.size());
  for (size_t i = 0; i < x.size(); ++i) xh[i] = to_16(t, x[i]);
  for (size_t i = 0; i < bias.size(); ++i) bh[i] = to_16(t, bias[i]);
  DeviceBuffer xd(xh.size() * 2), bd(std::max<size_t>(2, bh.size() * 2)), yd(size_t(m * n_out) * 2);
  KILN_CUDA_CHECK(cudaMemcpy(xd.get(), xh.data(), xh.size() * 2, cudaMemcpyHostToDevice));
  if (!bh.empty()) KILN_CUDA_CHECK(cudaMemcpy(bd.get(), bh.data(), bh.size() * 2, cudaMemcpyHostToDevice));
  KILN_CUDA_CHECK(cudaMemset(yd.get(), 0xFF, size_t(m * n_out) * 2));  // NaN: an output never stored fails
  launch_qgemv_dp4a(t, xd.get(), W.view, bias.empty() ? nullptr : bd.get(), yd.get(), m, n_out, nullptr, epi, tune);
  std::vector<uint16_t> yh(size_t(m * n_out));
  KILN_CUDA_CHECK(cudaMemcpy(yh.data(), yd.get(), yh.size() * 2, cudaMemcpyDeviceToHost));
  const double u = unit_roundoff(t), tiny = t == DType::kF16 ? 0x1p-24 : 1e-30;
  auto pre = [&](int64_t r, int64_t o, double& v, double& b) {  // value incl. bias, its bound
    const size_t i = size_t(r * rows + o);
    v = R.y[i] + (bias.empty() ? 0.0 : double(bias[size_t(o)]));
    b = R.xbound[i] * (1 + 1e-4) + 4.0 * 0x1p-24 * double(groups + 64) * (R.terms[i] + std::fabs(v));
  };
  double worst = 0;
  int failures = 0;
  for (int64_t r = 0; r < m; ++r)
    for (int64_t o = 0; o < n_out; ++o) {
      double v, b, want, bound;
      pre(r, o, v, b);
      const double b0 = b + u * (std::fabs(v) + b);  // after rounding to T
      if (swiglu) {
        double up, bu;
        pre(r, n_out + o, up, bu);
        const double bu0 = bu + u * (std::fabs(up) + bu);
        const double sg = silu(v), bs = 1.1 * b0 + u * (std::fabs(sg) + 1.1 * b0);
        want = sg * up;
        bound = std::fabs(sg) * bu0 + std::fabs(up) * bs + bs * bu0;
        bound += u * (std::fabs(want) + bound);
      } else if (epi == GemvEpilogue::kNone) {
        want = v, bound = b0;
      } else {
        want = epi == GemvEpilogue::kSilu ? silu(v) : epi == GemvEpilogue::kGeluTanh ? gelu_tanh(v) : gelu_erf(v);
        bound = 1.2 * b0 + 1e-6 * std::fabs(want);
        bound += u * (std::fabs(want) + bound);
      }
      bound = bound * 1.01 + tiny;
      const double got = from_16(t, yh[size_t(r * n_out + o)]), err = std::fabs(got - want);
      worst = std::max(worst, std::isnan(got) ? INFINITY : err / bound);
      if (!(err <= bound) && failures++ < 3)
        ADD_FAILURE() << what << " row " << r << " output " << o << ": got " << got << ", f64 " << want << ", |err| "
                      << err << " > bound " << bound;
    }
  return worst;
}

// Every launch variant (split-K inside the CTA, load depth, CTAs per SM) within the int8
// bound, with the epilogues: small and odd shapes (splits past the end of K get no chunk:
// 1x32 has one step, 8 splits), a packed-QKV-like 640x2048 with bias, SwiGLU, and a long K.
TEST(CudaQGemvDp4a, LaunchVariantsWithinTheInt8Bound) {
  KILN_SKIP_WITHOUT_CUDA();
  struct S {
    int64_t n_out, k;
    GemvEpilogue epi;
    bool bias;
  };
  const S shapes[] = {{1, 32, GemvEpilogue::kNone, false},      {37, 96, GemvEpilogue::kGeluTanh, true},
                      {130, 4128, GemvEpilogue::kNone, true},    {21, 224, GemvEpilogue::kSwiGlu, true},
                      {150, 4096, GemvEpilogue::kSwiGlu, false}, {640, 2048, GemvEpilogue::kNone, true},
                      {34, 14336, GemvEpilogue::kSilu, false},   {67, 1056, GemvEpilogue::kGeluErf, true}};
  std::mt19937_64 rng(14);
  std::uniform_real_distribution<float> ub(-0.5f, 0.5f);
  for (QuantFormat f : {QuantFormat::kQ4, QuantFormat::kQ8})
    for (const S& s : shapes) {
      const bool swiglu = s.epi == GemvEpilogue::kSwiGlu;
      const int64_t rows = swiglu ? 2 * s.n_out : s.n_out;
      const Weights W = make_weights(rows, s.k, f, rng);
      std::vector<float> bias;
      if (s.bias)
        for (int64_t i = 0; i < rows; ++i) bias.push_back(bf16_to_f32(f32_to_bf16(ub(rng))));  // exact in bf16 and f16
      for (int64_t m : {1, 2, 3, 5, 8}) {
        const DType t = m == 3 ? DType::kF16 : DType::kBF16;
        const std::vector<float> x = make_x(m, s.k, t, false, rng);
        const Reference R = reference(W, x, m);
        double worst = 0;
        int variants = 0;
        // The forms (depth, outputs a warp, chunks a step; 0: the default): at one row the
        // default (2 and 2 at depth 4) and every other built form; more rows have one.
        struct Form {
          int depth, outs, chunks;
        };
        const std::vector<Form> forms = m == 1 ? std::vector<Form>{{0, 0, 0}, {2, 2, 2}, {4, 2, 1}, {4, 1, 2},
                                                                   {2, 1, 1}, {4, 1, 1}, {8, 1, 1}}
                                               : std::vector<Form>{{0, 0, 0}};
        for (int splits : {1, 2, 4, 8})
          for (const Form& form : forms)
            for (int cps : {1, 4}) {
              QGemvDp4aTuning tune{cps, form.depth, splits};
              tune.outs_one_row = form.outs;
              tune.chunks_per_step = form.chunks;
              const std::string what =
                  str_cat(dtype_name(t), " ", quant_format_name(f), " ", s.n_out, "x", s.k, swiglu ? " swiglu" : "",
                          s.bias ? " +bias" : "", " epi ", int(s.epi), " m=", m, " ctas/SM ", cps, " depth ",
                          form.depth, " outs ", form.outs, " chunks ", form.chunks, " splits ", splits);
              worst =
                  std::max(worst, check_variant(t, W, s.n_out, x, R, m, s.epi, bias, tune, what));
              ++variants;
              if (form.depth != 0) continue;
              // The 16-warp, early-trigger launch beside a decode attention (one row, no SwiGLU,
              // its own form; elsewhere the flag is ignored).
              QGemvDp4aTuning beside = tune;
              beside.beside_attention = true;
              worst = std::max(worst, check_variant(t, W, s.n_out, x, R, m, s.epi, bias, beside,
                                                    what + " beside"));
              ++variants;
            }
        std::printf("  %s %s %5lldx%-6lld epi %d%s m=%lld: worst err/bound over %d variants %.3f\n",
                    dtype_name(t), quant_format_name(f), (long long)s.n_out, (long long)s.k,
                    int(s.epi), s.bias ? " +bias" : "", (long long)m, variants, worst);
      }
    }
}

// Split-K changes only the order of f32 sums: with x on the int8 grid (exact products) the
// variants agree with the unsplit kernel to f32 summation and the outputs' rounding.
TEST(CudaQGemvDp4a, SplitsAgreeWithTheUnsplitKernel) {
  KILN_SKIP_WITHOUT_CUDA();
  std::mt19937_64 rng(15);
  const Weights W = make_weights(300, 14336, QuantFormat::kQ4, rng);
  for (int64_t m : {1, 4}) {
    const std::vector<float> x = make_x(m, 14336, DType::kBF16, true, rng);
    const Reference R = reference(W, x, m);
    std::vector<uint16_t> xh(x.size());
    for (size_t i = 0; i < x.size(); ++i) xh[i] = f32_to_bf16(x[i]);
    DeviceBuffer xd(xh.size() * 2), yd(size_t(m * 300) * 2);
    KILN_CUDA_CHECK(cudaMemcpy(xd.get(), xh.data(), xh.size() * 2, cudaMemcpyHostToDevice));
    std::vector<uint16_t> base;
    for (int splits : {1, 2, 4, 8}) {
      launch_qgemv_dp4a(DType::kBF16, xd.get(), W.view, nullptr, yd.get(), m, 300, nullptr, GemvEpilogue::kNone,
                        {0, 0, splits});
      std::vector<uint16_t> yh(size_t(m * 300));
      KILN_CUDA_CHECK(cudaMemcpy(yh.data(), yd.get(), yh.size() * 2, cudaMemcpyDeviceToHost));
      if (splits == 1) {
        base = yh;
        continue;
      }
      int off_by_more = 0;
      for (size_t i = 0; i < yh.size(); ++i) {
        const double a = bf16_to_f32(yh[i]), b = bf16_to_f32(base[i]);
        // Both kernels' f32 sums (run_and_check's bound, twice) and one bf16 rounding each.
        const double f32_sums = 2 * 4.0 * 0x1p-24 * double(14336 / 32 + 64) * R.terms[i];
        off_by_more += !(std::fabs(a - b) <= 2 * 0x1p-8 * (std::fabs(b) + f32_sums) + f32_sums);
      }
      EXPECT_EQ(off_by_more, 0) << "m=" << m << " splits " << splits << ": outputs farther from unsplit than f32 "
                                << "summation order and two bf16 roundings allow";
    }
  }
}

// The L2 prefetch (QGemvDp4aTuning::l2_prefetch) changes only where loads are served from:
// the same bits as without, for both formats, SwiGLU, splits, one and four token rows and a
// weight larger than half the L2 (fewer rounds prefetched than run).
TEST(CudaQGemvDp4a, L2PrefetchKeepsTheBits) {
  KILN_SKIP_WITHOUT_CUDA();
  std::mt19937_64 rng(16);
  struct S {
    int64_t n_out, k;
    QuantFormat f;
    GemvEpilogue epi;
  };
  // 16384 x 2048 q8: 35 MB of codes and scales, past half of an H100's or H200's L2.
  for (const S& s : {S{300, 14336, QuantFormat::kQ4, GemvEpilogue::kNone},
                     S{1000, 2048, QuantFormat::kQ8, GemvEpilogue::kSwiGlu},
                     S{37, 96, QuantFormat::kQ4, GemvEpilogue::kNone},
                     S{16384, 2048, QuantFormat::kQ8, GemvEpilogue::kNone}}) {
    const bool swiglu = s.epi == GemvEpilogue::kSwiGlu;
    const Weights W = make_weights(swiglu ? 2 * s.n_out : s.n_out, s.k, s.f, rng);
    for (int64_t m : {1, 4}) {
      const std::vector<float> x = make_x(m, s.k, DType::kBF16, false, rng);
      std::vector<uint16_t> xh(x.size());
      for (size_t i = 0; i < x.size(); ++i) xh[i] = f32_to_bf16(x[i]);
      DeviceBuffer xd(xh.size() * 2), yd(size_t(m * s.n_out) * 2);
      KILN_CUDA_CHECK(cudaMemcpy(xd.get(), xh.data(), xh.size() * 2, cudaMemcpyHostToDevice));
      for (int splits : {0, 2}) {
        std::vector<uint16_t> out[2];
        for (int pf = 0; pf < 2; ++pf) {
          QGemvDp4aTuning tune{0, 0, splits};
          tune.l2_prefetch = pf == 1;
          launch_qgemv_dp4a(DType::kBF16, xd.get(), W.view, nullptr, yd.get(), m, s.n_out, nullptr, s.epi, tune);
          out[pf].resize(size_t(m * s.n_out));
          KILN_CUDA_CHECK(cudaMemcpy(out[pf].data(), yd.get(), out[pf].size() * 2, cudaMemcpyDeviceToHost));
        }
        EXPECT_EQ(out[0], out[1]) << quant_format_name(s.f) << " " << s.n_out << "x" << s.k << " m=" << m
                                  << " splits " << splits << ": the L2 prefetch changed the outputs";
      }
    }
  }
}

// The default split rule (host only): the fewest serial steps per warp, more splits only
// for a gain of more than 10%, at least 2 steps per split.
TEST(CudaQGemvDp4a, DefaultSplitRule) {
  // 8B shapes on 132 SMs x one CTA of 24 warps = 3168 resident warps, counted as units of
  // one output and steps of one chunk (the one-row default since session 57 gives the rule
  // half the units and the same steps: 2 outputs a warp, 2 chunks a step).
  // Outputs enough to fill half the warps: no split (measured: splits lost 1-50% there).
  EXPECT_EQ(qgemv_dp4a_default_splits(4096, 4, 3168), 1);    // o
  EXPECT_EQ(qgemv_dp4a_default_splits(4096, 14, 3168), 1);   // down
  EXPECT_EQ(qgemv_dp4a_default_splits(1000, 14, 3168), 8);   // few outputs, long K: 1 round x 14 steps -> 3 x 2
  EXPECT_EQ(qgemv_dp4a_default_splits(6144, 4, 3168), 1);    // qkv: 2 x 4, no split does better
  EXPECT_EQ(qgemv_dp4a_default_splits(14336, 4, 3168), 1);   // gate|up (4 splits: 19 x 1, but 1 step a split)
  EXPECT_EQ(qgemv_dp4a_default_splits(2048, 2, 3168), 1);    // TinyLlama o: 2 steps, nothing to split
  EXPECT_EQ(qgemv_dp4a_default_splits(128256, 4, 3168), 1);  // LM head: 41 x 4 -> 81 x 2, 1% less
  EXPECT_EQ(qgemv_dp4a_default_splits(1, 1, 3168), 1);
  EXPECT_EQ(qgemv_dp4a_default_splits(2, 448, 3168), 8);     // two outputs of a long K
  // A bad launch parameter is an error before the device is touched.
  const QuantWeightView v = quant_view_shape(QuantFormat::kQ4, 8, 64, QuantLayout::kRows);
  EXPECT_THROW(launch_qgemv_dp4a(DType::kBF16, nullptr, v, nullptr, nullptr, 1, 8, nullptr, GemvEpilogue::kNone,
                                 {0, 0, 3}),
               Error);
  EXPECT_THROW(launch_qgemv_dp4a(DType::kBF16, nullptr, v, nullptr, nullptr, 1, 8, nullptr, GemvEpilogue::kNone,
                                 {0, 3, 0}),
               Error);
  // A one-row form that is not built (the default outs 2 and chunks 2 at depth 8) is named.
  try {
    launch_qgemv_dp4a(DType::kBF16, nullptr, v, nullptr, nullptr, 1, 8, nullptr, GemvEpilogue::kNone, {0, 8, 0});
    ADD_FAILURE() << "expected an error for depth 8 with two outputs a warp and two chunks a step";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("2 outputs a warp, 2 chunks a step and depth 8"), std::string::npos)
        << e.what();
  }
}

// KILN_CUDA_QGEMV_ONE_ROW's parts (host only): each replaces the default's; unknown, empty
// and repeated parts and forms that are not built are errors naming the variable.
TEST(CudaQGemvDp4a, OneRowFormParse) {
  QGemvDp4aTuning t = qgemv_one_row_form_parse(nullptr);
  EXPECT_EQ(t.outs_one_row, 0);
  EXPECT_EQ(t.chunks_per_step, 0);
  EXPECT_EQ(t.depth, 0);
  t = qgemv_one_row_form_parse("outs1+chunks1");
  EXPECT_EQ(t.outs_one_row, 1);
  EXPECT_EQ(t.chunks_per_step, 1);
  EXPECT_EQ(t.depth, 0);
  t = qgemv_one_row_form_parse("depth2");
  EXPECT_EQ(t.depth, 2);
  EXPECT_EQ(t.outs_one_row, 0);
  t = qgemv_one_row_form_parse("chunks1+depth8+outs1");
  EXPECT_EQ(t.depth, 8);
  for (const char* bad : {"outs3", "outs2+", "+depth2", "outs2++depth2", "outs1+outs2", "depth8", "outs1+depth2",
                          "chunks"}) {
    try {
      qgemv_one_row_form_parse(bad);
      ADD_FAILURE() << "expected an error for '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << bad;
      EXPECT_NE(std::string(e.what()).find(std::string("KILN_CUDA_QGEMV_ONE_ROW='") + bad + "'"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_TRUE(qgemv_dp4a_one_row_built({}));
  QGemvDp4aTuning plain8{0, 8, 0};
  EXPECT_FALSE(qgemv_dp4a_one_row_built(plain8));
  plain8.outs_one_row = plain8.chunks_per_step = 1;
  EXPECT_TRUE(qgemv_dp4a_one_row_built(plain8));
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
