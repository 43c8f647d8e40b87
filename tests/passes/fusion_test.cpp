// Fusion passes on small graphs built in code: node counts before/after, the outputs
// before vs after on the CPU backend (A/B within tolerance), and patterns that must
// not fuse.
#include <gtest/gtest.h>

#include "core/log.h"
#include "ir/rewrite.h"
#include "pass_test_util.h"
#include "passes/pass.h"
#include "passes/pass_manager.h"
#include "backends/memory_plan.h"

namespace kiln {
namespace {

using testing::count_ops;
using testing::random_tensor;

constexpr int64_t kT = 7;

// Runs `pass` on a copy of g; checks the A/B outputs; returns the rewritten graph.
ir::Graph run_ab(const ir::Graph& g, passes::Pass& pass, bool expect_change = true, double tol = 1e-5) {
  ir::Graph opt = g;
  EXPECT_EQ(pass.run(opt), expect_change) << pass.name();
  EXPECT_NO_THROW(ir::verify(opt));
  std::printf("%s: %s\n", pass.name(), pass.stats().c_str());
  testing::expect_same_outputs(testing::run_graph(g, kT), testing::run_graph(opt, kT), tol);
  return opt;
}

TEST(FuseAddNorm, FusesResidualAddsIntoBothNormKinds) {
  ir::Graph g;
  ir::ValueId x = g.add_input("x", DType::kF32, {"T", 16});
  ir::ValueId r = g.add_input("r", DType::kF32, {"T", 16});
  ir::ValueId s = g.add("Add", {x, r});
  ir::ValueId n = g.add("RMSNorm", {s, g.add_weight("w", random_tensor({16}, 1, 0.1f, 1))}, {{"eps", 1e-6}});
  ir::ValueId o = g.add("Linear", {n, g.add_weight("lw", random_tensor({16, 16}, 2))});
  ir::ValueId s2 = g.add("Add", {s, o});  // the residual stream keeps reading the sum
  ir::ValueId ln = g.add("LayerNorm", {s2, g.add_weight("g", random_tensor({16}, 3, 0.1f, 1)),
                                       g.add_weight("b", random_tensor({16}, 4))}, {{"eps", 1e-5}});
  g.add_output("ln", ln);
  g.add_output("s2", s2);
  auto pass = passes::make_fuse_add_norm_pass();
  ir::Graph opt = run_ab(g, *pass);
  EXPECT_EQ(count_ops(opt, "Add"), 0u);
  EXPECT_EQ(count_ops(opt, "AddRMSNorm"), 1u);
  EXPECT_EQ(count_ops(opt, "AddLayerNorm"), 1u);
  EXPECT_EQ(pass->stats(), "fused 1 Add+RMSNorm, fused 1 Add+LayerNorm");
}

TEST(FuseAddNorm, LeavesBroadcastAddsAlone) {
  ir::Graph g;
  ir::ValueId x = g.add_input("x", DType::kF32, {"T", 16});
  ir::ValueId s = g.add("Add", {x, g.add_weight("bias", random_tensor({16}, 1))});
  g.add_output("y", g.add("RMSNorm", {s, g.add_weight("w", random_tensor({16}, 2, 0.1f, 1))}, {{"eps", 1e-6}}));
  run_ab(g, *passes::make_fuse_add_norm_pass(), false);
}

TEST(FuseSwiGlu, MergesGateAndUpIntoOneLinear) {
  ir::Graph g;
  ir::ValueId x = g.add_input("x", DType::kF32, {"T", 16});
  ir::ValueId gate = g.add("Linear", {x, g.add_weight("wg", random_tensor({24, 16}, 1))}, {}, "mlp.gate_proj");
  ir::ValueId up = g.add("Linear", {x, g.add_weight("wu", random_tensor({24, 16}, 2))}, {}, "mlp.up_proj");
  ir::ValueId h = g.add("Mul", {up, g.add("Silu", {gate})}, {}, "mlp.gate_mul");  // either operand order
  g.add_output("y", g.add("Linear", {h, g.add_weight("wd", random_tensor({16, 24}, 3))}, {}, "mlp.down_proj"));
  size_t bytes = g.weight_bytes();
  ir::Graph opt = run_ab(g, *passes::make_fuse_swiglu_pass());
  EXPECT_EQ(count_ops(opt, "SwiGLU"), 1u);
  EXPECT_EQ(count_ops(opt, "Linear"), 2u);
  EXPECT_EQ(count_ops(opt, "Silu") + count_ops(opt, "Mul"), 0u);
  EXPECT_EQ(opt.weight_bytes(), bytes) << "the separate gate/up weights must be dropped";
}

// Gate and up weights lying back to back in one buffer (views of a checkpoint's mapping
// that stores them in that order) stack into a view of that span, not a copy; the same
// rows apart or in two buffers are copied. The outputs match the unfused graph either way.
TEST(FuseSwiGlu, AdjacentWeightsOfOneBufferStackWithoutACopy) {
  const Tensor both = random_tensor({48, 16}, 4);
  const Tensor other = random_tensor({24, 16}, 5);
  auto build = [&](const Tensor& wg, const Tensor& wu) {
    ir::Graph g;
    ir::ValueId x = g.add_input("x", DType::kF32, {"T", 16});
    ir::ValueId gate = g.add("Linear", {x, g.add_weight("wg", wg)}, {}, "mlp.gate_proj");
    ir::ValueId up = g.add("Linear", {x, g.add_weight("wu", wu)}, {}, "mlp.up_proj");
    g.add_output("y", g.add("Mul", {g.add("Silu", {gate}), up}));
    ir::Graph opt = run_ab(g, *passes::make_fuse_swiglu_pass());
    for (const ir::Node& n : opt.nodes())
      if (n.op == "Linear") return opt.weight(n.inputs[1]);
    ADD_FAILURE() << "no merged Linear";
    return Tensor();
  };
  const Tensor view = build(both.slice_rows(0, 24), both.slice_rows(24, 48));
  EXPECT_EQ(view.data(), both.data()) << "adjacent rows of one buffer: a view";
  EXPECT_EQ(view.shape(), (std::vector<int64_t>{48, 16}));
  EXPECT_NE(build(both.slice_rows(24, 48), both.slice_rows(0, 24)).data(), both.data()) << "out of order: a copy";
  EXPECT_NE(build(both.slice_rows(0, 24), other).data(), both.data()) << "two buffers: a copy";
}

TEST(FuseLinearActivation, SwiGluBecomesTheMergedGemmsEpilogue) {
  ir::Graph g;
  ir::ValueId x = g.add_input("x", DType::kF32, {"T", 16});
  ir::ValueId gate = g.add("Linear", {x, g.add_weight("wg", random_tensor({24, 16}, 1))}, {}, "mlp.gate_proj");
  ir::ValueId up = g.add("Linear", {x, g.add_weight("wu", random_tensor({24, 16}, 2))}, {}, "mlp.up_proj");
  ir::ValueId h = g.add("Mul", {g.add("Silu", {gate}), up});
  g.add_output("y", g.add("Linear", {h, g.add_weight("wd", random_tensor({16, 24}, 3))}));
  ir::Graph merged = run_ab(g, *passes::make_fuse_swiglu_pass());
  ir::Graph opt = run_ab(merged, *passes::make_fuse_linear_activation_pass());
  EXPECT_EQ(count_ops(opt, "SwiGLU"), 0u);
  ASSERT_EQ(count_ops(opt, "Linear"), 2u);
  EXPECT_EQ(opt.nodes()[0].attr_str("activation"), "swiglu");
  EXPECT_EQ(opt.value(opt.nodes()[0].outputs[0]).shape.str(), Shape({"T", 24}).str());
}

// Gemma's MLP: a GELU(tanh) gate merges with up into GeGLU, which keeps its own node
// (no Linear epilogue); an erf GELU gate is left alone.
TEST(FuseSwiGlu, GeluTanhGateBecomesGeGlu) {
  for (const char* approx : {"tanh", "none"}) {
    ir::Graph g;
    ir::ValueId x = g.add_input("x", DType::kF32, {"T", 16});
    ir::ValueId gate = g.add("Linear", {x, g.add_weight("wg", random_tensor({24, 16}, 1))}, {}, "mlp.gate_proj");
    ir::ValueId up = g.add("Linear", {x, g.add_weight("wu", random_tensor({24, 16}, 2))}, {}, "mlp.up_proj");
    ir::ValueId act = g.add("Gelu", {gate}, {{"approximate", std::string(approx)}}, "mlp.act");
    ir::ValueId h = g.add("Mul", {act, up}, {}, "mlp.gate_mul");
    g.add_output("y", g.add("Linear", {h, g.add_weight("wd", random_tensor({16, 24}, 3))}, {}, "mlp.down_proj"));
    const bool tanh = std::string(approx) == "tanh";
    ir::Graph merged = run_ab(g, *passes::make_fuse_swiglu_pass(), tanh);
    EXPECT_EQ(count_ops(merged, "GeGLU"), tanh ? 1u : 0u) << approx;
    EXPECT_EQ(count_ops(merged, "Linear"), tanh ? 2u : 3u) << approx;
    EXPECT_EQ(count_ops(merged, "Gelu") + count_ops(merged, "Mul"), tanh ? 0u : 2u) << approx;
    if (!tanh) continue;
    ir::Graph opt = run_ab(merged, *passes::make_fuse_linear_activation_pass(), false);
    EXPECT_EQ(count_ops(opt, "GeGLU"), 1u);
  }
}

TEST(FuseSwiGlu, DoesNotFireWhenTheGateIsReadTwice) {
  ir::Graph g;
  ir::ValueId x = g.add_input("x", DType::kF32, {"T", 16});
  ir::ValueId gate = g.add("Linear", {x, g.add_weight("wg", random_tensor({24, 16}, 1))});
  ir::ValueId up = g.add("Linear", {x, g.add_weight("wu", random_tensor({24, 16}, 2))});
  g.add_output("y", g.add("Mul", {g.add("Silu", {gate}), up}));
  g.add_output("gate", gate);
  run_ab(g, *passes::make_fuse_swiglu_pass(), false);
}

// A Llama- (rope, GQA, no bias) or GPT-2/BERT-shaped (bias, no rope) attention block;
// `qk_norm`: Qwen3's per-head q and k RMSNorms before the ropes.
ir::Graph attention_block(bool rope, bool bias, bool causal, bool qk_norm = false) {
  const int64_t hq = 4, hkv = rope ? 2 : 4, d = 8, h = 32;
  ir::Graph g;
  ir::ValueId x = g.add_input("x", DType::kF32, {"T", h});
  ir::ValueId pos = g.add_input("positions", DType::kI32, {"T"});
  Tensor inv(DType::kF32, {d / 2});
  for (int64_t i = 0; i < d / 2; ++i) inv.data_as<float>()[i] = 1.0f / std::pow(10000.0f, float(2 * i) / d);
  ir::ValueId inv_freq = g.add_weight("inv_freq", inv);
  auto proj = [&](const char* name, int64_t out, uint32_t seed) {
    std::vector<ir::ValueId> in = {x, g.add_weight(std::string(name) + ".w", random_tensor({out, h}, seed))};
    if (bias) in.push_back(g.add_weight(std::string(name) + ".b", random_tensor({out}, seed + 100)));
    return g.add("Linear", in, {}, std::string("l0.") + name);
  };
  ir::ValueId q = proj("q_proj", hq * d, 1), k = proj("k_proj", hkv * d, 2), v = proj("v_proj", hkv * d, 3);
  if (qk_norm) {
    Tensor qw = random_tensor({d}, 5), kw = random_tensor({d}, 6);
    for (int64_t i = 0; i < d; ++i) qw.data_as<float>()[i] += 1.5f, kw.data_as<float>()[i] -= 1.5f;
    q = g.add("HeadRMSNorm", {q, g.add_weight("q_norm.w", qw)}, {{"eps", 1e-6}, {"head_dim", d}}, "l0.q_norm");
    k = g.add("HeadRMSNorm", {k, g.add_weight("k_norm.w", kw)}, {{"eps", 1e-6}, {"head_dim", d}}, "l0.k_norm");
  }
  if (rope) {
    q = g.add("Rope", {q, pos, inv_freq}, {{"num_heads", hq}, {"head_dim", d}});
    k = g.add("Rope", {k, pos, inv_freq}, {{"num_heads", hkv}, {"head_dim", d}});
  }
  ir::ValueId att = g.add("Attention", {q, k, v},
                          {{"layer", int64_t(0)}, {"num_heads", hq}, {"num_kv_heads", hkv}, {"head_dim", d},
                           {"scale", 1.0 / std::sqrt(double(d))}, {"causal", int64_t(causal)}},
                          "l0.attn");
  g.add_output("y", g.add("Linear", {att, g.add_weight("o.w", random_tensor({h, hq * d}, 4))}, {}, "l0.o_proj"));
  return g;
}

TEST(FuseQkvAttention, LlamaStyleWithRopeAndGqa) {
  ir::Graph g = attention_block(/*rope=*/true, /*bias=*/false, /*causal=*/true);
  ir::Graph opt = run_ab(g, *passes::make_fuse_qkv_attention_pass());
  EXPECT_EQ(count_ops(opt, "Rope"), 0u);
  EXPECT_EQ(count_ops(opt, "Linear"), 2u);  // qkv_proj + o_proj
  ASSERT_EQ(count_ops(opt, "Attention"), 1u);
  for (auto& n : opt.nodes())
    if (n.op == "Attention") {
      EXPECT_EQ(n.attr_int("packed_qkv"), 1);
      EXPECT_EQ(n.inputs.size(), 3u);  // qkv, positions, inv_freq
    }
}

// Qwen3: the q and k norms become one HeadRMSNorm over the packed row's q and k heads
// (each head's weight stacked: 4 q heads, then 2 k heads; v copied).
TEST(FuseQkvAttention, PerHeadQkNormsNormalizeThePackedRow) {
  ir::Graph g = attention_block(/*rope=*/true, /*bias=*/false, /*causal=*/true, /*qk_norm=*/true);
  ir::Graph opt = run_ab(g, *passes::make_fuse_qkv_attention_pass());
  EXPECT_EQ(count_ops(opt, "Rope"), 0u);
  EXPECT_EQ(count_ops(opt, "Linear"), 2u);
  ASSERT_EQ(count_ops(opt, "HeadRMSNorm"), 1u);
  for (auto& n : opt.nodes())
    if (n.op == "HeadRMSNorm") {
      EXPECT_EQ(n.attr_int("groups"), 6);
      EXPECT_EQ(opt.weight(n.inputs[1]).numel(), 6 * 8);
    }
  // A k norm read elsewhere keeps the block as it was.
  ir::Graph kept = attention_block(true, false, true, true);
  for (auto& n : kept.nodes())
    if (n.name == "l0.k_norm") kept.add_output("k", n.outputs[0]);
  run_ab(kept, *passes::make_fuse_qkv_attention_pass(), false);
}

TEST(FuseQkvAttention, BiasedProjectionsWithoutRope) {
  ir::Graph g = attention_block(/*rope=*/false, /*bias=*/true, /*causal=*/false);
  ir::Graph opt = run_ab(g, *passes::make_fuse_qkv_attention_pass());
  EXPECT_EQ(count_ops(opt, "Linear"), 2u);
  EXPECT_EQ(opt.nodes()[0].inputs.size(), 3u) << "the merged projection keeps the stacked bias";
}

TEST(FuseQkvAttention, DoesNotFireWhenKIsReadElsewhere) {
  ir::Graph g = attention_block(false, true, false);
  for (auto& n : g.nodes())
    if (n.name == "l0.k_proj") g.add_output("k", n.outputs[0]);
  run_ab(g, *passes::make_fuse_qkv_attention_pass(), false);
}

TEST(FuseLinearActivation, GeluAndSiluBecomeEpilogues) {
  ir::Graph g;
  ir::ValueId x = g.add_input("x", DType::kF32, {"T", 16});
  ir::ValueId a = g.add("Linear", {x, g.add_weight("w1", random_tensor({32, 16}, 1)),
                                   g.add_weight("b1", random_tensor({32}, 2))});
  a = g.add("Gelu", {a}, {{"approximate", std::string("tanh")}});
  ir::ValueId b = g.add("Silu", {g.add("Linear", {a, g.add_weight("w2", random_tensor({16, 32}, 3))})});
  ir::ValueId c = g.add("Gelu", {g.add("Linear", {b, g.add_weight("w3", random_tensor({16, 16}, 4))})});
  g.add_output("y", c);
  auto pass = passes::make_fuse_linear_activation_pass();
  ir::Graph opt = run_ab(g, *pass);
  EXPECT_EQ(opt.nodes().size(), 3u);
  EXPECT_EQ(opt.nodes()[0].attr_str("activation"), "gelu_tanh");
  EXPECT_EQ(opt.nodes()[1].attr_str("activation"), "silu");
  EXPECT_EQ(opt.nodes()[2].attr_str("activation"), "gelu_erf");
}

// BERT's embeddings (word + position + token type, then LayerNorm) or, with
// `residual_reads_sum`, GPT-2's (wte + wpe, whose sum is also the residual stream).
ir::Graph embedding_block(int lookups, bool residual_reads_sum, int64_t type_vocab = kT) {
  const int64_t h = 16;
  ir::Graph g;
  ir::ValueId tokens = g.add_input("tokens", DType::kI32, {"T"});
  ir::ValueId positions = g.add_input("positions", DType::kI32, {"T"});
  ir::ValueId types = g.add_input("token_types", DType::kI32, {"T"});
  ir::ValueId x = g.add("Embedding", {g.add_weight("word", random_tensor({50, h}, 1)), tokens}, {}, "embed_words");
  ir::ValueId p = g.add("Embedding", {g.add_weight("pos", random_tensor({40, h}, 2)), positions}, {}, "embed_pos");
  x = g.add("Add", {x, p}, {}, "embed_sum");
  if (lookups == 3)
    x = g.add("Add", {x, g.add("Embedding", {g.add_weight("type", random_tensor({type_vocab, h}, 3)), types}, {}, "embed_types")},
              {}, "embed_sum_types");
  ir::ValueId n = g.add("LayerNorm", {x, g.add_weight("ln.w", random_tensor({h}, 4, 0.1f, 1)),
                                      g.add_weight("ln.b", random_tensor({h}, 5))},
                        {{"eps", 1e-12}}, "embed_norm");
  ir::ValueId y = g.add("Linear", {n, g.add_weight("w", random_tensor({h, h}, 6))}, {}, "l0.proj");
  g.add_output("y", residual_reads_sum ? g.add("Add", {x, y}, {}, "residual") : y);
  return g;
}

TEST(FuseEmbeddingNorm, BertWordPositionAndTokenTypeBecomeOneNode) {
  for (int lookups : {3, 2}) {
    SCOPED_TRACE(lookups);
    ir::Graph g = embedding_block(lookups, false);
    ASSERT_EQ(g.nodes().size(), size_t(2 * lookups + 1));  // gathers, adds, norm, proj
    auto pass = passes::make_fuse_embedding_norm_pass();
    ir::Graph opt = run_ab(g, *pass, true, 1e-6);
    EXPECT_EQ(opt.nodes().size(), 2u);
    EXPECT_EQ(count_ops(opt, "EmbeddingLayerNorm"), 1u);
    EXPECT_EQ(count_ops(opt, "Embedding") + count_ops(opt, "Add") + count_ops(opt, "LayerNorm"), 0u);
    EXPECT_EQ(opt.nodes()[0].inputs.size(), size_t(2 + 2 * lookups));
    EXPECT_EQ(opt.nodes()[0].name, "embed_norm");
    EXPECT_EQ(pass->stats(), "fused 1 Embedding+LayerNorm");
    EXPECT_EQ(passes::fusion_of(opt.nodes()[0]), "fuse_embedding_norm");
  }
}

TEST(FuseEmbeddingNorm, OutOfRangeIdsAreStillAnError) {
  ir::Graph g = embedding_block(3, false, /*type_vocab=*/2);
  ASSERT_TRUE(passes::make_fuse_embedding_norm_pass()->run(g));
  // run_graph feeds 0..T-1 to every i32 input: token type ids past 1 are out of range.
  EXPECT_THROW(testing::run_graph(g, kT), Error);
}

TEST(FuseEmbeddingNorm, DoesNotFireWhenTheSumIsTheResidualStream) {
  ir::Graph g = embedding_block(2, /*residual_reads_sum=*/true);
  auto pass = passes::make_fuse_embedding_norm_pass();
  run_ab(g, *pass, false);
  EXPECT_EQ(pass->stats(), "");
}

// Run with KILN_LOG=debug by the passes_debug_log CTest entry (the level is read once).
TEST(FuseEmbeddingNorm, SaysWhyAtDebugLevel) {
  if (log_level() != LogLevel::kDebug) GTEST_SKIP() << "needs KILN_LOG=debug";
  ir::Graph g = embedding_block(2, true);
  ::testing::internal::CaptureStderr();
  passes::make_fuse_embedding_norm_pass()->run(g);
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("fuse_embedding_norm: not fusing 'embed_norm' (LayerNorm): the embedding sum %embed_sum "
                     "is also read elsewhere"),
            std::string::npos)
      << err;
}

// A pre-norm decoder in miniature: input norm -> projection (-> o projection) ->
// residual add + norm -> MLP (gelu or plain) -> down -> residual add -> final norm ->
// GatherRows -> LM head, with the final norm also a graph output ("hidden").
ir::Graph pre_norm_block(bool layer_norm, bool bias) {
  const int64_t h = 16, f = 24;
  ir::Graph g;
  ir::ValueId x = g.add_input("x", DType::kF32, {"T", h});
  ir::ValueId rows = g.add_input("rows", DType::kI32, {"R"});
  uint32_t seed = 1;
  auto norm = [&](ir::ValueId v, const std::string& name) {
    std::vector<ir::ValueId> in = {v, g.add_weight(name + ".w", random_tensor({h}, seed++, 0.1f, 1))};
    if (layer_norm) in.push_back(g.add_weight(name + ".b", random_tensor({h}, seed++)));
    return g.add(layer_norm ? "LayerNorm" : "RMSNorm", in, {{"eps", 1e-5}}, name);
  };
  auto linear = [&](ir::ValueId v, int64_t out, int64_t in, const std::string& name,
                    std::map<std::string, ir::Attr> attrs = {}) {
    std::vector<ir::ValueId> args = {v, g.add_weight(name + ".w", random_tensor({out, in}, seed++))};
    if (bias) args.push_back(g.add_weight(name + ".b", random_tensor({out}, seed++)));
    return g.add("Linear", args, attrs, name);
  };
  ir::ValueId a = linear(norm(x, "l0.input_norm"), h, h, "l0.qkv_proj");
  x = g.add("Add", {x, linear(a, h, h, "l0.o_proj")}, {}, "l0.residual_1");
  std::map<std::string, ir::Attr> act;
  if (layer_norm) act["activation"] = std::string("gelu_tanh");
  ir::ValueId m = linear(norm(x, "l0.post_norm"), f, h, "l0.up_proj", act);
  x = g.add("Add", {linear(m, h, f, "l0.down_proj"), x}, {}, "l0.residual_2");  // either operand order
  ir::ValueId hidden = norm(x, "final_norm");
  g.add_output("hidden", hidden);
  g.add_output("logits", linear(g.add("GatherRows", {hidden, rows}, {}, "select_rows"), 40, h, "lm_head"));
  return g;
}

size_t count_fused(const ir::Graph& g, bool residual) {
  size_t n = 0;
  for (auto& node : g.nodes())
    n += node.op == "Linear" && (residual ? node.input(3) != ir::kNoValue : node.has_attr("norm"));
  return n;
}

TEST(FuseNormLinear, FoldsEveryNormOfAPreNormBlockIntoItsLinears) {
  for (bool layer_norm : {false, true})
    for (bool bias : {false, true}) {
      SCOPED_TRACE(str_cat(layer_norm ? "LayerNorm" : "RMSNorm", bias ? " with bias" : ""));
      ir::Graph g = pre_norm_block(layer_norm, bias);
      ASSERT_TRUE(passes::make_fuse_add_norm_pass()->run(g));
      const std::string add_norm = layer_norm ? "AddLayerNorm" : "AddRMSNorm", norm = layer_norm ? "LayerNorm" : "RMSNorm";
      ASSERT_EQ(count_ops(g, add_norm), 2u);
      auto pass = passes::make_fuse_norm_linear_pass();
      ir::Graph opt = run_ab(g, *pass);
      // Both AddNorms are gone; one plain norm is left, only for the "hidden" output.
      EXPECT_EQ(count_ops(opt, add_norm) + count_ops(opt, "Add"), 0u);
      EXPECT_EQ(count_ops(opt, norm), 1u);
      EXPECT_EQ(opt.value(opt.find_output("hidden")).producer,
                int32_t(std::find_if(opt.nodes().begin(), opt.nodes().end(),
                                     [&](const ir::Node& n) { return n.op == norm; }) - opt.nodes().begin()));
      EXPECT_EQ(count_fused(opt, false), 3u);  // qkv, up, lm_head normalize their input
      EXPECT_EQ(count_fused(opt, true), 2u);   // o and down add the residual
      for (auto& n : opt.nodes())
        if (n.op == "Linear" && n.has_attr("norm")) {
          EXPECT_EQ(n.attr_str("norm"), layer_norm ? "layer" : "rms") << n.name;
          EXPECT_EQ(n.input(5) != ir::kNoValue, layer_norm) << n.name;
          EXPECT_EQ(passes::fusion_of(n), "fuse_norm_linear");
        }
      EXPECT_EQ(pass->stats(), "folded 3 norms into 3 Linear prologues and 2 residual adds into Linear epilogues "
                               "(1 norms kept for graph outputs)");
      // Steps that only want the logits do not need the kept norm.
      auto needed = nodes_needed_for(opt, {"logits"});
      for (size_t i = 0; i < opt.nodes().size(); ++i)
        if (opt.nodes()[i].op == norm) {
          EXPECT_FALSE(needed[i]);
        }
    }
}

TEST(FuseNormLinear, LeavesNormsThatOtherOpsRead) {
  // The norm's output feeds a Mul besides the Linear: the normalized rows must exist.
  ir::Graph g;
  ir::ValueId x = g.add_input("x", DType::kF32, {"T", 16});
  ir::ValueId n = g.add("RMSNorm", {x, g.add_weight("w", random_tensor({16}, 1, 0.1f, 1))}, {{"eps", 1e-6}});
  g.add_output("y", g.add("Linear", {n, g.add_weight("lw", random_tensor({16, 16}, 2))}));
  g.add_output("z", g.add("Mul", {n, x}));
  auto pass = passes::make_fuse_norm_linear_pass();
  run_ab(g, *pass, false);
  // An AddNorm of two inputs (no Linear to take the add): folding only the norm would
  // trade one kernel for another.
  ir::Graph h;
  ir::ValueId a = h.add_input("a", DType::kF32, {"T", 16});
  ir::ValueId b = h.add_input("b", DType::kF32, {"T", 16});
  auto outs = h.add_node("AddRMSNorm", {a, b, h.add_weight("w", random_tensor({16}, 3, 0.1f, 1))}, {{"eps", 1e-6}});
  h.add_output("s", outs[0]);
  h.add_output("y", h.add("Linear", {outs[1], h.add_weight("lw", random_tensor({16, 16}, 4))}));
  run_ab(h, *pass, false);
}

TEST(FuseNormLinear, TheCpuRunsTheFusedFormButDoesNotAskForIt) {
  auto cpu = create_backend("cpu");
  EXPECT_TRUE(cpu->supports_fusion("fuse_norm_linear"));
  EXPECT_FALSE(cpu->wants_fusion("fuse_norm_linear"));
  EXPECT_TRUE(cpu->wants_fusion("fuse_add_norm"));
  // A bad norm kind is refused when the node is built.
  ir::Graph g;
  ir::ValueId x = g.add_input("x", DType::kF32, {"T", 16});
  EXPECT_THROW(g.add("Linear", {x, g.add_weight("lw", random_tensor({16, 16}, 2)), ir::kNoValue, ir::kNoValue,
                                g.add_weight("nw", random_tensor({16}, 3))},
                     {{"norm", std::string("batch")}, {"norm_eps", 1e-6}}),
               Error);
  EXPECT_THROW(g.add("Linear", {x, g.add_weight("lw2", random_tensor({16, 16}, 2)), ir::kNoValue,
                                g.add_input("r", DType::kF32, {"T", 8})}),
               Error);
}

TEST(PassManager, LevelsDisableByNameAndReport) {
  ir::Graph g = attention_block(true, false, true);
  EXPECT_TRUE(passes::run_passes(g, {0, {}}).empty());
  auto names = passes::pass_list({2, {"fuse_qkv_attention"}});
  EXPECT_EQ(std::find(names.begin(), names.end(), "fuse_qkv_attention"), names.end());
  EXPECT_EQ(names.back(), "dce");
  ir::Graph kept = g;
  passes::run_passes(kept, {2, {"fuse_qkv_attention"}});
  EXPECT_EQ(count_ops(kept, "Rope"), 2u);
  auto report = passes::run_passes(g, {2, {}});
  std::string text = passes::format_pass_report(report);
  std::printf("%s", text.c_str());
  EXPECT_NE(text.find("fuse_qkv_attention: fused 1 Q/K/V"), std::string::npos) << text;
  try {
    passes::run_passes(g, {2, {"fuse_everything"}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no pass named 'fuse_everything'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(passes::run_passes(g, {3, {}}), Error);
}

}  // namespace
}  // namespace kiln
