// Graph rewrite helpers shared by the passes: who uses a value, removing nodes,
// restoring topological order, dead-code elimination. A pass appends its new nodes
// (Graph::add_node), redirects uses (Graph::replace_uses), marks what it replaced,
// then calls finish_rewrite. Tested in tests/passes/rewrite_test.cpp.
#pragma once

#include <cstdint>
#include <vector>

#include "ir/graph.h"

namespace kiln::ir {

// Consumers of every value (node indices, one entry per use) and which values are
// graph outputs. Invalidated by any change to the node list.
struct Uses {
  std::vector<std::vector<int32_t>> consumers;
  std::vector<bool> is_output;
  size_t count(ValueId v) const { return consumers[size_t(v)].size() + (is_output[size_t(v)] ? 1 : 0); }
  // True when `v` is read exactly once, by node `node`, and is not a graph output.
  bool only_used_by(ValueId v, int32_t node) const {
    return count(v) == 1 && !consumers[size_t(v)].empty() && consumers[size_t(v)][0] == node;
  }
};
Uses compute_uses(const Graph& g);

// Nodes that must stay even when nothing reads their outputs (Attention writes the
// KV cache).
bool has_side_effects(const Node& n);

// Removes the nodes whose index is flagged in `dead` (size = node count).
void remove_nodes(Graph& g, const std::vector<bool>& dead);

// Stable topological re-sort: nodes keep their relative order unless a node reads a
// value produced later (a fused node appended at the end). Throws kInvalidArgument
// naming a node on a cycle.
void topo_sort(Graph& g);

// Removes nodes whose outputs nobody reads (repeatedly); returns how many.
size_t dead_code_elim(Graph& g);

// The end of every rewriting pass: remove `dead` nodes, then unused ones, restore
// topological order, drop unreferenced values and weights, verify.
void finish_rewrite(Graph& g, const std::vector<bool>& dead);

}  // namespace kiln::ir
