// The decode stack (one persistent kernel for a batch-1 decode step through every layer,
// ops/decode_stack.h): the golden Llama (GQA, Llama-3 RoPE) and Qwen2 (q|k|v bias, MQA)
// fixtures decode token by token against transformers' per-step logits in bf16 and f16
// with the kernel running (its launches counted); random-weight Llama shapes at head dims
// 64 and 128, groups of 1-8 query heads and contexts of one and of several attention
// splits decode as the kernel-per-node path does (KILN_CUDA_DECODE_STACK=0); its replays
// as a CUDA graph give the eager launch's bits; batches of two keep the per-node path; a
// bad switch value is an error. Skips without a GPU.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include "../../models/golden_util.h"
#include "backends/cuda/ops/decode_stack.h"
#include "cuda_model_test_util.h"
#include "cuda_test_util.h"
#include "runtime/llm_runner.h"

namespace kiln::cuda {
namespace {

using namespace testing;
using kiln::cuda::testing::logits_of;
using kiln::cuda::testing::rel_rms;

// KILN_CUDA_DECODE_STACK for the models loaded in this scope (read when a graph compiles).
struct StackSwitch {
  explicit StackSwitch(const char* v) { setenv("KILN_CUDA_DECODE_STACK", v, 1); }
  ~StackSwitch() { unsetenv("KILN_CUDA_DECODE_STACK"); }
};

class CudaDecodeStackGolden : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(CudaDecodeStackGolden, DecodeMatchesTransformers) {
  KILN_SKIP_WITHOUT_CUDA();
  const auto& [family, dtype] = GetParam();
  StackSwitch on("1");
  auto model = Model::load(fixtures_dir() + "/models/" + family, {.backend = "cuda", .weight_dtype = dtype});
  kiln::testing::Reference ref(family);
  const int64_t n = ref.shape("greedy")[1];
  const uint64_t launches = decode_stack_launches();
  for (size_t b = 0; b < ref.prompts().size(); ++b) {
    const double worst = kiln::cuda::testing::golden_decode_worst_rel(*model, ref, b);
    std::printf("  %s %s decode prompt %zu: worst step rel %.3g over %lld steps\n", family.c_str(), dtype.c_str(), b,
                worst, (long long)n);
    // The bounds of the golden tests (models_test.cpp): 16-bit rounding of 2-layer random models.
    EXPECT_LE(worst, dtype == "f16" ? 1e-2 : 6e-2) << family << " " << dtype << " prompt " << b;
  }
  EXPECT_GT(decode_stack_launches(), launches) << "the decode stack did not run";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaDecodeStackGolden,
                         ::testing::Combine(::testing::Values("llama", "qwen2"), ::testing::Values("bf16", "f16")),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param);
                         });

struct Shape {
  const char* name;
  int hidden, inter, layers, hq, hkv, d;
};

std::string write_config(const Shape& s) {
  const std::string dir = ::testing::TempDir() + "/decode_stack_" + s.name;
  std::filesystem::create_directories(dir);
  std::ofstream f(dir + "/config.json");
  f << "{\"model_type\": \"llama\", \"vocab_size\": 1000, \"hidden_size\": " << s.hidden
    << ", \"intermediate_size\": " << s.inter << ", \"num_hidden_layers\": " << s.layers
    << ", \"num_attention_heads\": " << s.hq << ", \"num_key_value_heads\": " << s.hkv << ", \"head_dim\": " << s.d
    << ", \"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-5, \"rope_theta\": 500000.0,"
       " \"tie_word_embeddings\": false, \"bos_token_id\": 1, \"eos_token_id\": 2}";
  return dir + "/config.json";
}

class CudaDecodeStackShapes : public ::testing::TestWithParam<Shape> {};

