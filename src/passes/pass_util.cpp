// Helpers shared by the fusion passes (see pass_util.h).
#include "passes/pass_util.h"

#include <cstring>

#include "core/status.h"

namespace kiln::passes {

const ir::Node* producer(const ir::Graph& g, ir::ValueId v) {
  if (v == ir::kNoValue || g.value(v).kind != ir::ValueKind::kIntermediate) return nullptr;
  return &g.nodes().at(size_t(g.value(v).producer));
}

const ir::Node* single_use_producer(const ir::Graph& g, const ir::Uses& uses, ir::ValueId v,
                                    const std::string& op, int32_t user) {
  const ir::Node* p = producer(g, v);
  if (!p || p->op != op || p->outputs.size() != 1 || !uses.only_used_by(v, user)) return nullptr;
  return p;
}

bool scalar_weight(const ir::Graph& g, ir::ValueId v, double* out) {
  if (v == ir::kNoValue || !g.is_weight(v)) return false;
  const Tensor& t = g.weight(v);
  if (t.dtype() != DType::kF32 || t.numel() != 1) return false;
  *out = t.data_as<float>()[0];
  return true;
}

ir::ValueId other_input(const ir::Node& n, ir::ValueId v) {
  if (n.inputs.size() != 2) return ir::kNoValue;
  if (n.inputs[0] == v) return n.inputs[1];
  if (n.inputs[1] == v) return n.inputs[0];
  return ir::kNoValue;
}

const ir::Node* sole_consumer(const ir::Graph& g, const ir::Uses& uses, ir::ValueId v) {
  if (uses.count(v) != 1 || uses.consumers[size_t(v)].empty()) return nullptr;
  return &g.nodes()[size_t(uses.consumers[size_t(v)][0])];
}

std::map<std::string, ir::Attr> weight_quant_attrs(const ir::Node& linear) {
  std::map<std::string, ir::Attr> a;
  if (!linear.has_attr("weight_quant")) return a;
  a["weight_quant"] = linear.attr_str("weight_quant");
  a["weight_k"] = linear.attr_int("weight_k", -1);
  if (linear.has_attr("precision")) a["precision"] = linear.attr_str("precision");
  return a;
}

bool same_weight_quant(const ir::Node& a, const ir::Node& b) {
  return a.attr_str("weight_quant", "") == b.attr_str("weight_quant", "") &&
         a.attr_int("weight_k", -1) == b.attr_int("weight_k", -1) &&
         a.attr_str("precision", "") == b.attr_str("precision", "");
}

ir::ValueId concat_weights(ir::Graph& g, const std::vector<ir::ValueId>& parts, const std::string& name) {
  KILN_CHECK(!parts.empty(), "concat of nothing");
  const Tensor& first = g.weight(parts[0]);
  int64_t rows = 0;
  for (ir::ValueId p : parts) {
    const Tensor& t = g.weight(p);
    bool same = t.dtype() == first.dtype() && t.rank() == first.rank();
    for (int d = 1; same && d < t.rank(); ++d) same = t.dim(d) == first.dim(d);
    if (!same)
      throw_error(ErrorCode::kUnsupported, "cannot stack weight ", g.value(p).name, " ",
                  dtype_name(t.dtype()), t.shape_str(), " onto ", g.value(parts[0]).name, " ",
                  dtype_name(first.dtype()), first.shape_str());
    rows += t.dim(0);
  }
  std::vector<int64_t> shape = first.shape();
  shape[0] = rows;
  // Parts lying back to back in one buffer (views of a checkpoint's mapping whose file
  // stores them in this order, like an HF file's gate_proj and up_proj): the stacked
  // weight is a view of that span, so nothing is copied.
  bool adjacent = first.owner() != nullptr;
  const uint8_t* next = static_cast<const uint8_t*>(first.data());
  for (ir::ValueId p : parts) {
    const Tensor& t = g.weight(p);
    adjacent = adjacent && t.owner() == first.owner() && t.data() == next;
    next += t.nbytes();
  }
  if (adjacent)
    return g.add_weight(name, Tensor::view(const_cast<void*>(first.data()), first.dtype(), shape, first.owner()));
  Tensor out(first.dtype(), shape);
  size_t at = 0;
  for (ir::ValueId p : parts) {
    const Tensor& t = g.weight(p);
    std::memcpy(static_cast<uint8_t*>(out.data()) + at, t.data(), t.nbytes());
    at += t.nbytes();
  }
  return g.add_weight(name, std::move(out));
}

std::string name_scope(const std::string& node_name) {
  size_t dot = node_name.rfind('.');
  return dot == std::string::npos ? node_name + "." : node_name.substr(0, dot + 1);
}

}  // namespace kiln::passes
