// GEMM tactics timed at decode row counts (gemm.h: Gemm::RowTuningScope). Without a GPU:
// the bookkeeping keyed by (shape, m) (gemm_row_tuning.h) and KILN_CUDA_GEMM_TUNE_M's
// parsing. On the device: a row count met inside a scope is timed over every algorithm the
// heuristic offers, keeps one of them, and its outputs equal the untimed path's (the
// heuristic's first) and an f64 reference within the bf16 bound, in bf16 (with bias and
// with a residual) and FP8; outside a scope, under graph capture, with the switch off, or
// at a row count tuned at load, nothing is timed anew. The tactic search and cache
// (gemm_search.h) on the device: CudaGemmSearch (their host side: gemm_search_test.cpp).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_context.h"
#include "backends/cuda/ops/fp8.h"
#include "backends/cuda/ops/gemm.h"
#include "backends/cuda/ops/gemm_row_tuning.h"
#include "backends/cuda/ops/gemm_search.h"
#include "core/dtype.h"
#include "cuda_test_util.h"

namespace kiln::cuda {
namespace {

using namespace testing;

const GemmShape kA{int(DType::kBF16), int(DType::kBF16), 1536, 1024, false, 1536};

TEST(GemmRowTuning, DecidesEachShapeOncePerRowCount) {
  GemmRowTuning rt;
  GemmShape with_bias = kA, wider_y = kA, fp8 = kA;
  with_bias.bias = true;
  wider_y.ldy = 3072;
  fp8.in = int(DType::kFP8E4M3);

  // Outside a window (prefill steps) nothing is decided.
  EXPECT_FALSE(rt.claim(kA, 64, true));
  EXPECT_FALSE(rt.decided(kA, 64));
  EXPECT_FALSE(rt.pending(kA, 64));

  rt.mark_timed(kA, 128);  // tuned at load
  rt.open();
  EXPECT_TRUE(rt.pending(kA, 64));
  EXPECT_TRUE(rt.claim(kA, 64, true));
  EXPECT_FALSE(rt.pending(kA, 64));
  EXPECT_FALSE(rt.claim(kA, 64, true)) << "the next layer of the same shape is not timed again";
  EXPECT_TRUE(rt.claim(kA, 65, true)) << "another row count is";
  EXPECT_TRUE(rt.claim(with_bias, 64, true));
  EXPECT_TRUE(rt.claim(wider_y, 64, true));
  EXPECT_TRUE(rt.claim(fp8, 64, true));
  EXPECT_FALSE(rt.claim(kA, 128, true)) << "a row count tuned at load keeps that choice";
  // Met while capturing: decided untimed, and never timed later (a graph holds the choice).
  EXPECT_FALSE(rt.claim(kA, 32, false));
  EXPECT_TRUE(rt.decided(kA, 32));
  EXPECT_FALSE(rt.claim(kA, 32, true));
  rt.add_cost(64, 2.0);
  rt.add_cost(64, 3.0);
  rt.add_cost(65, 1.5);

  rt.open();  // nested: only the outermost close reports
  EXPECT_TRUE(rt.close().empty());
  EXPECT_TRUE(rt.is_open());
  auto s = rt.close();
  EXPECT_FALSE(rt.is_open());
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].m, 64);
  EXPECT_EQ(s[0].shapes, 2);
  EXPECT_DOUBLE_EQ(s[0].ms, 5.0);
  EXPECT_EQ(s[1].m, 65);
  EXPECT_EQ(s[1].shapes, 1);
  rt.open();
  EXPECT_TRUE(rt.close().empty()) << "costs are reported once";

  // Rebuilt FP8 plans are decided anew; the others keep their choices.
  const size_t before = rt.num_decided();
  rt.forget_in(int(DType::kFP8E4M3));
  EXPECT_EQ(rt.num_decided(), before - 1);
  EXPECT_FALSE(rt.decided(fp8, 64));
  EXPECT_TRUE(rt.decided(kA, 64));

  // Switched off: nothing is timed or decided.
  rt.set_enabled(false);
  rt.open();
  EXPECT_FALSE(rt.pending(kA, 256));
  EXPECT_FALSE(rt.claim(kA, 256, true));
  EXPECT_FALSE(rt.decided(kA, 256));
  rt.close();
}

