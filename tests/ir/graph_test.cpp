// Graph IR: shape inference with symbolic dims, schema errors, the verifier, the dump.
#include <gtest/gtest.h>

#include "core/status.h"
#include "ir/graph.h"
#include "ir/op_registry.h"

namespace kiln::ir {
namespace {

TEST(Graph, InfersSymbolicShapes) {
  Graph g;
  ValueId x = g.add_input("x", DType::kF32, {"T", 8});
  ValueId w = g.add_weight("w", Tensor(DType::kF32, {4, 8}));
  ValueId b = g.add_weight("b", Tensor(DType::kF32, {4}));
  ValueId y = g.add("Linear", {x, w, b}, {}, "proj");
  EXPECT_EQ(g.value(y).shape.str(), "[T, 4]");
  ValueId z = g.add("Gelu", {y}, {{"approximate", std::string("tanh")}});
  g.add_output("z", z);
  EXPECT_NO_THROW(verify(g));
  std::string dump = g.dump();
  EXPECT_NE(dump.find("%proj: f32[T, 4] = Linear(%x, @w, @b)"), std::string::npos) << dump;
  EXPECT_NE(dump.find("approximate=\"tanh\""), std::string::npos) << dump;
}

TEST(Graph, RejectsMismatchedShapesWithClearMessage) {
  Graph g;
  ValueId x = g.add_input("x", DType::kF32, {"T", 8});
  ValueId w = g.add_weight("w", Tensor(DType::kF32, {4, 6}));
  try {
    g.add("Linear", {x, w}, {}, "proj");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("proj"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("inner dims"), std::string::npos) << e.what();
  }
}

TEST(Graph, UnknownOpAndMissingAttribute) {
  Graph g;
  ValueId x = g.add_input("x", DType::kF32, {"T", 8});
  EXPECT_THROW(g.add("Frobnicate", {x}), Error);
  ValueId w = g.add_weight("w", Tensor(DType::kF32, {8}));
  EXPECT_THROW(g.add("RMSNorm", {x, w}), Error);  // no eps
  EXPECT_THROW(g.add("Silu", {x, x}), Error);    // too many inputs
}

TEST(Graph, AttentionChecksHeads) {
  Graph g;
  ValueId q = g.add_input("q", DType::kF32, {"T", 64});
  ValueId kv = g.add_input("kv", DType::kF32, {"T", 32});
  std::map<std::string, Attr> attrs = {{"layer", int64_t(0)}, {"num_heads", int64_t(4)},
                                       {"num_kv_heads", int64_t(2)}, {"head_dim", int64_t(16)},
                                       {"scale", 0.25}, {"causal", int64_t(1)}};
  EXPECT_EQ(g.value(g.add("Attention", {q, kv, kv}, attrs)).shape.str(), "[T, 64]");
  attrs["num_kv_heads"] = int64_t(3);
  EXPECT_THROW(g.add("Attention", {q, kv, kv}, attrs), Error);
}

TEST(Verifier, CatchesUseBeforeDefinitionAndUndefinedOutputs) {
  Graph g;
  ValueId x = g.add_input("x", DType::kF32, {"T", 8});
  ValueId a = g.add("Silu", {x});
  ValueId b = g.add("Tanh", {a});
  g.add_output("b", b);
  std::swap(g.nodes()[0], g.nodes()[1]);  // now Tanh reads a before Silu defines it
  EXPECT_THROW(verify(g), Error);
  Graph h;
  h.add_output("nothing", 42);
  EXPECT_THROW(verify(h), Error);
}

// A backend's own copy may give a node an output its op does not declare: the value is
// the node's, named after it; verify() then rejects the graph.
TEST(Graph, AddNodeOutput) {
  Graph g;
  ValueId x = g.add_input("x", DType::kF32, {"T", 8});
  ValueId w = g.add_weight("w", Tensor(DType::kF32, {8}));
  ValueId y = g.add("RMSNorm", {x, w}, {{"eps", 1e-5}}, "norm");
  g.add_output("y", y);
  ASSERT_NO_THROW(verify(g));
  const size_t values = g.num_values();
  const ValueId c = g.add_node_output(0, DType::kBF16, g.value(y).shape, "int8");
  EXPECT_EQ(size_t(c), values);
  EXPECT_EQ(g.nodes()[0].outputs, (std::vector<ValueId>{y, c}));
  EXPECT_EQ(g.value(c).name, "norm:int8");
  EXPECT_EQ(g.value(c).producer, 0);
  EXPECT_EQ(g.value(c).kind, ValueKind::kIntermediate);
  EXPECT_EQ(g.value(c).dtype, DType::kBF16);
  EXPECT_EQ(g.value(c).shape.str(), "[T, 8]");
  EXPECT_THROW(verify(g), Error);
}

TEST(Registry, ListsOps) {
  auto ops = registered_ops();
  EXPECT_NE(std::find(ops.begin(), ops.end(), "Attention"), ops.end());
  EXPECT_EQ(find_op_schema("nope"), nullptr);
}

}  // namespace
}  // namespace kiln::ir
