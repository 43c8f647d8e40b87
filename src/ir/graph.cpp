// Graph construction, lookup, verification and text dump (see graph.h).
#include "ir/graph.h"

#include <sstream>

#include "core/status.h"
#include "ir/op_registry.h"

namespace kiln::ir {

namespace {
const Attr& find_attr(const Node& n, const std::string& k) {
  auto it = n.attrs.find(k);
  if (it == n.attrs.end())
    throw_error(ErrorCode::kInvalidArgument, "node '", n.name, "' (", n.op,
                ") has no attribute '", k, "'");
  return it->second;
}
}  // namespace

int64_t Node::attr_int(const std::string& k) const {
  const Attr& a = find_attr(*this, k);
  if (auto p = std::get_if<int64_t>(&a)) return *p;
  throw_error(ErrorCode::kInvalidArgument, "node '", name, "' attribute '", k, "' is not an int");
}
int64_t Node::attr_int(const std::string& k, int64_t fallback) const {
  return has_attr(k) ? attr_int(k) : fallback;
}
double Node::attr_float(const std::string& k) const {
  const Attr& a = find_attr(*this, k);
  if (auto p = std::get_if<double>(&a)) return *p;
  if (auto p = std::get_if<int64_t>(&a)) return double(*p);
  throw_error(ErrorCode::kInvalidArgument, "node '", name, "' attribute '", k, "' is not a float");
}
double Node::attr_float(const std::string& k, double fallback) const {
  return has_attr(k) ? attr_float(k) : fallback;
}
const std::string& Node::attr_str(const std::string& k) const {
  const Attr& a = find_attr(*this, k);
  if (auto p = std::get_if<std::string>(&a)) return *p;
  throw_error(ErrorCode::kInvalidArgument, "node '", name, "' attribute '", k, "' is not a string");
}
std::string Node::attr_str(const std::string& k, const std::string& fallback) const {
  return has_attr(k) ? attr_str(k) : fallback;
}

ValueId Graph::add_input(const std::string& name, DType dtype, Shape shape) {
  ValueId id = ValueId(values_.size());
  values_.push_back({name, dtype, std::move(shape), ValueKind::kInput, -1});
  inputs_.push_back(id);
  return id;
}

ValueId Graph::add_weight(const std::string& name, Tensor tensor) {
  ValueId id = ValueId(values_.size());
  values_.push_back({name, tensor.dtype(), Shape::concrete(tensor.shape()), ValueKind::kWeight, -1});
  weights_.emplace(id, std::move(tensor));
  return id;
}

std::vector<ValueId> Graph::add_node(const std::string& op, std::vector<ValueId> inputs,
                                     std::map<std::string, Attr> attrs, const std::string& name) {
  const OpSchema& schema = get_op_schema(op);
  Node n;
  n.op = op;
  n.name = name.empty() ? op + "_" + std::to_string(next_auto_name_++) : name;
  n.inputs = std::move(inputs);
  n.attrs = std::move(attrs);
  if (int(n.inputs.size()) < schema.min_inputs || int(n.inputs.size()) > schema.max_inputs)
    throw_error(ErrorCode::kInvalidArgument, "node '", n.name, "' (", op, ") takes ",
                schema.min_inputs, "..", schema.max_inputs, " inputs, got ", n.inputs.size());
  std::vector<const Value*> in;
  for (ValueId v : n.inputs) {
    KILN_CHECK(v == kNoValue || (v >= 0 && size_t(v) < values_.size()), "bad value id ", v);
    in.push_back(v == kNoValue ? nullptr : &values_[size_t(v)]);
  }
  for (auto& a : schema.required_attrs)
    if (!n.has_attr(a))
      throw_error(ErrorCode::kInvalidArgument, "node '", n.name, "' (", op,
                  ") is missing attribute '", a, "'");
  std::vector<ValueType> out = schema.infer(n, in);
  int32_t node_index = int32_t(nodes_.size());
  for (size_t i = 0; i < out.size(); ++i) {
    ValueId id = ValueId(values_.size());
    std::string vname = out.size() == 1 ? n.name : n.name + ":" + std::to_string(i);
    values_.push_back({vname, out[i].dtype, out[i].shape, ValueKind::kIntermediate, node_index});
    n.outputs.push_back(id);
  }
  nodes_.push_back(std::move(n));
  return nodes_.back().outputs;
}

void Graph::add_output(const std::string& name, ValueId v) { outputs_.emplace_back(name, v); }

ValueId Graph::add_node_output(size_t node, DType dtype, Shape shape, const std::string& suffix) {
  KILN_CHECK(node < nodes_.size(), "add_node_output: node ", node, " of ", nodes_.size());
  const ValueId id = ValueId(values_.size());
  values_.push_back({nodes_[node].name + ":" + suffix, dtype, std::move(shape), ValueKind::kIntermediate,
                     int32_t(node)});
  nodes_[node].outputs.push_back(id);
  return id;
}

void Graph::replace_uses(ValueId from, ValueId to) {
  for (Node& n : nodes_)
    for (ValueId& v : n.inputs)
      if (v == from) v = to;
  for (auto& [name, v] : outputs_)
    if (v == from) v = to;
}

void Graph::compact() {
  std::vector<bool> live(values_.size(), false);
  for (ValueId v : inputs_) live[size_t(v)] = true;
  for (auto& [name, v] : outputs_) live[size_t(v)] = true;
  for (const Node& n : nodes_) {
    for (ValueId v : n.inputs)
      if (v != kNoValue) live[size_t(v)] = true;
    for (ValueId v : n.outputs) live[size_t(v)] = true;
  }
  std::vector<ValueId> remap(values_.size(), kNoValue);
  std::vector<Value> values;
  std::unordered_map<ValueId, Tensor> weights;
  for (size_t v = 0; v < values_.size(); ++v) {
    if (!live[v]) continue;
    remap[v] = ValueId(values.size());
    if (values_[v].kind == ValueKind::kWeight) weights.emplace(remap[v], std::move(weights_.at(ValueId(v))));
    values.push_back(std::move(values_[v]));
  }
  auto fix = [&](ValueId& v) {
    if (v != kNoValue) v = remap[size_t(v)];
  };
  for (ValueId& v : inputs_) fix(v);
  for (auto& [name, v] : outputs_) fix(v);
  for (size_t i = 0; i < nodes_.size(); ++i) {
    for (ValueId& v : nodes_[i].inputs) fix(v);
    for (ValueId& v : nodes_[i].outputs) {
      fix(v);
      values[size_t(v)].producer = int32_t(i);
    }
  }
  values_ = std::move(values);
  weights_ = std::move(weights);
}

ValueId Graph::find_input(const std::string& name) const {
  for (ValueId v : inputs_)
    if (values_[size_t(v)].name == name) return v;
  return kNoValue;
}

ValueId Graph::find_output(const std::string& name) const {
  for (auto& [n, v] : outputs_)
    if (n == name) return v;
  return kNoValue;
}

const Tensor& Graph::weight(ValueId id) const {
  auto it = weights_.find(id);
  KILN_CHECK(it != weights_.end(), "value ", id, " is not a weight");
  return it->second;
}
Tensor& Graph::weight(ValueId id) {
  auto it = weights_.find(id);
  KILN_CHECK(it != weights_.end(), "value ", id, " is not a weight");
  return it->second;
}

size_t Graph::weight_bytes() const {
  size_t b = 0;
  for (auto& [id, t] : weights_) b += t.nbytes();
  return b;
}

int64_t Graph::meta_int(const std::string& k, int64_t fallback) const {
  auto it = meta.find(k);
  if (it == meta.end()) return fallback;
  if (auto p = std::get_if<int64_t>(&it->second)) return *p;
  return fallback;
}

namespace {
std::string attr_to_string(const Attr& a) {
  std::ostringstream os;
  std::visit([&](const auto& v) {
    using T = std::decay_t<decltype(v)>;
    if constexpr (std::is_same_v<T, std::string>) os << '"' << v << '"';
    else if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, double>) os << v;
    else {
      os << '[';
      for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
      os << ']';
    }
  }, a);
  return os.str();
}
}  // namespace

