// FP8 E4M3 models on the device: the tiny Llama fixture calibrated on the CPU and
// quantized with --quant fp8, run on the CUDA backend (bf16 activations, FP8 Linears)
// against the same FP8 model on the CPU: prefill logits (cuBLASLt FP8 GEMM), decode
// steps one token at a time (the FP8 GEMV, in CUDA graphs), and an engine built with
// E4M3 codes stored in the file, loaded on the GPU; and the same model with the quantize
// fused into the norms and SwiGLU (the default) against KILN_CUDA_FP8_FUSE=0, logits bit
// for bit. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <unistd.h>

#include "backends/cuda/cuda_fp8_linear.h"
#include "builder/builder.h"
#include "cuda_model_test_util.h"
#include "cuda_test_util.h"
#include "runtime/llm_runner.h"
#include "runtime/quantize.h"

namespace kiln::cuda {
namespace {

using namespace testing;

// The tiny Llama fixture calibrated for FP8 (max clip, no smoothing) on 8 random
// sequences of 32 tokens, and a random 20-token prompt with 6 tokens to decode after it.
struct Fp8Case {
  std::string dir = fixtures_dir() + "/models/llama";
  QuantOptions q;
  quant::CalibrationTable table;
  std::vector<int32_t> prompt, decode;

  explicit Fp8Case(uint64_t seed) {
    std::mt19937_64 rng(seed);
    auto seq = [&](int len) {
      std::vector<int32_t> s;
      for (int i = 0; i < len; ++i) s.push_back(int32_t(rng() % 512));
      return s;
    };
    std::vector<std::vector<int32_t>> calib;
    for (int i = 0; i < 8; ++i) calib.push_back(seq(32));
    q.mode = "fp8";
    q.method = "max";
    q.smooth_alpha = -1;
    table = calibrate_model(dir, {}, q, &calib);
    prompt = seq(20);
    decode = seq(6);
  }
};

TEST(CudaFp8Model, TinyLlamaMatchesCpuFp8) {
  KILN_SKIP_WITHOUT_CUDA();
  Fp8Case c(9);
  const std::string& dir = c.dir;
  QuantOptions& q = c.q;
  const quant::CalibrationTable& table = c.table;
  const auto &prompt = c.prompt, &decode = c.decode;
  auto cpu = Model::load(dir, fp8_model_options({}, table, q));
  auto gpu = Model::load(dir, fp8_model_options({.backend = "cuda"}, table, q));
  auto gpu_bf16 = Model::load(dir, {.backend = "cuda", .weight_dtype = "bf16"});
  auto f32 = Model::load(dir);
  const auto ref = logits_of(*cpu, prompt, decode);
  const auto got = logits_of(*gpu, prompt, decode);
  const auto ref_f32 = logits_of(*f32, prompt, decode);
  // The GPU's bf16 activations (norms, attention, residuals) move some inputs across
  // E4M3 rounding boundaries (a 3-bit mantissa: one step is 6-12%), and this random-init
  // model amplifies every such flip, so the two FP8 models differ by far more than the
  // bf16 model differs from f32 (H200: 0.123 vs 0.019 RMS), yet less than FP8 differs
  // from f32 (0.20); two unrelated roundings would differ by ~1.4x that, and a wrong
  // scale, code or layout by ~1.
  const double e_gpu = rel_rms(got, ref), e_bf16 = rel_rms(logits_of(*gpu_bf16, prompt, decode), ref_f32),
               e_fp8 = rel_rms(ref, ref_f32);
  std::printf("  fp8 logits: cuda vs cpu %.3g RMS; cuda bf16 vs f32 %.3g; cpu fp8 vs f32 %.3g\n", e_gpu, e_bf16, e_fp8);
  EXPECT_LT(e_gpu, 0.75 * e_fp8);

  // An engine storing E4M3 codes (built on the CPU) runs on the GPU as the direct load does.
  const std::string tmp = ::testing::TempDir();
  q.calib = tmp + "/kiln_cuda_fp8_calib_" + std::to_string(::getpid()) + ".json";
  table.save(q.calib);
  BuildOptions bo;
  bo.model = dir;
  bo.output = tmp + "/kiln_cuda_fp8_" + std::to_string(::getpid()) + ".kiln";
  bo.tune = false;
  bo.quant = q;
  build_engine(bo);
  auto engine = Model::load(bo.output, {.backend = "cuda"});
  // Same codes and scales; only cuBLASLt's tuned algorithm (summation order) may differ.
  EXPECT_LT(rel_rms(logits_of(*engine, prompt, decode), got), 1e-2);
  std::filesystem::remove(q.calib);
  std::filesystem::remove(bo.output);
}

// --fp8-gate-up-out: the gate|up GEMM writes E4M3 (cuBLASLt D scale) and the E4M3 SwiGLU
// reads it at prefill (decode rows keep the bf16 GEMV). Against the CPU's FP8 model with
// the same option, within the bound of the test above; and the switch really changes the
// prefill logits (KILN_CUDA_FP8_GATEUP_E4M3=0 runs the bf16 [gate | up] path).
TEST(CudaFp8Model, GateUpE4M3MatchesCpuFp8WithTheOption) {
  KILN_SKIP_WITHOUT_CUDA();
  Fp8Case c(9);
  c.q.fp8_gate_up_out = true;
  auto cpu = Model::load(c.dir, fp8_model_options({}, c.table, c.q));
  auto f32 = Model::load(c.dir);
  const auto ref = logits_of(*cpu, c.prompt, c.decode);
  const auto ref_f32 = logits_of(*f32, c.prompt, c.decode);
  std::vector<float> got, got_bf16;
  {
    auto gpu = Model::load(c.dir, fp8_model_options({.backend = "cuda"}, c.table, c.q));
    got = logits_of(*gpu, c.prompt, {});
  }
  {
    ::setenv("KILN_CUDA_FP8_GATEUP_E4M3", "0", 1);
    auto gpu = Model::load(c.dir, fp8_model_options({.backend = "cuda"}, c.table, c.q));
    ::unsetenv("KILN_CUDA_FP8_GATEUP_E4M3");
    got_bf16 = logits_of(*gpu, c.prompt, {});
  }
  const std::vector<float> ref_prefill(ref.begin(), ref.begin() + long(got.size()));
  const std::vector<float> f32_prefill(ref_f32.begin(), ref_f32.begin() + long(got.size()));
  const double e_gpu = rel_rms(got, ref_prefill), e_fp8 = rel_rms(ref_prefill, f32_prefill),
               e_switch = rel_rms(got, got_bf16);
  std::printf("  fp8 gate|up E4M3 prefill logits: cuda vs cpu %.3g RMS; cpu vs f32 %.3g; vs the bf16 gate|up %.3g\n",
              e_gpu, e_fp8, e_switch);
  EXPECT_LT(e_gpu, 0.75 * e_fp8);
  EXPECT_GT(e_switch, 0.0);
  ::setenv("KILN_CUDA_FP8_GATEUP_E4M3", "2", 1);
  EXPECT_THROW(Model::load(c.dir, fp8_model_options({.backend = "cuda"}, c.table, c.q)), Error);
  ::unsetenv("KILN_CUDA_FP8_GATEUP_E4M3");
}

// The quantize fused into the producers changes no bit: the same codes reach the same
// kernels (prefill of 20 tokens: cuBLASLt's heuristic algorithm, not a timed one, in both
// loads; decode: the FP8 GEMV in CUDA graphs). Attention writes the o-projection's codes
// from the flash kernel's epilogue (forced on: KILN_CUDA_FLASH=1) or, on the other plans,
// by a quantize pass over its own output.
TEST(CudaFp8Model, FusedQuantizeIsBitIdentical) {
  KILN_SKIP_WITHOUT_CUDA();
  const Fp8Case c(21);
  const auto &prompt = c.prompt, &decode = c.decode;
  for (const char* flash : {"", "1"}) {
    SCOPED_TRACE(str_cat("KILN_CUDA_FLASH=", flash));
    const ScopedEnv flash_env("KILN_CUDA_FLASH", flash);
    auto load = [&](const char* fuse) {  // both switches are read when the graph is compiled
      ScopedEnv env("KILN_CUDA_FP8_FUSE", fuse);
      return Model::load(c.dir, fp8_model_options({.backend = "cuda"}, c.table, c.q));
    };
    auto fused = load("1");
    // Which nodes write codes: every norm but the final one (it feeds GatherRows, then the
    // LM head), every attention (its o projection) and every gate|up Linear (its SwiGLU
    // feeds the down projection).
    int producers = 0, norms = 0, attentions = 0, gate_ups = 0;
    for (const ir::Node& n : fused->graph().nodes()) {
      for (size_t o = 0; o < n.outputs.size(); ++o)
        producers += fp8_fused_output(n, o, fused->graph(), DType::kBF16).has_value();
      norms += n.op == "RMSNorm" || n.op == "AddRMSNorm";
      attentions += n.op == "Attention";
      gate_ups += n.op == "Linear" && n.attr_str("quant", "") == "fp8" && n.attr_str("activation", "") == "swiglu";
    }
    std::printf("  %d of the graph's nodes write E4M3 codes (%d norms, %d attentions, %d gate|up)\n", producers,
                norms, attentions, gate_ups);
    EXPECT_GT(gate_ups, 0);
    EXPECT_GT(attentions, 0);
    EXPECT_EQ(producers, norms - 1 + attentions + gate_ups);
    const auto on = logits_of(*fused, prompt, decode);
    fused.reset();
    auto unfused = load("0");
    const auto off = logits_of(*unfused, prompt, decode);
    ASSERT_EQ(on.size(), off.size());
    size_t bad = 0;
    for (size_t i = 0; i < on.size(); ++i) bad += std::memcmp(&on[i], &off[i], sizeof(float)) != 0;
    EXPECT_EQ(bad, 0u) << "of " << on.size() << " logits";
  }
}

}  // namespace
}  // namespace kiln::cuda
