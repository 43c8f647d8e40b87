// Graph rewrite helpers (see rewrite.h).
#include "ir/rewrite.h"

#include <queue>

#include "core/status.h"

namespace kiln::ir {

Uses compute_uses(const Graph& g) {
  Uses u;
  u.consumers.resize(g.num_values());
  u.is_output.assign(g.num_values(), false);
  for (size_t i = 0; i < g.nodes().size(); ++i)
    for (ValueId v : g.nodes()[i].inputs)
      if (v != kNoValue) u.consumers[size_t(v)].push_back(int32_t(i));
  for (auto& [name, v] : g.outputs()) u.is_output[size_t(v)] = true;
  return u;
}

bool has_side_effects(const Node& n) { return n.op == "Attention"; }

namespace {
void refresh_producers(Graph& g) {
  for (size_t i = 0; i < g.nodes().size(); ++i)
    for (ValueId v : g.nodes()[i].outputs) g.value(v).producer = int32_t(i);
}
}  // namespace

void remove_nodes(Graph& g, const std::vector<bool>& dead) {
  KILN_CHECK(dead.size() == g.nodes().size(), "dead mask size ", dead.size(), " vs ", g.nodes().size());
  std::vector<Node> kept;
  for (size_t i = 0; i < dead.size(); ++i)
    if (!dead[i]) kept.push_back(std::move(g.nodes()[i]));
  g.nodes() = std::move(kept);
  refresh_producers(g);
}

void topo_sort(Graph& g) {
  auto& nodes = g.nodes();
  const size_t n = nodes.size();
  std::vector<int32_t> producer(g.num_values(), -1);
  for (size_t i = 0; i < n; ++i)
    for (ValueId v : nodes[i].outputs) producer[size_t(v)] = int32_t(i);
  std::vector<int> pending(n, 0);
  std::vector<std::vector<int32_t>> users(n);
  for (size_t i = 0; i < n; ++i)
    for (ValueId v : nodes[i].inputs)
      if (v != kNoValue && producer[size_t(v)] >= 0) {
        ++pending[i];
        users[size_t(producer[size_t(v)])].push_back(int32_t(i));
      }
  // Smallest original index first keeps the order stable.
  std::priority_queue<int32_t, std::vector<int32_t>, std::greater<>> ready;
  for (size_t i = 0; i < n; ++i)
    if (!pending[i]) ready.push(int32_t(i));
  std::vector<int32_t> order;
  while (!ready.empty()) {
    int32_t i = ready.top();
    ready.pop();
    order.push_back(i);
    for (int32_t u : users[size_t(i)])
      if (--pending[size_t(u)] == 0) ready.push(u);
  }
  if (order.size() != n) {
    for (size_t i = 0; i < n; ++i)
      if (pending[i])
        throw_error(ErrorCode::kInvalidArgument, "graph has a cycle through node '", nodes[i].name, "'");
  }
  std::vector<Node> sorted;
  sorted.reserve(n);
  for (int32_t i : order) sorted.push_back(std::move(nodes[size_t(i)]));
  nodes = std::move(sorted);
  refresh_producers(g);
}

size_t dead_code_elim(Graph& g) {
  size_t removed = 0;
  for (;;) {
    Uses u = compute_uses(g);
    std::vector<bool> dead(g.nodes().size(), false);
    size_t now = 0;
    for (size_t i = 0; i < g.nodes().size(); ++i) {
      const Node& n = g.nodes()[i];
      if (has_side_effects(n)) continue;
      bool used = false;
      for (ValueId v : n.outputs) used = used || u.count(v) > 0;
      if (!used) {
        dead[i] = true;
        ++now;
      }
    }
    if (!now) return removed;
    remove_nodes(g, dead);
    removed += now;
  }
}

void finish_rewrite(Graph& g, const std::vector<bool>& dead) {
  std::vector<bool> mask = dead;
  mask.resize(g.nodes().size(), false);  // nodes appended by the pass are live
  remove_nodes(g, mask);
  dead_code_elim(g);
  topo_sort(g);
  g.compact();
  verify(g);
}

}  // namespace kiln::ir
