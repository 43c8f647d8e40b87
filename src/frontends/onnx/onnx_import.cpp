// ONNX node -> kiln IR node mapping (see onnx_import.h). One handler per ONNX op;
// most map one to one onto the generic op of the same name.
#include "frontends/onnx/onnx_import.h"

#include <cstring>
#include <functional>
#include <map>
#include <set>

#include "core/log.h"
#include "core/status.h"
#include "ir/plugin.h"

namespace kiln::onnx {

namespace {

class Importer;
using Handler = std::function<void(Importer&, const OnnxNode&)>;
const std::map<std::string, Handler>& handlers();

class Importer {
 public:
  Importer(const OnnxModel& m, std::string label) : m_(m), label_(std::move(label)), opset_(m.default_opset()) {}

  ir::Graph run() {
    if (opset_ < kMinOpset || opset_ > kMaxOpset)
      throw_error(ErrorCode::kUnsupported, label_, ": ONNX opset ", opset_, " is not supported (kiln imports ai.onnx opsets ",
                  kMinOpset, "-", kMaxOpset, "); re-export with torch.onnx.export(..., opset_version=17)");
    for (const OnnxTensor& t : m_.graph.initializers) add_constant(t.name, t.value);
    for (const OnnxValueInfo& in : m_.graph.inputs) {
      if (vals_.count(in.name)) continue;  // IR < 4 lists initializers as inputs too
      if (in.elem_type == 0 || !in.has_shape)
        throw_error(ErrorCode::kUnsupported, label_, ": graph input '", in.name, "' is not a tensor of known rank");
      vals_[in.name] = g_.add_input(in.name, dtype_from_onnx(in.elem_type, str_cat(label_, ": input '", in.name, "'")),
                                    Shape(in.shape));
    }
    for (size_t i = 0; i < m_.graph.nodes.size(); ++i) import_node(m_.graph.nodes[i], i);
    for (const OnnxValueInfo& out : m_.graph.outputs) {
      auto it = vals_.find(out.name);
      if (it == vals_.end())
        throw_error(ErrorCode::kInvalidFile, label_, ": graph output '", out.name, "' is not produced by any node");
      g_.add_output(out.name, it->second);
    }
    g_.meta["format"] = std::string("onnx");
    g_.meta["onnx_opset"] = opset_;
    g_.meta["onnx_producer"] = m_.producer_name + " " + m_.producer_version;
    ir::verify(g_);
    return std::move(g_);
  }

  // ---- helpers for handlers ----
  ir::Graph& g() { return g_; }
  int64_t opset() const { return opset_; }

  ir::ValueId in(const OnnxNode& n, size_t i) {
    if (i >= n.inputs.size() || n.inputs[i].empty()) fail(n, str_cat("input ", i, " is required"));
    return value(n, n.inputs[i]);
  }
  bool has_in(const OnnxNode& n, size_t i) const { return i < n.inputs.size() && !n.inputs[i].empty(); }
  ir::ValueId value(const OnnxNode& n, const std::string& name) {
    auto it = vals_.find(name);
    if (it == vals_.end())
      throw_error(ErrorCode::kInvalidFile, label_, ": node '", n.name, "' (", n.op_type, ") reads '", name,
                  "', which no earlier node, graph input or initializer defines (a missing initializer, or nodes "
                  "out of topological order)");
    return it->second;
  }
  // The constant tensor behind input i, or null when it is computed.
  const Tensor* constant(const OnnxNode& n, size_t i) {
    if (!has_in(n, i)) return nullptr;
    ir::ValueId v = value(n, n.inputs[i]);
    return g_.is_weight(v) ? &g_.weight(v) : nullptr;
  }
  std::vector<int64_t> const_ints(const OnnxNode& n, size_t i, const char* role) {
    const Tensor* t = constant(n, i);
    if (!t) fail(n, str_cat(role, " (input ", i, ") must be a constant"));
    return tensor_ints(n, *t, role);
  }
  std::vector<int64_t> tensor_ints(const OnnxNode& n, const Tensor& t, const char* role) {
    std::vector<int64_t> v(static_cast<size_t>(t.numel()));
    if (t.dtype() == DType::kI64) {
      if (!v.empty()) std::memcpy(v.data(), t.data(), v.size() * 8);
    } else if (t.dtype() == DType::kI32) {
      for (size_t k = 0; k < v.size(); ++k) v[k] = t.data_as<int32_t>()[k];
    } else {
      fail(n, str_cat(role, " must be int64 or int32, got ", dtype_name(t.dtype())));
    }
    return v;
  }

