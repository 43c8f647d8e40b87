// fuse_gelu_pattern: the GELUs that exporters spell out op by op become one Gelu
// node, the fused kernel:
//   erf (BERT):        x * (erf(x / sqrt(2)) + 1) * 0.5              -> approximate=none
//   tanh (GPT-2 "new"): 0.5x * (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) -> approximate=tanh
// (with x * 0.7071 for the division and the factors in either order).
// Tested in tests/passes/pattern_fusion_test.cpp and by the ONNX golden tests.
#include <cmath>
#include <numbers>

#include "passes/pass.h"
#include "passes/pass_util.h"

namespace kiln::passes {
namespace {

constexpr const char* kName = "fuse_gelu_pattern";

bool near(double a, double b) { return std::fabs(a - b) <= 1e-6 * std::fabs(b); }

class FuseGeluPattern final : public Pass {
 public:
  const char* name() const override { return kName; }

  bool run(ir::Graph& g) override {
    std::vector<bool> dead(g.nodes().size(), false);
    ir::Uses uses = ir::compute_uses(g);
    size_t fused = 0;
    erf_ = tanh_ = 0;
    const size_t n_nodes = g.nodes().size();
    for (size_t i = 0; i < n_nodes; ++i) {
      const ir::Node& erf = g.nodes()[i];  // Erf or Tanh
      if (erf.op != "Erf" && erf.op != "Tanh") continue;
      const bool is_tanh = erf.op == "Tanh";
      std::vector<const ir::Node*> inner;
      const ir::ValueId x = is_tanh ? match_tanh_argument(g, uses, erf, inner) : match_erf_argument(g, uses, erf, inner);
      if (x == ir::kNoValue) {
        not_fired(kName, erf, is_tanh ? "its input is not sqrt(2/pi) (x + 0.044715 x^3)" : "its input is not x / sqrt(2)");
        continue;
      }
      const ir::Node* add = sole_consumer(g, uses, erf.outputs[0]);
      double one = 0;
      if (!add || add->op != "Add" || !scalar_weight(g, other_input(*add, erf.outputs[0]), &one) || one != 1) {
        not_fired(kName, erf, erf.op, "(...) is not followed by + 1");
        continue;
      }
      // x * (1 + erf) * 0.5, or (0.5 * x) * (1 + erf).
      const ir::Node* m1 = sole_consumer(g, uses, add->outputs[0]);
      if (!m1 || m1->op != "Mul") {
        not_fired(kName, erf, "1 + ", erf.op, "(...) is not multiplied");
        continue;
      }
      ir::ValueId other = other_input(*m1, add->outputs[0]);
      const ir::Node* half = nullptr;
      ir::ValueId out = ir::kNoValue;
      double h = 0;
      if (other == x) {
        half = sole_consumer(g, uses, m1->outputs[0]);
        if (half && half->op == "Mul" && scalar_weight(g, other_input(*half, m1->outputs[0]), &h) && h == 0.5)
          out = half->outputs[0];
      } else if (const ir::Node* hx = producer(g, other);
                 hx && hx->op == "Mul" && uses.only_used_by(other, node_index(g, m1)) &&
                 other_input(*hx, x) != ir::kNoValue && scalar_weight(g, other_input(*hx, x), &h) && h == 0.5) {
        half = hx;
        out = m1->outputs[0];
      }
      if (out == ir::kNoValue) {
        not_fired(kName, erf, "the product is not x * (1 + ", erf.op, "(...)) * 0.5");
        continue;
      }
      inner.insert(inner.end(), {&erf, add, m1, half});
      for (const ir::Node* n : inner) dead[size_t(node_index(g, n))] = true;
      ir::ValueId gelu = g.add("Gelu", {x}, {{"approximate", std::string(is_tanh ? "tanh" : "none")}},
                               name_scope(erf.name) + "Gelu");
      ++(is_tanh ? tanh_ : erf_);
      g.replace_uses(out, gelu);
      ++fused;
    }
    if (!fused) {
      stats_.clear();
      return false;
    }
    ir::finish_rewrite(g, dead);
    stats_ = str_cat("fused ", fused, " op-by-op GELUs (", erf_, " erf, ", tanh_, " tanh)");
    return true;
  }

 private:
  // x / sqrt(2) or x * sqrt(1/2) read only by the Erf; returns x.
  static ir::ValueId match_erf_argument(const ir::Graph& g, const ir::Uses& uses, const ir::Node& erf,
                                        std::vector<const ir::Node*>& inner) {
    const ir::Node* scale = producer(g, erf.inputs[0]);
    double c = 0;
    if (!scale || !uses.only_used_by(erf.inputs[0], node_index(g, &erf)) || !scalar_weight(g, scale->inputs[1], &c) ||
        !((scale->op == "Div" && near(c, std::sqrt(2.0))) || (scale->op == "Mul" && near(c, std::sqrt(0.5)))))
      return ir::kNoValue;
    inner.push_back(scale);
    return scale->inputs[0];
  }

  // sqrt(2/pi) * (x + 0.044715 * x^3), every intermediate read once; returns x.
  static ir::ValueId match_tanh_argument(const ir::Graph& g, const ir::Uses& uses, const ir::Node& tanh,
                                         std::vector<const ir::Node*>& inner) {
    const double kSqrt2OverPi = std::sqrt(2.0 / std::numbers::pi);
    double c = 0;
    const ir::Node* s = single_use_producer(g, uses, tanh.inputs[0], "Mul", node_index(g, &tanh));
    if (!s || !scalar_weight(g, s->inputs[1], &c) || !near(c, kSqrt2OverPi)) return ir::kNoValue;
    const ir::Node* r = single_use_producer(g, uses, s->inputs[0], "Add", node_index(g, s));
    if (!r) return ir::kNoValue;
    for (int side = 0; side < 2; ++side) {
      const ir::ValueId x = r->inputs[size_t(1 - side)];
      const ir::Node* q = single_use_producer(g, uses, r->inputs[size_t(side)], "Mul", node_index(g, r));
      if (!q || !scalar_weight(g, q->inputs[1], &c) || !near(c, 0.044715)) continue;
      const ir::Node* p = single_use_producer(g, uses, q->inputs[0], "Pow", node_index(g, q));
      if (!p || p->inputs[0] != x || !scalar_weight(g, p->inputs[1], &c) || c != 3) continue;
      inner.insert(inner.end(), {s, r, q, p});
      return x;
    }
    return ir::kNoValue;
  }

  size_t erf_ = 0, tanh_ = 0;
};

}  // namespace

std::unique_ptr<Pass> make_fuse_gelu_pattern_pass() { return std::make_unique<FuseGeluPattern>(); }

}  // namespace kiln::passes
