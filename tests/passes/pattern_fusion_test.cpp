// fuse_layer_norm_pattern and fuse_gelu_pattern: the op-by-op forms exporters emit
// collapse into LayerNorm / Gelu nodes with the same outputs; a near miss stays.
#include <gtest/gtest.h>

#include "pass_test_util.h"
#include "passes/pass.h"

namespace kiln {
namespace {

using testing::count_ops;

Tensor scalar(float v) {
  Tensor t(DType::kF32, {});
  t.data_as<float>()[0] = v;
  return t;
}

// gelu(layer_norm(x)) spelled out as ONNX opset 14 exports of BERT have it.
ir::Graph op_by_op_graph(float pow_exponent = 2.0f) {
  ir::Graph g;
  ir::ValueId x = g.add_input("x", DType::kF32, Shape{"B", "S", 16});
  auto last = std::map<std::string, ir::Attr>{{"axes", std::vector<int64_t>{-1}}};
  ir::ValueId mean = g.add("ReduceMean", {x}, last);
  ir::ValueId d = g.add("Sub", {x, mean});
  ir::ValueId var = g.add("ReduceMean", {g.add("Pow", {d, g.add_weight("two", scalar(pow_exponent))})}, last);
  ir::ValueId sd = g.add("Sqrt", {g.add("Add", {var, g.add_weight("eps", scalar(1e-12f))})});
  ir::ValueId n = g.add("Div", {d, sd});
  ir::ValueId ln = g.add("Add", {g.add("Mul", {n, g.add_weight("w", testing::random_tensor({16}, 1, 0.1f, 1.0f))}),
                                 g.add_weight("b", testing::random_tensor({16}, 2))});
  ir::ValueId e = g.add("Erf", {g.add("Div", {ln, g.add_weight("sqrt2", scalar(1.4142135f))})});
  ir::ValueId p = g.add("Mul", {ln, g.add("Add", {e, g.add_weight("one", scalar(1.0f))})});
  g.add_output("y", g.add("Mul", {p, g.add_weight("half", scalar(0.5f))}));
  return g;
}

TEST(PatternFusion, LayerNormAndGeluCollapse) {
  ir::Graph g = op_by_op_graph();
  auto before = testing::run_graph(g, 6);
  auto ln = passes::make_fuse_layer_norm_pattern_pass();
  auto gelu = passes::make_fuse_gelu_pattern_pass();
  EXPECT_TRUE(ln->run(g));
  EXPECT_TRUE(gelu->run(g));
  std::printf("  %s; %s\n", ln->stats().c_str(), gelu->stats().c_str());
  EXPECT_EQ(g.nodes().size(), 2u);
  EXPECT_EQ(count_ops(g, "LayerNorm"), 1u);
  EXPECT_EQ(count_ops(g, "Gelu"), 1u);
  testing::expect_same_outputs(before, testing::run_graph(g, 6), 1e-5);
}

TEST(PatternFusion, NearMissStays) {
  ir::Graph g = op_by_op_graph(3.0f);  // not a variance
  size_t nodes = g.nodes().size();
  EXPECT_FALSE(passes::make_fuse_layer_norm_pattern_pass()->run(g));
  EXPECT_EQ(g.nodes().size(), nodes);
}

}  // namespace
}  // namespace kiln
