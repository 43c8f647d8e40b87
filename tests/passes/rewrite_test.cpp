// Graph rewrite helpers (src/ir/rewrite.h) and the cleanup passes: topological
// re-sort after appending a node, dead-code elimination, compaction of values and
// weights, common-subexpression elimination.
#include <gtest/gtest.h>

#include "ir/rewrite.h"
#include "pass_test_util.h"
#include "passes/pass.h"

namespace kiln {
namespace {

using testing::count_ops;
using testing::random_tensor;

TEST(Rewrite, TopoSortMovesAppendedProducerBeforeItsReaders) {
  ir::Graph g;
  ir::ValueId x = g.add_input("x", DType::kF32, {"T", 4});
  ir::ValueId a = g.add("Silu", {x}, {}, "a");
  ir::ValueId b = g.add("Tanh", {a}, {}, "b");
  g.add_output("y", b);
  // Replace a with a new node appended after its reader.
  ir::ValueId a2 = g.add("Gelu", {x}, {}, "a2");
  g.replace_uses(a, a2);
  ir::finish_rewrite(g, {true, false, false});
  ASSERT_EQ(g.nodes().size(), 2u);
  EXPECT_EQ(g.nodes()[0].op, "Gelu");
  EXPECT_EQ(g.nodes()[1].op, "Tanh");
  EXPECT_NO_THROW(ir::verify(g));
}

TEST(Rewrite, DceRemovesUnusedNodesAndCompactDropsTheirWeights) {
  ir::Graph g;
  ir::ValueId x = g.add_input("x", DType::kF32, {"T", 4});
  ir::ValueId w = g.add_weight("w", random_tensor({4, 4}, 1));
  ir::ValueId unused = g.add("Linear", {x, w}, {}, "unused");
  g.add("Tanh", {unused}, {}, "unused_too");
  g.add_output("y", g.add("Silu", {x}, {}, "y"));
  auto dce = passes::make_dce_pass();
  EXPECT_TRUE(dce->run(g));
  EXPECT_EQ(g.nodes().size(), 1u);
  EXPECT_EQ(g.weight_bytes(), 0u);
  EXPECT_NE(dce->stats().find("removed 2 nodes"), std::string::npos) << dce->stats();
  EXPECT_FALSE(dce->run(g));
  EXPECT_NO_THROW(ir::verify(g));
}

TEST(Rewrite, DceKeepsAttentionBecauseItWritesTheKvCache) {
  ir::Graph g;
  ir::ValueId q = g.add_input("q", DType::kF32, {"T", 8});
  g.add("Attention", {q, q, q},
        {{"layer", int64_t(0)}, {"num_heads", int64_t(1)}, {"num_kv_heads", int64_t(1)},
         {"head_dim", int64_t(8)}, {"scale", 1.0}, {"causal", int64_t(1)}});
  g.add_output("x", q);
  EXPECT_FALSE(passes::make_dce_pass()->run(g));
  EXPECT_EQ(count_ops(g, "Attention"), 1u);
}

TEST(Rewrite, CseMergesIdenticalNodesOnly) {
  ir::Graph g;
  ir::ValueId x = g.add_input("x", DType::kF32, {"T", 4});
  ir::ValueId a = g.add("Gelu", {x}, {{"approximate", std::string("tanh")}});
  ir::ValueId b = g.add("Gelu", {x}, {{"approximate", std::string("tanh")}});
  ir::ValueId c = g.add("Gelu", {x}, {{"approximate", std::string("none")}});
  g.add_output("y", g.add("Add", {g.add("Add", {a, b}), c}));
  ir::Graph before = g;
  auto cse = passes::make_cse_pass();
  EXPECT_TRUE(cse->run(g));
  EXPECT_EQ(count_ops(g, "Gelu"), 2u);
  EXPECT_EQ(cse->stats(), "merged 1 duplicate nodes");
  testing::expect_same_outputs(testing::run_graph(before, 5), testing::run_graph(g, 5), 0);
}

}  // namespace
}  // namespace kiln
