// Runs the ordered pass list of an optimization level over a graph, skipping passes
// disabled by name, and reports what each pass changed. Model::load and `kiln build`
// call this. Tested in tests/passes/pass_manager_test.cpp.
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"
#include "passes/pass.h"

namespace kiln::passes {

constexpr int kMaxOptLevel = 2;

struct PassOptions {
  int opt_level = 2;                  // 0: none, 1: cleanup, 2: cleanup + fusions
  std::vector<std::string> disabled;  // pass names to skip (see pass_names())
  // assign_precision runs (at every level, after the fusions) only when this is set.
  std::string precision;
  std::vector<PrecisionPin> pins;
};

struct PassResult {
  std::string name;
  bool changed = false;
  std::string stats;
  double ms = 0;
  size_t nodes_before = 0, nodes_after = 0;
};

// Every pass name, in the order of the highest level's list.
std::vector<std::string> pass_names();
// The names run at `level` (without disabled ones).
std::vector<std::string> pass_list(const PassOptions& options);
// Runs the level's passes in order. Throws kInvalidArgument for an unknown level or a
// disabled name that is not a pass (listing the known ones).
std::vector<PassResult> run_passes(ir::Graph& g, const PassOptions& options);
// The fusion pass whose output form `n` is ("fuse_add_norm" for AddRMSNorm, ...), or
// "" for a node any backend runs. Backends opt in per pass (Backend::supports_fusion).
std::string fusion_of(const ir::Node& n);
std::vector<std::string> fusion_pass_names();

// "fuse_add_norm: fused 24 Add+RMSNorm (0.4 ms)" lines, one per pass.
std::string format_pass_report(const std::vector<PassResult>& results);

}  // namespace kiln::passes
