// W8A8 INT8 on the device against the CPU backend's int8 kernels: the activation
// quantization kernel bit for bit against core/int8.h over every bf16 value, ties and
// specials (static and per-token scales), and with the input rows rotated (--hadamard)
// against core/hadamard.h then core/int8.h; the W8A8 Linear (int8 GEMV for <= 4 rows, above
// the fused CUTLASS GEMM where built, else cuBLASLt's int8 GEMM in row tiles; BERT-base's
// shapes up to 4096 rows; the two GEMMs give the same bits) over a
// table of shapes, biases, activation epilogues and per-token scales, against the CPU's
// W8A8 Linear with the same attrs. Both quantize the same inputs to the same codes and
// sum them exactly, so with f32 activations the outputs agree to rounding noise and with
// bf16 activations the GPU's output is the CPU's f32 result rounded to bf16 (bounds
// below, per element; prefill rows with GELU / SiLU round the GEMM's output to bf16 before
// the activation, a second rounding the bound takes from the CPU's pre-activation). That
// split path is bit for bit the Linear without its activation followed by the activation
// op. Unsupported shapes and bad attrs are clear errors. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_context.h"
#include "backends/cuda/ops/int8.h"
#include "backends/cuda/ops/int8_gemm_sm90.h"
#include "core/dtype.h"
#include "core/hadamard.h"
#include "core/int8.h"
#include "core/status.h"
#include "cuda_test_util.h"

