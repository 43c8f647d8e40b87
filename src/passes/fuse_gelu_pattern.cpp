// fuse_gelu_pattern: the erf GELU that exporters spell out op by op,
// x * (erf(x / sqrt(2)) + 1) * 0.5 (also with x * 0.7071 and the factors in either
// order), becomes one Gelu node (approximate = none), the fused kernel.
// Tested in tests/passes/pattern_fusion_test.cpp and by the ONNX golden tests.
#include <cmath>

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
    const size_t n_nodes = g.nodes().size();
    for (size_t i = 0; i < n_nodes; ++i) {
      const ir::Node& erf = g.nodes()[i];
      if (erf.op != "Erf") continue;
      const ir::Node* scale = producer(g, erf.inputs[0]);
      double c = 0;
      bool scaled = scale && uses.only_used_by(erf.inputs[0], int32_t(i)) && scalar_weight(g, scale->inputs[1], &c) &&
                    ((scale->op == "Div" && near(c, std::sqrt(2.0))) || (scale->op == "Mul" && near(c, std::sqrt(0.5))));
      if (!scaled) {
        not_fired(kName, erf, "its input is not x / sqrt(2)");
        continue;
      }
      const ir::ValueId x = scale->inputs[0];
      const ir::Node* add = sole_consumer(g, uses, erf.outputs[0]);
      double one = 0;
      if (!add || add->op != "Add" || !scalar_weight(g, other_input(*add, erf.outputs[0]), &one) || one != 1) {
        not_fired(kName, erf, "erf(...) is not followed by + 1");
        continue;
      }
      // x * (1 + erf) * 0.5, or (0.5 * x) * (1 + erf).
      const ir::Node* m1 = sole_consumer(g, uses, add->outputs[0]);
      if (!m1 || m1->op != "Mul") continue;
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
        not_fired(kName, erf, "the product is not x * (1 + erf(x / sqrt(2))) * 0.5");
        continue;
      }
      for (const ir::Node* n : {scale, &erf, add, m1, half}) dead[size_t(node_index(g, n))] = true;
      ir::ValueId gelu = g.add("Gelu", {x}, {{"approximate", std::string("none")}}, name_scope(erf.name) + "Gelu");
      g.replace_uses(out, gelu);
      ++fused;
    }
    if (!fused) {
      stats_.clear();
      return false;
    }
    ir::finish_rewrite(g, dead);
    stats_ = str_cat("fused ", fused, " op-by-op erf GELUs");
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> make_fuse_gelu_pattern_pass() { return std::make_unique<FuseGeluPattern>(); }

}  // namespace kiln::passes
