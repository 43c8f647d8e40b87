// Constant folding with symbolic shape arithmetic (for imported ONNX graphs, whose
// exporters compute every Reshape target from Shape/Gather/Unsqueeze/Concat chains):
// - tracks small int64 vectors whose entries are concrete or symbolic dims
//   (Shape(x) = x's dims, then Gather/Unsqueeze/Squeeze/Concat/Slice/Cast/arith);
// - a Reshape/Expand/Slice/ConstantOfShape operand known this way becomes an
//   attribute (a symbolic entry equal to the input's own dim becomes Reshape's 0 /
//   Expand's 1), so shapes downstream become exact;
// - a node whose inputs are all constants is evaluated on the CPU backend and
//   replaced by a weight, as is any vector whose entries are all concrete.
// Changes no numerics (the same kernels run, once). Tested in
// tests/passes/constant_folding_test.cpp and by the ONNX golden tests.
#include <algorithm>
#include <cstring>
#include <optional>

#include "backends/backend.h"
#include "core/log.h"
#include "ir/op_registry.h"
#include "ir/rewrite.h"
#include "passes/pass.h"
#include "passes/pass_util.h"

namespace kiln::passes {
namespace {

constexpr int64_t kMaxFoldElems = 1 << 20;  // larger results stay computed (engine size)
constexpr size_t kMaxSymLen = 16;

// A small int vector with concrete or symbolic entries; "?" is unknown (equal to nothing).
struct SymVec {
  std::vector<Dim> v;
  bool scalar = false;
  bool concrete() const {
    return std::all_of(v.begin(), v.end(), [](const Dim& d) { return d.is_concrete(); });
  }
};

bool same_dim(const Dim& a, const Dim& b) {
  if (a.is_concrete() || b.is_concrete()) return a.is_concrete() && b.is_concrete() && a.value == b.value;
  return a.sym == b.sym && a.sym != "?";
}

std::vector<int64_t> ints_of(const ir::Node& n, const std::string& k) {
  auto it = n.attrs.find(k);
  if (it == n.attrs.end()) return {};
  if (auto* v = std::get_if<std::vector<int64_t>>(&it->second)) return *v;
  if (auto* v = std::get_if<int64_t>(&it->second)) return {*v};
  return {};
}

class ConstantFolding final : public Pass {
 public:
  const char* name() const override { return "constant_folding"; }

  bool run(ir::Graph& g) override {
    dead_.assign(g.nodes().size(), false);
    folded_ = absorbed_ = 0;
    for (int round = 0; round < 16; ++round) {
      reinfer(g);
      compute_syms(g);
      size_t before = folded_ + absorbed_;
      absorb_operands(g);
      fold_nodes(g);
      if (folded_ + absorbed_ == before) break;
    }
    if (!folded_ && !absorbed_) {
      stats_.clear();
      return false;
    }
    ir::finish_rewrite(g, dead_);
    stats_ = str_cat("folded ", folded_, " nodes into constants, ", absorbed_, " shape operands into attributes");
    return true;
  }

 private:
  // Output types follow from (changed) attributes and inputs, in node order.
  void reinfer(ir::Graph& g) {
    for (size_t i = 0; i < g.nodes().size(); ++i) {
      if (dead_[i]) continue;
      ir::Node& n = g.nodes()[i];
      std::vector<const ir::Value*> in;
      for (ir::ValueId v : n.inputs) in.push_back(v == ir::kNoValue ? nullptr : &g.value(v));
      auto out = ir::get_op_schema(n.op).infer(n, in);
      for (size_t k = 0; k < out.size() && k < n.outputs.size(); ++k) {
        g.value(n.outputs[k]).dtype = out[k].dtype;
        g.value(n.outputs[k]).shape = out[k].shape;
      }
    }
  }