TEST(GemmRowTuning, EnvironmentValue) {
  EXPECT_TRUE(gemm_row_tuning_from_value(nullptr));
  EXPECT_TRUE(gemm_row_tuning_from_value(""));
  EXPECT_TRUE(gemm_row_tuning_from_value("1"));
  EXPECT_FALSE(gemm_row_tuning_from_value("0"));
  EXPECT_TRUE(gemm_row_tuning_from_value("all"));
  EXPECT_EQ(gemm_tune_rows_from_value("all"), GemmTuneRows::kAll);
  EXPECT_EQ(gemm_tune_rows_from_value(nullptr), GemmTuneRows::kDecode);
  EXPECT_EQ(gemm_tune_rows_from_value("0"), GemmTuneRows::kOff);
  for (const char* bad : {"off", "2", "true", "ALL"}) {
    try {
      gemm_row_tuning_from_value(bad);
      ADD_FAILURE() << "KILN_CUDA_GEMM_TUNE_M=" << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("KILN_CUDA_GEMM_TUNE_M"), std::string::npos) << e.what();
    }
  }
}

// Device buffers of bf16 values drawn in [-1, 1), with their f32 copies on the host.
struct Bf16Operand {
  std::vector<float> host;
  DeviceBuffer dev;
  Bf16Operand(int64_t n, std::mt19937_64& rng) : host(size_t(n)), dev(size_t(n) * 2) {
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    std::vector<uint16_t> bits(static_cast<size_t>(n));
    for (size_t i = 0; i < host.size(); ++i) {
      bits[i] = f32_to_bf16(d(rng));
      host[i] = bf16_to_f32(bits[i]);
    }
    KILN_CUDA_CHECK(cudaMemcpy(dev.get(), bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
  }
};

// y = x·wᵀ (+ bias) (+ residual) in f64, x [m, k], w [n, k].
std::vector<double> gemm_ref(const Bf16Operand& x, const Bf16Operand& w, const Bf16Operand* bias,
                             const Bf16Operand* residual, int64_t m, int64_t n, int64_t k) {
  std::vector<double> ref(size_t(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = bias ? bias->host[size_t(j)] : 0.0;
      for (int64_t q = 0; q < k; ++q) acc += double(x.host[size_t(i * k + q)]) * w.host[size_t(j * k + q)];
      ref[size_t(i * n + j)] = acc + (residual ? residual->host[size_t(i * n + j)] : 0.0);
    }
  return ref;
}

std::vector<float> download_bf16(const DeviceBuffer& b, int64_t n) {
  std::vector<uint16_t> bits(static_cast<size_t>(n));
  KILN_CUDA_CHECK(cudaMemcpy(bits.data(), b.get(), bits.size() * 2, cudaMemcpyDeviceToHost));
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) out[i] = bf16_to_f32(bits[i]);
  return out;
}

// max|got - ref| / max|ref|.
double rel_err(const std::vector<float>& got, const std::vector<double>& ref) {
  double err = 0, mx = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    err = std::isnan(got[i]) ? INFINITY : std::max(err, std::fabs(double(got[i]) - ref[i]));
    mx = std::max(mx, std::fabs(ref[i]));
  }
  return mx > 0 ? err / mx : err;
}
std::vector<double> as_f64(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// Every algorithm the heuristic offered was timed, and the kept one is the heuristic's
// first unless another was faster by more than the margin (then the fastest).
void expect_timed_choice(const Gemm::Choice& c, const std::string& what) {
  ASSERT_GE(c.candidates, 1) << what;
  ASSERT_EQ(int(c.times.size()), c.candidates) << what << ": not timed";
  for (int t = 0; t < c.candidates; ++t) {
    EXPECT_EQ(c.times[size_t(t)].tactic, t) << what;
    EXPECT_GT(c.times[size_t(t)].ms, 0.0f) << what;
  }
  ASSERT_GE(c.tactic, 0) << what;
  ASSERT_LT(c.tactic, c.candidates) << what;
  float best = c.times[0].ms;
  for (auto& t : c.times) best = std::min(best, t.ms);
  if (c.tactic == 0)
    EXPECT_LE(c.times[0].ms, best * (1.0f + Gemm::kRowTuneMargin)) << what;
  else
    EXPECT_EQ(c.times[size_t(c.tactic)].ms, best) << what;
  std::printf("  %-34s keeps #%d of %d (%.1f us; heuristic's first %.1f us)\n", what.c_str(), c.tactic, c.candidates,
              c.times[size_t(c.tactic)].ms * 1e3, c.times[0].ms * 1e3);
}

TEST(CudaGemmRowTuning, TunedRowCountsMatchTheHeuristicPath) {
  KILN_SKIP_WITHOUT_CUDA();
  cudaStream_t s = nullptr;
  KILN_CUDA_CHECK(cudaStreamCreate(&s));
  std::mt19937_64 rng(17);
  struct Case {
    int64_t m, n, k;
    bool bias, residual;
  };
  for (const Case& cs : {Case{64, 1536, 1024, false, false}, Case{256, 1536, 1024, true, false},
                         Case{64, 1024, 2048, false, true}, Case{96, 4096, 512, true, false}}) {
    const std::string what = str_cat("bf16 m=", cs.m, " n=", cs.n, " k=", cs.k, cs.bias ? " +bias" : "",
                                     cs.residual ? " +residual" : "");
    Bf16Operand x(cs.m * cs.k, rng), w(cs.n * cs.k, rng), bias(cs.n, rng), res(cs.m * cs.n, rng);
    const void* bp = cs.bias ? bias.dev.get() : nullptr;
    const void* rp = cs.residual ? res.dev.get() : nullptr;
    const std::vector<double> ref =
        gemm_ref(x, w, cs.bias ? &bias : nullptr, cs.residual ? &res : nullptr, cs.m, cs.n, cs.k);
    DeviceBuffer y0(size_t(cs.m * cs.n) * 2), y1(size_t(cs.m * cs.n) * 2);

    Gemm untimed;  // no scope: the heuristic's first
    untimed.run(DType::kBF16, x.dev.get(), w.dev.get(), bp, y0.get(), cs.m, cs.n, cs.k, s, 0, rp);
    const Gemm::Choice c0 = untimed.choice(DType::kBF16, DType::kBF16, cs.m, cs.n, cs.k, cs.bias);
    EXPECT_EQ(c0.tactic, 0) << what;
    EXPECT_TRUE(c0.times.empty()) << what;

    Gemm timed;
    timed.set_row_tuning(true);
    {
      Gemm::RowTuningScope scope(timed);
      timed.run(DType::kBF16, x.dev.get(), w.dev.get(), bp, y1.get(), cs.m, cs.n, cs.k, s, 0, rp);
    }
    KILN_CUDA_CHECK(cudaStreamSynchronize(s));
    const Gemm::Choice c1 = timed.choice(DType::kBF16, DType::kBF16, cs.m, cs.n, cs.k, cs.bias);
    expect_timed_choice(c1, what);
    EXPECT_EQ(c1.candidates, c0.candidates) << what << ": the same heuristic list";

    const std::vector<float> got0 = download_bf16(y0, cs.m * cs.n), got1 = download_bf16(y1, cs.m * cs.n);
    const double e01 = rel_err(got1, as_f64(got0)), e0 = rel_err(got0, ref), e1 = rel_err(got1, ref);
    std::printf("  %-34s tuned vs untuned %.3g, vs f64: untuned %.3g tuned %.3g\n", what.c_str(), e01, e0, e1);
    EXPECT_LE(e01, op_tolerance("bf16")) << what;
    EXPECT_LE(e0, op_tolerance("bf16")) << what;
    EXPECT_LE(e1, op_tolerance("bf16")) << what;

    // A later step at the same m keeps the choice without timing again.
    {
      Gemm::RowTuningScope scope(timed);
      timed.run(DType::kBF16, x.dev.get(), w.dev.get(), bp, y1.get(), cs.m, cs.n, cs.k, s, 0, rp);
    }
    const Gemm::Choice again = timed.choice(DType::kBF16, DType::kBF16, cs.m, cs.n, cs.k, cs.bias);
    EXPECT_EQ(again.tactic, c1.tactic) << what;
    ASSERT_EQ(again.times.size(), c1.times.size()) << what;
    for (size_t t = 0; t < c1.times.size(); ++t) EXPECT_EQ(again.times[t].ms, c1.times[t].ms) << what << ": retimed";
    KILN_CUDA_CHECK(cudaStreamSynchronize(s));
    EXPECT_LE(rel_err(download_bf16(y1, cs.m * cs.n), ref), op_tolerance("bf16")) << what;
  }
  KILN_CUDA_CHECK(cudaStreamDestroy(s));
}

TEST(CudaGemmRowTuning, NotTimedOutsideScopesUnderCaptureWhenOffOrTunedAtLoad) {
  KILN_SKIP_WITHOUT_CUDA();
  cudaStream_t s = nullptr;
  KILN_CUDA_CHECK(cudaStreamCreate(&s));
  std::mt19937_64 rng(5);
  const int64_t n = 1024, k = 1024, mmax = 128;
  Bf16Operand x(mmax * k, rng), w(n * k, rng);
  DeviceBuffer y(size_t(mmax * n) * 2), y_graph(size_t(mmax * n) * 2);
  auto choice = [&](Gemm& g, int64_t m) { return g.choice(DType::kBF16, DType::kBF16, m, n, k, false); };

  Gemm g;
  g.set_row_tuning(true);
  // Outside a scope (a prefill step), then inside one: the first decode step still times it.
  g.run(DType::kBF16, x.dev.get(), w.dev.get(), nullptr, y.get(), 48, n, k, s);
  EXPECT_TRUE(choice(g, 48).times.empty());
  {
    Gemm::RowTuningScope scope(g);
    g.run(DType::kBF16, x.dev.get(), w.dev.get(), nullptr, y.get(), 48, n, k, s);
  }
  expect_timed_choice(choice(g, 48), "bf16 m=48 after a prefill use");

  // Tuned at load: a decode step at that m keeps the load-time timings.
  const auto load = g.tune(DType::kBF16, x.dev.get(), w.dev.get(), nullptr, y.get(), 128, n, k, s);
  {
    Gemm::RowTuningScope scope(g);
    g.run(DType::kBF16, x.dev.get(), w.dev.get(), nullptr, y.get(), 128, n, k, s);
  }
  const Gemm::Choice c128 = choice(g, 128);
  ASSERT_EQ(c128.times.size(), load.size());
  for (size_t t = 0; t < load.size(); ++t) EXPECT_EQ(c128.times[t].ms, load[t].ms) << "retimed at m=128";

  // First met inside a scope under graph capture (its plan made before, by a prefill
  // use): not timed then (the capture would fail), nor afterwards.
  g.run(DType::kBF16, x.dev.get(), w.dev.get(), nullptr, y.get(), 80, n, k, s);
  {
    Gemm::RowTuningScope scope(g);
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    KILN_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    g.run(DType::kBF16, x.dev.get(), w.dev.get(), nullptr, y_graph.get(), 80, n, k, s);
    KILN_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    KILN_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    KILN_CUDA_CHECK(cudaGraphLaunch(exec, s));
    KILN_CUDA_CHECK(cudaStreamSynchronize(s));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  EXPECT_TRUE(choice(g, 80).times.empty());
  EXPECT_EQ(choice(g, 80).tactic, 0);
  {
    Gemm::RowTuningScope scope(g);
    g.run(DType::kBF16, x.dev.get(), w.dev.get(), nullptr, y.get(), 80, n, k, s);
  }
  EXPECT_TRUE(choice(g, 80).times.empty()) << "decided under capture, then timed";
  KILN_CUDA_CHECK(cudaStreamSynchronize(s));
  EXPECT_LE(rel_err(download_bf16(y_graph, 80 * n), as_f64(download_bf16(y, 80 * n))), op_tolerance("bf16"))
      << "the captured GEMM and eager differ";

  // Switched off.
  Gemm off;
  off.set_row_tuning(false);
  {
    Gemm::RowTuningScope scope(off);
    off.run(DType::kBF16, x.dev.get(), w.dev.get(), nullptr, y.get(), 64, n, k, s);
  }
  EXPECT_TRUE(choice(off, 64).times.empty());
  EXPECT_EQ(choice(off, 64).tactic, 0);
  KILN_CUDA_CHECK(cudaStreamSynchronize(s));
  KILN_CUDA_CHECK(cudaStreamDestroy(s));
}

// Row buckets (a server's GEMMs): a row count between powers of two runs the algorithms
// of the power of two above it that cuBLASLt accepts for it, with that plan's choice; the
// outputs stay within the bf16 bound of f64, with bias and with a residual; powers of two
// and one row keep their own heuristic lists.
TEST(CudaGemmRowTuning, RowBucketsRunThePowerOfTwosAlgorithms) {
  KILN_SKIP_WITHOUT_CUDA();
  cudaStream_t s = nullptr;
  KILN_CUDA_CHECK(cudaStreamCreate(&s));
  std::mt19937_64 rng(29);
  const int64_t n = 1536, k = 1024, mmax = 1024;
  Bf16Operand x(mmax * k, rng), w(n * k, rng), bias(n, rng), res(mmax * n, rng);
  DeviceBuffer y(size_t(mmax * n) * 2);
  Gemm g, plain;
  g.set_row_buckets(true);
  for (int64_t m : {3, 61, 100, 255, 700}) {
    for (bool with_bias : {false, true}) {
      const bool residual = !with_bias;
      const std::string what = str_cat("bf16 m=", m, with_bias ? " +bias" : " +residual");
      const void* bp = with_bias ? bias.dev.get() : nullptr;
      const void* rp = residual ? res.dev.get() : nullptr;
      g.run(DType::kBF16, x.dev.get(), w.dev.get(), bp, y.get(), m, n, k, s, 0, rp);
      KILN_CUDA_CHECK(cudaStreamSynchronize(s));
      std::vector<double> ref(size_t(m * n));
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double acc = with_bias ? bias.host[size_t(j)] : 0.0;
          for (int64_t q = 0; q < k; ++q) acc += double(x.host[size_t(i * k + q)]) * w.host[size_t(j * k + q)];
          ref[size_t(i * n + j)] = acc + (residual ? res.host[size_t(i * n + j)] : 0.0);
        }
      EXPECT_LE(rel_err(download_bf16(y, m * n), ref), op_tolerance("bf16")) << what;
      int64_t mb = 1;
      while (mb < m) mb *= 2;
      const Gemm::Choice c = g.choice(DType::kBF16, DType::kBF16, m, n, k, with_bias);
      const Gemm::Choice base = g.choice(DType::kBF16, DType::kBF16, mb, n, k, with_bias);
      ASSERT_GE(base.candidates, 1) << what << ": the power of two's plan was not made";
      EXPECT_GE(c.candidates, 1) << what;
      EXPECT_LE(c.candidates, base.candidates) << what << ": more algorithms than the bucket's";
      plain.run(DType::kBF16, x.dev.get(), w.dev.get(), bp, y.get(), m, n, k, s, 0, rp);
      std::printf("  %-26s %d of the m=%lld plan's %d algorithms (its own heuristic: %d)\n", what.c_str(),
                  c.candidates, (long long)mb, base.candidates,
                  plain.choice(DType::kBF16, DType::kBF16, m, n, k, with_bias).candidates);
    }
  }
  // Powers of two and one row: their own plans, as without buckets.
  for (int64_t m : {1, 64}) {
    g.run(DType::kBF16, x.dev.get(), w.dev.get(), nullptr, y.get(), m, n, k, s);
    plain.run(DType::kBF16, x.dev.get(), w.dev.get(), nullptr, y.get(), m, n, k, s);
    EXPECT_EQ(g.choice(DType::kBF16, DType::kBF16, m, n, k, false).candidates,
              plain.choice(DType::kBF16, DType::kBF16, m, n, k, false).candidates) << "m=" << m;
  }
  KILN_CUDA_CHECK(cudaStreamSynchronize(s));
  KILN_CUDA_CHECK(cudaStreamDestroy(s));
}

TEST(CudaGemmRowTuning, Fp8TunedRowCountMatchesTheHeuristicPath) {
  KILN_SKIP_WITHOUT_CUDA();
  if (!fp8_device_supported(0)) GTEST_SKIP() << "no FP8 on this device";
  cudaStream_t s = nullptr;
  KILN_CUDA_CHECK(cudaStreamCreate(&s));
  std::mt19937_64 rng(23);
  const int64_t m = 64, n = 2048, k = 1024;
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<uint8_t> xq(size_t(m * k)), wq(size_t(n * k));
  for (auto& v : xq) v = f32_to_fp8e4m3(d(rng) * 4.0f);
  for (auto& v : wq) v = f32_to_fp8e4m3(d(rng) * 4.0f);
  const float w_scale = 0.02f, x_scale = 0.5f;
  const float scales[8] = {w_scale, 0, 0, 0, x_scale, 0, 0, 0};
  Bf16Operand bias(n, rng);
  DeviceBuffer dx(xq.size()), dw(wq.size()), ds(sizeof scales), y0(size_t(m * n) * 2), y1(size_t(m * n) * 2);
  KILN_CUDA_CHECK(cudaMemcpy(dx.get(), xq.data(), xq.size(), cudaMemcpyHostToDevice));
  KILN_CUDA_CHECK(cudaMemcpy(dw.get(), wq.data(), wq.size(), cudaMemcpyHostToDevice));
  KILN_CUDA_CHECK(cudaMemcpy(ds.get(), scales, sizeof scales, cudaMemcpyHostToDevice));
  const auto* sp = static_cast<const float*>(ds.get());
  std::vector<double> ref(size_t(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t q = 0; q < k; ++q)
        acc += double(fp8e4m3_to_f32(xq[size_t(i * k + q)])) * fp8e4m3_to_f32(wq[size_t(j * k + q)]);
      ref[size_t(i * n + j)] = acc * double(w_scale) * x_scale + bias.host[size_t(j)];
    }

  Gemm untimed;
  untimed.run_fp8(dx.get(), dw.get(), sp, bias.dev.get(), y0.get(), m, n, k, s);
  Gemm timed;
  timed.set_row_tuning(true);
  {
    Gemm::RowTuningScope scope(timed);
    timed.run_fp8(dx.get(), dw.get(), sp, bias.dev.get(), y1.get(), m, n, k, s);
  }
  KILN_CUDA_CHECK(cudaStreamSynchronize(s));
  const Gemm::Choice c = timed.choice(DType::kFP8E4M3, DType::kBF16, m, n, k, true);
  expect_timed_choice(c, "fp8 m=64 n=2048 k=1024 +bias");
  EXPECT_EQ(c.candidates, untimed.choice(DType::kFP8E4M3, DType::kBF16, m, n, k, true).candidates);
  const std::vector<float> got0 = download_bf16(y0, m * n), got1 = download_bf16(y1, m * n);
  const double e01 = rel_err(got1, as_f64(got0)), e0 = rel_err(got0, ref), e1 = rel_err(got1, ref);
  std::printf("  fp8: tuned vs untuned %.3g, vs f64: untuned %.3g tuned %.3g\n", e01, e0, e1);
  EXPECT_LE(e01, op_tolerance("bf16"));
  EXPECT_LE(e0, op_tolerance("bf16"));
  EXPECT_LE(e1, op_tolerance("bf16"));
  KILN_CUDA_CHECK(cudaStreamDestroy(s));
}

// GEMM tactic search and the tactic cache (gemm_search.h): a searched plan times the
// heuristic's candidates and the search's and its output equals an f64 reference within the
// bf16 bound; a cache written by one Gemm gives a second its choice untimed (also inside a
// decode step's scope); an entry cuBLASLt refuses is timed anew and replaced.
TEST(CudaGemmSearch, SearchedChoiceIsCorrectAndTheCacheGivesItUntimed) {
  KILN_SKIP_WITHOUT_CUDA();
  cudaStream_t s = nullptr;
  KILN_CUDA_CHECK(cudaStreamCreate(&s));
  std::mt19937_64 rng(23);
  const auto dir = std::filesystem::temp_directory_path() / ("kiln_gemm_cache_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "cache.json").string();
  struct Case {
    int64_t m, n, k;
    bool bias;
  };
  for (const Case& cs : {Case{256, 1536, 1024, false}, Case{128, 768, 3072, true}, Case{48, 2304, 768, true}}) {
    const std::string what = str_cat("bf16 m=", cs.m, " n=", cs.n, " k=", cs.k, cs.bias ? " +bias" : "");
    Bf16Operand x(cs.m * cs.k, rng), w(cs.n * cs.k, rng), bias(cs.n, rng);
    const void* bp = cs.bias ? bias.dev.get() : nullptr;
    const std::vector<double> ref = gemm_ref(x, w, cs.bias ? &bias : nullptr, nullptr, cs.m, cs.n, cs.k);
    DeviceBuffer y(size_t(cs.m * cs.n) * 2);

    Gemm plain;
    plain.tune(DType::kBF16, x.dev.get(), w.dev.get(), bp, y.get(), cs.m, cs.n, cs.k, s);
    const Gemm::Choice c0 = plain.choice(DType::kBF16, DType::kBF16, cs.m, cs.n, cs.k, cs.bias);

    Gemm searched;
    searched.set_search(true);
    searched.set_tactic_cache(path);
    const auto times = searched.tune(DType::kBF16, x.dev.get(), w.dev.get(), bp, y.get(), cs.m, cs.n, cs.k, s);
    const Gemm::Choice c1 = searched.choice(DType::kBF16, DType::kBF16, cs.m, cs.n, cs.k, cs.bias);
    EXPECT_GT(c1.candidates, c0.candidates) << what << ": the search added no candidate";
    EXPECT_LE(c1.candidates, c0.candidates + 8) << what;
    ASSERT_EQ(int(times.size()), c1.candidates) << what << ": every candidate timed";
    float best = INFINITY;
    for (auto& t : times) best = std::min(best, t.ms);
    EXPECT_EQ(times[size_t(c1.tactic)].ms, best) << what;
    EXPECT_FALSE(c1.cached);
    ASSERT_TRUE(GemmAlgoConfig::parse(c1.algo).has_value()) << c1.algo;
    searched.run(DType::kBF16, x.dev.get(), w.dev.get(), bp, y.get(), cs.m, cs.n, cs.k, s);
    KILN_CUDA_CHECK(cudaStreamSynchronize(s));
    const double e1 = rel_err(download_bf16(y, int64_t(ref.size())), ref);
    std::printf("  %-28s heuristic's best #%d %.1f us, searched #%d of %d %.1f us (%s), err %.3g\n", what.c_str(),
                c0.tactic, c0.times[size_t(c0.tactic)].ms * 1e3, c1.tactic, c1.candidates, best * 1e3,
                c1.algo.c_str(), e1);
    EXPECT_LE(e1, op_tolerance("bf16")) << what;

    // A second Gemm with the cache: the same configuration, untimed, the same output bound.
    Gemm later;
    later.set_tactic_cache(path);
    EXPECT_TRUE(later.tune(DType::kBF16, x.dev.get(), w.dev.get(), bp, y.get(), cs.m, cs.n, cs.k, s).empty()) << what;
    const Gemm::Choice c2 = later.choice(DType::kBF16, DType::kBF16, cs.m, cs.n, cs.k, cs.bias);
    EXPECT_TRUE(c2.cached) << what;
    EXPECT_TRUE(c2.times.empty()) << what;
    EXPECT_EQ(c2.algo, c1.algo) << what;
    KILN_CUDA_CHECK(cudaMemset(y.get(), 0xff, size_t(cs.m * cs.n) * 2));  // NaNs unless written
    later.run(DType::kBF16, x.dev.get(), w.dev.get(), bp, y.get(), cs.m, cs.n, cs.k, s);
    KILN_CUDA_CHECK(cudaStreamSynchronize(s));
    EXPECT_LE(rel_err(download_bf16(y, int64_t(ref.size())), ref), op_tolerance("bf16")) << what;
    // Inside a decode step's scope the cached row count is not timed again either.
    later.set_row_tuning(true);
    {
      Gemm::RowTuningScope scope(later);
      later.run(DType::kBF16, x.dev.get(), w.dev.get(), bp, y.get(), cs.m, cs.n, cs.k, s);
    }
    EXPECT_TRUE(later.choice(DType::kBF16, DType::kBF16, cs.m, cs.n, cs.k, cs.bias).times.empty()) << what;
  }

  // An entry cuBLASLt refuses (no such algorithm): the plan is timed anew and the entry replaced.
  {
    const std::string device = gemm_tactic_device();
    const GemmShape shape{int(DType::kBF16), int(DType::kBF16), 1536, 1024, false, 1536};
    const std::string key = gemm_cache_key(shape, 64, false);
    {
      GemmTacticCache c(path, device);
      ASSERT_GT(c.size(), 0u) << "the searches above wrote no entry for '" << device << "'";
      GemmAlgoConfig junk;
      junk.id = 99999;
      c.put(key, {junk, 1.0});
    }
    Bf16Operand x(64 * 1024, rng), w(1536 * 1024, rng);
    DeviceBuffer y(size_t(64 * 1536) * 2);
    Gemm g;
    g.set_tactic_cache(path);
    const auto times = g.tune(DType::kBF16, x.dev.get(), w.dev.get(), nullptr, y.get(), 64, 1536, 1024, s);
    EXPECT_FALSE(times.empty()) << "a refused entry was not timed anew";
    EXPECT_FALSE(g.choice(DType::kBF16, DType::kBF16, 64, 1536, 1024, false).cached);
    GemmTacticCache c(path, device);
    ASSERT_TRUE(c.find(key).has_value());
    EXPECT_NE(c.find(key)->algo.id, 99999) << "the refused entry was not replaced";
  }
  std::filesystem::remove_all(dir);
  KILN_CUDA_CHECK(cudaStreamDestroy(s));
}

}  // namespace
}  // namespace kiln::cuda