  void bind(const OnnxNode& n, const std::vector<ir::ValueId>& outs) {
    for (size_t i = 0; i < n.outputs.size() && i < outs.size(); ++i)
      if (!n.outputs[i].empty()) vals_[n.outputs[i]] = outs[i];
  }
  void alias(const OnnxNode& n, size_t out, ir::ValueId v) { vals_[n.outputs.at(out)] = v; }
  // Emits one kiln node for ONNX node n.
  void emit(const OnnxNode& n, const std::string& op, std::vector<ir::ValueId> inputs,
            std::map<std::string, ir::Attr> attrs = {}) {
    bind(n, g_.add_node(op, std::move(inputs), std::move(attrs), node_name_));
  }
  ir::ValueId emit_extra(const std::string& op, std::vector<ir::ValueId> inputs, std::map<std::string, ir::Attr> attrs = {}) {
    return g_.add(op, std::move(inputs), std::move(attrs), node_name_ + "/" + op + std::to_string(extra_++));
  }
  ir::ValueId add_constant(const std::string& name, Tensor t) {
    if (t.dtype() == DType::kF16 || t.dtype() == DType::kBF16) t = t.to(DType::kF32);  // kiln computes in f32
    ir::ValueId v = g_.add_weight(unique_value_name(name), std::move(t));
    vals_[name] = v;
    return v;
  }
  ir::ValueId scalar_constant(float x) {
    Tensor t(DType::kF32, {});
    t.data_as<float>()[0] = x;
    return g_.add_weight(unique_value_name(node_name_ + "/const" + std::to_string(extra_++)), std::move(t));
  }

  [[noreturn]] void fail(const OnnxNode& n, const std::string& what) const {
    throw_error(ErrorCode::kUnsupported, label_, ": node '", n.name, "' (", n.op_type, ", opset ", opset_, "): ", what);
  }

 private:
  void import_node(const OnnxNode& n, size_t index) {
    node_name_ = n.name.empty() ? n.op_type + "_" + std::to_string(index) : n.name;
    if (!names_.insert(node_name_).second) node_name_ = str_cat(node_name_, "#", index);
    extra_ = 0;
    // Ops of loaded plugins (ir/plugin.h): any domain; in the default domain kiln's own
    // importers come first.
    const std::string domain = ir::plugin_domain_normalize(n.domain);
    if (!domain.empty()) {
      if (const ir::PluginOp* op = ir::plugin_find_op(domain, n.op_type)) return import_plugin(*op, n);
      throw_error(ErrorCode::kUnsupported, label_, ": node '", node_name_, "' uses op ", n.domain, "::", n.op_type,
                  ", outside the standard ai.onnx domain (opset ", opset_, "), and no loaded plugin provides it. "
                  "Load a plugin library that implements it with --plugin FILE (or KILN_PLUGINS=path1:path2; "
                  "docs/plugins.md), export with standard ops only (e.g. plain torch.onnx.export, not an "
                  "optimizer's fused ops), or add the op to kiln's op registry (src/ir) with a backend kernel");
    }
    auto it = handlers().find(n.op_type);
    if (it == handlers().end()) {
      if (const ir::PluginOp* op = ir::plugin_find_op("", n.op_type)) return import_plugin(*op, n);
      std::string known;
      for (auto& [k, h] : handlers()) known += (known.empty() ? "" : ", ") + k;
      throw_error(ErrorCode::kUnsupported, label_, ": node '", node_name_, "' uses ONNX op ", n.op_type, " (opset ",
                  opset_, "), which kiln's ONNX importer does not support and no loaded plugin provides. Re-export "
                  "the model with the supported ops (", known, "), load a plugin library that implements it with "
                  "--plugin FILE (docs/plugins.md), or add the op to kiln's op registry (src/ir) with a backend "
                  "kernel");
    }
    it->second(*this, n);
  }
  // A node of a plugin's op: one Plugin IR node carrying the ONNX attributes; its
  // output types come from the plugin's shape inference.
  void import_plugin(const ir::PluginOp& op, const OnnxNode& n) {
    std::vector<ir::ValueId> ins;
    size_t count = n.inputs.size();
    while (count && n.inputs[count - 1].empty()) --count;  // trailing absent optionals
    for (size_t i = 0; i < count; ++i) ins.push_back(has_in(n, i) ? in(n, i) : ir::kNoValue);
    std::map<std::string, ir::Attr> attrs;
    for (const OnnxAttribute& a : n.attrs) {
      if (a.name == ir::kPluginOpAttr || a.name == ir::kPluginDomainAttr)
        fail(n, str_cat("attribute '", a.name, "' has a name kiln reserves for plugin nodes"));
      switch (a.type) {
        case AttrType::kFloat: attrs[a.name] = double(a.f); break;
        case AttrType::kInt: attrs[a.name] = a.i; break;
        case AttrType::kString: attrs[a.name] = a.s; break;
        case AttrType::kInts: attrs[a.name] = a.ints; break;
        case AttrType::kFloats: attrs[a.name] = std::vector<double>(a.floats.begin(), a.floats.end()); break;
        default:
          fail(n, str_cat("attribute '", a.name, "' has ONNX type ", int(a.type),
                          "; plugin ops take int, float, string, ints and floats attributes"));
      }
    }
    attrs[ir::kPluginOpAttr] = n.op_type;
    attrs[ir::kPluginDomainAttr] = op.domain;
    std::vector<ir::ValueId> outs = g_.add_node(ir::kPluginOp, std::move(ins), std::move(attrs), node_name_);
    size_t used = n.outputs.size();
    while (used && n.outputs[used - 1].empty()) --used;
    if (used > outs.size())
      fail(n, str_cat("the node has ", used, " outputs, but plugin ", op.origin(), " says op ", op.qualified_name(),
                      " produces ", outs.size(), " here"));
    bind(n, outs);
  }

