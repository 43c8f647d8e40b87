// The shared activation memory plan: dead values' slots are reused, a node's outputs
// never share a slot with its inputs, graph outputs keep their slots to the end.
#include <gtest/gtest.h>

#include "backends/memory_plan.h"

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

}  // namespace
}  // namespace kiln