std::string Graph::dump() const {
  std::ostringstream os;
  os << "graph: " << inputs_.size() << " inputs, " << weights_.size() << " weights ("
     << weight_bytes() / (1024.0 * 1024.0) << " MiB), " << nodes_.size() << " nodes\n";
  for (auto& [k, a] : meta) os << "  meta " << k << " = " << attr_to_string(a) << "\n";
  for (ValueId v : inputs_) {
    auto& val = values_[size_t(v)];
    os << "  input %" << val.name << ": " << dtype_name(val.dtype) << val.shape.str() << "\n";
  }
  auto ref = [&](ValueId v) -> std::string {
    if (v == kNoValue) return "_";
    auto& val = values_[size_t(v)];
    return (val.kind == ValueKind::kWeight ? "@" : "%") + val.name;
  };
  for (auto& n : nodes_) {
    os << "  ";
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      auto& val = values_[size_t(n.outputs[i])];
      os << (i ? ", " : "") << "%" << val.name << ": " << dtype_name(val.dtype) << val.shape.str();
    }
    os << " = " << n.op << "(";
    for (size_t i = 0; i < n.inputs.size(); ++i) os << (i ? ", " : "") << ref(n.inputs[i]);
    os << ")";
    if (!n.attrs.empty()) {
      os << " {";
      bool first = true;
      for (auto& [k, a] : n.attrs) {
        os << (first ? "" : ", ") << k << "=" << attr_to_string(a);
        first = false;
      }
      os << "}";
    }
    os << "\n";
  }
  for (auto& [name, v] : outputs_) os << "  output " << name << " = " << ref(v) << "\n";
  return os.str();
}

