// Q/K/V merge + packed attention: three Linears of one input feeding Attention (through
// Rope for q and k, in Llama-style models) become one Linear with the weights stacked
// [Wq; Wk; Wv] and one Attention{packed_qkv=1} that takes the [T, (hq+2hkv)*d] result
// and, when there was a Rope, positions + inv_freq (RoPE is applied inside the op, so
// backends keep one simple rope kernel on contiguous q and k). One GEMM instead of
// three reads the activations once and launches once. Per-head q/k norms before the
// Ropes (Qwen3's HeadRMSNorm) become one HeadRMSNorm over the packed row's q and k heads
// (each head's weight stacked; v copied). Tested in tests/passes/fusion_test.cpp.
#include "passes/pass.h"
#include "passes/pass_util.h"

namespace kiln::passes {
namespace {

constexpr const char* kName = "fuse_qkv_attention";

class FuseQkvAttention final : public Pass {
 public:
  const char* name() const override { return kName; }

  bool run(ir::Graph& g) override {
    std::vector<bool> dead(g.nodes().size(), false);
    size_t fused = 0, with_rope = 0;
    const size_t n_nodes = g.nodes().size();
    for (size_t i = 0; i < n_nodes; ++i) {
      if (g.nodes()[i].op != "Attention" || g.nodes()[i].attr_int("packed_qkv", 0)) continue;
      ir::Uses uses = ir::compute_uses(g);
      Match m;
      if (!match(g, uses, int32_t(i), m)) continue;
      rewrite(g, int32_t(i), m, dead);
      ++fused;
      with_rope += m.rope[0] != nullptr;
    }
    if (!fused) {
      stats_.clear();
      return false;
    }
    ir::finish_rewrite(g, dead);
    stats_ = str_cat("fused ", fused, " Q/K/V projections into packed Attention (", with_rope, " with RoPE)");
    return true;
  }

 private:
  struct Match {
    const ir::Node* lin[3] = {};   // q, k, v projections
    const ir::Node* rope[2] = {};  // q, k ropes (both or neither)
    const ir::Node* norm[2] = {};  // q, k HeadRMSNorms before the ropes (both or neither)
  };

  static bool match(const ir::Graph& g, const ir::Uses& uses, int32_t att_idx, Match& m) {
    const ir::Node& att = g.nodes()[size_t(att_idx)];
    for (int r = 0; r < 2; ++r) {
      m.rope[r] = single_use_producer(g, uses, att.inputs[size_t(r)], "Rope", att_idx);
    }
    if ((m.rope[0] == nullptr) != (m.rope[1] == nullptr))
      return not_fired(kName, att, "only one of q and k goes through a single-use Rope"), false;
    for (int r = 0; r < 2 && m.rope[0]; ++r)
      m.norm[r] = single_use_producer(g, uses, m.rope[r]->inputs[0], "HeadRMSNorm", node_index(g, m.rope[r]));
    if ((m.norm[0] == nullptr) != (m.norm[1] == nullptr))
      return not_fired(kName, att, "only one of q and k goes through a single-use HeadRMSNorm"), false;
    if (m.norm[0]) {
      const int64_t d = att.attr_int("head_dim");
      for (const ir::Node* nm : m.norm)
        if (nm->has_attr("groups") || nm->attr_int("head_dim") != d || !g.is_weight(nm->inputs[1]) ||
            g.weight(nm->inputs[1]).numel() != d)
          return not_fired(kName, att, "HeadRMSNorm '", nm->name, "' is not one weight of head_dim for every head"),
                 false;
      if (m.norm[0]->attr_float("eps") != m.norm[1]->attr_float("eps") ||
          g.weight(m.norm[0]->inputs[1]).dtype() != g.weight(m.norm[1]->inputs[1]).dtype())
        return not_fired(kName, att, "the q and k HeadRMSNorms differ in eps or weight dtype"), false;
    }
    for (int r = 0; r < 3; ++r) {
      const ir::Node* before = r < 2 ? (m.norm[r] ? m.norm[r] : m.rope[r]) : nullptr;  // what reads the projection
      ir::ValueId v = before ? before->inputs[0] : att.inputs[size_t(r)];
      int32_t user = before ? node_index(g, before) : att_idx;
      m.lin[r] = single_use_producer(g, uses, v, "Linear", user);
      if (!m.lin[r]) return not_fired(kName, att, "input ", r, " is not a single-use Linear"), false;
      if (m.lin[r]->has_attr("activation"))
        return not_fired(kName, att, "projection '", m.lin[r]->name, "' has an activation epilogue"), false;
      if (!g.is_weight(m.lin[r]->inputs[1]))
        return not_fired(kName, att, "projection '", m.lin[r]->name, "' has a computed weight"), false;
    }
    if (m.lin[1]->inputs[0] != m.lin[0]->inputs[0] || m.lin[2]->inputs[0] != m.lin[0]->inputs[0])
      return not_fired(kName, att, "q, k and v project different inputs"), false;
    const bool bias = m.lin[0]->input(2) != ir::kNoValue;
    for (int r = 1; r < 3; ++r)
      if ((m.lin[r]->input(2) != ir::kNoValue) != bias)
        return not_fired(kName, att, "only some of q, k, v have a bias"), false;
    for (int r = 1; r < 3; ++r)
      if (g.weight(m.lin[r]->inputs[1]).dtype() != g.weight(m.lin[0]->inputs[1]).dtype() ||
          !same_weight_quant(*m.lin[r], *m.lin[0]))
        return not_fired(kName, att, "q, k, v weights have different dtypes"), false;
    if (m.rope[0]) {
      const ir::Node &rq = *m.rope[0], &rk = *m.rope[1];
      const int64_t d = att.attr_int("head_dim");
      if (rq.inputs[1] != rk.inputs[1] || rq.inputs[2] != rk.inputs[2])
        return not_fired(kName, att, "q and k Ropes use different positions or frequencies"), false;
      if (rq.attr_int("head_dim") != d || rk.attr_int("head_dim") != d ||
          rq.attr_int("rotary_dim", d) != rk.attr_int("rotary_dim", d))
        return not_fired(kName, att, "q and k Ropes rotate different head shapes"), false;
    }
    return true;
  }

