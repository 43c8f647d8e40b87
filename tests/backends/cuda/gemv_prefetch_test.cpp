// The prefetching GEMV (GemvKind::kPrefetch, ops/gemv_prefetch.cu) launched directly:
// against a host reference (f64 sums rounded where the unfused kernels round) and against
// the streaming kernel on the same inputs, over a table of shapes (n not a multiple of
// anything, k from 64 to 14336 - whole-row tiles, column tiles with a partial last one -,
// 1-4 rows, bf16 and f16, every epilogue, bias, the norm prologues, the residual), at the
// smallest ring (one stage: the producer waits for the consumers at every tile), the
// default and the largest; bit-identical to the streaming kernel where that one does not
// split K. A CUDA graph of a dependent-launch chain (prefetching GEMVs, a norm and the
// streaming GEMV triggering early, a residual read two kernels later) replays as it ran
// eagerly and as the streaming chain computes. KILN_CUDA_GEMV / KILN_CUDA_GEMV_RING_KB
// parsing. Skips without a GPU (the environment tests need none).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "backends/cuda/cuda_context.h"
#include "backends/cuda/ops/convert.h"
#include "backends/cuda/ops/gemv.h"
#include "backends/cuda/ops/norm.h"
#include "core/status.h"

#include "cuda_test_util.h"

