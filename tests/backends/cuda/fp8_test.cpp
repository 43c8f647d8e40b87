// FP8 E4M3 on the device against the CPU FP8 kernels: the activation quantization
// kernel (the hardware's cvt.rn.satfinite) bit for bit against core/dtype.h's exact
// conversion over a sweep of every f32 exponent, ties and specials; the FP8 Linear
// (GEMV for <= 4 rows, cuBLASLt's FP8 GEMM above) over a table of shapes, biases and
// activation epilogues, with weights quantized at load or stored as E4M3 codes, against
// the CPU backend's FP8 Linear on the same bf16-exact inputs (same codes, so only f32
// summation order and the bf16 output rounding differ); unsupported shapes and modes
// are clear errors. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/ops/fp8.h"
#include "core/dtype.h"
#include "core/fp8.h"
#include "core/status.h"
#include "cuda_test_util.h"

namespace kiln::cuda {
namespace {

using namespace testing;

std::vector<uint8_t> device_quantize(DType dtype, const void* host, size_t bytes, int64_t n, float inv) {
  void* dx = nullptr;
  void* dq = nullptr;
  KILN_CUDA_CHECK(cudaMalloc(&dx, bytes));
  KILN_CUDA_CHECK(cudaMalloc(&dq, size_t(n)));
  KILN_CUDA_CHECK(cudaMemcpy(dx, host, bytes, cudaMemcpyHostToDevice));
  launch_fp8_quantize(dtype, dx, n, inv, static_cast<uint8_t*>(dq), nullptr);
  std::vector<uint8_t> q(static_cast<size_t>(n));
  KILN_CUDA_CHECK(cudaMemcpy(q.data(), dq, size_t(n), cudaMemcpyDeviceToHost));
  cudaFree(dx);
  cudaFree(dq);
  return q;
}

TEST(CudaFp8, QuantizeKernelIsTheCoreConversion) {
  KILN_SKIP_WITHOUT_CUDA();
  std::vector<float> x;
  for (uint64_t b = 0; b <= 0xffffffffull; b += 1021) x.push_back(f32_from_bits(uint32_t(b)));  // every exponent
  for (int c = 0; c < 0x7e; ++c)  // every tie between neighbouring codes and its neighbours, both signs
    for (float sign : {1.0f, -1.0f}) {
      const float mid = sign * (fp8e4m3_to_f32(uint8_t(c)) + fp8e4m3_to_f32(uint8_t(c + 1))) / 2;
      x.insert(x.end(), {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, sign * INFINITY)});
    }
  x.insert(x.end(), {448.0f, 464.0f, 465.0f, -1e9f, INFINITY, -INFINITY, std::numeric_limits<float>::quiet_NaN(),
                     -0.0f, std::ldexp(1.0f, -10), std::numeric_limits<float>::denorm_min()});
  auto q = device_quantize(DType::kF32, x.data(), x.size() * 4, int64_t(x.size()), 1.0f);
  size_t bad = 0, nan_sign = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    // NaN inputs: the core conversion gives the canonical 0x7f (as CUDA's host code
    // does); any NaN code from the device passes, a differing sign is only reported.
    if (std::isnan(x[i]) && (q[i] & 0x7f) == 0x7f) {
      nan_sign += q[i] != 0x7f;
      continue;
    }
    if (q[i] != f32_to_fp8e4m3(x[i]) && bad++ < 10)
      ADD_FAILURE() << "f32 bits 0x" << std::hex << f32_bits(x[i]) << ": device 0x" << int(q[i]) << ", core 0x"
                    << int(f32_to_fp8e4m3(x[i]));
  }
  EXPECT_EQ(bad, 0u) << "of " << x.size();
  if (nan_sign) std::printf("  %zu NaN inputs came back as 0xff rather than 0x7f\n", nan_sign);
  // bf16 input times a static scale, as the FP8 Linear quantizes its activation.
  std::vector<uint16_t> h;
  for (uint32_t b = 0; b < 0x10000; ++b) h.push_back(uint16_t(b));
  const float inv = fp8_scale_for_amax(3.7).inv;
  auto qh = device_quantize(DType::kBF16, h.data(), h.size() * 2, int64_t(h.size()), inv);
  bad = 0;
  for (size_t i = 0; i < h.size(); ++i) {
    if (std::isnan(bf16_to_f32(h[i])) && (qh[i] & 0x7f) == 0x7f) continue;
    if (qh[i] != f32_to_fp8e4m3(bf16_to_f32(h[i]) * inv) && bad++ < 10)
      ADD_FAILURE() << "bf16 0x" << std::hex << h[i] << ": device 0x" << int(qh[i]);
  }
  EXPECT_EQ(bad, 0u);
}