void verify(const Graph& g) {
  std::vector<bool> defined(g.num_values(), false);
  for (size_t v = 0; v < g.num_values(); ++v)
    if (g.value(ValueId(v)).kind != ValueKind::kIntermediate) defined[v] = true;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    const OpSchema* schema = find_op_schema(n.op);
    if (!schema) throw_error(ErrorCode::kUnsupported, "node '", n.name, "': unknown op '", n.op, "'");
    std::vector<const Value*> in;
    for (ValueId v : n.inputs) {
      if (v == kNoValue) {
        in.push_back(nullptr);
        continue;
      }
      if (v < 0 || size_t(v) >= g.num_values())
        throw_error(ErrorCode::kInvalidArgument, "node '", n.name, "' uses unknown value id ", v);
      if (!defined[size_t(v)])
        throw_error(ErrorCode::kInvalidArgument, "node '", n.name, "' uses %",
                    g.value(v).name, " before it is defined (graph not in topological order)");
      in.push_back(&g.value(v));
    }
    auto types = schema->infer(n, in);
    if (types.size() != n.outputs.size())
      throw_error(ErrorCode::kInvalidArgument, "node '", n.name, "' has ", n.outputs.size(),
                  " outputs, op ", n.op, " produces ", types.size());
    for (size_t o = 0; o < types.size(); ++o) {
      const Value& out = g.value(n.outputs[o]);
      if (defined[size_t(n.outputs[o])])
        throw_error(ErrorCode::kInvalidArgument, "value %", out.name, " is defined twice");
      if (out.dtype != types[o].dtype || !(out.shape == types[o].shape))
        throw_error(ErrorCode::kInvalidArgument, "node '", n.name, "' output %", out.name,
                    " is ", dtype_name(out.dtype), out.shape.str(), " but shape inference says ",
                    dtype_name(types[o].dtype), types[o].shape.str());
      defined[size_t(n.outputs[o])] = true;
    }
  }
  for (auto& [name, v] : g.outputs())
    if (v < 0 || size_t(v) >= g.num_values() || !defined[size_t(v)])
      throw_error(ErrorCode::kInvalidArgument, "graph output '", name, "' is not defined");
}

}  // namespace kiln::ir