namespace kiln::cuda {
namespace {

using namespace testing;

float round_to(DType t, double v) {
  const float f = float(v);
  return t == DType::kBF16 ? bf16_to_f32(f32_to_bf16(f)) : f16_to_f32(f32_to_f16(f));
}

struct Case {
  int64_t m, n, k;
  GemvEpilogue epi;
  bool bias;
  GemvNorm norm;
  bool residual;
};

std::string case_name(const std::string& dt, const Case& c) {
  const char* epi[] = {"none", "gelu_erf", "gelu_tanh", "silu", "swiglu"};
  const char* norm[] = {"", " rms", " layer"};
  return str_cat(dt, " m=", c.m, " n=", c.n, " k=", c.k, " ", epi[int(c.epi)], c.bias ? " +bias" : "",
                 norm[int(c.norm)], c.residual ? " +res" : "");
}

// Inputs on the host (f32 values exact in the dtype) and on the device.
struct Data {
  DType dtype;
  int64_t rows;  // weight rows: 2n with SwiGLU
  Tensor x, w, b, gamma, beta, res;
  DeviceBuffer dx, dw, db, dgamma, dbeta, dres, dy;
  Data(const std::string& dt, const Case& c, uint64_t seed) : dtype(storage_dtype(dt)) {
    std::mt19937_64 rng(seed);
    rows = c.epi == GemvEpilogue::kSwiGlu ? 2 * c.n : c.n;
    x = random_tensor({c.m, c.k}, rng, dt, -2.0f, 2.0f);
    w = random_tensor({rows, c.k}, rng, dt, -0.1f, 0.1f);
    b = random_tensor({rows}, rng, dt);
    gamma = random_tensor({c.k}, rng, "f32", 0.5f, 1.5f);
    beta = random_tensor({c.k}, rng, "f32", -0.5f, 0.5f);
    res = random_tensor({c.m, c.n}, rng, dt, -2.0f, 2.0f);
    dx = upload(x, dtype);
    dw = upload(w, dtype);
    db = upload(b, dtype);
    dgamma = upload(gamma, DType::kF32);
    dbeta = upload(beta, DType::kF32);
    dres = upload(res, dtype);
    dy = DeviceBuffer(size_t(c.m * c.n) * 2);
  }
  static DeviceBuffer upload(const Tensor& t, DType to) {
    const Tensor h = t.to(to);
    DeviceBuffer d(h.nbytes());
    KILN_CUDA_CHECK(cudaMemcpy(d.get(), h.data(), h.nbytes(), cudaMemcpyHostToDevice));
    return d;
  }
  GemvFusion fusion(const Case& c) const {
    GemvFusion f;
    f.norm = c.norm;
    if (c.norm != GemvNorm::kNone) {
      f.gamma = static_cast<const float*>(dgamma.get());
      f.beta = c.norm == GemvNorm::kLayer ? static_cast<const float*>(dbeta.get()) : nullptr;
      f.eps = 1e-5f;
    }
    f.residual = c.residual ? dres.get() : nullptr;
    return f;
  }
  Tensor run(const Case& c, GemvKind kind) {
    KILN_CUDA_CHECK(cudaMemset(dy.get(), 0xff, size_t(c.m * c.n) * 2));  // NaNs where nothing is stored
    launch_gemv(dtype, dx.get(), dw.get(), c.bias ? db.get() : nullptr, dy.get(), c.m, c.n, c.k, nullptr, c.epi,
                fusion(c), kind);
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    Tensor h(dtype, {c.m, c.n});
    KILN_CUDA_CHECK(cudaMemcpy(h.data(), dy.get(), h.nbytes(), cudaMemcpyDeviceToHost));
    return h.to(DType::kF32);
  }
};

// The unfused graph's arithmetic in f64, rounded to the dtype where its kernels store:
// the norm's rows, the Linear's output, the activation (SwiGLU: gate, up, silu(gate), the
// product), the residual sum.
Tensor host_reference(const Data& d, const Case& c) {
  const int64_t k = c.k;
  std::vector<float> xn(size_t(c.m * k));
  for (int64_t t = 0; t < c.m; ++t) {
    const float* xr = d.x.data_as<float>() + t * k;
    double mean = 0, var = 0;
    for (int64_t i = 0; i < k; ++i) mean += xr[i];
    mean /= double(k);
    for (int64_t i = 0; i < k; ++i) {
      const double v = c.norm == GemvNorm::kRms ? xr[i] : xr[i] - mean;
      var += v * v;
    }
    const double r = 1.0 / std::sqrt(var / double(k) + 1e-5);
    for (int64_t i = 0; i < k; ++i) {
      const double g = d.gamma.data_as<float>()[i], be = d.beta.data_as<float>()[i];
      double v = xr[i];
      if (c.norm == GemvNorm::kRms) v = v * r * g;
      else if (c.norm == GemvNorm::kLayer) v = (v - mean) * r * g + be;
      xn[size_t(t * k + i)] = c.norm == GemvNorm::kNone ? xr[i] : round_to(d.dtype, v);
    }
  }
  auto dot = [&](int64_t t, int64_t row) {
    double s = c.bias ? double(d.b.data_as<float>()[row]) : 0.0;
    const float* wr = d.w.data_as<float>() + row * k;
    for (int64_t i = 0; i < k; ++i) s += double(xn[size_t(t * k + i)]) * double(wr[i]);
    return double(round_to(d.dtype, s));
  };
  Tensor y(DType::kF32, {c.m, c.n});
  for (int64_t t = 0; t < c.m; ++t)
    for (int64_t o = 0; o < c.n; ++o) {
      const double v = dot(t, o);
      double out = v;
      switch (c.epi) {
        case GemvEpilogue::kNone: break;
        case GemvEpilogue::kGeluErf: out = 0.5 * v * std::erfc(-v / std::sqrt(2.0)); break;
        case GemvEpilogue::kGeluTanh:
          out = 0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
          break;
        case GemvEpilogue::kSilu: out = v / (1.0 + std::exp(-v)); break;
        case GemvEpilogue::kSwiGlu: out = double(round_to(d.dtype, v / (1.0 + std::exp(-v)))) * dot(t, c.n + o); break;
      }
      out = round_to(d.dtype, out);
      if (c.residual) out = round_to(d.dtype, out + double(d.res.data_as<float>()[t * c.n + o]));
      y.data_as<float>()[t * c.n + o] = float(out);
    }
  return y;
}

struct RingKb {
  explicit RingKb(const char* kb) {
    if (kb) setenv("KILN_CUDA_GEMV_RING_KB", kb, 1);
    else unsetenv("KILN_CUDA_GEMV_RING_KB");
  }
  ~RingKb() { unsetenv("KILN_CUDA_GEMV_RING_KB"); }
};

// Against the host reference and the streaming kernel; bit-identical to it where the
// streaming kernel gives a row one warp (k < 1024, or n > 8192: gemv.cu's split_for).
void check(const std::string& dt, const Case& c, const char* ring_kb) {
  const std::string what = case_name(dt, c) + (ring_kb ? str_cat(" ring ", ring_kb, " KB") : "");
  Data d(dt, c, uint64_t(c.m * 1000003 + c.n * 7919 + c.k * 31 + int(c.epi) * 5 + dt[0]));
  const Tensor ref = host_reference(d, c);
  const Tensor stream = d.run(c, GemvKind::kStream);
  const RingKb ring(ring_kb);
  const Tensor got = d.run(c, GemvKind::kPrefetch);
  const Diff e = diff(got, ref), es = diff(stream, ref);
  std::printf("  %-58s rel %.3g (stream %.3g)\n", what.c_str(), e.rel(), es.rel());
  EXPECT_LE(e.rel(), op_tolerance(dt)) << what;
  if (c.k < 1024 || c.n > 8192)
    EXPECT_EQ(std::memcmp(got.data(), stream.data(), got.nbytes()), 0) << what << ": not the streaming kernel's bits";
  else
    EXPECT_LE(diff(got, stream).rel(), op_tolerance(dt)) << what << " vs stream";
  // Again: the same bits (no order depends on timing).
  const Tensor again = d.run(c, GemvKind::kPrefetch);
  EXPECT_EQ(std::memcmp(got.data(), again.data(), got.nbytes()), 0) << what << ": rerun differs";
}

TEST(CudaGemvPrefetch, MatchesReferenceAndStreamOverShapes) {
  KILN_SKIP_WITHOUT_CUDA();
  if (!gemv_prefetch_available()) GTEST_SKIP() << "the prefetching GEMV needs sm_90";
  using E = GemvEpilogue;
  using N = GemvNorm;
  const Case cases[] = {
      {1, 1, 64, E::kNone, false, N::kNone, false},        // one row, one CTA
      {3, 131, 64, E::kGeluErf, true, N::kNone, false},    // many whole rows per tile
      {2, 263, 72, E::kSwiGlu, true, N::kRms, true},       // k % 16 != 0, norm and residual
      {4, 1001, 520, E::kGeluTanh, true, N::kLayer, false},
      {1, 2309, 1000, E::kSilu, false, N::kNone, true},    // whole rows, 8 per tile
      {2, 777, 1032, E::kNone, true, N::kRms, false},      // column tiles, a partial last one
      {1, 515, 2056, E::kSwiGlu, false, N::kRms, false},   // SwiGLU column tiles of 512
      {4, 333, 4104, E::kNone, false, N::kNone, true},     // x from global (4 x 4104 > 32 KB)
      {1, 200, 14336, E::kNone, true, N::kNone, true},     // the 8B down shape's k
      {3, 8195, 1024, E::kSilu, false, N::kNone, false},   // n > 8192: stream's split is 1
      {1, 5003, 768, E::kGeluTanh, true, N::kLayer, true}, // GPT-2's fc with everything
  };
  for (const char* dt : {"bf16", "f16"})
    for (const Case& c : cases) check(dt, c, nullptr);
  // The ring's extremes: one stage (every tile waits for the previous one's consumers)
  // and twelve.
  for (const char* kb : {"16", "192"})
    for (const Case& c : {cases[2], cases[5], cases[8]}) check("bf16", c, kb);
}

// A decode-step-like chain captured with programmatic dependent launch: the GEMVs'
// inputs are written by the kernel just before them, the last one adds a residual
// written three kernels earlier. Replay equals eager bit for bit; the prefetching chain
// equals the streaming one within rounding.
TEST(CudaGemvPrefetch, DependentLaunchChainGraphMatchesEagerAndStream) {
  KILN_SKIP_WITHOUT_CUDA();
  if (!gemv_prefetch_available()) GTEST_SKIP() << "the prefetching GEMV needs sm_90";
  const int64_t d = 1536, ff = 4096;
  DeviceBuffer x(size_t(d) * 2), h(size_t(d) * 2), q(size_t(d) * 2), a(size_t(d) * 2), u(size_t(ff) * 2),
      out(size_t(d) * 4), wq(size_t(d * d) * 2), wo(size_t(d * d) * 2), wu(size_t(2 * ff * d) * 2),
      wd(size_t(d * ff) * 2), gamma(size_t(d) * 4);
  cudaStream_t s;
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  launch_fill_random(wq.get(), DType::kBF16, d * d, 1, s);
  launch_fill_random(wo.get(), DType::kBF16, d * d, 2, s);
  launch_fill_random(wu.get(), DType::kBF16, 2 * ff * d, 3, s);
  launch_fill_random(wd.get(), DType::kBF16, d * ff, 4, s);
  launch_fill_random(gamma.get(), DType::kF32, d, 5, s);
  KILN_CUDA_CHECK(cudaStreamSynchronize(s));  // weights exist before any step, as in the backend
  auto* g = static_cast<const float*>(gamma.get());
  auto enqueue = [&](GemvKind kind) {
    launch_fill_random(x.get(), DType::kBF16, d, 6, s);
    launch_rms_norm(DType::kBF16, x.get(), g, 1e-5f, 1, d, h.get(), s);  // early trigger (1 row)
    launch_gemv(DType::kBF16, h.get(), wq.get(), nullptr, q.get(), 1, d, d, s, GemvEpilogue::kNone,
                GemvFusion{GemvNorm::kRms, g, nullptr, 1e-5f, nullptr}, kind);
    launch_add_rms_norm(DType::kBF16, q.get(), h.get(), g, 1e-5f, 1, d, x.get(), a.get(), s);
    launch_gemv(DType::kBF16, a.get(), wo.get(), nullptr, h.get(), 1, d, d, s, GemvEpilogue::kNone,
                GemvFusion{GemvNorm::kNone, nullptr, nullptr, 0.0f, h.get()}, kind);
    launch_gemv(DType::kBF16, h.get(), wu.get(), nullptr, u.get(), 1, ff, d, s, GemvEpilogue::kSwiGlu,
                GemvFusion{GemvNorm::kRms, g, nullptr, 1e-5f, nullptr}, kind);
    // The residual: x, written by the add-norm three kernels back.
    launch_gemv(DType::kBF16, u.get(), wd.get(), nullptr, h.get(), 1, d, ff, s, GemvEpilogue::kNone,
                GemvFusion{GemvNorm::kNone, nullptr, nullptr, 0.0f, x.get()}, kind);
    launch_convert(h.get(), DType::kBF16, out.get(), DType::kF32, d, s);
  };
  auto fetch = [&] {
    std::vector<float> v(static_cast<size_t>(d));
    KILN_CUDA_CHECK(cudaMemcpyAsync(v.data(), out.get(), v.size() * 4, cudaMemcpyDeviceToHost, s));
    KILN_CUDA_CHECK(cudaStreamSynchronize(s));
    KILN_CUDA_CHECK(cudaMemsetAsync(out.get(), 0, v.size() * 4, s));
    KILN_CUDA_CHECK(cudaMemsetAsync(h.get(), 0, size_t(d) * 2, s));
    return v;
  };
  std::vector<float> results[2][2];  // [kind][eager, replay]
  for (GemvKind kind : {GemvKind::kStream, GemvKind::kPrefetch}) {
    auto& r = results[kind == GemvKind::kPrefetch];
    set_pdl_allowed(true);
    enqueue(kind);
    r[0] = fetch();
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    KILN_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    enqueue(kind);
    KILN_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    set_pdl_allowed(false);
    KILN_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < 3; ++i) KILN_CUDA_CHECK(cudaGraphLaunch(exec, s));  // back to back, as decode steps
    r[1] = fetch();
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    double mx = 0;
    for (float v : r[0]) mx = std::max(mx, double(std::fabs(v)));
    EXPECT_GT(mx, 0.0) << "all-zero output";
    EXPECT_EQ(std::memcmp(r[0].data(), r[1].data(), r[0].size() * 4), 0)
        << (kind == GemvKind::kPrefetch ? "prefetch" : "stream") << ": replay differs from eager";
  }
  cudaStreamDestroy(s);
  Tensor ts = Tensor::view(results[0][0].data(), DType::kF32, {d});
  Tensor tp = Tensor::view(results[1][0].data(), DType::kF32, {d});
  const Diff e = diff(tp, ts);
  std::printf("  chain prefetch vs stream: max|err| %.3g  max|ref| %.3g  rel %.3g\n", e.max_err, e.max_ref, e.rel());
  EXPECT_LE(e.rel(), 3e-2);
}

TEST(CudaGemvPrefetch, EnvironmentChoices) {
  unsetenv("KILN_CUDA_GEMV");
  EXPECT_TRUE(gemv_choice_from_env().use);
  EXPECT_EQ(gemv_choice_from_env().kind, GemvKind::kStream);
  setenv("KILN_CUDA_GEMV", "prefetch", 1);
  EXPECT_EQ(gemv_choice_from_env().kind, GemvKind::kPrefetch);
  setenv("KILN_CUDA_GEMV", "stream", 1);
  EXPECT_EQ(gemv_choice_from_env().kind, GemvKind::kStream);
  setenv("KILN_CUDA_GEMV", "0", 1);
  EXPECT_FALSE(gemv_choice_from_env().use);
  setenv("KILN_CUDA_GEMV", "fast", 1);
  try {
    gemv_choice_from_env();
    ADD_FAILURE() << "KILN_CUDA_GEMV=fast accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KILN_CUDA_GEMV"), std::string::npos) << e.what();
  }
  unsetenv("KILN_CUDA_GEMV");
  EXPECT_EQ(gemv_prefetch_ring_bytes(), 64 << 10);
  setenv("KILN_CUDA_GEMV_RING_KB", "96", 1);
  EXPECT_EQ(gemv_prefetch_ring_bytes(), 96 << 10);
  for (const char* bad : {"0", "24", "208", "64k"}) {
    setenv("KILN_CUDA_GEMV_RING_KB", bad, 1);
    try {
      gemv_prefetch_ring_bytes();
      ADD_FAILURE() << "KILN_CUDA_GEMV_RING_KB=" << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("KILN_CUDA_GEMV_RING_KB"), std::string::npos) << e.what();
    }
  }
  unsetenv("KILN_CUDA_GEMV_RING_KB");
}

}  // namespace
}  // namespace kiln::cuda