  std::string unique_value_name(const std::string& base) {
    std::string s = base;
    for (int k = 1; !value_names_.insert(s).second; ++k) s = base + "#" + std::to_string(k);
    return s;
  }

  const OnnxModel& m_;
  std::string label_;
  int64_t opset_;
  ir::Graph g_;
  std::map<std::string, ir::ValueId> vals_;
  std::set<std::string> names_, value_names_;
  std::string node_name_;
  int extra_ = 0;
};

const OnnxAttribute* attr(const OnnxNode& n, const char* k) { return n.attr(k); }
int64_t attr_i(const OnnxNode& n, const char* k, int64_t fallback) {
  auto* a = n.attr(k);
  return a ? a->i : fallback;
}
float attr_f(const OnnxNode& n, const char* k, float fallback) {
  auto* a = n.attr(k);
  return a ? a->f : fallback;
}

void direct(Importer& im, const OnnxNode& n) {
  std::vector<ir::ValueId> ins;
  for (size_t i = 0; i < n.inputs.size(); ++i) ins.push_back(im.in(n, i));
  im.emit(n, n.op_type, ins);
}

void constant(Importer& im, const OnnxNode& n) {
  if (auto* a = attr(n, "value"); a && a->t) return (void)im.add_constant(n.outputs.at(0), a->t->value);
  auto ints = [&](std::vector<int64_t> v, bool scalar) {
    Tensor t(DType::kI64, scalar ? std::vector<int64_t>{} : std::vector<int64_t>{int64_t(v.size())});
    if (!v.empty()) std::memcpy(t.data(), v.data(), v.size() * 8);
    return t;
  };
  auto floats = [&](std::vector<float> v, bool scalar) {
    Tensor t(DType::kF32, scalar ? std::vector<int64_t>{} : std::vector<int64_t>{int64_t(v.size())});
    if (!v.empty()) std::memcpy(t.data(), v.data(), v.size() * 4);
    return t;
  };
  if (auto* a = attr(n, "value_int")) return (void)im.add_constant(n.outputs.at(0), ints({a->i}, true));
  if (auto* a = attr(n, "value_ints")) return (void)im.add_constant(n.outputs.at(0), ints(a->ints, false));
  if (auto* a = attr(n, "value_float")) return (void)im.add_constant(n.outputs.at(0), floats({a->f}, true));
  if (auto* a = attr(n, "value_floats")) return (void)im.add_constant(n.outputs.at(0), floats(a->floats, false));
  im.fail(n, "a Constant without a tensor, int or float value (sparse and string constants are not supported)");
}

void identity(Importer& im, const OnnxNode& n) {
  // Dropout is the identity at inference; its optional mask output must be unused.
  if (n.op_type == "Dropout" && n.outputs.size() > 1 && !n.outputs[1].empty())
    im.fail(n, "the Dropout mask output is used; inference graphs do not have one");
  im.alias(n, 0, im.in(n, 0));
}

void cast(Importer& im, const OnnxNode& n) {
  int64_t to = attr_i(n, "to", 0);
  DType dt = dtype_from_onnx(int32_t(to), str_cat("node '", n.name, "' (Cast)"));
  im.emit(n, "Cast", {im.in(n, 0)}, {{"to", std::string(dtype_name(dt))}, {"bool", int64_t(to == kOnnxBool)}});
}

void gemm(Importer& im, const OnnxNode& n) {
  float alpha = attr_f(n, "alpha", 1.0f), beta = attr_f(n, "beta", 1.0f);
  bool ta = attr_i(n, "transA", 0) != 0, tb = attr_i(n, "transB", 0) != 0;
  const Tensor* b = im.constant(n, 1);
  const Tensor* c = im.constant(n, 2);
  ir::ValueId a = im.in(n, 0);
  bool bias_ok = !im.has_in(n, 2) || (c && c->numel() >= 1 && (c->rank() <= 1 || (c->rank() == 2 && c->dim(0) == 1)));
  if (b && b->rank() == 2 && !ta && bias_ok && b->dtype() == DType::kF32) {
    // A constant B is a Linear: weight [N, K] (PyTorch's layout), alpha and beta folded in.
    int64_t k = tb ? b->dim(1) : b->dim(0), nn = tb ? b->dim(0) : b->dim(1);
    Tensor w(DType::kF32, {nn, k});
    for (int64_t i = 0; i < nn; ++i)
      for (int64_t j = 0; j < k; ++j)
        w.data_as<float>()[i * k + j] = alpha * (tb ? b->data_as<float>()[i * k + j] : b->data_as<float>()[j * nn + i]);
    std::vector<ir::ValueId> ins = {a, im.g().add_weight(n.inputs[1] + (tb ? "" : "^T"), std::move(w))};
    if (c) {
      Tensor bias(DType::kF32, {nn});
      Tensor cf = c->to(DType::kF32);
      for (int64_t i = 0; i < nn; ++i) bias.data_as<float>()[i] = beta * cf.data_as<float>()[cf.numel() == 1 ? 0 : i];
      ins.push_back(im.g().add_weight(n.inputs[2] + "/bias", std::move(bias)));
    }
    return im.emit(n, "Linear", ins);
  }
  ir::ValueId bv = im.in(n, 1);
  if (ta) a = im.emit_extra("Transpose", {a}, {{"perm", std::vector<int64_t>{1, 0}}});
  if (tb) bv = im.emit_extra("Transpose", {bv}, {{"perm", std::vector<int64_t>{1, 0}}});
  ir::ValueId y = im.emit_extra("MatMul", {a, bv});
  if (alpha != 1.0f) y = im.emit_extra("Mul", {y, im.scalar_constant(alpha)});
  if (!im.has_in(n, 2)) return im.alias(n, 0, y);
  ir::ValueId cv = im.in(n, 2);
  if (beta != 1.0f) cv = im.emit_extra("Mul", {cv, im.scalar_constant(beta)});
  im.emit(n, "Add", {y, cv});
}

void layer_norm(Importer& im, const OnnxNode& n) {
  const Tensor* w = im.constant(n, 1);
  ir::ValueId x = im.in(n, 0);
  int64_t rank = int64_t(im.g().value(x).shape.rank());
  int64_t axis = attr_i(n, "axis", -1);
  if (axis != -1 && axis != rank - 1) im.fail(n, str_cat("normalization over axis ", axis, " (kiln normalizes the last axis)"));
  if (!w || w->rank() != 1) im.fail(n, "the scale must be a 1-D constant");
  for (size_t i = 1; i < n.outputs.size(); ++i)
    if (!n.outputs[i].empty()) im.fail(n, "the Mean/InvStdDev outputs (training only) are used");
  std::vector<ir::ValueId> ins = {x, im.in(n, 1)};
  if (im.has_in(n, 2)) ins.push_back(im.in(n, 2));
  im.emit(n, "LayerNorm", ins, {{"eps", double(attr_f(n, "epsilon", 1e-5f))}});
}

void softmax(Importer& im, const OnnxNode& n) {
  im.emit(n, "Softmax", {im.in(n, 0)}, {{"axis", attr_i(n, "axis", -1)}});
}

void reduce(Importer& im, const OnnxNode& n) {
  std::map<std::string, ir::Attr> attrs = {{"keepdims", attr_i(n, "keepdims", 1)}};
  std::vector<int64_t> axes;
  if (auto* a = attr(n, "axes")) axes = a->ints;
  else if (im.has_in(n, 1)) axes = im.const_ints(n, 1, "axes");
  if (!axes.empty()) attrs["axes"] = axes;
  else if (attr_i(n, "noop_with_empty_axes", 0)) return im.alias(n, 0, im.in(n, 0));
  im.emit(n, n.op_type, {im.in(n, 0)}, attrs);
}

// An op whose operand `i` decides a shape: an attribute `name` when constant, else an input.
void shape_operand(Importer& im, const OnnxNode& n, const std::string& op, size_t i, const char* name,
                   std::map<std::string, ir::Attr> attrs = {}) {
  std::vector<ir::ValueId> ins;
  for (size_t k = 0; k < i; ++k) ins.push_back(im.in(n, k));
  if (im.constant(n, i)) attrs[name] = im.const_ints(n, i, name);
  else if (im.has_in(n, i)) ins.push_back(im.in(n, i));
  im.emit(n, op, ins, attrs);
}

void reshape(Importer& im, const OnnxNode& n) {
  shape_operand(im, n, "Reshape", 1, "shape", {{"allowzero", attr_i(n, "allowzero", 0)}});
}

void expand(Importer& im, const OnnxNode& n) { shape_operand(im, n, "Expand", 1, "shape"); }

void constant_of_shape(Importer& im, const OnnxNode& n) {
  double value = 0;
  DType dt = DType::kF32;
  if (auto* a = attr(n, "value"); a && a->t) {
    const Tensor& t = a->t->value;
    if (t.numel() != 1) im.fail(n, "value must hold one element");
    dt = t.dtype();
    Tensor d = t.to(DType::kF32);
    value = t.dtype() == DType::kI64 ? double(t.data_as<int64_t>()[0]) : double(d.data_as<float>()[0]);
  }
  std::map<std::string, ir::Attr> attrs = {{"dtype", std::string(dtype_name(dt))}, {"value", value}};
  if (im.constant(n, 0)) {
    attrs["shape"] = im.const_ints(n, 0, "shape");
    return im.emit(n, "ConstantOfShape", {}, attrs);
  }
  im.emit(n, "ConstantOfShape", {im.in(n, 0)}, attrs);
}

void transpose(Importer& im, const OnnxNode& n) {
  std::map<std::string, ir::Attr> attrs;
  if (auto* a = attr(n, "perm")) attrs["perm"] = a->ints;
  im.emit(n, "Transpose", {im.in(n, 0)}, attrs);
}

void with_axis(Importer& im, const OnnxNode& n, const char* key, int64_t fallback) {
  std::vector<ir::ValueId> ins;
  for (size_t i = 0; i < n.inputs.size(); ++i) ins.push_back(im.in(n, i));
  im.emit(n, n.op_type, ins, {{key, attr_i(n, key, fallback)}});
}

void slice(Importer& im, const OnnxNode& n) {
  bool all_const = true;
  for (size_t i = 1; i < n.inputs.size(); ++i)
    if (im.has_in(n, i) && !im.constant(n, i)) all_const = false;
  if (!all_const) {
    std::vector<ir::ValueId> ins;
    for (size_t i = 0; i < n.inputs.size(); ++i) ins.push_back(im.has_in(n, i) ? im.in(n, i) : ir::kNoValue);
    return im.emit(n, "Slice", ins);
  }
  std::map<std::string, ir::Attr> attrs = {{"starts", im.const_ints(n, 1, "starts")}, {"ends", im.const_ints(n, 2, "ends")}};
  if (im.has_in(n, 3)) attrs["axes"] = im.const_ints(n, 3, "axes");
  if (im.has_in(n, 4)) attrs["steps"] = im.const_ints(n, 4, "steps");
  im.emit(n, "Slice", {im.in(n, 0)}, attrs);
}

void unsqueeze(Importer& im, const OnnxNode& n) {
  std::vector<int64_t> axes = attr(n, "axes") ? attr(n, "axes")->ints : im.const_ints(n, 1, "axes");
  im.emit(n, "Unsqueeze", {im.in(n, 0)}, {{"axes", axes}});
}

void squeeze(Importer& im, const OnnxNode& n) {
  std::map<std::string, ir::Attr> attrs;
  if (auto* a = attr(n, "axes")) attrs["axes"] = a->ints;
  else if (im.has_in(n, 1)) attrs["axes"] = im.const_ints(n, 1, "axes");
  im.emit(n, "Squeeze", {im.in(n, 0)}, attrs);
}

void shape(Importer& im, const OnnxNode& n) {
  std::map<std::string, ir::Attr> attrs;
  if (auto* a = attr(n, "start")) attrs["start"] = a->i;
  if (auto* a = attr(n, "end")) attrs["end"] = a->i;
  im.emit(n, "Shape", {im.in(n, 0)}, attrs);
}

void trilu(Importer& im, const OnnxNode& n) {
  std::vector<ir::ValueId> ins = {im.in(n, 0)};
  if (im.has_in(n, 1)) ins.push_back(im.in(n, 1));
  im.emit(n, "Trilu", ins, {{"upper", attr_i(n, "upper", 1)}});
}

void split(Importer& im, const OnnxNode& n) {
  std::map<std::string, ir::Attr> attrs = {{"axis", attr_i(n, "axis", 0)}};
  if (auto* a = attr(n, "split")) attrs["split"] = a->ints;
  else if (im.has_in(n, 1)) attrs["split"] = im.const_ints(n, 1, "split");
  else attrs["num_outputs"] = attr_i(n, "num_outputs", int64_t(n.outputs.size()));
  im.emit(n, "Split", {im.in(n, 0)}, attrs);
}

const std::map<std::string, Handler>& handlers() {
  static const std::map<std::string, Handler> h = [] {
    std::map<std::string, Handler> m;
    for (const char* op : {"Add",     "Sub",  "Mul",         "Div",     "Pow",
                           "Equal",   "Less", "LessOrEqual", "Greater", "GreaterOrEqual",
                           "And",     "Or",   "Xor",         "Where",   "Not",
                           "Sqrt",    "Erf",  "Exp",         "Log",     "Tanh",
                           "Sigmoid", "Relu", "Neg",         "Abs",     "Reciprocal",
                           "Cos",     "Sin",  "MatMul",      "Range"})
      m[op] = direct;
    m["Constant"] = constant;
    m["Identity"] = identity;
    m["Dropout"] = identity;
    m["Cast"] = cast;
    m["Gemm"] = gemm;
    m["LayerNormalization"] = layer_norm;
    m["Softmax"] = softmax;
    for (const char* op : {"ReduceMean", "ReduceSum", "ReduceMax"}) m[op] = reduce;
    m["Reshape"] = reshape;
    m["Expand"] = expand;
    m["ConstantOfShape"] = constant_of_shape;
    m["Transpose"] = transpose;
    m["Gather"] = [](Importer& im, const OnnxNode& n) { with_axis(im, n, "axis", 0); };
    m["Concat"] = [](Importer& im, const OnnxNode& n) { with_axis(im, n, "axis", 0); };
    m["Flatten"] = [](Importer& im, const OnnxNode& n) { with_axis(im, n, "axis", 1); };
    m["Slice"] = slice;
    m["Unsqueeze"] = unsqueeze;
    m["Squeeze"] = squeeze;
    m["Shape"] = shape;
    m["Trilu"] = trilu;
    m["Split"] = split;
    return m;
  }();
  return h;
}

}  // namespace

ir::Graph import_onnx_graph(const OnnxModel& model, const std::string& label) {
  return Importer(model, label).run();
}

ir::Graph load_onnx_graph(const std::string& path) {
  OnnxModel m = load_onnx_model(path);
  ir::Graph g = import_onnx_graph(m, path);
  log_debug("onnx: imported ", path, ": ", g.nodes().size(), " nodes, opset ", m.default_opset());
  return g;
}

std::vector<std::string> onnx_supported_ops() {
  std::vector<std::string> v;
  for (auto& [k, h] : handlers()) v.push_back(k);
  return v;
}

}  // namespace kiln::onnx
