// Small helpers the fusion passes share: matching a node by producer, concatenating
// weights for merged GEMMs, naming fused nodes, and the debug-level "did not fire"
// log. Tested through the passes' tests in tests/passes/.
#pragma once

#include <string>
#include <vector>

#include "core/log.h"
#include "ir/graph.h"
#include "ir/rewrite.h"

namespace kiln::passes {

// The node producing `v`, or null for inputs, weights and absent values.
const ir::Node* producer(const ir::Graph& g, ir::ValueId v);
// The producer of `v` if it is a node of `op` that nothing but `user` reads (so a
// fusion may swallow it); null otherwise.
const ir::Node* single_use_producer(const ir::Graph& g, const ir::Uses& uses, ir::ValueId v,
                                    const std::string& op, int32_t user);
inline int32_t node_index(const ir::Graph& g, const ir::Node* n) {
  return int32_t(n - g.nodes().data());
}

// The value of a one-element f32 weight (an exported graph's eps, 0.5, sqrt(2)...);
// false when `v` is anything else.
bool scalar_weight(const ir::Graph& g, ir::ValueId v, double* out);
// The other input of a binary node when one input is `v` (kNoValue otherwise).
ir::ValueId other_input(const ir::Node& n, ir::ValueId v);
// The only node reading `v` (which must not be a graph output), else null.
const ir::Node* sole_consumer(const ir::Graph& g, const ir::Uses& uses, ir::ValueId v);

// Rows of `parts` (all weights of one dtype, same trailing dims) stacked into one new
// weight named `name`; returns its value id. Throws kUnsupported if the parts differ.
ir::ValueId concat_weights(ir::Graph& g, const std::vector<ir::ValueId>& parts, const std::string& name);
// The attrs that describe a Linear weight kept quantized (weight_quant, weight_k; see
// core/weight_quant.h's row image), to carry onto a Linear whose weights stack the
// originals' images; empty for plain weights. Linears whose weights stack must agree
// on them (same_weight_quant).
std::map<std::string, ir::Attr> weight_quant_attrs(const ir::Node& linear);
bool same_weight_quant(const ir::Node& a, const ir::Node& b);

// "layers.3.attn" -> "layers.3." (the scope of a node's name, for fused node names).
std::string name_scope(const std::string& node_name);

// A fusion that looked at `node` and did not fire says why at debug level.
template <typename... Args>
void not_fired(const char* pass, const ir::Node& node, const Args&... why) {
  log_debug(pass, ": not fusing '", node.name, "' (", node.op, "): ", why...);
}

}  // namespace kiln::passes