namespace kiln::cuda {
namespace {

using namespace testing;

// launch_int8_quantize on the device: codes, and the per-token scales when `dynamic`.
std::pair<std::vector<int8_t>, std::vector<float>> device_quantize(DType dtype, const void* host, int64_t t, int64_t k,
                                                                   float inv, bool dynamic) {
  const size_t es = dtype_size(dtype), n = size_t(t * k);
  void *dx = nullptr, *dq = nullptr, *ds = nullptr;
  KILN_CUDA_CHECK(cudaMalloc(&dx, n * es));
  KILN_CUDA_CHECK(cudaMalloc(&dq, n));
  KILN_CUDA_CHECK(cudaMalloc(&ds, size_t(t) * 4));
  KILN_CUDA_CHECK(cudaMemcpy(dx, host, n * es, cudaMemcpyHostToDevice));
  launch_int8_quantize(dtype, dx, t, k, inv, static_cast<int8_t*>(dq), dynamic ? static_cast<float*>(ds) : nullptr,
                       nullptr);
  std::vector<int8_t> q(n);
  std::vector<float> rs(static_cast<size_t>(t));
  KILN_CUDA_CHECK(cudaMemcpy(q.data(), dq, n, cudaMemcpyDeviceToHost));
  KILN_CUDA_CHECK(cudaMemcpy(rs.data(), ds, size_t(t) * 4, cudaMemcpyDeviceToHost));
  cudaFree(dx);
  cudaFree(dq);
  cudaFree(ds);
  return {q, rs};
}

TEST(CudaW8a8, QuantizeKernelIsTheCoreRule) {
  KILN_SKIP_WITHOUT_CUDA();
  // Every bf16 value times a static scale's inverse, as the Linear quantizes its input.
  std::vector<uint16_t> h;
  for (uint32_t b = 0; b < 0x10000; ++b) h.push_back(uint16_t(b));
  const float inv = 1.0f / int8_act_scale(3.7);
  auto [q, unused] = device_quantize(DType::kBF16, h.data(), 256, 256, inv, false);
  size_t bad = 0;
  for (size_t i = 0; i < h.size(); ++i)
    if (q[i] != int8_quantize(bf16_to_f32(h[i]), inv) && bad++ < 10)
      ADD_FAILURE() << "bf16 0x" << std::hex << h[i] << ": device " << std::dec << int(q[i]) << ", core "
                    << int(int8_quantize(bf16_to_f32(h[i]), inv));
  EXPECT_EQ(bad, 0u);
  // f32: every tie between neighbouring codes and its neighbours, saturation, specials.
  std::vector<float> x;
  for (int c = -128; c < 128; ++c)
    for (float d : {-1e-3f, 0.0f, 1e-3f}) x.push_back(float(c) + 0.5f + d);
  x.insert(x.end(), {127.0f, 127.5f, -127.5f, 1e30f, -1e30f, INFINITY, -INFINITY,
                     std::numeric_limits<float>::quiet_NaN(), -0.0f, std::numeric_limits<float>::denorm_min()});
  while (x.size() % 4) x.push_back(0.25f);
  auto [qf, unused2] = device_quantize(DType::kF32, x.data(), 1, int64_t(x.size()), 1.0f, false);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(int(qf[i]), int(int8_quantize(x[i], 1.0f))) << "x = " << x[i];
  // Per token: rows of different magnitudes (one all zero, one with a NaN) in f16.
  const int64_t t = 5, k = 1000;
  std::mt19937_64 rng(3);
  std::vector<float> rows(size_t(t * k));
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (int64_t r = 0; r < t; ++r)
    for (int64_t i = 0; i < k; ++i) rows[size_t(r * k + i)] = r == 2 ? 0.0f : d(rng) * std::ldexp(1.0f, int(r) * 3 - 4);
  rows[size_t(4 * k + 17)] = std::numeric_limits<float>::quiet_NaN();
  Tensor xf(DType::kF32, {t, k});
  std::memcpy(xf.data(), rows.data(), rows.size() * 4);
  Tensor xh = xf.to(DType::kF16), xr = xh.to(DType::kF32);
  auto [qd, rs] = device_quantize(DType::kF16, xh.data(), t, k, 0.0f, true);
  for (int64_t r = 0; r < t; ++r) {
    float amax = 0.0f;
    for (int64_t i = 0; i < k; ++i) amax = std::max(amax, std::fabs(xr.data_as<float>()[r * k + i]));
    const float scale = int8_row_scale(amax);
    EXPECT_EQ(rs[size_t(r)], scale) << "row " << r;
    bad = 0;
    for (int64_t i = 0; i < k; ++i)
      bad += qd[size_t(r * k + i)] != int8_quantize(xr.data_as<float>()[r * k + i], 1.0f / scale);
    EXPECT_EQ(bad, 0u) << "row " << r;
  }
}

// launch_int8_quantize_hadamard: each row through core/hadamard.h's transform on the host,
// then core/int8.h's rule, code for code and row scale for row scale, in f32, f16 and
// bf16, over block sizes 4 to 8192 (one block a row, or 3, 7 and 21 of them) and row
// counts 1 to 33; and the bad arguments are errors naming them.
TEST(CudaW8a8, RotatedQuantizeIsHostTransformThenCoreRule) {
  KILN_SKIP_WITHOUT_CUDA();
  struct C {
    int64_t k, t;
    DType dt;
  };
  for (C c : {C{4, 3, DType::kF32}, C{96, 33, DType::kBF16}, C{1536, 5, DType::kBF16}, C{1536, 1, DType::kF16},
              C{8192, 2, DType::kBF16}, C{14336, 3, DType::kBF16}, C{5632, 4, DType::kF16}})
    for (bool dynamic : {false, true}) {
      const int64_t b = hadamard_block(c.k);
      std::mt19937_64 rng(uint64_t(c.k * 5 + c.t + dynamic));
      std::uniform_real_distribution<float> d(-1.0f, 1.0f);
      Tensor xf(DType::kF32, {c.t, c.k});
      for (int64_t i = 0; i < xf.numel(); ++i) xf.data_as<float>()[i] = d(rng) * (1.0f + float(i % 13));
      if (c.t > 1) xf.data_as<float>()[c.k + 7] = 300.0f;  // one outlier channel in row 1
      const Tensor xs = xf.to(c.dt), xr = xs.to(DType::kF32);  // what the device reads, in f32
      // A static clip inside the rotated range: some codes saturate.
      const float inv = dynamic ? 0.0f : 1.0f / int8_act_scale(0.3 * std::sqrt(double(b)) * 6.0);
      const size_t es = dtype_size(c.dt), n = size_t(c.t * c.k);
      DeviceBuffer dx(n * es), dq(n), ds(size_t(c.t) * 4);
      KILN_CUDA_CHECK(cudaMemcpy(dx.get(), xs.data(), n * es, cudaMemcpyHostToDevice));
      launch_int8_quantize_hadamard(c.dt, dx.get(), c.t, c.k, b, inv, static_cast<int8_t*>(dq.get()),
                                    dynamic ? static_cast<float*>(ds.get()) : nullptr, nullptr);
      std::vector<int8_t> q(n);
      std::vector<float> rs(size_t(c.t));
      KILN_CUDA_CHECK(cudaMemcpy(q.data(), dq.get(), n, cudaMemcpyDeviceToHost));
      KILN_CUDA_CHECK(cudaMemcpy(rs.data(), ds.get(), size_t(c.t) * 4, cudaMemcpyDeviceToHost));
      size_t bad = 0, saturated = 0;
      for (int64_t r = 0; r < c.t; ++r) {
        std::vector<float> row(xr.data_as<float>() + r * c.k, xr.data_as<float>() + (r + 1) * c.k);
        hadamard_transform(row.data(), c.k);
        float ri = inv;
        if (dynamic) {
          float amax = 0.0f;
          for (float v : row) amax = std::max(amax, std::fabs(v));
          EXPECT_EQ(rs[size_t(r)], int8_row_scale(amax)) << "k=" << c.k << " row " << r;
          ri = 1.0f / int8_row_scale(amax);
        }
        for (int64_t i = 0; i < c.k; ++i) {
          const int8_t want = int8_quantize(row[size_t(i)], ri);
          saturated += want == 127 || want == -127;
          if (q[size_t(r * c.k + i)] != want && bad++ < 5)
            ADD_FAILURE() << "k=" << c.k << " b=" << b << " " << dtype_name(c.dt) << " row " << r << " col " << i
                          << ": device " << int(q[size_t(r * c.k + i)]) << ", host " << int(want);
        }
      }
      EXPECT_EQ(bad, 0u) << "k=" << c.k << (dynamic ? " per-token" : " static");
      if (!dynamic && c.t > 1) EXPECT_GT(saturated, 0u) << "k=" << c.k << ": the static clip saturates nothing";
    }
  DeviceBuffer dx(4096), dq(1024);
  auto expect_error = [&](int64_t k, int64_t b, const std::string& needle) {
    try {
      launch_int8_quantize_hadamard(DType::kBF16, dx.get(), 1, k, b, 1.0f, static_cast<int8_t*>(dq.get()), nullptr,
                                    nullptr);
      ADD_FAILURE() << "expected an error mentioning '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(96, 64, "block 64");                 // 64 does not divide 96
  expect_error(96, 3, "block 3");                   // not a power of two
  expect_error(kInt8HadamardMaxK * 2, 1024, "at most");  // past shared memory
}

// One W8A8 Linear: x [T, k] input, f32 weight [n, k] (each backend quantizes it per
// channel at load), optional bias, activation epilogue, static or per-token scales.
ir::Graph w8a8_linear_graph(int64_t k, int64_t n, bool bias, const std::string& act, double act_amax, bool dynamic,
                            std::mt19937_64& rng, int64_t act_hadamard = 0) {
  ir::Graph g;
  auto x = g.add_input("x", DType::kF32, Shape{"T", k});
  std::map<std::string, ir::Attr> attrs = {{"quant", std::string("w8a8")}, {"act_amax", act_amax}};
  if (!act.empty()) attrs["activation"] = act;
  if (dynamic) attrs["act_dynamic"] = int64_t(1);
  if (act_hadamard) attrs["act_hadamard"] = act_hadamard;
  // Rows of different magnitudes, so the per-channel scales differ.
  Tensor w = random_tensor({n, k}, rng, "f32", -0.1f, 0.1f);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < k; ++i) w.data_as<float>()[r * k + i] *= 1.0f + float(r % 7);
  std::vector<ir::ValueId> in = {x, g.add_weight("w", std::move(w))};
  if (bias) in.push_back(g.add_weight("b", random_tensor({n}, rng, "f32")));
  g.add_output("y", g.add("Linear", in, attrs, "op"));
  return g;
}

// The CPU's W8A8 output and the GPU's (activations in `dtype`: "f32" or "bf16").
std::pair<Tensor, Tensor> run_both(const ir::Graph& g, const TensorMap& in, const std::string& dtype) {
  auto cpu = create_backend("cpu");
  auto gpu = create_backend("cuda");
  // Outputs are views of the compiled graph's buffers: copied before the graph goes.
  Tensor want = cpu->compile(g, {.weight_dtype = "f32"})->run(in, {}, nullptr).at("y").clone();
  Tensor got = gpu->compile(g, {.weight_dtype = dtype == "f32" ? "f32" : "w8a8"})->run(in, {}, nullptr).at("y").clone();
  return {got, want};
}

// The CPU's W8A8 output of g with its Linear's activation removed (the pre-activation).
Tensor cpu_pre_activation(ir::Graph g, const TensorMap& in) {
  for (ir::Node& n : g.nodes())
    if (n.op == "Linear") n.attrs.erase("activation");
  return create_backend("cpu")->compile(g, {.weight_dtype = "f32"})->run(in, {}, nullptr).at("y").clone();
}

// Whether the bf16 GPU runs this many rows of an activation as GEMM, then the activation
// on the GEMM's bf16 output (cuda_w8a8_linear.h): rows above the GEMV's, GELU or SiLU.
bool split_activation(const std::string& act, int64_t t) {
  return t > 4 && (act == "gelu_erf" || act == "gelu_tanh" || act == "silu");
}

// Per element: f32 activations compute the same f32 value (erf/exp may differ by an ulp
// or two: 1e-6); bf16 activations round that value once to bf16 (half an ulp: 2^-8
// relative) and the activation may add an ulp of f32. `floor` covers outputs near zero.
// With `pre` (the CPU's pre-activation v; the split path), v is first rounded to bf16:
// the activation moves by at most its largest slope (< 1.13 for GELU and SiLU) times
// 2^-8 |v| more (bf16's unit roundoff, as for the output).
void expect_close(const Tensor& got, const Tensor& want, const std::string& dtype, const std::string& what,
                  const Tensor* pre = nullptr) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const double rel = dtype == "f32" ? 1e-6 : std::ldexp(1.0, -8) * 1.001;
  double max_ref = 0, worst = 0;
  for (int64_t i = 0; i < want.numel(); ++i) max_ref = std::max(max_ref, double(std::fabs(want.data_as<float>()[i])));
  const double floor = 1e-6 * max_ref;
  size_t bad = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double g = got.data_as<float>()[i], r = want.data_as<float>()[i], err = std::fabs(g - r);
    const double slack = pre ? 1.13 * std::ldexp(1.0, -8) * 1.001 * std::fabs(pre->data_as<float>()[i]) : 0.0;
    worst = std::max(worst, std::max(0.0, err - slack) / std::max(std::fabs(r), floor));
    if (!(err <= rel * std::fabs(r) + slack + floor) && bad++ < 5)
      ADD_FAILURE() << what << " (" << dtype << ") element " << i << ": cuda " << g << ", cpu " << r;
  }
  std::printf("  %-56s %-4s worst rel err %.3g (bound %.3g)\n", what.c_str(), dtype.c_str(), worst, rel);
  EXPECT_EQ(bad, 0u) << what << " (" << dtype << ")";
}

void expect_compile_error(const ir::Graph& g, const std::string& dtype, const std::string& needle) {
  auto gpu = create_backend("cuda");
  try {
    gpu->compile(g, {.weight_dtype = dtype});
    ADD_FAILURE() << "expected an error mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

struct Shape3 {
  int64_t k, n;
  bool bias;
};

TEST(CudaW8a8, LinearMatchesCpuW8a8) {
  KILN_SKIP_WITHOUT_CUDA();
  // K % 16 != 0 (36) takes cuBLASLt even for <= 4 rows; N % 4 != 0 (3, 50) runs on
  // zero-padded weight rows.
  for (Shape3 s : {Shape3{64, 64, false}, Shape3{36, 20, true}, Shape3{64, 3, true}, Shape3{128, 50, false},
                   Shape3{576, 1536, true}, Shape3{1536, 576, false}})
    for (int64_t t : {1, 2, 3, 4, 5, 16, 33, 128, 300})
      for (const char* dt : {"f32", "bf16"}) {
        std::mt19937_64 rng(uint64_t(s.k * 7 + s.n + t * 131));
        // The calibrated clip sits inside the input range: some values saturate.
        ir::Graph g = w8a8_linear_graph(s.k, s.n, s.bias, "", 0.8, false, rng);
        TensorMap in = {{"x", random_tensor({t, s.k}, rng, "bf16")}};
        auto [got, want] = run_both(g, in, dt);
        expect_close(got, want, dt, str_cat("w8a8 Linear t=", t, " k=", s.k, " n=", s.n, s.bias ? " +bias" : ""));
      }
}

// --hadamard Linears (attr act_hadamard = b): both backends rotate the same input rows
// and round them to the same codes (RotatedQuantizeIsHostTransformThenCoreRule), so the
// outputs agree as the unrotated Linear's do; the GEMV (<= 4 rows) and the GEMMs, static
// and per-token scales, SmolLM2's (1536: blocks of 512) and Llama-3.1-8B's (14336:
// blocks of 2048) down projection widths. A wrong block size is refused by name.
TEST(CudaW8a8, LinearWithRotatedInputMatchesCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  for (Shape3 s : {Shape3{96, 40, true}, Shape3{1536, 576, false}, Shape3{14336, 256, false}})
    for (bool dynamic : {false, true})
      for (int64_t t : {1, 4, 5, 130}) {
        const int64_t b = hadamard_block(s.k);
        std::mt19937_64 rng(uint64_t(s.k + s.n * 3 + t * 7 + dynamic));
        ir::Graph g = w8a8_linear_graph(s.k, s.n, s.bias, "", 0.5 * std::sqrt(double(b)), dynamic, rng, b);
        TensorMap in = {{"x", random_tensor({t, s.k}, rng, "bf16")}};
        for (const char* dt : {"f32", "bf16"}) {
          auto [got, want] = run_both(g, in, dt);
          expect_close(got, want, dt,
                       str_cat("w8a8 Linear rotated b=", b, dynamic ? " per-token" : "", " t=", t, " k=", s.k));
        }
      }
  std::mt19937_64 rng(3);
  expect_compile_error(w8a8_linear_graph(96, 40, false, "", 1.0, false, rng, 64), "w8a8",
                       "act_hadamard 64 (its K = 96 rotates in blocks of 32)");
}

// A row-parallel shard's weight_amax (parallel/tensor_parallel.h): each row rounds on the
// given max (the unsharded row's, >= its own), as the CPU does, for the GEMV (<= 4 rows) and
// the GEMMs; the attribute changes the output (rows whose given max exceeds their own take
// coarser codes), and a max below a row's own or a count that is not the rows' is refused.
TEST(CudaW8a8, WeightAmaxRoundsEachRowOnTheGivenMax) {
  KILN_SKIP_WITHOUT_CUDA();
  for (Shape3 s : {Shape3{64, 40, true}, Shape3{768, 256, false}})
    for (int64_t t : {1, 4, 5, 130}) {
      std::mt19937_64 rng(uint64_t(s.k * 5 + s.n + t));
      ir::Graph plain = w8a8_linear_graph(s.k, s.n, s.bias, "", 0.8, false, rng);
      ir::Graph g = plain;
      const Tensor& w = g.weight(g.nodes().back().inputs[1]);
      std::vector<double> amax(size_t(s.n));
      for (int64_t r = 0; r < s.n; ++r) {
        float own = 0.0f;
        for (int64_t i = 0; i < s.k; ++i)
          own = std::max(own, std::fabs(w.data_as<float>()[r * s.k + i]));
        amax[size_t(r)] = double(own) * (1.0 + 0.75 * double(r % 3));
      }
      g.nodes().back().attrs["weight_amax"] = amax;
      TensorMap in = {{"x", random_tensor({t, s.k}, rng, "bf16")}};
      for (const char* dt : {"f32", "bf16"}) {
        auto [got, want] = run_both(g, in, dt);
        expect_close(got, want, dt,
                     str_cat("w8a8 Linear weight_amax t=", t, " k=", s.k, " n=", s.n));
        auto [own_rows, unused] = run_both(plain, in, dt);
        double diff = 0;
        for (int64_t i = 0; i < got.numel(); ++i)
          diff = std::max(
              diff, double(std::fabs(got.data_as<float>()[i] - own_rows.data_as<float>()[i])));
        EXPECT_GT(diff, 0.0) << "weight_amax changed nothing (t=" << t << ", " << dt << ")";
      }
      if (t == 1) {
        ir::Graph low = g;
        low.nodes().back().attrs["weight_amax"] = std::vector<double>(size_t(s.n), 1e-6);
        expect_compile_error(low, "w8a8", "whose own max |w| is");
        ir::Graph few = g;
        few.nodes().back().attrs["weight_amax"] = std::vector<double>(size_t(s.n - 1), 1.0);
        expect_compile_error(few, "w8a8",
                             str_cat(s.n - 1, " weight_amax values for ", s.n, " output rows"));
      }
    }
}

TEST(CudaW8a8, BertBaseShapes) {
  KILN_SKIP_WITHOUT_CUDA();
  // BERT-base's Linears (QKV merged, attention out, FFN up with GELU, FFN down) up to
  // batch 32 x 128 tokens: 4096 rows of [4096, 3072] sums are 48 MiB, two row tiles.
  struct B {
    int64_t k, n;
    const char* act;
  };
  for (B s : {B{768, 768, ""}, B{768, 2304, ""}, B{768, 3072, "gelu_erf"}, B{3072, 768, ""}})
    for (int64_t t : {1, 4, 384, 3000, 4096}) {
      std::mt19937_64 rng(uint64_t(s.k + s.n + t));
      ir::Graph g = w8a8_linear_graph(s.k, s.n, true, s.act, 3.0, false, rng);
      TensorMap in = {{"x", random_tensor({t, s.k}, rng, "bf16", -4.0f, 4.0f)}};
      auto [got, want] = run_both(g, in, "bf16");
      const Tensor pre = split_activation(s.act, t) ? cpu_pre_activation(g, in) : Tensor();
      expect_close(got, want, "bf16", str_cat("bert-base w8a8 t=", t, " k=", s.k, " n=", s.n, " ", s.act),
                   split_activation(s.act, t) ? &pre : nullptr);
    }
}

TEST(CudaW8a8, LinearEpiloguesAndPerTokenScales) {
  KILN_SKIP_WITHOUT_CUDA();
  for (const char* act : {"", "gelu_erf", "gelu_tanh", "silu", "swiglu"})
    for (bool dynamic : {false, true})
      for (int64_t t : {1, 3, 4, 9, 64, 600}) {
        std::mt19937_64 rng(uint64_t(t) * 17 + std::strlen(act) + dynamic);
        // n = 326 at t = 9: padded to 328 weight rows (with SwiGLU: 163 outputs, gate and
        // up halves not multiples of 4).
        ir::Graph g = w8a8_linear_graph(256, t == 9 ? 326 : 320, true, act, 1.0, dynamic, rng);
        TensorMap in = {{"x", random_tensor({t, 256}, rng, "bf16")}};
        const bool split = split_activation(act, t);
        const Tensor pre = split ? cpu_pre_activation(g, in) : Tensor();
        for (const char* dt : {"f32", "bf16"}) {
          auto [got, want] = run_both(g, in, dt);
          expect_close(got, want, dt, str_cat("w8a8 Linear+", *act ? act : "none", dynamic ? " per-token" : "", " t=", t),
                       split && std::string(dt) == "bf16" ? &pre : nullptr);
        }
      }
  // Per-token scales across row tiles (the tile's scales start at its first row).
  std::mt19937_64 rng(99);
  ir::Graph g = w8a8_linear_graph(768, 3072, true, "gelu_erf", 0.0, true, rng);
  TensorMap in = {{"x", random_tensor({3000, 768}, rng, "bf16")}};
  auto [got, want] = run_both(g, in, "bf16");
  const Tensor pre = cpu_pre_activation(g, in);
  expect_close(got, want, "bf16", "w8a8 Linear per-token t=3000 k=768 n=3072 gelu_erf", &pre);
}

// The fused CUTLASS GEMM (the default for prefill rows where it is built) and cuBLASLt's
// int8 GEMM + the dequantize kernel (KILN_CUDA_W8A8_GEMM=cublaslt) give the same bits: the
// same exact sums and the same f32 epilogue, rounded once (GELU in the CUTLASS epilogue:
// KILN_CUDA_W8A8_ACT_EPILOGUE=1).
TEST(CudaW8a8, FusedGemmIsTheCublasLtPathToTheBit) {
  KILN_SKIP_WITHOUT_CUDA();
  std::string why;
  if (!int8_gemm_sm90_available(&why)) GTEST_SKIP() << "skipped: " << why;
  struct B {
    int64_t k, n, t;
    const char* act;
    bool dynamic, bias;
  };
  for (B s : {B{768, 3072, 1000, "gelu_erf", true, true}, B{768, 768, 300, "", false, true},
              B{3072, 768, 4100, "", true, false}, B{256, 320, 9, "gelu_erf", false, false}}) {
    std::mt19937_64 rng(uint64_t(s.k + s.n + s.t));
    ir::Graph g = w8a8_linear_graph(s.k, s.n, s.bias, s.act, 3.0, s.dynamic, rng);
    TensorMap in = {{"x", random_tensor({s.t, s.k}, rng, "bf16", -4.0f, 4.0f)}};
    auto run_with = [&](const char* gemm) {
      ScopedEnv env("KILN_CUDA_W8A8_GEMM", gemm), epilogue("KILN_CUDA_W8A8_ACT_EPILOGUE", "1");
      return create_backend("cuda")->compile(g, {.weight_dtype = "w8a8"})->run(in, {}, nullptr).at("y").clone();
    };
    const Tensor fused = run_with("cutlass"), ref = run_with("cublaslt");
    ASSERT_EQ(fused.shape(), ref.shape());
    size_t differ = 0;
    for (int64_t i = 0; i < ref.numel(); ++i) differ += fused.data_as<float>()[i] != ref.data_as<float>()[i];
    EXPECT_EQ(differ, 0u) << "t=" << s.t << " k=" << s.k << " n=" << s.n << " " << s.act
                          << (s.dynamic ? " per-token" : " static");
  }
}

// The default split path: a W8A8 Linear with GELU / SiLU over prefill rows is, bit for
// bit, the same Linear without the activation followed by the Gelu / Silu op (its bf16
// output, then launch_unary); with KILN_CUDA_W8A8_ACT_EPILOGUE=1 (the activation in the
// CUTLASS epilogue, one rounding) it is not, for some elements.
TEST(CudaW8a8, SplitActivationIsLinearThenActivationOp) {
  KILN_SKIP_WITHOUT_CUDA();
  std::string why;
  if (!int8_gemm_sm90_available(&why)) GTEST_SKIP() << "skipped (the split runs on the CUTLASS path): " << why;
  struct B {
    int64_t k, n, t;
    const char* act;
    bool dynamic;
  };
  for (B s : {B{768, 3072, 1000, "gelu_erf", true}, B{256, 320, 9, "gelu_tanh", false}, B{256, 328, 301, "silu", true},
              B{64, 128, 5, "gelu_erf", false}}) {
    std::mt19937_64 rng(uint64_t(s.k * 3 + s.n + s.t));
    const ir::Graph fused = w8a8_linear_graph(s.k, s.n, true, s.act, 3.0, s.dynamic, rng);
    // The same weights and attrs, the activation as its own node.
    const ir::Node& lin = fused.nodes()[0];
    ir::Graph apart;
    std::vector<ir::ValueId> ins = {apart.add_input("x", DType::kF32, Shape{"T", s.k})};
    for (size_t i = 1; i < lin.inputs.size(); ++i)
      ins.push_back(apart.add_weight(fused.value(lin.inputs[i]).name, fused.weight(lin.inputs[i]).clone()));
    std::map<std::string, ir::Attr> la = lin.attrs;
    la.erase("activation");
    const ir::ValueId pre = apart.add("Linear", ins, la, "op");
    const std::string act = s.act;
    std::map<std::string, ir::Attr> ga;
    if (act != "silu") ga["approximate"] = std::string(act == "gelu_erf" ? "none" : "tanh");
    apart.add_output("y", apart.add(act == "silu" ? "Silu" : "Gelu", {pre}, ga, "act"));
    ir::verify(apart);
    TensorMap in = {{"x", random_tensor({s.t, s.k}, rng, "bf16", -4.0f, 4.0f)}};
    auto run = [&](const ir::Graph& g, const char* epilogue) {
      ScopedEnv env("KILN_CUDA_W8A8_ACT_EPILOGUE", epilogue);
      return create_backend("cuda")->compile(g, {.weight_dtype = "w8a8"})->run(in, {}, nullptr).at("y").clone();
    };
    const Tensor a = run(fused, "0"), b = run(apart, "0"), e = run(fused, "1");
    ASSERT_EQ(a.shape(), b.shape());
    size_t differ = 0, differ_epilogue = 0;
    for (int64_t i = 0; i < a.numel(); ++i) {
      differ += f32_bits(a.data_as<float>()[i]) != f32_bits(b.data_as<float>()[i]);
      differ_epilogue += a.data_as<float>()[i] != e.data_as<float>()[i];
    }
    const std::string what = str_cat("t=", s.t, " k=", s.k, " n=", s.n, " ", s.act, s.dynamic ? " per-token" : " static");
    std::printf("  split %s: %lld values, %zu differ from Linear -> %s, %zu from the epilogue activation\n",
                what.c_str(), (long long)a.numel(), differ, s.act, differ_epilogue);
    EXPECT_EQ(differ, 0u) << what;
    // One rounding against two: a handful of elements at least must tell them apart.
    EXPECT_GT(differ_epilogue, 0u) << what << ": KILN_CUDA_W8A8_ACT_EPILOGUE=1 changed nothing";
  }
  ScopedEnv env("KILN_CUDA_W8A8_ACT_EPILOGUE", "yes");
  std::mt19937_64 rng(5);
  const ir::Graph g = w8a8_linear_graph(64, 64, true, "gelu_erf", 3.0, false, rng);
  expect_compile_error(g, "w8a8", "KILN_CUDA_W8A8_ACT_EPILOGUE='yes'");
}

TEST(CudaW8a8, UnsupportedIsAClearError) {
  KILN_SKIP_WITHOUT_CUDA();
  std::mt19937_64 rng(5);
  expect_compile_error(w8a8_linear_graph(42, 32, false, "", 1.0, false, rng), "w8a8", "multiple of 4");  // K = 42
  expect_compile_error(w8a8_linear_graph(64, 32, false, "", -1.0, false, rng), "w8a8", "act_amax");
  expect_compile_error(w8a8_linear_graph(64, 32, false, "", NAN, false, rng), "w8a8", "act_amax");
  ir::Graph g = w8a8_linear_graph(64, 32, false, "", 1.0, false, rng);
  g.nodes()[0].attrs["quant"] = std::string("int3");
  expect_compile_error(g, "w8a8", "runs fp8 and w8a8");
  ScopedEnv env("KILN_CUDA_W8A8_GEMM", "cutless");
  expect_compile_error(w8a8_linear_graph(64, 32, false, "", 1.0, false, rng), "w8a8", "expected cutlass or cublaslt");
}

}  // namespace
}  // namespace kiln::cuda
