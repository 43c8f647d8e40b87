// The graph IR: values (dtype + possibly symbolic shape), nodes (op + attributes) and
// the graph's inputs, outputs and weights. Frontends and model builders emit it; passes
// rewrite it; backends execute it. Tested in tests/ir/graph_test.cpp.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "core/dtype.h"
#include "core/shape.h"
#include "core/tensor.h"

namespace kiln::ir {

using ValueId = int32_t;
constexpr ValueId kNoValue = -1;

enum class ValueKind { kInput, kWeight, kIntermediate };

struct Value {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  ValueKind kind = ValueKind::kIntermediate;
  int32_t producer = -1;  // node index for intermediates
};

using Attr = std::variant<int64_t, double, std::string, std::vector<int64_t>, std::vector<double>>;

struct Node {
  std::string op;
  std::string name;
  std::vector<ValueId> inputs;  // kNoValue marks an absent optional input
  std::vector<ValueId> outputs;
  std::map<std::string, Attr> attrs;

  bool has_attr(const std::string& k) const { return attrs.count(k) != 0; }
  int64_t attr_int(const std::string& k) const;
  int64_t attr_int(const std::string& k, int64_t fallback) const;
  double attr_float(const std::string& k) const;
  double attr_float(const std::string& k, double fallback) const;
  const std::string& attr_str(const std::string& k) const;
  std::string attr_str(const std::string& k, const std::string& fallback) const;
  ValueId input(size_t i) const { return i < inputs.size() ? inputs[i] : kNoValue; }
};

class Graph {
 public:
  ValueId add_input(const std::string& name, DType dtype, Shape shape);
  // Adds a weight; the tensor's dtype and shape define the value.
  ValueId add_weight(const std::string& name, Tensor tensor);
  // Adds a node; output types come from the op's shape inference (ir/op_registry.h).
  // Returns the node's outputs.
  std::vector<ValueId> add_node(const std::string& op, std::vector<ValueId> inputs,
                                std::map<std::string, Attr> attrs = {},
                                const std::string& name = "");
  // Single-output convenience.
  ValueId add(const std::string& op, std::vector<ValueId> inputs,
              std::map<std::string, Attr> attrs = {}, const std::string& name = "") {
    return add_node(op, std::move(inputs), std::move(attrs), name).at(0);
  }
  void add_output(const std::string& name, ValueId v);
  // Gives node `node` one more output, named "<node name>:<suffix>". For a backend's own
  // copy of a graph only (the CUDA backend's norms that also write int8 codes,
  // backends/cuda/cuda_int8_fuse.h): the op's shape inference does not know the output,
  // so verify() rejects the result.
  ValueId add_node_output(size_t node, DType dtype, Shape shape, const std::string& suffix);
  // Points every node input and graph output that reads `from` at `to` (rewrites).
  void replace_uses(ValueId from, ValueId to);
  // Drops values nothing references (no node reads or writes them, not a graph input
  // or output) with their weights, and renumbers the rest densely in their old order.
  // Node indices are unchanged; producers are recomputed. Used after rewrites.
  void compact();

  const Value& value(ValueId id) const { return values_.at(size_t(id)); }
  Value& value(ValueId id) { return values_.at(size_t(id)); }
  size_t num_values() const { return values_.size(); }
  const std::vector<Node>& nodes() const { return nodes_; }
  std::vector<Node>& nodes() { return nodes_; }
  const std::vector<ValueId>& inputs() const { return inputs_; }
  const std::vector<std::pair<std::string, ValueId>>& outputs() const { return outputs_; }
  // Looks up a graph input by name; kNoValue when absent.
  ValueId find_input(const std::string& name) const;
  ValueId find_output(const std::string& name) const;

  const Tensor& weight(ValueId id) const;
  Tensor& weight(ValueId id);
  bool is_weight(ValueId id) const { return value(id).kind == ValueKind::kWeight; }
  size_t weight_bytes() const;

  // Free-form model metadata (family, layer count, KV heads, ...), for the runtime
  // and `kiln inspect`.
  std::map<std::string, Attr> meta;
  int64_t meta_int(const std::string& k, int64_t fallback = -1) const;

  // Readable text dump: one line per input, weight summary, one line per node.
  std::string dump() const;

 private:
  std::vector<Value> values_;
  std::vector<Node> nodes_;
  std::vector<ValueId> inputs_;
  std::vector<std::pair<std::string, ValueId>> outputs_;
  std::unordered_map<ValueId, Tensor> weights_;
  int next_auto_name_ = 0;
};

// Checks structural invariants: ids in range, every value produced once before use
// (topological order), output dtypes/shapes consistent with shape inference, graph
// outputs defined. Throws kiln::Error(kInvalidArgument) naming the node on failure.
void verify(const Graph& g);

}  // namespace kiln::ir
