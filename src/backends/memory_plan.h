// Activation memory planning shared by every backend: values whose lifetimes do not
// overlap share a buffer ("slot"), assigned greedily in node order by last use. A node's
// outputs never share a slot with its own inputs, so kernels may assume no aliasing.
// Also: which nodes a run that wants only some outputs must execute.
// Tested in tests/backends/memory_plan_test.cpp and through every backend's tests.
#pragma once

#include <cstddef>
#include <map>
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
// The plan's bytes when the symbolic dims take the values in `dims`: each slot holds
// the largest value assigned to it, the arena is their sum (what a backend that grows
// each slot to its largest value, as the CPU backend does, ends up holding). A dim not
// in `dims` takes the largest value given: B (sequences) and R (rows wanted) never
// outnumber T (the tokens of a step), each sequence or row being at least one token.
struct MemoryPlanSize {
  std::vector<size_t> slot_bytes;
  size_t peak_bytes = 0;
};
MemoryPlanSize memory_plan_size(const ir::Graph& graph, const MemoryPlan& plan,
                                const std::map<std::string, int64_t>& dims);

}  // namespace kiln
