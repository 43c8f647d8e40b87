// fuse_layer_norm_pattern: the LayerNorm that exporters spell out op by op (ONNX
// opsets < 17: ReduceMean, Sub, Pow 2, ReduceMean, Add eps, Sqrt, Div, Mul w, Add b)
// becomes one LayerNorm node over the last axis, so imported graphs use the fused
// kernel (and fuse_add_norm can take the residual Add in front of it).
// Tested in tests/passes/pattern_fusion_test.cpp and by the ONNX golden tests.
#include <cmath>

#include "passes/pass.h"
#include "passes/pass_util.h"

namespace kiln::passes {
namespace {

constexpr const char* kName = "fuse_layer_norm_pattern";

bool last_axis_mean(const ir::Graph& g, const ir::Node* n) {
  if (!n || n->op != "ReduceMean" || n->attr_int("keepdims", 1) != 1 || !n->has_attr("axes")) return false;
  auto& axes = std::get<std::vector<int64_t>>(n->attrs.at("axes"));
  int64_t rank = int64_t(g.value(n->inputs[0]).shape.rank());
  return axes.size() == 1 && (axes[0] == -1 || axes[0] == rank - 1);
}

// A 1-D f32 weight matching x's concrete last dim.
bool row_weight(const ir::Graph& g, ir::ValueId w, const Shape& x) {
  if (w == ir::kNoValue || !g.is_weight(w) || g.weight(w).dtype() != DType::kF32 || g.weight(w).rank() != 1) return false;
  return x.rank() >= 1 && x.back().is_concrete() && x.back().value == g.weight(w).dim(0);
}

class FuseLayerNormPattern final : public Pass {
 public:
  const char* name() const override { return kName; }

  bool run(ir::Graph& g) override {
    std::vector<bool> dead(g.nodes().size(), false);
    ir::Uses uses = ir::compute_uses(g);
    size_t fused = 0;
    const size_t n_nodes = g.nodes().size();
    for (size_t i = 0; i < n_nodes; ++i) {
      const ir::Node& div = g.nodes()[i];
      if (div.op != "Div") continue;
      const int32_t di = int32_t(i);
      const ir::ValueId d = div.inputs[0];
      const ir::Node* sqrt = single_use_producer(g, uses, div.inputs[1], "Sqrt", di);
      if (!sqrt) continue;  // not a normalization
      const ir::Node* add_eps = single_use_producer(g, uses, sqrt->inputs[0], "Add", node_index(g, sqrt));
      double eps = 0;
      if (!add_eps || !scalar_weight(g, add_eps->inputs[1], &eps)) {
        not_fired(kName, div, "the denominator is not sqrt(variance + eps)");
        continue;
      }
      const ir::Node* var = single_use_producer(g, uses, add_eps->inputs[0], "ReduceMean", node_index(g, add_eps));
      const ir::Node* pow = var ? single_use_producer(g, uses, var->inputs[0], "Pow", node_index(g, var)) : nullptr;
      double two = 0;
      if (!last_axis_mean(g, var) || !pow || pow->inputs[0] != d || !scalar_weight(g, pow->inputs[1], &two) || two != 2) {
        not_fired(kName, div, "the variance is not mean((x - mean)^2) over the last axis");
        continue;
      }
      const ir::Node* sub = producer(g, d);
      if (!sub || sub->op != "Sub" || uses.count(d) != 2) {
        not_fired(kName, div, "the centered input is not a Sub read only by Pow and Div");
        continue;
      }
      const ir::ValueId x = sub->inputs[0];
      const ir::Node* mean = single_use_producer(g, uses, sub->inputs[1], "ReduceMean", node_index(g, sub));
      if (!last_axis_mean(g, mean) || mean->inputs[0] != x) {
        not_fired(kName, div, "the mean is not ReduceMean(x) over the last axis");
        continue;
      }
      const Shape& xs = g.value(x).shape;
      const ir::Node* mul = sole_consumer(g, uses, div.outputs[0]);
      ir::ValueId w = mul && mul->op == "Mul" ? other_input(*mul, div.outputs[0]) : ir::kNoValue;
      const ir::Node* add_b = mul ? sole_consumer(g, uses, mul->outputs[0]) : nullptr;
      ir::ValueId b = add_b && add_b->op == "Add" ? other_input(*add_b, mul->outputs[0]) : ir::kNoValue;
      if (!row_weight(g, w, xs) || !row_weight(g, b, xs)) {
        not_fired(kName, div, "the normalized value is not followed by Mul and Add with [", xs.back().str(), "] weights");
        continue;
      }
      for (const ir::Node* n : {mean, sub, pow, var, add_eps, sqrt, &div, mul, add_b}) dead[size_t(node_index(g, n))] = true;
      const ir::ValueId out = add_b->outputs[0];
      ir::ValueId ln = g.add("LayerNorm", {x, w, b}, {{"eps", eps}}, name_scope(div.name) + "LayerNorm");
      g.replace_uses(out, ln);
      ++fused;
    }
    if (!fused) {
      stats_.clear();
      return false;
    }
    ir::finish_rewrite(g, dead);
    stats_ = str_cat("fused ", fused, " op-by-op LayerNorms");
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> make_fuse_layer_norm_pattern_pass() { return std::make_unique<FuseLayerNormPattern>(); }

}  // namespace kiln::passes
