// The shared activation memory plan: dead values' slots are reused, a node's outputs
// never share a slot with its inputs, graph outputs keep their slots to the end; a run
// wanting some outputs executes their producers and every node with a side effect.
#include <gtest/gtest.h>

#include "backends/memory_plan.h"
#include "core/status.h"

namespace kiln {
namespace {

TEST(MemoryPlan, ReusesDeadSlotsButNeverAliasesInputsOrOutputs) {
  ir::Graph g;
  ir::ValueId x = g.add_input("x", DType::kF32, {"T", 8});
  ir::ValueId a = g.add("Silu", {x});
  ir::ValueId b = g.add("Tanh", {a});   // a dies here
  ir::ValueId c = g.add("Silu", {b});   // may reuse a's slot, not b's
  ir::ValueId d = g.add("Add", {c, b}); // b and c die here
  g.add_output("d", d);
  g.add_output("a_again", g.add("Tanh", {d}));
  MemoryPlan p = plan_activation_slots(g);
  EXPECT_EQ(p.slot_of[size_t(x)], -1);
  EXPECT_NE(p.slot_of[size_t(a)], p.slot_of[size_t(b)]);
  EXPECT_NE(p.slot_of[size_t(c)], p.slot_of[size_t(b)]);
  EXPECT_EQ(p.slot_of[size_t(c)], p.slot_of[size_t(a)]) << "a is dead when c is made";
  EXPECT_NE(p.slot_of[size_t(d)], p.slot_of[size_t(b)]);
  EXPECT_NE(p.slot_of[size_t(d)], p.slot_of[size_t(c)]);
  EXPECT_LE(p.num_slots, 3);
}

TEST(NodesNeeded, OnlyTheWantedOutputsProducersAndSideEffects) {
  ir::Graph g;
  ir::ValueId x = g.add_input("x", DType::kF32, {"T", 8});
  ir::ValueId a = g.add("Silu", {x});                              // node 0
  ir::ValueId r = g.add("AllReduce", {a});                         // node 1: always runs
  ir::ValueId logits = g.add("Tanh", {r});                         // node 2
  auto top = g.add_node("TopKLogits", {logits}, {{"k", int64_t(4)}});  // node 3
  ir::ValueId hidden = g.add("Silu", {x});                         // node 4
  g.add_output("hidden", hidden);
  g.add_output("logits", logits);
  g.add_output("top_ids", top[1]);
  EXPECT_EQ(nodes_needed_for(g, {}), (std::vector<bool>{true, true, true, true, true}));
  EXPECT_EQ(nodes_needed_for(g, {"logits"}), (std::vector<bool>{true, true, true, false, false}));
  EXPECT_EQ(nodes_needed_for(g, {"top_ids"}), (std::vector<bool>{true, true, true, true, false}));
  EXPECT_EQ(nodes_needed_for(g, {"hidden"}), (std::vector<bool>{true, true, false, false, true}));
  try {
    nodes_needed_for(g, {"logits", "lm_head"});
    FAIL() << "expected kiln::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("'lm_head'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("top_ids"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kiln
