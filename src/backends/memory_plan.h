// Activation memory planning shared by every backend: values whose lifetimes do not
// overlap share a buffer ("slot"), assigned greedily in node order by last use. A node's
// outputs never share a slot with its own inputs, so kernels may assume no aliasing.
// Also: which nodes a run that wants only some outputs must execute.
// Tested in tests/backends/memory_plan_test.cpp and through every backend's tests.
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"

namespace kiln {

struct MemoryPlan {
  std::vector<int> slot_of;  // per value: its slot, or -1 (inputs, weights)
  int num_slots = 0;
};

MemoryPlan plan_activation_slots(const ir::Graph& graph);

// Per node: whether a run returning the outputs named in `wanted` (all when empty) must
// execute it: the outputs' producers, transitively, and every node with a side effect
// (Attention writes the KV cache; AllReduce must run on every rank). Throws
// kInvalidArgument for a name that is not a graph output.
std::vector<bool> nodes_needed_for(const ir::Graph& graph, const std::vector<std::string>& wanted);

}  // namespace kiln