// Prefill (per node either way) then decode steps through the stack vs the per-node path.
TEST_P(CudaDecodeStackShapes, DecodeMatchesPerNodeKernels) {
  KILN_SKIP_WITHOUT_CUDA();
  const Shape s = GetParam();
  const std::string config = write_config(s);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> tok(3, 999);
  for (int ctx : {5, 700}) {
    std::vector<int32_t> prompt(static_cast<size_t>(ctx)), decode(24);
    for (auto& t : prompt) t = tok(rng);
    for (auto& t : decode) t = tok(rng);
    std::vector<float> off, on;
    {
      StackSwitch sw("0");
      auto m = Model::load_random(config, {.backend = "cuda", .weight_dtype = "bf16"});
      off = logits_of(*m, prompt, decode);
    }
    const uint64_t launches = decode_stack_launches();
    {
      StackSwitch sw("1");
      auto m = Model::load_random(config, {.backend = "cuda", .weight_dtype = "bf16"});
      on = logits_of(*m, prompt, decode);
    }
    EXPECT_GT(decode_stack_launches(), launches) << s.name << ": the decode stack did not run";
    // The decode steps' logits (the prefill runs the same kernels either way).
    const size_t vocab = 1000, pre = size_t(ctx) * vocab;
    ASSERT_EQ(on.size(), off.size());
    const std::vector<float> don(on.begin() + pre, on.end()), doff(off.begin() + pre, off.end());
    const double e = rel_rms(don, doff);
    std::printf("  %s, context %d: decode logits rel RMS %.3g vs the per-node kernels\n", s.name, ctx, e);
    // Summation order and where bf16 rounding lands differ; measured below 1e-2.
    EXPECT_LE(e, 2e-2) << s.name << " context " << ctx;
  }
}

// Replays of a captured step give the eager launch's bits (the kernel is deterministic:
// fixed work split, partial sums added in a fixed order).
TEST(CudaDecodeStack, GraphReplayIsBitIdenticalToEager) {
  KILN_SKIP_WITHOUT_CUDA();
  const std::string config = write_config({"graphs", 256, 768, 2, 8, 2, 64});
  std::vector<int32_t> prompt(static_cast<size_t>(77)), decode(12);
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> tok(3, 999);
  for (auto& t : prompt) t = tok(rng);
  for (auto& t : decode) t = tok(rng);
  StackSwitch on("1");
  auto run = [&](const char* graphs) {
    setenv("KILN_CUDA_GRAPHS", graphs, 1);
    auto m = Model::load_random(config, {.backend = "cuda", .weight_dtype = "bf16"});
    unsetenv("KILN_CUDA_GRAPHS");
    auto all = logits_of(*m, prompt, decode);
    return std::vector<float>(all.end() - int64_t(decode.size()) * 1000, all.end());
  };
  const uint64_t launches = decode_stack_launches();
  EXPECT_EQ(run("1"), run("0"));
  EXPECT_GT(decode_stack_launches(), launches);
}

// A step of two sequences keeps the per-node kernels (the stack decodes one token).
TEST(CudaDecodeStack, BatchesOfTwoKeepThePerNodePath) {
  KILN_SKIP_WITHOUT_CUDA();
  StackSwitch on("1");
  auto m = Model::load_random(write_config({"batch2", 256, 768, 2, 8, 2, 64}), {.backend = "cuda", .weight_dtype = "bf16"});
  LlmRunner r(*m);
  r.add_sequence({5, 6, 7});
  r.add_sequence({8, 9});
  r.step();  // prefill
  const uint64_t launches = decode_stack_launches();
  for (int i = 0; i < 3; ++i)
    for (auto& o : r.step()) r.append_tokens(o.seq, {argmax(o.logits.data(), int64_t(o.logits.size()))});
  EXPECT_EQ(decode_stack_launches(), launches);
}

// KILN_CUDA_DECODE_STACK takes 0 or 1; another value is an error naming it.
TEST(CudaDecodeStack, SwitchRejectsOtherValues) {
  KILN_SKIP_WITHOUT_CUDA();
  StackSwitch bad("yes");
  try {
    auto m = Model::load_random(write_config({"switch", 256, 768, 1, 8, 2, 64}), {.backend = "cuda", .weight_dtype = "bf16"});
    FAIL() << "a bad KILN_CUDA_DECODE_STACK was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KILN_CUDA_DECODE_STACK"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaDecodeStackShapes,
                         ::testing::Values(Shape{"d64_g4", 512, 1536, 3, 8, 2, 64},
                                           Shape{"d128_g2", 1024, 2816, 2, 16, 8, 128},
                                           Shape{"d128_g8_mqa_like", 512, 1024, 2, 8, 1, 128},
                                           Shape{"d64_g1", 256, 768, 2, 4, 4, 64}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace kiln::cuda
