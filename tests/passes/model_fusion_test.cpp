// The default pass list on the real model graphs (tiny HF fixtures): the expected
// fused node counts per family (one packed Attention and two fused Add+Norm per layer)
// and the optimized model's outputs against the faithful graph's (decoders through the
// paged KV cache, prefill then decode; the encoder through encode()). The golden tests
// in tests/models/ check the optimized graphs against transformers as well.
#include <gtest/gtest.h>

#include "../models/golden_util.h"
#include "pass_test_util.h"
#include "passes/pass.h"
#include "runtime/encoder_runner.h"
#include "runtime/llm_runner.h"

namespace kiln {
namespace {

using testing::count_ops;

struct Expect {
  std::string model;
  size_t add_norm_extra;  // fused Add+Norm beyond 2 per layer (GPT-2's embedding sum)
  bool swiglu;
  size_t embedding_norm = 0;  // BERT's word + position + token type + LayerNorm
};

class ModelFusion : public ::testing::TestWithParam<Expect> {};

std::vector<float> decode_logits(Model& m) {
  LlmRunner r(m);
  std::vector<float> all;
  r.add_sequence({3, 1, 4, 1, 5, 9, 2, 6});
  r.add_sequence({2, 7, 1});
  for (int step = 0; step < 4; ++step) {
    auto outs = r.step();
    for (auto& o : outs) {
      all.insert(all.end(), o.logits.begin(), o.logits.end());
      r.append_tokens(o.seq, {argmax(o.logits.data(), int64_t(o.logits.size()))});
    }
  }
  return all;
}

TEST_P(ModelFusion, FusedCountsAndSameOutputsAsTheFaithfulGraph) {
  const Expect& e = GetParam();
  auto plain = Model::load(testing::fixture_dir(e.model), {"cpu", "f32", nullptr, 0, {}});
  auto fused = Model::load(testing::fixture_dir(e.model));
  const ir::Graph& g = fused->graph();
  const size_t layers = size_t(fused->info().num_layers);
  std::printf("%s: %zu -> %zu nodes\n%s", e.model.c_str(), plain->graph().nodes().size(), g.nodes().size(),
              passes::format_pass_report(fused->pass_report()).c_str());
  ASSERT_EQ(count_ops(g, "Attention"), layers);
  for (auto& n : g.nodes()) {
    if (n.op == "Attention") {
      EXPECT_EQ(n.attr_int("packed_qkv", 0), 1) << n.name;
    }
  }
  EXPECT_EQ(count_ops(g, "AddRMSNorm") + count_ops(g, "AddLayerNorm"), 2 * layers + e.add_norm_extra);
  // SwiGLU ends up as the gate|up GEMM's epilogue (fuse_swiglu, then fuse_linear_activation).
  EXPECT_EQ(count_ops(g, "SwiGLU"), 0u);
  size_t swiglu_epilogues = 0;
  for (auto& n : g.nodes()) swiglu_epilogues += n.op == "Linear" && n.attr_str("activation", "") == "swiglu";
  EXPECT_EQ(swiglu_epilogues, e.swiglu ? layers : 0);
  EXPECT_EQ(count_ops(g, "EmbeddingLayerNorm"), e.embedding_norm);
  if (e.embedding_norm) {
    EXPECT_EQ(count_ops(g, "Embedding"), 0u);
  }
  EXPECT_EQ(count_ops(g, "Rope") + count_ops(g, "Gelu") + count_ops(g, "Silu") + count_ops(g, "Mul"), 0u);
  // Per layer, Q/K/V become one GEMM and gate/up another.
  EXPECT_EQ(count_ops(g, "Linear"), count_ops(plain->graph(), "Linear") - 2 * layers - (e.swiglu ? layers : 0));
  EXPECT_LT(g.nodes().size(), plain->graph().nodes().size());

  if (fused->info().is_decoder) {
    auto want = decode_logits(*plain), got = decode_logits(*fused);
    ASSERT_EQ(want.size(), got.size());
    KILN_EXPECT_CLOSE(got.data(), want.data(), got.size(), 1e-5, e.model + " logits, fused vs faithful");
  } else {
    std::vector<EncoderInput> batch = {{{2, 5, 7, 9, 3}, {}}, {{2, 8, 3}, {0, 0, 1}}};
    auto want = encode(*plain, batch), got = encode(*fused, batch);
    for (size_t b = 0; b < batch.size(); ++b) {
      KILN_EXPECT_CLOSE(got[b].hidden.data(), want[b].hidden.data(), got[b].hidden.size(), 1e-5,
                        e.model + " hidden, fused vs faithful");
      KILN_EXPECT_CLOSE(got[b].logits.data(), want[b].logits.data(), got[b].logits.size(), 1e-5,
                        e.model + " logits, fused vs faithful");
    }
  }
}

// fuse_norm_linear (which the CUDA backend asks for) on the real decoder graphs after the
// default passes: every residual add goes into a Linear epilogue and every norm into
// Linear prologues, but GPT-2's embedding sum (no Linear to take the add) and the final
// norm kept for the "hidden" output; the same outputs on the CPU, which runs the fused form.
TEST(ModelNormLinearFusion, FoldsTheDecodersNorms) {
  struct Case {
    const char* model;
    const char* add_norm;
    size_t add_norms_left;
  };
  for (Case c : {Case{"llama", "AddRMSNorm", 0}, Case{"qwen2", "AddRMSNorm", 0}, Case{"qwen3", "AddRMSNorm", 0}, Case{"phi3", "AddRMSNorm", 0}, Case{"gpt2", "AddLayerNorm", 1}}) {
    SCOPED_TRACE(c.model);
    ModelOptions o;
    o.top_logits_k = 0;  // compare the logits themselves
    auto m = Model::load(testing::fixture_dir(c.model), o);
    const ir::Graph& g = m->graph();
    const size_t layers = size_t(m->info().num_layers);
    ir::Graph opt = g;
    auto pass = passes::make_fuse_norm_linear_pass();
    ASSERT_TRUE(pass->run(opt));
    std::printf("%s: %s (%zu -> %zu nodes)\n", c.model, pass->stats().c_str(), g.nodes().size(), opt.nodes().size());
    EXPECT_EQ(count_ops(opt, c.add_norm), c.add_norms_left);
    EXPECT_EQ(count_ops(opt, "RMSNorm") + count_ops(opt, "LayerNorm"), 1u);  // for "hidden"
    size_t prologues = 0, residuals = 0;
    for (auto& n : opt.nodes()) {
      prologues += n.op == "Linear" && n.has_attr("norm");
      residuals += n.op == "Linear" && n.input(3) != ir::kNoValue;
    }
    // Per layer: qkv and gate|up (or c_fc) normalize; o and down add. Plus the LM head,
    // less GPT-2's first layer norm (after the embedding sum).
    EXPECT_EQ(prologues, 2 * layers + 1 - c.add_norms_left);
    EXPECT_EQ(residuals, 2 * layers);
    const int64_t t = 6;
    testing::expect_same_outputs(testing::run_graph(g, t), testing::run_graph(opt, t), 1e-5);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, ModelFusion,
                         ::testing::Values(Expect{"gpt2", 1, false}, Expect{"llama", 0, true},
                                           Expect{"qwen2", 0, true}, Expect{"qwen3", 0, true}, Expect{"phi3", 0, true}, Expect{"bert", 0, false, 1}),
                         [](const auto& info) { return info.param.model; });

}  // namespace
}  // namespace kiln