  std::optional<SymVec> weight_sym(const ir::Graph& g, ir::ValueId v) {
    const Tensor& t = g.weight(v);
    if ((t.dtype() != DType::kI64 && t.dtype() != DType::kI32) || t.rank() > 1 || size_t(t.numel()) > kMaxSymLen)
      return std::nullopt;
    SymVec s;
    s.scalar = t.rank() == 0;
    for (int64_t i = 0; i < t.numel(); ++i)
      s.v.emplace_back(t.dtype() == DType::kI64 ? t.data_as<int64_t>()[i] : int64_t(t.data_as<int32_t>()[i]));
    return s;
  }

  const SymVec* sym(const ir::Graph& g, ir::ValueId v) {
    if (v == ir::kNoValue) return nullptr;
    if (g.is_weight(v) && !syms_[size_t(v)]) syms_[size_t(v)] = weight_sym(g, v);
    return syms_[size_t(v)] ? &*syms_[size_t(v)] : nullptr;
  }

  void compute_syms(const ir::Graph& g) {
    syms_.assign(g.num_values(), std::nullopt);
    for (size_t i = 0; i < g.nodes().size(); ++i) {
      if (dead_[i]) continue;
      const ir::Node& n = g.nodes()[i];
      if (n.outputs.size() != 1) continue;
      std::optional<SymVec> out = eval_sym(g, n);
      if (out && out->v.size() <= kMaxSymLen) syms_[size_t(n.outputs[0])] = std::move(out);
    }
  }

  std::optional<SymVec> eval_sym(const ir::Graph& g, const ir::Node& n) {
    const SymVec* a = n.inputs.empty() ? nullptr : sym(g, n.inputs[0]);
    if (n.op == "Shape") {
      const Shape& s = g.value(n.inputs[0]).shape;
      int64_t r = int64_t(s.rank()), b = n.attr_int("start", 0), e = n.attr_int("end", r);
      if (b < 0) b += r;
      if (e < 0) e += r;
      SymVec out;
      for (int64_t i = std::clamp<int64_t>(b, 0, r); i < std::clamp<int64_t>(e, 0, r); ++i) out.v.push_back(s[size_t(i)]);
      return out;
    }
    if (!a) return std::nullopt;
    if (n.op == "Identity" || (n.op == "Cast" && !n.attr_int("bool", 0) &&
                               (n.attr_str("to") == "i64" || n.attr_str("to") == "i32")))
      return *a;
    if (n.op == "Gather" && n.attr_int("axis", 0) == 0 && !a->scalar) {
      const SymVec* idx = sym(g, n.inputs[1]);
      if (!idx || !idx->concrete()) return std::nullopt;
      SymVec out;
      out.scalar = idx->scalar;
      for (const Dim& d : idx->v) {
        int64_t k = d.value < 0 ? d.value + int64_t(a->v.size()) : d.value;
        if (k < 0 || k >= int64_t(a->v.size())) return std::nullopt;
        out.v.push_back(a->v[size_t(k)]);
      }
      return out;
    }
    if (n.op == "Unsqueeze" && a->scalar && ints_of(n, "axes") == std::vector<int64_t>{0}) return SymVec{a->v, false};
    if (n.op == "Squeeze" && !a->scalar && a->v.size() == 1) return SymVec{a->v, true};
    if (n.op == "Concat") {
      SymVec out;
      for (ir::ValueId in : n.inputs) {
        const SymVec* s = sym(g, in);
        if (!s || s->scalar) return std::nullopt;
        out.v.insert(out.v.end(), s->v.begin(), s->v.end());
      }
      return out;
    }
    if (n.op == "Slice" && !a->scalar && n.has_attr("starts")) {
      auto st = ints_of(n, "starts"), en = ints_of(n, "ends"), steps = ints_of(n, "steps");
      if (st.size() != 1 || (!steps.empty() && steps[0] != 1)) return std::nullopt;
      int64_t len = int64_t(a->v.size()), b = st[0] < 0 ? st[0] + len : st[0], e = en[0] < 0 ? en[0] + len : en[0];
      b = std::clamp<int64_t>(b, 0, len);
      e = std::clamp<int64_t>(e, 0, len);
      SymVec out;
      for (int64_t i = b; i < e; ++i) out.v.push_back(a->v[size_t(i)]);
      return out;
    }
    static const std::vector<std::string> kArith = {"Add", "Sub", "Mul", "Div"};
    if (std::find(kArith.begin(), kArith.end(), n.op) != kArith.end()) {
      const SymVec* b = sym(g, n.inputs[1]);
      if (!b || (a->v.size() != b->v.size() && b->v.size() != 1 && a->v.size() != 1)) return std::nullopt;
      SymVec out;
      out.scalar = a->scalar && b->scalar;
      size_t len = std::max(a->v.size(), b->v.size());
      for (size_t i = 0; i < len; ++i) {
        const Dim& x = a->v[a->v.size() == 1 ? 0 : i];
        const Dim& y = b->v[b->v.size() == 1 ? 0 : i];
        if (x.is_concrete() && y.is_concrete()) {
          int64_t r = n.op == "Add" ? x.value + y.value : n.op == "Sub" ? x.value - y.value
                    : n.op == "Mul" ? x.value * y.value : (y.value ? x.value / y.value : 0);
          out.v.emplace_back(r);
        } else if ((n.op == "Mul" || n.op == "Div") && y.is_concrete() && y.value == 1) {
          out.v.push_back(x);
        } else if ((n.op == "Add" || n.op == "Sub") && y.is_concrete() && y.value == 0) {
          out.v.push_back(x);
        } else {
          out.v.emplace_back("?");
        }
      }
      return out;
    }
    return std::nullopt;
  }

