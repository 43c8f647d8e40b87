// Greedy slot assignment by last use (see memory_plan.h).
#include "backends/memory_plan.h"

#include <algorithm>
#include <limits>

#include "core/status.h"

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
    // Freed in node order (producer, then output position), not by value id: ids are
    // renumbered when an engine is written and read back, and the plan (and so the
    // arena size the builder recorded) must not change with them.
    auto key = [&](ir::ValueId v) {
      const ir::Value& val = graph.value(v);
      const auto& outs = nodes[size_t(val.producer)].outputs;
      return std::make_pair(val.producer, std::find(outs.begin(), outs.end(), v) - outs.begin());
    };
    std::sort(dying.begin(), dying.end(), [&](ir::ValueId a, ir::ValueId b) { return key(a) < key(b); });
    dying.erase(std::unique(dying.begin(), dying.end()), dying.end());
    for (ir::ValueId v : dying) free_slots.push_back(plan.slot_of[size_t(v)]);
  }
  return plan;
}

std::vector<bool> nodes_needed_for(const ir::Graph& graph, const std::vector<std::string>& wanted) {
  const auto& nodes = graph.nodes();
  std::vector<bool> value_needed(graph.num_values(), false), node_needed(nodes.size(), false);
  for (auto& [name, id] : graph.outputs())
    if (wanted.empty() || std::find(wanted.begin(), wanted.end(), name) != wanted.end())
      value_needed[size_t(id)] = true;
  for (const std::string& name : wanted)
    if (graph.find_output(name) == ir::kNoValue) {
      std::string known;
      for (auto& [n, id] : graph.outputs()) known += (known.empty() ? "" : ", ") + n;
      throw_error(ErrorCode::kInvalidArgument, "no graph output named '", name, "' (outputs: ", known, ")");
    }
  // Nodes are in topological order: walk back from the last.
  for (size_t i = nodes.size(); i-- > 0;) {
    const ir::Node& n = nodes[i];
    bool need = n.op == "Attention" || n.op == "AllReduce";
    for (ir::ValueId out : n.outputs) need = need || value_needed[size_t(out)];
    if (!need) continue;
    node_needed[i] = true;
    for (ir::ValueId in : n.inputs)
      if (in != ir::kNoValue) value_needed[size_t(in)] = true;
  }
  return node_needed;
}

MemoryPlanSize memory_plan_size(const ir::Graph& graph, const MemoryPlan& plan,
                                const std::map<std::string, int64_t>& dims) {
  int64_t largest = 1;
  for (auto& [name, v] : dims) largest = std::max(largest, v);
  MemoryPlanSize size;
  size.slot_bytes.assign(size_t(plan.num_slots), 0);
  for (size_t v = 0; v < graph.num_values() && v < plan.slot_of.size(); ++v) {
    if (plan.slot_of[v] < 0) continue;
    const ir::Value& val = graph.value(ir::ValueId(v));
    size_t bytes = dtype_size(val.dtype);
    for (const Dim& d : val.shape.dims()) {
      auto it = d.is_concrete() ? dims.end() : dims.find(d.sym);
      bytes *= size_t(d.is_concrete() ? d.value : it != dims.end() ? it->second : largest);
    }
    size_t& slot = size.slot_bytes[size_t(plan.slot_of[v])];
    slot = std::max(slot, bytes);
  }
  for (size_t b : size.slot_bytes) size.peak_bytes += b;
  return size;
}

}  // namespace kiln