  static void rewrite(ir::Graph& g, int32_t att_idx, const Match& m, std::vector<bool>& dead) {
    // Copy what we need: add_node may reallocate the node vector.
    const ir::Node att = g.nodes()[size_t(att_idx)];
    const std::string scope = name_scope(att.name);
    std::vector<ir::ValueId> w, b;
    for (auto* l : m.lin) {
      w.push_back(l->inputs[1]);
      b.push_back(l->input(2));
    }
    ir::ValueId x = m.lin[0]->inputs[0];
    const auto quant_attrs = weight_quant_attrs(*m.lin[0]);
    std::vector<ir::ValueId> rope_in;
    int64_t rotary_dim = 0;
    if (m.rope[0]) {
      rope_in = {m.rope[0]->inputs[1], m.rope[0]->inputs[2]};
      rotary_dim = m.rope[0]->attr_int("rotary_dim", att.attr_int("head_dim"));
    }
    for (auto* l : m.lin) dead[size_t(node_index(g, l))] = true;
    for (auto* r : m.rope)
      if (r) dead[size_t(node_index(g, r))] = true;
    // The q and k norms: each head's weight, hq q heads then hkv k heads.
    std::vector<ir::ValueId> norm_w;
    double norm_eps = 0;
    if (m.norm[0]) {
      norm_w.assign(size_t(att.attr_int("num_heads")), m.norm[0]->inputs[1]);
      norm_w.insert(norm_w.end(), size_t(att.attr_int("num_kv_heads")), m.norm[1]->inputs[1]);
      norm_eps = m.norm[0]->attr_float("eps");
      for (auto* nm : m.norm) dead[size_t(node_index(g, nm))] = true;
    }
    dead[size_t(att_idx)] = true;

    std::vector<ir::ValueId> lin_in = {x, concat_weights(g, w, scope + "qkv_proj.weight")};
    if (b[0] != ir::kNoValue) lin_in.push_back(concat_weights(g, b, scope + "qkv_proj.bias"));
    ir::ValueId qkv = g.add("Linear", lin_in, quant_attrs, scope + "qkv_proj");
    if (!norm_w.empty())
      qkv = g.add("HeadRMSNorm", {qkv, concat_weights(g, norm_w, scope + "qk_norm.weight")},
                  {{"eps", norm_eps}, {"head_dim", att.attr_int("head_dim")}, {"groups", int64_t(norm_w.size())}},
                  scope + "qk_norm");
    auto attrs = att.attrs;
    attrs["packed_qkv"] = int64_t(1);
    std::vector<ir::ValueId> att_in = {qkv};
    if (!rope_in.empty()) {
      att_in.insert(att_in.end(), rope_in.begin(), rope_in.end());
      attrs["rotary_dim"] = rotary_dim;
    }
    ir::ValueId out = g.add("Attention", att_in, attrs, att.name);
    g.replace_uses(att.outputs[0], out);
  }
};

}  // namespace

std::unique_ptr<Pass> make_fuse_qkv_attention_pass() { return std::make_unique<FuseQkvAttention>(); }

}  // namespace kiln::passes