  // Shape operands known symbolically become attributes.
  void absorb_operands(ir::Graph& g) {
    for (size_t i = 0; i < g.nodes().size(); ++i) {
      if (dead_[i]) continue;
      ir::Node& n = g.nodes()[i];
      if ((n.op == "Reshape" || n.op == "Expand") && n.inputs.size() == 2) {
        const SymVec* s = sym(g, n.inputs[1]);
        if (!s || s->scalar) continue;
        const Shape& x = g.value(n.inputs[0]).shape;
        std::vector<int64_t> target;
        int unknown = 0;
        for (size_t k = 0; k < s->v.size(); ++k) {
          const Dim& d = s->v[k];
          if (d.is_concrete()) {
            target.push_back(d.value);
            unknown += d.value == -1 && n.op == "Reshape";
            continue;
          }
          if (n.op == "Reshape") {
            // The input's own dim at this position: ONNX Reshape's 0 copies it.
            if (!n.attr_int("allowzero", 0) && k < x.rank() && same_dim(d, x[k])) target.push_back(0);
            else target.push_back(-1), ++unknown;
          } else {
            size_t off = s->v.size() - std::min(s->v.size(), x.rank());
            // Expand: a target dim equal to the input's aligned dim is the same as 1.
            if (k >= off && k - off < x.rank() && same_dim(d, x[k - off])) target.push_back(1);
            else ++unknown;
          }
        }
        if (unknown > (n.op == "Reshape" ? 1 : 0)) continue;
        n.attrs["shape"] = target;
        n.inputs.resize(1);
        ++absorbed_;
      } else if (n.op == "ConstantOfShape" && n.inputs.size() == 1) {
        const SymVec* s = sym(g, n.inputs[0]);
        if (!s || !s->concrete()) continue;
        std::vector<int64_t> shape;
        for (auto& d : s->v) shape.push_back(d.value);
        n.attrs["shape"] = shape;
        n.inputs.clear();
        ++absorbed_;
      } else if (n.op == "Slice" && !n.has_attr("starts") && n.inputs.size() >= 3) {
        const char* keys[] = {"starts", "ends", "axes", "steps"};
        std::map<std::string, ir::Attr> attrs;
        bool ok = true;
        for (size_t k = 1; k < n.inputs.size() && ok; ++k) {
          if (n.inputs[k] == ir::kNoValue) continue;
          const SymVec* s = sym(g, n.inputs[k]);
          ok = s && s->concrete() && !s->scalar;
          if (!ok) break;
          std::vector<int64_t> v;
          for (auto& d : s->v) v.push_back(d.value);
          attrs[keys[k - 1]] = v;
        }
        if (!ok) continue;
        for (auto& [k, v] : attrs) n.attrs[k] = v;
        n.inputs.resize(1);
        ++absorbed_;
      }
    }
  }

