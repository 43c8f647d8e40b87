// The skinny tensor-core GEMM (ops/skinny_gemm.h) for 5..128 token rows: Linear graphs on
// the CUDA backend against the CPU backend (every row-count bucket, K not a multiple of the
// 64-wide stage, N not of the row tile, bias, each epilogue incl. SwiGLU, bf16 and f16, the
// K % 8 fallback to cuBLASLt, KILN_CUDA_SKINNY=0 and a bad value); the kernel launched
// directly at every split-K factor against a host reference (bit-identical reruns, splits
// agreeing within rounding); and a CUDA-graph capture with programmatic dependent launch
// whose replay must equal the eager run bit for bit. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "backends/cuda/cuda_context.h"
#include "backends/cuda/ops/convert.h"
#include "backends/cuda/ops/skinny_gemm.h"
#include "core/status.h"

#include "cuda_test_util.h"

namespace kiln::cuda {
namespace {

using namespace testing;

const std::vector<int64_t>& skinny_rows() {
  static const std::vector<int64_t> v = {5, 8, 9, 16, 33, 64, 100, 128};  // every bucket, both edges
  return v;
}

// One Linear [n, k] graph run at every row count of `ts` (one compile, one step each).
void check_linear(const std::string& dt, int64_t n, int64_t k, bool bias, const std::string& act,
                  const std::vector<int64_t>& ts, uint64_t seed) {
  std::mt19937_64 rng(seed);
  ir::Graph g;
  ir::ValueId x = g.add_input("x", DType::kF32, Shape{"T", k});
  ir::ValueId w = g.add_weight("w", random_tensor({n, k}, rng, dt, -0.1f, 0.1f));
  ir::ValueId b = bias ? g.add_weight("b", random_tensor({n}, rng, dt)) : ir::kNoValue;
  std::map<std::string, ir::Attr> attrs;
  if (!act.empty()) attrs["activation"] = act;
  g.add_output("y", g.add("Linear", {x, w, b}, std::move(attrs), "linear"));
  std::vector<StepCase> steps;
  for (int64_t t : ts) {
    StepCase s;
    s.inputs["x"] = random_tensor({t, k}, rng, dt);
    steps.push_back(std::move(s));
  }
  expect_backends_match(g, steps, dt, op_tolerance(dt),
                        str_cat("Linear", act.empty() ? "" : "+", act, " n=", n, " k=", k, bias ? " +bias" : "",
                                " t=5..128"));
}

// The kernel is opt-in (KILN_CUDA_SKINNY=N): the Linear-level tests turn it on up to 128
// rows for their body.
struct SkinnyOn {
  SkinnyOn() { setenv("KILN_CUDA_SKINNY", "128", 1); }
  ~SkinnyOn() { unsetenv("KILN_CUDA_SKINNY"); }
};

TEST(CudaSkinny, LinearMatchesCpuAtEveryRowBucket) {
  KILN_SKIP_WITHOUT_CUDA();
  const SkinnyOn on;
  struct S { int64_t n, k; bool bias; };
  for (const char* dt : {"bf16", "f16"})
    for (S s : {S{96, 64, false},      // one k tile, a partial row tile
                S{200, 1000, true},    // K % 64 != 0: the last stage zero-filled
                S{3072, 2048, true},   // few row tiles: split-K through a cluster
                S{72, 4104, false},    // one row tile, long K, K % 64 == 8
                S{4160, 256, true}})   // many row tiles, short K (no split)
      check_linear(dt, s.n, s.k, s.bias, "", skinny_rows(), uint64_t(s.n * 31 + s.k + dt[0]));
}

TEST(CudaSkinny, EpiloguesMatchCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  const SkinnyOn on;
  for (const char* dt : {"bf16", "f16"})
    for (const char* act : {"gelu_erf", "gelu_tanh", "silu", "swiglu"}) {
      // swiglu: 2 x 161 rows, so the last 32-output tile is partial; 1536: split-K.
      check_linear(dt, 322, 520, true, act, {5, 9, 33, 128}, uint64_t(act[0] * 3 + act[5] + dt[0]));
      check_linear(dt, 1536, 2048, false, act, {16, 64, 100}, uint64_t(act[0] * 5 + act[5] + dt[0]));
    }
}

// K not a multiple of 8 (rows not 16-byte aligned): cuBLASLt takes these rows.
TEST(CudaSkinny, UnalignedKFallsBackToCublasLt) {
  KILN_SKIP_WITHOUT_CUDA();
  const SkinnyOn on;
  EXPECT_FALSE(skinny_supports(DType::kBF16, 16, 100));
  EXPECT_FALSE(skinny_supports(DType::kF32, 16, 128));
  EXPECT_FALSE(skinny_supports(DType::kBF16, kSkinnyMaxRows + 1, 128));
  check_linear("bf16", 130, 100, true, "silu", {9, 40}, 5);
}

TEST(CudaSkinny, EnvironmentSwitch) {
  KILN_SKIP_WITHOUT_CUDA();
  setenv("KILN_CUDA_SKINNY", "0", 1);
  EXPECT_EQ(skinny_rows_limit(), 0);
  check_linear("bf16", 640, 512, true, "swiglu", {9, 64}, 11);  // the cuBLASLt path, as before
  setenv("KILN_CUDA_SKINNY", "32", 1);
  EXPECT_EQ(skinny_rows_limit(), 32);
  check_linear("bf16", 640, 512, true, "", {16, 33, 64}, 12);  // 16 skinny, 33 and 64 cuBLASLt
  setenv("KILN_CUDA_SKINNY", "many", 1);
  try {
    skinny_rows_limit();
    ADD_FAILURE() << "KILN_CUDA_SKINNY=many accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KILN_CUDA_SKINNY"), std::string::npos) << e.what();
  }
  unsetenv("KILN_CUDA_SKINNY");
  EXPECT_EQ(skinny_rows_limit(), 0);  // off by default (slower than cuBLASLt as measured)
}

