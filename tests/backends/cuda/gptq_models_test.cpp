// GPTQ models on the device: the tiny Llama fixture calibrated on the CPU and quantized
// with --quant gptq (q4 row images chosen by the Hessian sweep, stored as kept-quantized
// Linears), run on the CUDA backend (bf16 activations, the q4 GEMVs and the skinny GEMM
// for its 20-token prompt) against the same GPTQ model on the CPU; and the real all-MiniLM-L6-v2
// (when fetched) gives the CPU's GPTQ embeddings on the GPU, directly and from an engine
// built on the CPU. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <unistd.h>

#include "builder/builder.h"
#include "cuda_model_test_util.h"
#include "cuda_test_util.h"
#include "runtime/encoder_runner.h"
#include "runtime/model_tokenizer.h"
#include "runtime/quantize.h"

namespace kiln::cuda {
namespace {

using namespace testing;

TEST(CudaGptqModel, TinyLlamaMatchesCpuGptq) {
  KILN_SKIP_WITHOUT_CUDA();
  const std::string dir = fixtures_dir() + "/models/llama";
  std::mt19937_64 rng(21);
  auto seq = [&](int len) {
    std::vector<int32_t> s;
    for (int i = 0; i < len; ++i) s.push_back(int32_t(rng() % 512));
    return s;
  };
  std::vector<std::vector<int32_t>> calib;
  for (int i = 0; i < 8; ++i) calib.push_back(seq(32));
  const auto prompt = seq(20), decode = seq(6);
  QuantOptions q;
  q.mode = "gptq";
  const quant::CalibrationTable table = calibrate_gptq(dir, {}, q, QuantFormat::kQ4, &calib);
  auto cpu = Model::load(dir, gptq_model_options({.weight_dtype = "q4"}, table, q));
  auto gpu = Model::load(dir, gptq_model_options({.backend = "cuda", .weight_dtype = "q4"}, table, q));
  auto f32 = Model::load(dir);
  auto gpu_bf16 = Model::load(dir, {.backend = "cuda", .weight_dtype = "bf16"});
  const auto ref = logits_of(*cpu, prompt, decode), got = logits_of(*gpu, prompt, decode);
  const auto ref_f32 = logits_of(*f32, prompt, decode);
  // The same q4 weights on both sides: what differs is the GPU's bf16 activations (and the
  // dp4a GEMV's int8 rounding of x at decode), of the order of bf16 vs f32 on this model,
  // far below what q4 itself costs; a wrong code, scale or layout would be of order 1.
  const double e_gpu = rel_rms(got, ref), e_bf16 = rel_rms(logits_of(*gpu_bf16, prompt, decode), ref_f32),
               e_q4 = rel_rms(ref, ref_f32);
  std::printf("  gptq q4 logits: cuda vs cpu %.3g RMS; cuda bf16 vs f32 %.3g; cpu gptq vs f32 %.3g\n", e_gpu, e_bf16,
              e_q4);
  EXPECT_LT(e_gpu, 0.5 * e_q4);
  EXPECT_LT(e_gpu, 4 * e_bf16 + 1e-3);
}

// --effective-bits: a plan mixing q8 and q4 row images (and the f32 logits GEMM its
// precision pass keeps) runs on the GPU as on the CPU.
TEST(CudaGptqModel, TinyLlamaMixedPlanMatchesCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  const std::string dir = fixtures_dir() + "/models/llama";
  std::mt19937_64 rng(23);
  auto seq = [&](int len) {
    std::vector<int32_t> s;
    for (int i = 0; i < len; ++i) s.push_back(int32_t(rng() % 512));
    return s;
  };
  std::vector<std::vector<int32_t>> calib;
  for (int i = 0; i < 6; ++i) calib.push_back(seq(32));
  const auto prompt = seq(20), decode = seq(6);
  QuantOptions q;
  q.mode = "gptq";
  q.effective_bits = 6.0;
  quant::CalibrationTable table = calibrate_gptq(dir, {}, q, QuantFormat::kQ4, &calib);
  plan_effective_bits(dir, {.backend = "cuda", .weight_dtype = "q4"}, table, q, &calib);
  ASSERT_FALSE(table.precision_plan.empty());
  auto cpu = Model::load(dir, gptq_model_options({.weight_dtype = "q4"}, table, q));
  auto gpu = Model::load(dir, gptq_model_options({.backend = "cuda", .weight_dtype = "q4"}, table, q));
  int q8 = 0;
  for (const ir::Node& n : gpu->graph().nodes()) q8 += n.attr_str("weight_quant", "") == "q8";
  EXPECT_EQ(size_t(q8), table.precision_plan.size());
  auto f32 = Model::load(dir);
  auto gpu_bf16 = Model::load(dir, {.backend = "cuda", .weight_dtype = "bf16"});
  const auto ref = logits_of(*cpu, prompt, decode), got = logits_of(*gpu, prompt, decode);
  const auto ref_f32 = logits_of(*f32, prompt, decode);
  const double e_gpu = rel_rms(got, ref), e_mixed = rel_rms(ref, ref_f32),
               e_bf16 = rel_rms(logits_of(*gpu_bf16, prompt, decode), ref_f32);
  std::printf("  mixed q4/q8 (%zu q8) logits: cuda vs cpu %.3g RMS; cuda bf16 vs f32 %.3g; cpu mixed vs f32 %.3g\n",
              table.precision_plan.size(), e_gpu, e_bf16, e_mixed);
  // As for all-q4 GPTQ above: the GPU's bf16 activations and int8-rounded x, not a code.
  EXPECT_LT(e_gpu, e_mixed);
  EXPECT_LT(e_gpu, 4 * e_bf16 + 1e-3);
}

TEST(CudaGptqModel, RealMiniLmEmbeddingsMatchCpuGptq) {
  KILN_SKIP_WITHOUT_CUDA();
  const std::string dir = kiln::testing::models_dir() + "/all-minilm-l6-v2";
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "real model not found at " << dir;
  QuantOptions q;
  q.mode = "gptq";
  const quant::CalibrationTable table = calibrate_gptq(dir, {}, q, QuantFormat::kQ4);
  auto cpu = Model::load(dir, gptq_model_options({.weight_dtype = "q4"}, table, q));
  auto gpu = Model::load(dir, gptq_model_options({.backend = "cuda", .weight_dtype = "q4"}, table, q));
  // An engine built for the GPU (GPTQ's row images in the file, calibrated again on the
  // same default text: deterministic) runs as the direct load does.
  BuildOptions bo;
  bo.model = dir;
  bo.backend = "cuda";
  bo.output = ::testing::TempDir() + "/kiln_cuda_gptq_" + std::to_string(::getpid()) + ".kiln";
  bo.tune = false;
  bo.weight_dtype = "q4";
  bo.quant = q;
  build_engine(bo);
  auto engine = Model::load(bo.output, {.backend = "cuda"});
  auto tokenizer = load_model_tokenizer(*cpu);
  ASSERT_TRUE(tokenizer);
  std::vector<EncoderInput> batch;
  for (const char* t : {"The quick brown fox jumps over the lazy dog.", "A paged KV cache shares prompts between users.",
                        "Rain is expected over the mountains tonight."})
    batch.push_back({tokenizer->encode(t, true), {}});
  const auto a = encode(*cpu, batch), b = encode(*gpu, batch), e = encode(*engine, batch);
  std::filesystem::remove(bo.output);
  for (size_t i = 0; i < batch.size(); ++i) {
    const Diff d = diff(Tensor::view(const_cast<float*>(e[i].mean_pooled.data()), DType::kF32,
                                     {int64_t(e[i].mean_pooled.size())}),
                        Tensor::view(const_cast<float*>(b[i].mean_pooled.data()), DType::kF32,
                                     {int64_t(b[i].mean_pooled.size())}));
    EXPECT_LT(d.rel(), 1e-2) << "engine vs direct load, sentence " << i;
    double dot = 0, na = 0, nb = 0;
    for (size_t j = 0; j < a[i].mean_pooled.size(); ++j) {
      dot += double(a[i].mean_pooled[j]) * b[i].mean_pooled[j];
      na += double(a[i].mean_pooled[j]) * a[i].mean_pooled[j];
      nb += double(b[i].mean_pooled[j]) * b[i].mean_pooled[j];
    }
    const double c = dot / std::sqrt(na * nb);
    std::printf("  minilm gptq q4 sentence %zu: cuda vs cpu cosine %.6f\n", i, c);
    EXPECT_GT(c, 0.999) << "sentence " << i;  // q4 vs f32 is ~0.985 on such sentences
  }
}

}  // namespace
}  // namespace kiln::cuda
