// Residual Add + norm: Norm(Add(a, b)) becomes AddRMSNorm / AddLayerNorm(a, b, w[, bias])
// with two outputs, the sum (the residual stream, which pre-norm blocks keep reading)
// and its norm. The sum is written and normalized in one pass over the row instead of
// two passes and a re-read. Only same-shape adds fuse (not a broadcast bias add).
// Tested in tests/passes/fusion_test.cpp.
#include "passes/pass.h"
#include "passes/pass_util.h"

namespace kiln::passes {
namespace {

constexpr const char* kName = "fuse_add_norm";

class FuseAddNorm final : public Pass {
 public:
  const char* name() const override { return kName; }

  bool run(ir::Graph& g) override {
    std::vector<bool> dead(g.nodes().size(), false);
    size_t rms = 0, ln = 0;
    const size_t n_nodes = g.nodes().size();
    for (size_t i = 0; i < n_nodes; ++i) {
      const ir::Node& norm = g.nodes()[i];
      if (norm.op != "RMSNorm" && norm.op != "LayerNorm") continue;
      const ir::Node* add = producer(g, norm.inputs[0]);
      if (!add || add->op != "Add") {
        not_fired(kName, norm, "its input is not produced by an Add");
        continue;
      }
      const int32_t ai = node_index(g, add);
      if (dead[size_t(ai)]) {
        not_fired(kName, norm, "its Add already fused with another norm");
        continue;
      }
      const ir::Value &a = g.value(add->inputs[0]), &b = g.value(add->inputs[1]);
      if (!(a.shape == b.shape)) {
        not_fired(kName, norm, "the Add broadcasts ", b.shape.str(), " onto ", a.shape.str());
        continue;
      }
      const bool is_rms = norm.op == "RMSNorm";
      std::vector<ir::ValueId> in = {add->inputs[0], add->inputs[1], norm.inputs[1]};
      if (!is_rms && norm.input(2) != ir::kNoValue) in.push_back(norm.inputs[2]);
      const ir::ValueId sum = add->outputs[0], normed = norm.outputs[0];
      const std::string name = norm.name;
      auto attrs = norm.attrs;
      dead[i] = dead[size_t(ai)] = true;
      auto outs = g.add_node(is_rms ? "AddRMSNorm" : "AddLayerNorm", in, attrs, name);
      g.replace_uses(sum, outs[0]);
      g.replace_uses(normed, outs[1]);
      ++(is_rms ? rms : ln);
    }
    if (!rms && !ln) {
      stats_.clear();
      return false;
    }
    ir::finish_rewrite(g, dead);
    stats_ = rms ? str_cat("fused ", rms, " Add+RMSNorm") : "";
    if (ln) stats_ += str_cat(rms ? ", " : "", "fused ", ln, " Add+LayerNorm");
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> make_fuse_add_norm_pass() { return std::make_unique<FuseAddNorm>(); }

}  // namespace kiln::passes
