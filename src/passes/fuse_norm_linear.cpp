// Norm and residual add folded into the Linears around them (pre-norm decoder blocks):
//   y = Linear(a); s, n = AddNorm(y, r); z = Linear(n)
// becomes
//   s = Linear{residual r}(a); z = Linear{norm}(s)
// The Linear before the add writes the residual stream itself (xWᵀ + b + r in its
// epilogue), and every Linear reading the norm normalizes its own input rows (attr
// norm = rms | layer, norm_eps; inputs 4-5 the norm's gamma/beta) before the product,
// so the norm's output is never stored and the AddNorm node disappears. A plain norm
// (no add in front: a first layer's input norm) folds its norm half only. Fires only
// when every reader of the norm's output is a Linear (directly, or through a row
// GatherRows, which commutes with a row norm); a graph output reading the norm keeps a
// norm node of its own (steps that do not ask for that output skip it). Backends that
// gain from it claim it (CUDA: the decode GEMV normalizes its few rows in shared memory);
// quantization flows leave it off (runtime/model.cpp), since their rewrites look for
// the norm in front of a Linear. Tested in tests/passes/fusion_test.cpp.
#include "passes/pass.h"
#include "passes/pass_util.h"

namespace kiln::passes {
namespace {

constexpr const char* kName = "fuse_norm_linear";

bool is_norm(const std::string& op) {
  return op == "RMSNorm" || op == "LayerNorm" || op == "AddRMSNorm" || op == "AddLayerNorm";
}

class FuseNormLinear final : public Pass {
 public:
  const char* name() const override { return kName; }

  bool run(ir::Graph& g) override {
    std::vector<bool> dead(g.nodes().size(), false);
    size_t norms = 0, prologues = 0, residuals = 0, kept = 0;
    const size_t n_nodes = g.nodes().size();
    for (size_t i = 0; i < n_nodes; ++i) {
      if (!is_norm(g.nodes()[i].op)) continue;
      const ir::Uses uses = ir::compute_uses(g);  // earlier rewrites moved readers
      Match m;
      if (!match(g, uses, int32_t(i), m)) continue;
      rewrite(g, int32_t(i), m, dead);
      ++norms;
      prologues += m.linears.size();
      residuals += m.residual_linear >= 0;
      kept += m.keep_for_output;
    }
    if (!norms) {
      stats_.clear();
      return false;
    }
    ir::finish_rewrite(g, dead);
    stats_ = str_cat("folded ", norms, " norms into ", prologues, " Linear prologues and ", residuals,
                     " residual adds into Linear epilogues");
    if (kept) stats_ += str_cat(" (", kept, " norms kept for graph outputs)");
    return true;
  }

 private:
  struct Match {
    std::vector<int32_t> linears;  // Linears that normalize their input
    std::vector<int32_t> gathers;  // GatherRows between the norm and some of them
    int32_t residual_linear = -1;  // the Linear that adds the residual (AddNorm only)
    ir::ValueId residual = ir::kNoValue;
    bool keep_for_output = false;  // the normalized rows are also a graph output
  };

  // A Linear that may take the norm into its prologue: reads `v` as x only, has none yet.
  static bool prologue_ok(const ir::Node& l, ir::ValueId v) {
    if (l.op != "Linear" || l.inputs[0] != v || l.has_attr("norm")) return false;
    for (size_t j = 1; j < l.inputs.size(); ++j)
      if (l.inputs[j] == v) return false;
    return true;
  }

