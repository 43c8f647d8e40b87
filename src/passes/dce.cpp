// Dead-code elimination: removes nodes whose outputs nobody reads (Attention stays, it
// writes the KV cache) and the weights only they used. Tested in tests/passes/cleanup_test.cpp.
#include "ir/rewrite.h"
#include "passes/pass.h"

namespace kiln::passes {
namespace {

class DeadCodeElimination final : public Pass {
 public:
  const char* name() const override { return "dce"; }
  bool run(ir::Graph& g) override {
    size_t values = g.num_values();
    size_t removed = ir::dead_code_elim(g);
    g.compact();
    size_t dropped = values - g.num_values();
    stats_ = removed || dropped ? str_cat("removed ", removed, " nodes, ", dropped, " values") : "";
    return removed || dropped;
  }
};

}  // namespace

std::unique_ptr<Pass> make_dce_pass() { return std::make_unique<DeadCodeElimination>(); }

}  // namespace kiln::passes
