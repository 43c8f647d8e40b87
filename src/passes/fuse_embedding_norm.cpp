// BERT's embeddings: LayerNorm(word[tokens] + position[positions] + token_type[types])
// becomes one EmbeddingLayerNorm node that gathers and sums the rows straight into its
// output and normalizes them there, instead of three gathers, two adds and a norm with
// four [T, H] intermediates. Fires only when every intermediate (each gather and each
// partial sum) is read by this chain alone: GPT-2's wte + wpe sum is also the residual
// stream, so it is left to fuse_add_norm. A table kept as q8/q4 codes (a GGUF's) stays an
// Embedding of its own. Tested in tests/passes/fusion_test.cpp.
#include "passes/pass.h"
#include "passes/pass_util.h"

namespace kiln::passes {
namespace {

constexpr const char* kName = "fuse_embedding_norm";
constexpr size_t kMaxLookups = 3;  // word + position + token type (the op's schema)

class FuseEmbeddingNorm final : public Pass {
 public:
  const char* name() const override { return kName; }

  bool run(ir::Graph& g) override {
    std::vector<bool> dead(g.nodes().size(), false);
    const ir::Uses uses = ir::compute_uses(g);
    size_t fused = 0;
    const size_t n_nodes = g.nodes().size();
    for (size_t i = 0; i < n_nodes; ++i) {
      const ir::Node& norm = g.nodes()[i];
      if (norm.op != "LayerNorm") continue;
      const ir::Node* top = producer(g, norm.inputs[0]);
      if (!top || top->op != "Add") {
        not_fired(kName, norm, "its input is not an Add of Embeddings");
        continue;
      }
      if (!uses.only_used_by(norm.inputs[0], int32_t(i))) {
        not_fired(kName, norm, "the embedding sum %", g.value(norm.inputs[0]).name,
                  " is also read elsewhere (e.g. as the residual stream)");
        continue;
      }
      // Walk the Add tree down to its leaves, left to right (the order the kernel sums).
      std::vector<const ir::Node*> lookups, adds;
      std::string why;
      collect(g, uses, top, lookups, adds, why);
      if (why.empty() && lookups.size() > kMaxLookups)
        why = str_cat(lookups.size(), " embeddings are summed, the fused op takes at most ", kMaxLookups);
      if (!why.empty()) {
        not_fired(kName, norm, why);
        continue;
      }
      std::vector<ir::ValueId> in = {norm.inputs[1], norm.input(2)};
      for (const ir::Node* e : lookups) {
        in.push_back(e->inputs[0]);
        in.push_back(e->inputs[1]);
      }
      const ir::ValueId out = norm.outputs[0];
      const std::string name = norm.name;
      auto attrs = norm.attrs;
      dead[i] = true;
      for (const ir::Node* n : lookups) dead[size_t(node_index(g, n))] = true;
      for (const ir::Node* n : adds) dead[size_t(node_index(g, n))] = true;
      // add_node may reallocate the node list: nothing above is used after it.
      ir::ValueId fused_out = g.add("EmbeddingLayerNorm", in, attrs, name);
      g.replace_uses(out, fused_out);
      ++fused;
    }
    if (!fused) {
      stats_.clear();
      return false;
    }
    ir::finish_rewrite(g, dead);
    stats_ = str_cat("fused ", fused, " Embedding+LayerNorm");
    return true;
  }

 private:
  // Appends the Embedding leaves of the single-use Add tree under `add` to `lookups`
  // (and the Adds to `adds`); sets `why` when the tree is not such a sum.
  static void collect(const ir::Graph& g, const ir::Uses& uses, const ir::Node* add,
                      std::vector<const ir::Node*>& lookups, std::vector<const ir::Node*>& adds,
                      std::string& why) {
    adds.push_back(add);
    const int32_t ai = node_index(g, add);
    if (!(g.value(add->inputs[0]).shape == g.value(add->inputs[1]).shape)) {
      why = str_cat("the Add '", add->name, "' broadcasts");
      return;
    }
    for (ir::ValueId v : add->inputs) {
      if (!why.empty()) return;
      const ir::Node* p = producer(g, v);
      if (!p || (p->op != "Add" && p->op != "Embedding")) {
        why = str_cat("%", g.value(v).name, " is ", p ? "produced by " + p->op : std::string("not computed"),
                      ", not an Embedding or an Add of them");
        return;
      }
      if (!uses.only_used_by(v, ai)) {
        why = str_cat("%", g.value(v).name, " (", p->op, " '", p->name, "') is also read elsewhere");
        return;
      }
      if (p->op == "Add") {
        collect(g, uses, p, lookups, adds, why);
      } else if (!g.is_weight(p->inputs[0])) {
        why = str_cat("the table of '", p->name, "' is computed, not a weight");
      } else if (!p->attr_str("weight_quant", "").empty()) {
        why = str_cat("the table of '", p->name, "' is a ", p->attr_str("weight_quant", ""),
                      " image (a GGUF's codes), which the fused op does not read");
      } else {
        lookups.push_back(p);
      }
    }
  }
};

}  // namespace

std::unique_ptr<Pass> make_fuse_embedding_norm_pass() { return std::make_unique<FuseEmbeddingNorm>(); }

}  // namespace kiln::passes