  static bool match(const ir::Graph& g, const ir::Uses& uses, int32_t ni, Match& m) {
    const ir::Node& norm = g.nodes()[size_t(ni)];
    const bool add = norm.op[0] == 'A';
    const ir::ValueId normed = norm.outputs[add ? 1 : 0];
    for (int32_t c : uses.consumers[size_t(normed)]) {
      const ir::Node& r = g.nodes()[size_t(c)];
      if (prologue_ok(r, normed)) {
        m.linears.push_back(c);
        continue;
      }
      if (r.op == "GatherRows" && r.inputs[0] == normed && r.inputs[1] != normed &&
          !uses.is_output[size_t(r.outputs[0])] && !uses.consumers[size_t(r.outputs[0])].empty()) {
        bool all = true;
        for (int32_t gc : uses.consumers[size_t(r.outputs[0])]) all = all && prologue_ok(g.nodes()[size_t(gc)], r.outputs[0]);
        if (all) {
          m.gathers.push_back(c);
          for (int32_t gc : uses.consumers[size_t(r.outputs[0])]) m.linears.push_back(gc);
          continue;
        }
      }
      return not_fired(kName, norm, "its output is read by ", r.op, " '", r.name, "', not only by Linears"), false;
    }
    if (m.linears.empty()) return not_fired(kName, norm, "no Linear reads its output"), false;
    m.keep_for_output = uses.is_output[size_t(normed)];
    if (!add) return true;
    // The residual add goes into the epilogue of the Linear producing one addend, which
    // nothing else may read (its output becomes the sum).
    for (size_t j : {size_t(1), size_t(0)}) {
      const ir::Node* lin = producer(g, norm.inputs[j]);
      if (!lin || lin->op != "Linear" || !uses.only_used_by(norm.inputs[j], ni) || lin->input(3) != ir::kNoValue)
        continue;
      m.residual_linear = node_index(g, lin);
      m.residual = norm.inputs[1 - j];
      return true;
    }
    // Folding the norm alone would trade the AddNorm kernel for an Add kernel: no gain.
    return not_fired(kName, norm, "neither addend is a Linear output read only by the add"), false;
  }

  static void rewrite(ir::Graph& g, int32_t ni, const Match& m, std::vector<bool>& dead) {
    const ir::Node norm = g.nodes()[size_t(ni)];  // a copy: add_node may reallocate
    const bool add = norm.op[0] == 'A';
    const bool rms = norm.op == "RMSNorm" || norm.op == "AddRMSNorm";
    const ir::ValueId gamma = norm.inputs[add ? 2 : 1];
    const ir::ValueId beta = rms ? ir::kNoValue : norm.input(add ? 3 : 2);
    const double eps = norm.attr_float("eps");
    const ir::ValueId normed = norm.outputs[add ? 1 : 0];
    // The un-normalized rows: the sum, written by the residual Linear from now on.
    ir::ValueId src = norm.inputs[0];
    if (add) {
      ir::Node& lin = g.nodes()[size_t(m.residual_linear)];
      lin.inputs.resize(std::max<size_t>(lin.inputs.size(), 4), ir::kNoValue);
      lin.inputs[3] = m.residual;
      src = lin.outputs[0];
      g.replace_uses(norm.outputs[0], src);
    }
    for (int32_t gi : m.gathers) g.nodes()[size_t(gi)].inputs[0] = src;
    for (int32_t li : m.linears) {
      ir::Node& l = g.nodes()[size_t(li)];
      if (l.inputs[0] == normed) l.inputs[0] = src;
      l.inputs.resize(6, ir::kNoValue);
      l.inputs[4] = gamma;
      l.inputs[5] = beta;
      l.attrs["norm"] = std::string(rms ? "rms" : "layer");
      l.attrs["norm_eps"] = eps;
    }
    dead[size_t(ni)] = true;
    if (m.keep_for_output) {
      std::vector<ir::ValueId> in = {src, gamma};
      if (beta != ir::kNoValue) in.push_back(beta);
      const ir::ValueId out = g.add(rms ? "RMSNorm" : "LayerNorm", in, {{"eps", eps}}, norm.name);
      g.replace_uses(normed, out);  // only graph outputs still read it
    }
  }
};

}  // namespace

std::unique_ptr<Pass> make_fuse_norm_linear_pass() { return std::make_unique<FuseNormLinear>(); }

}  // namespace kiln::passes
