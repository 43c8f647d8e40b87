// Gate/up merge + SwiGLU: Mul(Silu(Linear(x, Wg)), Linear(x, Wu)) becomes
// SwiGLU(Linear(x, [Wg; Wu])): one GEMM of twice the width (the activations are read
// once) and one elementwise pass instead of Silu + Mul with an extra intermediate.
// The GELU(tanh) gate (Gemma's MLP) likewise becomes GeGLU(Linear(x, [Wg; Wu])).
// Tested in tests/passes/fusion_test.cpp.
#include "passes/pass.h"
#include "passes/pass_util.h"

namespace kiln::passes {
namespace {

constexpr const char* kName = "fuse_swiglu";

class FuseSwiGlu final : public Pass {
 public:
  const char* name() const override { return kName; }

  bool run(ir::Graph& g) override {
    std::vector<bool> dead(g.nodes().size(), false);
    size_t fused = 0, geglu = 0;
    ir::Uses uses = ir::compute_uses(g);
    const size_t n_nodes = g.nodes().size();
    for (size_t i = 0; i < n_nodes; ++i) {
      const ir::Node& mul = g.nodes()[i];
      if (mul.op != "Mul") continue;
      const int32_t mi = int32_t(i);
      const ir::Node *silu = nullptr, *gate = nullptr, *up = nullptr;
      for (int side = 0; side < 2 && !silu; ++side) {
        silu = single_use_producer(g, uses, mul.inputs[size_t(side)], "Silu", mi);
        if (!silu) {
          // GELU(tanh) gates (Gemma): GeGLU; the erf GELU has no fused op.
          silu = single_use_producer(g, uses, mul.inputs[size_t(side)], "Gelu", mi);
          if (silu && silu->attr_str("approximate", "none") != "tanh") silu = nullptr;
        }
        if (silu) up = single_use_producer(g, uses, mul.inputs[size_t(1 - side)], "Linear", mi);
      }
      if (!silu) continue;  // not a gated MLP: nothing to say
      const char* fused_op = silu->op == "Silu" ? "SwiGLU" : "GeGLU";
      gate = single_use_producer(g, uses, silu->inputs[0], "Linear", node_index(g, silu));
      if (!gate || !up) {
        not_fired(kName, mul, "gate or up is not a single-use Linear");
        continue;
      }
      if (gate->inputs[0] != up->inputs[0]) {
        not_fired(kName, mul, "gate and up project different inputs");
        continue;
      }
      if (gate->has_attr("activation") || up->has_attr("activation") || !g.is_weight(gate->inputs[1]) ||
          !g.is_weight(up->inputs[1]) || (gate->input(2) == ir::kNoValue) != (up->input(2) == ir::kNoValue) ||
          g.weight(gate->inputs[1]).dtype() != g.weight(up->inputs[1]).dtype() || !same_weight_quant(*gate, *up)) {
        not_fired(kName, mul, "gate and up differ in epilogue, bias or weight kind");
        continue;
      }
      const std::string mul_name = mul.name, scope = name_scope(mul.name);
      const ir::ValueId x = gate->inputs[0], mul_out = mul.outputs[0];
      const auto quant_attrs = weight_quant_attrs(*gate);
      const ir::ValueId wg = gate->inputs[1], wu = up->inputs[1], bg = gate->input(2), bu = up->input(2);
      for (const ir::Node* n : {&mul, silu, gate, up}) dead[size_t(node_index(g, n))] = true;
      std::vector<ir::ValueId> in = {x, concat_weights(g, {wg, wu}, scope + "gate_up_proj.weight")};
      if (bg != ir::kNoValue) in.push_back(concat_weights(g, {bg, bu}, scope + "gate_up_proj.bias"));
      ir::ValueId gu = g.add("Linear", in, quant_attrs, scope + "gate_up_proj");
      g.replace_uses(mul_out, g.add(fused_op, {gu}, {}, mul_name));
      ++fused;
      geglu += std::string(fused_op) == "GeGLU";
      uses = ir::compute_uses(g);  // the rewrite redirected readers
    }
    if (!fused) {
      stats_.clear();
      return false;
    }
    ir::finish_rewrite(g, dead);
    stats_ = geglu == 0 ? str_cat("fused ", fused, " gate/up Linears + Silu*Mul into SwiGLU")
             : geglu == fused ? str_cat("fused ", fused, " gate/up Linears + Gelu(tanh)*Mul into GeGLU")
                              : str_cat("fused ", fused - geglu, " gate/up Linears + Silu*Mul into SwiGLU and ", geglu,
                                        " + Gelu(tanh)*Mul into GeGLU");
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> make_fuse_swiglu_pass() { return std::make_unique<FuseSwiGlu>(); }

}  // namespace kiln::passes