  // Nodes with constant inputs (or fully concrete symbolic vectors) become weights.
  void fold_nodes(ir::Graph& g) {
    for (size_t i = 0; i < g.nodes().size(); ++i) {
      if (dead_[i]) continue;
      const ir::Node n = g.nodes()[i];
      // Plugin nodes stay: the engine then still records (and needs) the plugin that
      // computes them, rather than a result baked in from one build's plugin version.
      if (ir::has_side_effects(n) || n.op == "AllReduce" || n.op == "Plugin") continue;
      std::vector<Tensor> outs;
      if (n.outputs.size() == 1 && syms_[size_t(n.outputs[0])] && syms_[size_t(n.outputs[0])]->concrete() &&
          g.value(n.outputs[0]).dtype == DType::kI64) {
        const SymVec& s = *syms_[size_t(n.outputs[0])];
        Tensor t(DType::kI64, s.scalar ? std::vector<int64_t>{} : std::vector<int64_t>{int64_t(s.v.size())});
        for (size_t k = 0; k < s.v.size(); ++k) t.data_as<int64_t>()[k] = s.v[k].value;
        outs.push_back(std::move(t));
      } else {
        bool all_const = true;
        for (ir::ValueId in : n.inputs) all_const = all_const && (in == ir::kNoValue || g.is_weight(in));
        if (!all_const || !evaluate(g, n, outs)) continue;
      }
      for (size_t k = 0; k < outs.size(); ++k) {
        ir::ValueId w = g.add_weight(g.value(n.outputs[k]).name + "/folded", std::move(outs[k]));
        g.replace_uses(n.outputs[k], w);
      }
      dead_[i] = true;
      ++folded_;
    }
  }

  // Runs `n` alone on the CPU backend; false (the node stays) when it cannot or the
  // result is large.
  bool evaluate(const ir::Graph& g, const ir::Node& n, std::vector<Tensor>& outs) {
    for (ir::ValueId o : n.outputs) {
      const Shape& s = g.value(o).shape;
      if (!s.is_concrete() || s.numel() > kMaxFoldElems) return false;
    }
    try {
      ir::Graph mini;
      std::vector<ir::ValueId> ins;
      for (ir::ValueId in : n.inputs)
        ins.push_back(in == ir::kNoValue ? ir::kNoValue : mini.add_weight(g.value(in).name, g.weight(in)));
      auto o = mini.add_node(n.op, ins, n.attrs, n.name);
      for (size_t k = 0; k < o.size(); ++k) mini.add_output("out" + std::to_string(k), o[k]);
      if (!cpu_) cpu_ = create_backend("cpu");
      auto compiled = cpu_->compile(mini, {});
      TensorMap res = compiled->run({}, StepInfo{}, nullptr);
      for (size_t k = 0; k < o.size(); ++k) outs.push_back(res.at("out" + std::to_string(k)).clone());
      return true;
    } catch (const Error& e) {
      log_debug("constant_folding: not folding '", n.name, "' (", n.op, "): ", e.what());
      outs.clear();
      return false;
    }
  }

  std::vector<bool> dead_;
  std::vector<std::optional<SymVec>> syms_;
  std::unique_ptr<Backend> cpu_;
  size_t folded_ = 0, absorbed_ = 0;
};

}  // namespace

std::unique_ptr<Pass> make_constant_folding_pass() { return std::make_unique<ConstantFolding>(); }

}  // namespace kiln::passes