// One FP8 Linear: x [T, k] input, weight [n, k] (stored as E4M3 codes + weight_scale
// when `stored`, else f32 quantized by each backend at load), optional bias.
ir::Graph fp8_linear_graph(int64_t k, int64_t n, bool bias, const std::string& act, bool stored, double act_amax,
                           std::mt19937_64& rng) {
  ir::Graph g;
  auto x = g.add_input("x", DType::kF32, Shape{"T", k});
  Tensor w = random_tensor({n, k}, rng, "bf16", -0.1f, 0.1f);
  std::map<std::string, ir::Attr> attrs = {{"quant", std::string("fp8")}, {"act_amax", act_amax}};
  if (!act.empty()) attrs["activation"] = act;
  ir::ValueId wv;
  if (stored) {
    Tensor q(DType::kFP8E4M3, {n, k});
    attrs["weight_scale"] = double(fp8_quantize_tensor(w.data_as<float>(), size_t(w.numel()), q.data_as<uint8_t>()).scale);
    wv = g.add_weight("w", std::move(q));
  } else {
    wv = g.add_weight("w", std::move(w));
  }
  std::vector<ir::ValueId> in = {x, wv};
  if (bias) in.push_back(g.add_weight("b", random_tensor({n}, rng, "bf16")));
  g.add_output("y", g.add("Linear", in, attrs, "op"));
  return g;
}

TEST(CudaFp8, LinearMatchesCpuFp8) {
  KILN_SKIP_WITHOUT_CUDA();
  struct S {
    int64_t k, n;
    bool bias;
  };
  for (S s : {S{64, 64, false}, S{576, 192, true}, S{576, 1536, false}, S{1536, 576, true}, S{1024, 4096, true},
              S{4096, 512, false}, S{48, 32, true}})
    for (int64_t t : {1, 2, 3, 4, 5, 16, 33, 128, 300})
      for (bool stored : {false, true}) {
        std::mt19937_64 rng(uint64_t(s.k * 7 + s.n + t * 131 + stored));
        // The calibrated clip sits inside the input range: some values saturate.
        ir::Graph g = fp8_linear_graph(s.k, s.n, s.bias, "", stored, 0.8, rng);
        TensorMap in = {{"x", random_tensor({t, s.k}, rng, "bf16")}};
        expect_backends_match(g, {{in, {}}}, "fp8", op_tolerance("bf16"),
                              str_cat("fp8 Linear t=", t, " k=", s.k, " n=", s.n, s.bias ? " +bias" : "",
                                      stored ? " stored" : ""));
      }
}

TEST(CudaFp8, LinearEpilogues) {
  KILN_SKIP_WITHOUT_CUDA();
  for (const char* act : {"gelu_erf", "gelu_tanh", "silu", "swiglu"})
    for (int64_t t : {1, 3, 4, 9, 64}) {
      std::mt19937_64 rng(uint64_t(t) * 17 + std::strlen(act));
      ir::Graph g = fp8_linear_graph(256, 320, true, act, true, 1.0, rng);
      TensorMap in = {{"x", random_tensor({t, 256}, rng, "bf16")}};
      expect_backends_match(g, {{in, {}}}, "fp8", op_tolerance("bf16"), str_cat("fp8 Linear+", act, " t=", t));
    }
}

TEST(CudaFp8, UnsupportedIsAClearError) {
  KILN_SKIP_WITHOUT_CUDA();
  auto gpu = create_backend("cuda");
  std::mt19937_64 rng(5);
  ir::Graph g = fp8_linear_graph(40, 32, false, "", false, 1.0, rng);  // K = 40: not a multiple of 16
  try {
    gpu->compile(g, {.weight_dtype = "fp8"});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiples of 16"), std::string::npos) << e.what();
  }
  ir::Graph g3 = fp8_linear_graph(64, 32, false, "", false, 1.0, rng);
  try {
    gpu->compile(g3, {.weight_dtype = "f32"});  // FP8 Linears need bf16 activations
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kiln::cuda