// Host data for a direct launch: x [m, k], w [rows, k], bias [rows] in `dt`, on the device.
struct Direct {
  DType dtype;
  Tensor x, w, b;  // f32 values exactly representable in dtype
  DeviceBuffer dx, dw, db, dy;
  Direct(const std::string& dt, int64_t m, int64_t rows, int64_t k, int64_t n_out, uint64_t seed)
      : dtype(storage_dtype(dt)) {
    std::mt19937_64 rng(seed);
    x = random_tensor({m, k}, rng, dt);
    w = random_tensor({rows, k}, rng, dt, -0.1f, 0.1f);
    b = random_tensor({rows}, rng, dt);
    dx = upload(x);
    dw = upload(w);
    db = upload(b);
    dy = DeviceBuffer(size_t(m * n_out) * 2);
  }
  DeviceBuffer upload(const Tensor& t) const {
    const Tensor h = t.to(dtype);
    DeviceBuffer d(h.nbytes());
    KILN_CUDA_CHECK(cudaMemcpy(d.get(), h.data(), h.nbytes(), cudaMemcpyHostToDevice));
    return d;
  }
  Tensor download(const DeviceBuffer& d, int64_t m, int64_t n) const {
    Tensor h(dtype, {m, n});
    KILN_CUDA_CHECK(cudaMemcpy(h.data(), d.get(), h.nbytes(), cudaMemcpyDeviceToHost));
    return h.to(DType::kF32);
  }
};

float round_to(DType t, double v) {
  const float f = float(v);
  return t == DType::kBF16 ? bf16_to_f32(f32_to_bf16(f)) : f16_to_f32(f32_to_f16(f));
}

// y = x·wᵀ + b in f64, rounded to the dtype; with SwiGLU (rows [gate; up]) rounded where
// the unfused GEMM -> SwiGLU kernels round: gate, up, silu(gate), the product.
Tensor host_reference(const Direct& d, int64_t m, int64_t k, int64_t n_out, bool swiglu) {
  Tensor y(DType::kF32, {m, n_out});
  const float* x = d.x.data_as<float>();
  const float* w = d.w.data_as<float>();
  const float* b = d.b.data_as<float>();
  auto dot = [&](int64_t t, int64_t r) {
    double s = b[r];
    for (int64_t i = 0; i < k; ++i) s += double(x[t * k + i]) * double(w[r * k + i]);
    return s;
  };
  for (int64_t t = 0; t < m; ++t)
    for (int64_t o = 0; o < n_out; ++o) {
      double v = round_to(d.dtype, dot(t, o));
      if (swiglu) v = double(round_to(d.dtype, v / (1.0 + std::exp(-v)))) * round_to(d.dtype, dot(t, n_out + o));
      y.data_as<float>()[t * n_out + o] = round_to(d.dtype, v);
    }
  return y;
}

bool has_clusters() {
  int dev = 0, major = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  return major >= 9;
}

