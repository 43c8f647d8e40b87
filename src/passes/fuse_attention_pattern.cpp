// fuse_attention_pattern: the attention that exporters spell out op by op over 4-D
// [B, H, S, D] tensors,
//   MatMul(q, k^T) -> Div or Mul by a constant -> (Add mask) -> Softmax(-1) -> MatMul(., v)
// becomes one ScaledDotProductAttention node (a generic op: batched tensors and any
// additive mask, which kiln's Attention op, fed ragged token rows and StepInfo with a
// KV cache, does not take). k^T's Transpose is folded into the node's k operand, so
// the [B, H, Sq, Sk] scores are never materialized. Tested in
// tests/passes/attention_fusion_test.cpp and by the ONNX golden tests.
#include "passes/pass.h"
#include "passes/pass_util.h"

namespace kiln::passes {
namespace {

constexpr const char* kName = "fuse_attention_pattern";

bool is_f32_4d(const ir::Graph& g, ir::ValueId v) {
  return g.value(v).dtype == DType::kF32 && g.value(v).shape.rank() == 4;
}

// A single-use Div or Mul by a one-element constant over MatMul scores: the scores
// and the factor that multiplies them (1/c for a Div).
struct Scaled {
  const ir::Node* node = nullptr;
  ir::ValueId scores = ir::kNoValue;
  double scale = 0;
};

Scaled match_scale(const ir::Graph& g, const ir::Uses& uses, ir::ValueId v, int32_t user) {
  Scaled r;
  double c = 0;
  if (const ir::Node* n = single_use_producer(g, uses, v, "Div", user)) {
    if (scalar_weight(g, n->inputs[1], &c) && c != 0) r = {n, n->inputs[0], 1.0 / c};
  } else if (const ir::Node* m = single_use_producer(g, uses, v, "Mul", user)) {
    if (scalar_weight(g, m->inputs[1], &c)) r = {m, m->inputs[0], c};
    else if (scalar_weight(g, m->inputs[0], &c)) r = {m, m->inputs[1], c};
  }
  const ir::Node* p = r.node ? producer(g, r.scores) : nullptr;
  return p && p->op == "MatMul" ? r : Scaled{};
}

class FuseAttentionPattern final : public Pass {
 public:
  const char* name() const override { return kName; }

  bool run(ir::Graph& g) override {
    std::vector<bool> dead(g.nodes().size(), false);
    ir::Uses uses = ir::compute_uses(g);
    size_t fused = 0, masked = 0;
    const size_t n_nodes = g.nodes().size();
    for (size_t i = 0; i < n_nodes; ++i) {
      const ir::Node& sm = g.nodes()[i];
      if (sm.op != "Softmax") continue;
      const int32_t si = int32_t(i);
      const ir::ValueId x = sm.inputs[0];
      const int64_t axis = sm.attr_int("axis", -1);
      if (!is_f32_4d(g, x)) {
        not_fired(kName, sm, "the softmax input is not a 4-D f32 [B, H, Sq, Sk] score tensor");
        continue;
      }
      if (axis != -1 && axis != 3) {
        not_fired(kName, sm, "the softmax is over axis ", axis, ", not the last (key) axis");
        continue;
      }
      const ir::Node* pv = sole_consumer(g, uses, sm.outputs[0]);
      // GPT-2's export casts the f32 probabilities to f32 (the dtype of v).
      const ir::Node* cast = pv && pv->op == "Cast" && pv->attr_str("to", "") == dtype_name(DType::kF32) &&
                                   !pv->attr_int("bool", 0) ? pv : nullptr;
      if (cast) pv = sole_consumer(g, uses, cast->outputs[0]);
      const ir::ValueId probs = cast ? cast->outputs[0] : sm.outputs[0];
      if (!pv || pv->op != "MatMul" || pv->inputs[0] != probs || !is_f32_4d(g, pv->inputs[1])) {
        not_fired(kName, sm, "the probabilities are not read only by MatMul(probs, v) with a 4-D v (",
                  uses.count(probs), " readers", pv ? ", one " + pv->op : std::string(), ")");
        continue;
      }
      // Optional additive mask between the scale and the softmax (either operand order;
      // the mask itself may be a Mul, as BERT's (1 - m) * -10000 is).
      const ir::Node* add = single_use_producer(g, uses, x, "Add", si);
      ir::ValueId mask = ir::kNoValue;
      Scaled sc;
      if (add) {
        for (int side = 0; side < 2 && !sc.node; ++side) {
          sc = match_scale(g, uses, add->inputs[size_t(side)], node_index(g, add));
          mask = add->inputs[size_t(1 - side)];
        }
        if (sc.node && (g.value(mask).dtype != DType::kF32 || g.value(mask).shape.rank() > 4)) {
          not_fired(kName, sm, "the mask ", g.value(mask).shape.str(), " is not f32 of rank <= 4");
          continue;
        }
      } else {
        sc = match_scale(g, uses, x, si);
      }
      if (!sc.node) {
        not_fired(kName, sm, "the scores are not MatMul(q, k^T) scaled by Div or Mul with a one-element constant",
                  add ? " (before the mask Add)" : "");
        continue;
      }
      const double c = sc.scale;
      const ir::ValueId scores = sc.scores;
      const ir::Node* qk = single_use_producer(g, uses, scores, "MatMul", node_index(g, sc.node));
      if (!qk || !is_f32_4d(g, qk->inputs[0]) || !is_f32_4d(g, qk->inputs[1])) {
        not_fired(kName, sm, "the scaled scores are not MatMul(q, k^T) of 4-D operands");
        continue;
      }
      // Everything the rewrite needs, read before g.add() may move the node list.
      const ir::ValueId q = qk->inputs[0], kt = qk->inputs[1], v = pv->inputs[1], out = pv->outputs[0];
      const std::string scope = name_scope(qk->name);
      std::vector<const ir::Node*> swallowed = {qk, sc.node, &sm, pv};
      if (add) swallowed.push_back(add);
      if (cast) swallowed.push_back(cast);
      for (const ir::Node* n : swallowed) dead[size_t(node_index(g, n))] = true;
      // k = Transpose(k^T, [0,1,3,2]), composed with a Transpose that made k^T.
      ir::ValueId k = kt;
      std::vector<int64_t> perm = {0, 1, 3, 2};
      if (const ir::Node* t = producer(g, kt); t && t->op == "Transpose" && t->has_attr("perm")) {
        auto tp = std::get<std::vector<int64_t>>(t->attrs.at("perm"));
        if (tp.size() == 4) {
          perm = {tp[0], tp[1], tp[3], tp[2]};
          k = t->inputs[0];
        }
      }
      if (perm != std::vector<int64_t>{0, 1, 2, 3}) k = g.add("Transpose", {k}, {{"perm", perm}}, scope + "sdpa_k");
      std::vector<ir::ValueId> ins = {q, k, v};
      if (mask != ir::kNoValue) ins.push_back(mask);
      ir::ValueId y = g.add("ScaledDotProductAttention", ins, {{"scale", c}}, scope + "ScaledDotProductAttention");
      g.replace_uses(out, y);
      ++fused;
      masked += mask != ir::kNoValue;
    }
    if (!fused) {
      stats_.clear();
      return false;
    }
    ir::finish_rewrite(g, dead);
    stats_ = str_cat("fused ", fused, " op-by-op attentions (", masked, " with a mask)");
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> make_fuse_attention_pattern_pass() { return std::make_unique<FuseAttentionPattern>(); }

}  // namespace kiln::passes
