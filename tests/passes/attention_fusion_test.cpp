// fuse_attention_pattern: op-by-op attention over 4-D tensors (as ONNX exports of BERT
// and GPT-2 spell it) becomes one ScaledDotProductAttention node whose outputs match
// the unfused graph on the CPU backend; near misses stay and say why at debug level.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/log.h"
#include "pass_test_util.h"
#include "passes/pass.h"
#include "passes/pass_manager.h"

namespace kiln {
namespace {

using testing::count_ops;

constexpr int64_t kHeads = 3, kHeadDim = 8;

Tensor scalar(float v) {
  Tensor t(DType::kF32, {});
  t.data_as<float>()[0] = v;
  return t;
}

struct Variant {
  bool div = true;          // Div by sqrt(D), else Mul by 1/sqrt(D)
  bool scale_first = false;  // Mul(c, scores) instead of Mul(scores, c)
  bool mask = true;          // additive [B, 1, 1, S] mask
  bool mask_first = false;   // Add(mask, scores)
  int64_t softmax_axis = -1;
};

// x [2, S, H*D] -> Q/K/V by MatMul with [H*D, H*D] weights, split into heads by
// Reshape + Transpose (K straight to [B, H, D, S] as BERT's export does), attention,
// and heads merged back.
ir::Graph attention_graph(const Variant& o) {
  ir::Graph g;
  const int64_t hd = kHeads * kHeadDim;
  // Inputs first: run_graph seeds each input's data by its value id, which the pass's
  // compaction keeps only for values declared before everything it may drop.
  ir::ValueId x = g.add_input("x", DType::kF32, Shape{2, "S", hd});
  ir::ValueId m = o.mask ? g.add_input("m", DType::kF32, Shape{2, 1, 1, "S"}) : ir::kNoValue;
  auto proj = [&](const char* name, uint32_t seed) {
    ir::ValueId p = g.add("MatMul", {x, g.add_weight(name, testing::random_tensor({hd, hd}, seed, 0.4f))});
    return g.add("Reshape", {p}, {{"shape", std::vector<int64_t>{0, 0, kHeads, kHeadDim}}});
  };
  ir::ValueId q = g.add("Transpose", {proj("wq", 1)}, {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
  ir::ValueId kt = g.add("Transpose", {proj("wk", 2)}, {{"perm", std::vector<int64_t>{0, 2, 3, 1}}});
  ir::ValueId v = g.add("Transpose", {proj("wv", 3)}, {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
  ir::ValueId s = g.add("MatMul", {q, kt}, {}, "layer.0.attn.qk");
  const float d = float(std::sqrt(double(kHeadDim)));
  if (o.div) s = g.add("Div", {s, g.add_weight("sqrt_d", scalar(d))});
  else if (o.scale_first) s = g.add("Mul", {g.add_weight("inv_sqrt_d", scalar(1 / d)), s});
  else s = g.add("Mul", {s, g.add_weight("inv_sqrt_d", scalar(1 / d))});
  if (o.mask) {
    // BERT's extended mask: (1 - m) * -10000 over [B, 1, 1, S].
    ir::ValueId ext = g.add("Mul", {g.add("Sub", {g.add_weight("one", scalar(1)), m}), g.add_weight("big", scalar(-1e4f))});
    s = o.mask_first ? g.add("Add", {ext, s}) : g.add("Add", {s, ext});
  }
  ir::ValueId p = g.add("Softmax", {s}, {{"axis", o.softmax_axis}}, "layer.0.attn.softmax");
  ir::ValueId ctx = g.add("Transpose", {g.add("MatMul", {p, v})}, {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
  g.add_output("y", g.add("Reshape", {ctx}, {{"shape", std::vector<int64_t>{0, 0, hd}}}));
  return g;
}

// run_graph feeds m ~ N(0, 0.5), so the additive mask has arbitrary large values of
// either sign, not just 0 / -1e4: the fused op must add whatever it is given.
void expect_fuses(const Variant& o, const char* what) {
  SCOPED_TRACE(what);
  ir::Graph g = attention_graph(o);
  const size_t before_nodes = g.nodes().size();
  TensorMap before = testing::run_graph(g, 5);
  auto pass = passes::make_fuse_attention_pattern_pass();
  ASSERT_TRUE(pass->run(g));
  std::printf("  %s: %s (%zu -> %zu nodes)\n", what, pass->stats().c_str(), before_nodes, g.nodes().size());
  EXPECT_EQ(count_ops(g, "ScaledDotProductAttention"), 1u);
  EXPECT_EQ(count_ops(g, "Softmax"), 0u);
  EXPECT_EQ(count_ops(g, "MatMul"), 3u);  // the projections
  // MatMul, scale, (Add), Softmax, MatMul become one node; K's Transpose is rewritten
  // as the [B, H, S, D] one, not added.
  EXPECT_EQ(g.nodes().size(), before_nodes - (o.mask ? 4 : 3));
  const ir::Node* k_t = nullptr;
  for (auto& n : g.nodes())
    if (n.op == "ScaledDotProductAttention") {
      EXPECT_EQ(n.inputs.size(), o.mask ? 4u : 3u);
      EXPECT_NEAR(n.attr_float("scale"), 1 / std::sqrt(double(kHeadDim)), 1e-6);
      k_t = &g.nodes()[size_t(g.value(n.inputs[1]).producer)];
    }
  ASSERT_NE(k_t, nullptr);
  EXPECT_EQ(k_t->op, "Transpose");
  EXPECT_EQ(std::get<std::vector<int64_t>>(k_t->attrs.at("perm")), (std::vector<int64_t>{0, 2, 1, 3}));
  testing::expect_same_outputs(before, testing::run_graph(g, 5), 1e-5);
}

TEST(FuseAttentionPattern, DivScaleWithMask) { expect_fuses({}, "div, mask"); }
TEST(FuseAttentionPattern, MulScaleWithoutMask) { expect_fuses({.div = false, .mask = false}, "mul, no mask"); }
TEST(FuseAttentionPattern, OperandsInEitherOrder) {
  expect_fuses({.div = false, .scale_first = true, .mask = true, .mask_first = true}, "mul(c, s), add(mask, s)");
}
TEST(FuseAttentionPattern, PositiveLastAxis) { expect_fuses({.softmax_axis = 3}, "softmax axis 3"); }

TEST(FuseAttentionPattern, BroadcastsLikeTheUnfusedOps) {
  // One query row stretched to 3 by the mask, one K head shared by both Q heads (MatMul
  // batch broadcasting), K given as [B, H, S, D] and transposed by [0, 1, 3, 2].
  ir::Graph g;
  ir::ValueId q = g.add_input("q", DType::kF32, Shape{2, 2, 1, 4});
  ir::ValueId k = g.add_input("k", DType::kF32, Shape{2, 1, 3, 4});
  ir::ValueId v = g.add_input("v", DType::kF32, Shape{2, 2, 3, 5});
  ir::ValueId m = g.add_input("m", DType::kF32, Shape{2, 1, 3, 3});
  ir::ValueId s = g.add("MatMul", {q, g.add("Transpose", {k}, {{"perm", std::vector<int64_t>{0, 1, 3, 2}}})});
  s = g.add("Add", {g.add("Mul", {s, g.add_weight("c", scalar(0.7f))}), m});
  g.add_output("y", g.add("MatMul", {g.add("Softmax", {s}), v}));
  TensorMap before = testing::run_graph(g, 1);
  ASSERT_TRUE(passes::make_fuse_attention_pattern_pass()->run(g));
  EXPECT_EQ(g.nodes().size(), 1u);  // k's two transposes cancel
  EXPECT_EQ(count_ops(g, "ScaledDotProductAttention"), 1u);
  EXPECT_EQ(g.value(g.outputs()[0].second).shape, (Shape{2, 2, 3, 5}));
  testing::expect_same_outputs(before, testing::run_graph(g, 1), 1e-5);
}

TEST(FuseAttentionPattern, OpSaysWhatDoesNotFit) {
  ir::Graph g;
  ir::ValueId q = g.add_input("q", DType::kF32, Shape{1, 2, 4, 8});
  ir::ValueId k = g.add_input("k", DType::kF32, Shape{1, 2, 6, 8});
  ir::ValueId v = g.add_input("v", DType::kF32, Shape{1, 2, 5, 8});
  try {
    g.add("ScaledDotProductAttention", {q, k, v}, {{"scale", 1.0}}, "sdpa");
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'sdpa' (ScaledDotProductAttention): key lengths of the scores and v differ"),
              std::string::npos) << e.what();
  }
}

TEST(FuseAttentionPattern, SoftmaxOverAnotherAxisStays) {
  ir::Graph g = attention_graph({.softmax_axis = 2});
  const size_t nodes = g.nodes().size();
  auto pass = passes::make_fuse_attention_pattern_pass();
  EXPECT_FALSE(pass->run(g));
  EXPECT_EQ(g.nodes().size(), nodes);
  EXPECT_EQ(count_ops(g, "ScaledDotProductAttention"), 0u);
}

TEST(FuseAttentionPattern, SharedScoresStay) {
  // The scaled scores are also a graph output: fusing would drop a value someone reads.
  ir::Graph g = attention_graph({});
  for (auto& n : g.nodes())
    if (n.op == "Div") g.add_output("scores", n.outputs[0]);
  EXPECT_FALSE(passes::make_fuse_attention_pattern_pass()->run(g));
}

TEST(FuseAttentionPattern, RunsInTheO2ListAndCanBeDisabled) {
  auto names = passes::pass_list({2, {}});
  EXPECT_NE(std::find(names.begin(), names.end(), "fuse_attention_pattern"), names.end());
  ir::Graph g = attention_graph({});
  passes::run_passes(g, {2, {"fuse_attention_pattern"}});
  EXPECT_EQ(count_ops(g, "ScaledDotProductAttention"), 0u);
  passes::run_passes(g, {2, {}});
  EXPECT_EQ(count_ops(g, "ScaledDotProductAttention"), 1u);
}

TEST(FuseAttentionPattern, SaysWhyAtDebugLevel) {
  if (log_level() != LogLevel::kDebug) GTEST_SKIP() << "needs KILN_LOG=debug";
  ir::Graph g = attention_graph({.softmax_axis = 2});
  ::testing::internal::CaptureStderr();
  passes::make_fuse_attention_pattern_pass()->run(g);
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("fuse_attention_pattern: not fusing 'layer.0.attn.softmax' (Softmax): the softmax is over "
                     "axis 2, not the last (key) axis"),
            std::string::npos)
      << err;
}

}  // namespace
}  // namespace kiln