TEST(CudaSkinny, EverySplitMatchesHostReferenceAndRerunsBitIdentical) {
  KILN_SKIP_WITHOUT_CUDA();
  const int max_split = has_clusters() ? kSkinnyMaxSplit : 1;
  struct S { int64_t m, n, k; bool swiglu; };
  for (const char* dt : {"bf16", "f16"})
    for (S s : {S{9, 200, 1032, false}, S{33, 96, 2048, true}, S{64, 130, 1600, false}, S{128, 260, 2056, true}}) {
      const int64_t rows = s.swiglu ? 2 * s.n : s.n;
      Direct d(dt, s.m, rows, s.k, s.n, uint64_t(s.m * 7 + s.k));
      const Tensor ref = host_reference(d, s.m, s.k, s.n, s.swiglu);
      const GemvEpilogue epi = s.swiglu ? GemvEpilogue::kSwiGlu : GemvEpilogue::kNone;
      Tensor first;
      for (int split = 1; split <= max_split; ++split) {
        const std::string what = str_cat(dt, " m=", s.m, " n=", s.n, " k=", s.k, s.swiglu ? " swiglu" : "",
                                         " split=", split);
        launch_skinny_gemm(d.dtype, d.dx.get(), d.dw.get(), d.db.get(), d.dy.get(), s.m, s.n, s.k, nullptr, epi,
                           split);
        KILN_CUDA_CHECK(cudaDeviceSynchronize());
        const Tensor got = d.download(d.dy, s.m, s.n);
        const Diff e = diff(got, ref);
        std::printf("  skinny %-44s max|err| %.3g  max|ref| %.3g  rel %.3g\n", what.c_str(), e.max_err, e.max_ref,
                    e.rel());
        EXPECT_LE(e.rel(), op_tolerance(dt)) << what;
        // The same launch again: the same bits (the cluster adds partials in rank order).
        KILN_CUDA_CHECK(cudaMemset(d.dy.get(), 0xff, size_t(s.m * s.n) * 2));
        launch_skinny_gemm(d.dtype, d.dx.get(), d.dw.get(), d.db.get(), d.dy.get(), s.m, s.n, s.k, nullptr, epi,
                           split);
        const Tensor again = d.download(d.dy, s.m, s.n);
        EXPECT_EQ(std::memcmp(got.data(), again.data(), got.nbytes()), 0) << what << ": rerun differs";
        if (split == 1) first = got;
        else EXPECT_LE(diff(got, first).rel(), op_tolerance(dt)) << what << " vs split 1";
      }
    }
}

// The decode-step setting: a graph captured with programmatic dependent launch, where the
// GEMM's input is written by the kernel just before it and its output read by the one
// after. The replay must equal the eager run bit for bit, for an unsplit and a split grid.
TEST(CudaSkinny, GraphCaptureWithDependentLaunchMatchesEager) {
  KILN_SKIP_WITHOUT_CUDA();
  struct S { int64_t m, n, k; int split; };
  std::vector<S> cases = {{48, 4096, 512, 1}};
  if (has_clusters()) cases.push_back({128, 384, 4096, 6});
  for (S c : cases) {
    const std::string what = str_cat("m=", c.m, " n=", c.n, " k=", c.k, " split=", c.split);
    DeviceBuffer x(size_t(c.m * c.k) * 2), w(size_t(c.n * c.k) * 2), y(size_t(c.m * c.n) * 2),
        out(size_t(c.m * c.n) * 4);
    cudaStream_t s;
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    launch_fill_random(w.get(), DType::kBF16, c.n * c.k, 3, s);
    KILN_CUDA_CHECK(cudaStreamSynchronize(s));  // weights exist before any step, as in the backend
    set_pdl_allowed(true);
    auto enqueue = [&] {
      launch_fill_random(x.get(), DType::kBF16, c.m * c.k, 4, s);
      launch_skinny_gemm(DType::kBF16, x.get(), w.get(), nullptr, y.get(), c.m, c.n, c.k, s, GemvEpilogue::kSilu,
                         c.split);
      launch_convert(y.get(), DType::kBF16, out.get(), DType::kF32, c.m * c.n, s);
    };
    enqueue();  // eager (also the first launch, which sets the kernel's attributes)
    std::vector<float> eager(size_t(c.m * c.n)), replay(eager.size());
    KILN_CUDA_CHECK(cudaMemcpyAsync(eager.data(), out.get(), eager.size() * 4, cudaMemcpyDeviceToHost, s));
    KILN_CUDA_CHECK(cudaStreamSynchronize(s));
    KILN_CUDA_CHECK(cudaMemsetAsync(out.get(), 0, eager.size() * 4, s));
    KILN_CUDA_CHECK(cudaMemsetAsync(x.get(), 0, size_t(c.m * c.k) * 2, s));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    KILN_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    enqueue();
    KILN_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    set_pdl_allowed(false);
    KILN_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    KILN_CUDA_CHECK(cudaGraphLaunch(exec, s));
    KILN_CUDA_CHECK(cudaMemcpyAsync(replay.data(), out.get(), replay.size() * 4, cudaMemcpyDeviceToHost, s));
    KILN_CUDA_CHECK(cudaStreamSynchronize(s));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(s);
    double worst = 0;
    for (float v : eager) worst = std::max(worst, double(std::fabs(v)));
    EXPECT_GT(worst, 0.0) << what << ": all-zero output";
    EXPECT_EQ(std::memcmp(eager.data(), replay.data(), eager.size() * 4), 0) << what << ": replay differs";
  }
}

}  // namespace
}  // namespace kiln::cuda
