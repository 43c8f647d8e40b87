// Common-subexpression elimination: two side-effect-free nodes with the same op, the
// same inputs and the same attributes compute the same values, so the later one's
// readers are pointed at the earlier one. Weights count as equal only by identity (the
// same value), never by content. Tested in tests/passes/cleanup_test.cpp.
#include <map>
#include <sstream>

#include "ir/rewrite.h"
#include "passes/pass.h"

namespace kiln::passes {
namespace {

std::string node_key(const ir::Node& n) {
  std::ostringstream os;
  os << n.op << '(';
  for (ir::ValueId v : n.inputs) os << v << ',';
  os << "){";
  for (auto& [k, a] : n.attrs) {
    os << k << '=' << a.index() << ':';
    std::visit([&](const auto& x) {
      using T = std::decay_t<decltype(x)>;
      if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, double> || std::is_same_v<T, std::string>)
        os << x;
      else
        for (auto& e : x) os << e << ' ';
    }, a);
    os << ';';
  }
  return os.str();
}

class CommonSubexpressionElimination final : public Pass {
 public:
  const char* name() const override { return "cse"; }
  bool run(ir::Graph& g) override {
    std::map<std::string, size_t> seen;
    std::vector<bool> dead(g.nodes().size(), false);
    size_t merged = 0;
    for (size_t i = 0; i < g.nodes().size(); ++i) {
      const ir::Node& n = g.nodes()[i];
      if (ir::has_side_effects(n)) continue;
      auto [it, fresh] = seen.emplace(node_key(n), i);
      if (fresh) continue;
      // Nodes are in topological order, so redirecting to the earlier twin keeps it.
      const ir::Node& twin = g.nodes()[it->second];
      for (size_t o = 0; o < n.outputs.size(); ++o) g.replace_uses(n.outputs[o], twin.outputs[o]);
      dead[i] = true;
      ++merged;
    }
    if (!merged) {
      stats_.clear();
      return false;
    }
    ir::finish_rewrite(g, dead);
    stats_ = str_cat("merged ", merged, " duplicate nodes");
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> make_cse_pass() { return std::make_unique<CommonSubexpressionElimination>(); }

}  // namespace kiln::passes
