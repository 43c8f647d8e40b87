// --weight-dtype auto on CUDA (the CLI's default): a GGUF's Q4_0 / Q8_0 Linears keep their
// own codes in their own format side by side (q4 and q8 GEMVs in one model), the tied LM
// head takes a q8 copy of a Q8_0 token embedding, and everything else (the other weights
// and the activations) runs in bf16 (auto_weight_dtype). The model of
// tests/models/gguf_quant_llama.h (2 layers, hidden 64), a prefill of 7 tokens and 4
// decode steps, against the CPU's auto model (the same codes, f32 activations): logits
// within the bf16 model bound (6e-2 of the reference's RMS; models_test.cpp), with the
// tensor-core q4 GEMV (KILN_CUDA_QGEMV=mma: x multiplied as given; the default dp4a GEMV
// rounds x to int8, which moves these tiny random models' logits by 4-15%, see
// qgemv_dp4a_models_test.cpp, which runs the real SmolLM2 under auto with it). A file
// with an f32 token embedding keeps the head in bf16. Skips without a GPU.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>

#include "../../models/gguf_quant_llama.h"
#include "cuda_model_test_util.h"
#include "runtime/encoder_runner.h"

namespace kiln::cuda {
namespace {

using namespace testing;

// A prefill of 7 tokens and 4 decode steps on `gpu` against the CPU's auto model of the
// same file: logits within the bf16 model bound (6e-2 of the reference's RMS).
void expect_like_the_cpus_auto(Model& gpu, const std::string& path, const std::string& what) {
  auto cpu = Model::load(path, {.weight_dtype = "auto"});
  const std::vector<int32_t> prompt = {1, 5, 9, 3, 14, 2, 7}, decode = {4, 11, 0, 8};
  const std::vector<float> want = logits_of(*cpu, prompt, decode), got = logits_of(gpu, prompt, decode);
  ASSERT_EQ(got.size(), want.size()) << what;
  const double err = rel_rms(got, want);
  std::printf("  gguf auto (%s) on cuda vs the cpu's auto: logits rel rms %.4g over %zu values\n", what.c_str(), err,
              want.size());
  EXPECT_LE(err, 6e-2) << what;
}

TEST(CudaGgufAuto, EachLinearKeepsItsFormatBesideBf16) {
  KILN_SKIP_WITHOUT_CUDA();
  kiln::test::TempDir dir;
  for (GgmlType embd : {GgmlType::kF32, GgmlType::kQ8_0}) {
    const bool q8_head = embd == GgmlType::kQ8_0;
    const std::string what = std::string("token_embd ") + ggml_type_name(uint32_t(embd));
    const std::string path = dir.file("mixed.gguf");
    kiln::test::write_file(path, kiln::test::quant_llama(GgmlType::kQ4_0, GgmlType::kQ8_0, embd));
    ::setenv("KILN_CUDA_QGEMV", "mma", 1);  // read when the graph is compiled
    auto gpu = Model::load(path, {.backend = "cuda", .weight_dtype = "auto"});
    ::unsetenv("KILN_CUDA_QGEMV");
    EXPECT_EQ(gpu->compile_options().weight_dtype, "bf16") << what;
    std::map<std::string, size_t> formats;  // weight_quant -> Linears
    size_t plain = 0;
    for (const ir::Node& n : gpu->graph().nodes()) {
      if (n.op != "Linear") continue;
      if (!n.has_attr("weight_quant")) {
        ++plain;
        continue;
      }
      ++formats[n.attr_str("weight_quant")];
      EXPECT_EQ(n.attr_str("precision", ""), n.attr_str("weight_quant")) << what << ": " << n.name;
    }
    EXPECT_GT(formats["q4"], 0u) << what << ": the Q4_0 attention keeps q4 codes";
    EXPECT_GT(formats["q8"], 0u) << what << ": the Q8_0 MLP keeps q8 codes";
    EXPECT_EQ(plain, q8_head ? 0u : 1u) << what << ": only an f32 embedding's tied head is not kept";
    expect_like_the_cpus_auto(*gpu, path, what);
  }
}

// A Q4_K_M-style mix on CUDA: Q4_K attention kept as q4 codes, a Q6_K MLP requantized to
// q8 at load (ggml_requantized_to_q8, as on the CPU), a Q4_K token embedding kept as a q4
// table, and a Q5_0 attention kept exactly as q8 codes beside a Q8_0 MLP. Both backends load the same codes, so the bound is the bf16
// model's (6e-2 of the reference's RMS, as above).
TEST(CudaGgufAuto, KQuantMixesStayQuantized) {
  KILN_SKIP_WITHOUT_CUDA();
  kiln::test::TempDir dir;
  struct Case {
    GgmlType attn, mlp, embd;
    size_t q4, q8, plain;
  };
  // The third: a Q4_K token embedding stays a q4 table (expanded to bf16 on upload) and the
  // tied head keeps its q4 codes.
  for (const Case& c : {Case{GgmlType::kQ4_K, GgmlType::kQ6_K, GgmlType::kF32, 4, 4, 1},
                        Case{GgmlType::kQ5_0, GgmlType::kQ8_0, GgmlType::kF32, 0, 8, 1},
                        Case{GgmlType::kQ4_K, GgmlType::kQ6_K, GgmlType::kQ4_K, 5, 4, 0}}) {
    const std::string what = std::string(ggml_type_name(uint32_t(c.attn))) + "/" + ggml_type_name(uint32_t(c.mlp)) +
                             "/" + ggml_type_name(uint32_t(c.embd));
    const std::string path = dir.file("kquant.gguf");
    kiln::test::write_file(path, kiln::test::quant_llama(c.attn, c.mlp, c.embd));
    ::setenv("KILN_CUDA_QGEMV", "mma", 1);  // read when the graph is compiled
    auto gpu = Model::load(path, {.backend = "cuda", .weight_dtype = "auto"});
    ::unsetenv("KILN_CUDA_QGEMV");
    std::map<std::string, size_t> formats;  // weight_quant -> Linears ("bf16": not kept)
    for (const ir::Node& n : gpu->graph().nodes())
      if (n.op == "Linear") ++formats[n.attr_str("weight_quant", "bf16")];
    EXPECT_EQ(formats["q4"], c.q4) << what;
    EXPECT_EQ(formats["q8"], c.q8) << what;
    EXPECT_EQ(formats["bf16"], c.plain) << what << ": only the tied head over an f32 embedding";
    expect_like_the_cpus_auto(*gpu, path, what);
  }
}

// A Q8_0 GPT-2 GGUF (Conv1D weights as the file's [out, in] rows): every Linear keeps its
// q8 codes on CUDA, the token table is expanded to bf16 at upload with the tied head keeping
// its q8 codes, and the logits follow the CPU's auto model of the same file.
// Every Linear of the model's graph keeps the file's q8 codes.
void expect_every_linear_keeps_q8(const Model& m) {
  size_t linears = 0, q8 = 0;
  for (const ir::Node& n : m.graph().nodes())
    if (n.op == "Linear") {
      ++linears;
      q8 += n.attr_str("weight_quant", "") == "q8";
    }
  EXPECT_GT(linears, 0u);
  EXPECT_EQ(q8, linears);
}

TEST(CudaGgufAuto, Gpt2KeepsItsQ8Linears) {
  KILN_SKIP_WITHOUT_CUDA();
  kiln::test::TempDir dir;
  const std::string path = dir.file("gpt2_q8.gguf");
  kiln::test::write_file(path, kiln::test::q8_gpt2(kiln::testing::fixture_dir("gpt2")));
  ::setenv("KILN_CUDA_QGEMV", "mma", 1);  // read when the graph is compiled
  auto gpu = Model::load(path, {.backend = "cuda", .weight_dtype = "auto"});
  ::unsetenv("KILN_CUDA_QGEMV");
  expect_every_linear_keeps_q8(*gpu);
  expect_like_the_cpus_auto(*gpu, path, "gpt2 Q8_0");
}

// A BERT GGUF (llama.cpp's converter layout, the tiny classifier fixture as Q8_0, pooling
// by [CLS]): its Linears keep their q8 codes on the GPU, the table is looked up from its
// image, and the sentence embeddings are the CPU's to bf16's rounding.
TEST(CudaGgufAuto, BertKeepsItsQ8LinearsAndTable) {
  KILN_SKIP_WITHOUT_CUDA();
  kiln::test::TempDir dir;
  const std::string path = dir.file("bert_q8.gguf");
  kiln::test::write_file(path, kiln::test::bert_gguf(kiln::testing::fixture_dir("bert"), GgmlType::kQ8_0, 2));
  auto gpu = Model::load(path, {.backend = "cuda", .weight_dtype = "auto"});
  auto cpu = Model::load(path, {.weight_dtype = "auto"});
  EXPECT_EQ(gpu->info().pooling, "cls");
  expect_every_linear_keeps_q8(*gpu);
  const std::vector<EncoderInput> in = {{{2, 5, 7, 9, 3}, {}}, {{2, 8, 3, 11, 12, 13, 3}, {0, 0, 0, 1, 1, 1, 1}}};
  const auto want = encode(*cpu, in), got = encode(*gpu, in);
  for (size_t i = 0; i < in.size(); ++i) {
    const double err = rel_rms(got[i].embedding, want[i].embedding);
    std::printf("  bert Q8_0 gguf on cuda vs the cpu: sequence %zu embedding rel rms %.4g\n", i, err);
    EXPECT_LE(err, 6e-2) << i;
    EXPECT_LE(rel_rms(got[i].mean_pooled, want[i].mean_pooled), 6e-2) << i;
  }
}

// ModelOptions::lean_host_weights on CUDA: after compiling, the host tensors of every
// uploaded weight are released (dtype and shape kept, no data) and the model computes the
// logits it computes with them kept, bit for bit (the same device weights).
TEST(CudaLeanHost, ReleasedHostWeightsComputeTheSameLogits) {
  KILN_SKIP_WITHOUT_CUDA();
  kiln::test::TempDir dir;
  const std::string path = dir.file("lean.gguf");
  kiln::test::write_file(path, kiln::test::quant_llama(GgmlType::kQ4_K, GgmlType::kQ6_K, GgmlType::kQ4_K));
  ModelOptions o{.backend = "cuda", .weight_dtype = "auto"};
  auto kept = Model::load(path, o);
  o.lean_host_weights = true;
  auto lean = Model::load(path, o);
  size_t released = 0, weights = 0;
  const ir::Graph& g = lean->graph();
  for (size_t v = 0; v < g.num_values(); ++v)
    if (g.is_weight(ir::ValueId(v))) {
      ++weights;
      released += g.weight(ir::ValueId(v)).empty();
      EXPECT_EQ(g.weight(ir::ValueId(v)).shape(), kept->graph().weight(ir::ValueId(v)).shape());
    }
  std::printf("  %zu of %zu host weights released\n", released, weights);
  for (const ir::Node& n : g.nodes())  // the large ones: every Linear's and the table
    if (n.op == "Linear" || n.op == "Embedding") {
      EXPECT_TRUE(g.weight(n.inputs[n.op == "Linear" ? 1 : 0]).empty()) << n.name;
    }
  const std::vector<int32_t> prompt = {1, 5, 9, 3, 14, 2, 7}, decode = {4, 11, 0, 8};
  const std::vector<float> want = logits_of(*kept, prompt, decode), got = logits_of(*lean, prompt, decode);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace kiln::cuda
