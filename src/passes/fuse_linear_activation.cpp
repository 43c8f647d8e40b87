// Bias + activation epilogue: Gelu/Silu/SwiGLU(Linear(x)) becomes Linear{activation=...}, so
// a backend applies the activation while the GEMM's output tile is still hot (cuBLASLt
// epilogues on CUDA) and no separate intermediate is planned. Tested in
// tests/passes/fusion_test.cpp.
#include "passes/pass.h"
#include "passes/pass_util.h"

namespace kiln::passes {
namespace {

constexpr const char* kName = "fuse_linear_activation";

// The epilogue name for an activation node, or "" when it has none. SwiGLU (from
// fuse_swiglu, after a merged gate|up Linear) becomes the "swiglu" epilogue, which
// halves the Linear's output.
std::string epilogue_of(const ir::Node& act) {
  if (act.op == "Silu") return "silu";
  if (act.op == "SwiGLU") return "swiglu";
  if (act.op != "Gelu") return "";
  std::string approx = act.attr_str("approximate", "none");
  return approx == "none" ? "gelu_erf" : approx == "tanh" ? "gelu_tanh" : "";
}

class FuseLinearActivation final : public Pass {
 public:
  const char* name() const override { return kName; }

  bool run(ir::Graph& g) override {
    std::vector<bool> dead(g.nodes().size(), false);
    ir::Uses uses = ir::compute_uses(g);
    size_t fused = 0;
    for (size_t i = 0; i < g.nodes().size(); ++i) {
      const ir::Node& act = g.nodes()[i];
      if (act.op != "Gelu" && act.op != "Silu" && act.op != "SwiGLU") continue;
      std::string epi = epilogue_of(act);
      const ir::Node* lin = producer(g, act.inputs[0]);
      if (!lin || lin->op != "Linear") {
        not_fired(kName, act, "its input is not a Linear");
        continue;
      }
      if (!uses.only_used_by(act.inputs[0], int32_t(i)) || lin->has_attr("activation") || epi.empty()) {
        not_fired(kName, act, "the Linear output has other readers or an epilogue already");
        continue;
      }
      ir::Node& l = g.nodes()[size_t(node_index(g, lin))];
      l.attrs["activation"] = epi;
      if (epi == "swiglu") g.value(l.outputs[0]).shape = g.value(act.outputs[0]).shape;  // [T, N/2]
      g.replace_uses(act.outputs[0], l.outputs[0]);
      dead[i] = true;
      ++fused;
    }
    if (!fused) {
      stats_.clear();
      return false;
    }
    ir::finish_rewrite(g, dead);
    stats_ = str_cat("fused ", fused, " activations into Linear epilogues");
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> make_fuse_linear_activation_pass() { return std::make_unique<FuseLinearActivation>(); }

}  // namespace kiln::passes
