// Activation memory planning shared by every backend: values whose lifetimes do not
// overlap share a buffer ("slot"), assigned greedily in node order by last use. A node's
// outputs never share a slot with its own inputs, so kernels may assume no aliasing.
// Tested in tests/backends/memory_plan_test.cpp and through every backend's tests.
#pragma once

#include <vector>

#include "ir/graph.h"

namespace kiln {

struct MemoryPlan {
  std::vector<int> slot_of;  // per value: its slot, or -1 (inputs, weights)
  int num_slots = 0;
};

MemoryPlan plan_activation_slots(const ir::Graph& graph);

}  // namespace kiln
