// Greedy slot assignment by last use (see memory_plan.h).
#include "backends/memory_plan.h"

#include <algorithm>
#include <limits>

namespace kiln {

MemoryPlan plan_activation_slots(const ir::Graph& graph) {
  const auto& nodes = graph.nodes();
  std::vector<size_t> last_use(graph.num_values(), 0);
  for (size_t i = 0; i < nodes.size(); ++i)
    for (ir::ValueId in : nodes[i].inputs)
      if (in != ir::kNoValue) last_use[size_t(in)] = i;
  for (auto& [name, id] : graph.outputs()) last_use[size_t(id)] = std::numeric_limits<size_t>::max();
  MemoryPlan plan;
  plan.slot_of.assign(graph.num_values(), -1);
  std::vector<int> free_slots;
  for (size_t i = 0; i < nodes.size(); ++i) {
    for (ir::ValueId out : nodes[i].outputs) {
      if (free_slots.empty()) free_slots.push_back(plan.num_slots++);
      plan.slot_of[size_t(out)] = free_slots.back();
      free_slots.pop_back();
      if (last_use[size_t(out)] == 0) last_use[size_t(out)] = i;  // unused output
    }
    // Release after outputs are assigned so no output aliases an input.
    std::vector<ir::ValueId> dying;
    for (ir::ValueId in : nodes[i].inputs)
      if (in != ir::kNoValue && plan.slot_of[size_t(in)] >= 0 && last_use[size_t(in)] == i)
        dying.push_back(in);
    for (ir::ValueId out : nodes[i].outputs)
      if (last_use[size_t(out)] == i) dying.push_back(out);
    std::sort(dying.begin(), dying.end());
    dying.erase(std::unique(dying.begin(), dying.end()), dying.end());
    for (ir::ValueId v : dying) free_slots.push_back(plan.slot_of[size_t(v)]);
  }
  return plan;
}

}  // namespace kiln
