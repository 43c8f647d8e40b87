// constant_folding: the Shape -> Gather -> Unsqueeze -> Concat -> Reshape chain ONNX
// exporters emit becomes a Reshape with a constant target (0 = keep the symbolic dim),
// constant-only nodes become weights, and the outputs do not change.
#include <gtest/gtest.h>

#include <cstring>

#include "ir/op_registry.h"
#include "pass_test_util.h"
#include "passes/pass.h"

namespace kiln {
namespace {

using testing::count_ops;

Tensor i64s(std::vector<int64_t> v, bool scalar = false) {
  Tensor t(DType::kI64, scalar ? std::vector<int64_t>{} : std::vector<int64_t>{int64_t(v.size())});
  std::memcpy(t.data(), v.data(), v.size() * 8);
  return t;
}

ir::Graph shape_chain_graph() {
  ir::Graph g;
  ir::ValueId x = g.add_input("x", DType::kF32, Shape{"B", "S", 32});
  ir::ValueId s = g.add("Shape", {x});
  ir::ValueId b = g.add("Gather", {s, g.add_weight("i0", i64s({0}, true))}, {{"axis", int64_t(0)}});
  ir::ValueId t = g.add("Gather", {s, g.add_weight("i1", i64s({1}, true))}, {{"axis", int64_t(0)}});
  ir::ValueId ub = g.add("Unsqueeze", {b}, {{"axes", std::vector<int64_t>{0}}});
  ir::ValueId ut = g.add("Unsqueeze", {t}, {{"axes", std::vector<int64_t>{0}}});
  ir::ValueId target = g.add("Concat", {ub, ut, g.add_weight("h", i64s({4})), g.add_weight("d", i64s({8}))},
                             {{"axis", int64_t(0)}});
  ir::ValueId r = g.add("Reshape", {x, target});
  ir::ValueId y = g.add("Transpose", {r}, {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
  g.add_output("y", y);
  // A constant-only subexpression.
  ir::ValueId c = g.add("Add", {g.add_weight("w1", testing::random_tensor({32}, 1)),
                                g.add_weight("w2", testing::random_tensor({32}, 2))});
  g.add_output("z", g.add("Mul", {x, c}));
  return g;
}

TEST(ConstantFolding, ShapeChainBecomesAStaticReshape) {
  ir::Graph g = shape_chain_graph();
  EXPECT_EQ(g.value(g.find_output("y")).shape.str(), "[?, ?, ?, ?]");  // target computed at run time
  auto before = testing::run_graph(g, 5);
  auto pass = passes::make_constant_folding_pass();
  EXPECT_TRUE(pass->run(g));
  std::printf("  %s\n", pass->stats().c_str());
  EXPECT_EQ(count_ops(g, "Shape"), 0u);
  EXPECT_EQ(count_ops(g, "Concat"), 0u);
  EXPECT_EQ(count_ops(g, "Add"), 0u);
  ASSERT_EQ(count_ops(g, "Reshape"), 1u);
  for (auto& n : g.nodes())
    if (n.op == "Reshape") {
      EXPECT_EQ(n.inputs.size(), 1u);
      EXPECT_EQ(std::get<std::vector<int64_t>>(n.attrs.at("shape")), (std::vector<int64_t>{0, 0, 4, 8}));
    }
  // Exact symbolic shapes downstream.
  EXPECT_EQ(g.value(g.find_output("y")).shape.str(), "[B, 4, S, 8]");
  testing::expect_same_outputs(before, testing::run_graph(g, 5), 0.0);
  EXPECT_FALSE(passes::make_constant_folding_pass()->run(g));  // a fixed point
}

TEST(ConstantFolding, LeavesBuiltModelsAlone) {
  ir::Graph g;
  ir::ValueId x = g.add_input("x", DType::kF32, Shape{"T", 8});
  g.add_output("y", g.add("Linear", {x, g.add_weight("w", testing::random_tensor({8, 8}, 3))}));
  EXPECT_FALSE(passes::make_constant_folding_pass()->run(g));
}

}  // namespace
}  // namespace kiln
