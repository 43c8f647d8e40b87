// Tensor-parallel sharding of a faithful graph (see tensor_parallel.h).
#include "parallel/tensor_parallel.h"

#include <cstring>
#include <map>
#include <set>

#include "core/log.h"
#include "core/status.h"

namespace kiln {

namespace {

enum class Split { kNone, kColumns /* output rows */, kRows /* input columns */ };

struct Plan {
  // Per Linear node: how its weight is split; for column splits, how the rows map to
  // this rank (a list of [begin, end) row ranges of the full weight).
  std::map<size_t, Split> split;
  std::map<size_t, std::vector<std::pair<int64_t, int64_t>>> rows;
};

const std::set<std::string> kElementwise = {"Gelu", "Silu", "Mul"};

// The node producing value v, or -1.
int producer(const ir::Graph& g, ir::ValueId v) {
  return v == ir::kNoValue ? -1 : g.value(v).producer;
}

// Rows [h0 * d, h1 * d) of a per-head weight.
std::vector<std::pair<int64_t, int64_t>> head_rows(int64_t h0, int64_t h1, int64_t d) {
  return {{h0 * d, h1 * d}};
}

Tensor take_rows(const Tensor& t, const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  int64_t rows = 0;
  for (auto& [b, e] : ranges) rows += e - b;
  std::vector<int64_t> shape = t.shape();
  shape[0] = rows;
  Tensor out(DType::kF32, shape);
  const size_t row_bytes = t.nbytes() / size_t(t.dim(0));
  size_t off = 0;
  for (auto& [b, e] : ranges) {
    std::memcpy(static_cast<char*>(out.data()) + off, static_cast<const char*>(t.data()) + size_t(b) * row_bytes,
                size_t(e - b) * row_bytes);
    off += size_t(e - b) * row_bytes;
  }
  return out;
}

Tensor take_columns(const Tensor& t, int64_t c0, int64_t c1) {
  const int64_t rows = t.dim(0), cols = t.dim(1);
  Tensor out(DType::kF32, {rows, c1 - c0});
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(out.data_as<float>() + r * (c1 - c0), t.data_as<float>() + r * cols + c0,
                size_t(c1 - c0) * sizeof(float));
  return out;
}

}  // namespace

BuiltModel shard_tensor_parallel(const BuiltModel& model, int rank, int world) {
  KILN_THROW_IF(world < 1 || rank < 0 || rank >= world, kInvalidArgument, "tensor parallel rank ",
                rank, " of ", world);
  const ir::Graph& g = model.graph;
  const auto& nodes = g.nodes();
  Plan plan;
  std::map<size_t, std::map<std::string, ir::Attr>> new_attrs;  // Rope / Attention heads

  for (size_t i = 0; i < nodes.size(); ++i) {
    const ir::Node& n = nodes[i];
    if (n.op == "Attention") {
      const int64_t hq = n.attr_int("num_heads"), hkv = n.attr_int("num_kv_heads"), d = n.attr_int("head_dim");
      if (hq % world)
        throw_error(ErrorCode::kUnsupported, "tensor parallel: ", hq, " attention heads do not split over ",
                    world, " ranks");
      if (hkv % world && world % hkv)
        throw_error(ErrorCode::kUnsupported, "tensor parallel: ", hkv, " K/V heads neither split over nor ",
                    "replicate across ", world, " ranks");
      const int64_t q0 = rank * hq / world, q1 = (rank + 1) * hq / world;
      // K/V heads of this rank: a slice when they divide, else the one its Q heads use.
      int64_t k0, k1;
      if (hkv % world == 0) k0 = rank * hkv / world, k1 = (rank + 1) * hkv / world;
      else k0 = q0 / (hq / hkv), k1 = k0 + 1;
      const int64_t local_q = q1 - q0, local_kv = k1 - k0;
      new_attrs[i] = {{"num_heads", local_q}, {"num_kv_heads", local_kv}};
      for (int j = 0; j < 3; ++j) {
        // Through an optional Rope and per-head norm (Qwen3; one weight for every head,
        // so a rank's heads keep it) to the projecting Linear.
        int p = producer(g, n.inputs[size_t(j)]);
        if (p >= 0 && nodes[size_t(p)].op == "Rope") {
          new_attrs[size_t(p)] = {{"num_heads", j == 0 ? local_q : local_kv}};
          p = producer(g, nodes[size_t(p)].inputs[0]);
        }
        if (p >= 0 && nodes[size_t(p)].op == "HeadRMSNorm") {
          const ir::Node& nm = nodes[size_t(p)];
          if (nm.has_attr("groups") || !g.is_weight(nm.inputs[1]) || g.weight(nm.inputs[1]).numel() != d)
            throw_error(ErrorCode::kUnsupported, "tensor parallel: '", nm.name,
                        "' does not normalize every head with one weight");
          p = producer(g, nm.inputs[0]);
        }
        if (p < 0 || nodes[size_t(p)].op != "Linear")
          throw_error(ErrorCode::kUnsupported, "tensor parallel: attention '", n.name, "' input ", j,
                      " does not come from a Linear");
        plan.split[size_t(p)] = Split::kColumns;
        plan.rows[size_t(p)] = j == 0 ? head_rows(q0, q1, d) : head_rows(k0, k1, d);
      }
      // The output projection reads the attention output.
      for (size_t c = i + 1; c < nodes.size(); ++c)
        if (nodes[c].op == "Linear" && nodes[c].inputs[0] == n.outputs[0]) plan.split[c] = Split::kRows;
    }
  }
  // MLPs: a Linear fed by an elementwise chain (Gelu/Silu/Mul) of Linears is the down
  // projection; the Linears at the chain's roots are its up/gate projections.
  for (size_t i = 0; i < nodes.size(); ++i) {
    const ir::Node& n = nodes[i];
    if (n.op != "Linear" || plan.split.count(i)) continue;
    std::vector<int> stack = {producer(g, n.inputs[0])}, roots;
    bool ok = stack[0] >= 0 && kElementwise.count(nodes[size_t(stack[0])].op);
    while (ok && !stack.empty()) {
      int p = stack.back();
      stack.pop_back();
      if (p < 0) { ok = false; break; }
      const ir::Node& pn = nodes[size_t(p)];
      if (pn.op == "Linear") roots.push_back(p);
      else if (kElementwise.count(pn.op))
        for (ir::ValueId in : pn.inputs) stack.push_back(producer(g, in));
      else ok = false;
    }
    if (!ok || roots.empty()) continue;
    for (int r : roots) {
      const int64_t inner = g.value(nodes[size_t(r)].inputs[1]).shape[0].value;
      if (inner % world)
        throw_error(ErrorCode::kUnsupported, "tensor parallel: MLP width ", inner, " of '",
                    nodes[size_t(r)].name, "' does not split over ", world, " ranks");
      plan.split[size_t(r)] = Split::kColumns;
      plan.rows[size_t(r)] = {{rank * inner / world, (rank + 1) * inner / world}};
    }
    plan.split[i] = Split::kRows;
  }

  // Rebuild the graph with sharded weights and an AllReduce after each row-parallel Linear.
  BuiltModel out;
  out.info = model.info;
  ir::Graph& h = out.graph;
  h.meta = g.meta;
  std::vector<ir::ValueId> map(g.num_values(), ir::kNoValue);
  for (ir::ValueId v : g.inputs()) map[size_t(v)] = h.add_input(g.value(v).name, g.value(v).dtype, g.value(v).shape);
  std::map<ir::ValueId, ir::ValueId> replicated;  // weights shared as they are
  auto weight = [&](ir::ValueId v) {
    auto it = replicated.find(v);
    if (it != replicated.end()) return it->second;
    return replicated[v] = h.add_weight(g.value(v).name, g.weight(v));
  };
  for (size_t i = 0; i < nodes.size(); ++i) {
    const ir::Node& n = nodes[i];
    const Split split = plan.split.count(i) ? plan.split.at(i) : Split::kNone;
    std::vector<ir::ValueId> ins;
    for (size_t j = 0; j < n.inputs.size(); ++j) {
      ir::ValueId v = n.inputs[j];
      if (v == ir::kNoValue) {
        ins.push_back(ir::kNoValue);
      } else if (!g.is_weight(v)) {
        ins.push_back(map[size_t(v)]);
      } else if (split == Split::kColumns && j >= 1) {  // weight rows and bias
        ins.push_back(h.add_weight(g.value(v).name + ".tp" + std::to_string(rank),
                                   take_rows(g.weight(v), plan.rows.at(i))));
      } else if (split == Split::kRows && j == 1) {
        const int64_t k = g.weight(v).dim(1);
        if (k % world)
          throw_error(ErrorCode::kUnsupported, "tensor parallel: '", n.name, "' input width ", k,
                      " does not split over ", world, " ranks");
        ins.push_back(h.add_weight(g.value(v).name + ".tp" + std::to_string(rank),
                                   take_columns(g.weight(v), rank * k / world, (rank + 1) * k / world)));
      } else if (split == Split::kRows && j == 2) {
        // The bias is added once, after the sum: rank 0 keeps it.
        if (rank == 0) ins.push_back(weight(v));
      } else {
        ins.push_back(weight(v));
      }
    }
    auto attrs = n.attrs;
    if (new_attrs.count(i))
      for (auto& [k, a] : new_attrs.at(i)) attrs[k] = a;
    std::vector<ir::ValueId> outs = h.add_node(n.op, ins, attrs, n.name);
    if (split == Split::kRows && world > 1) outs = {h.add("AllReduce", {outs[0]}, {}, n.name + ".allreduce")};
    for (size_t o = 0; o < outs.size(); ++o) map[size_t(n.outputs[o])] = outs[o];
  }
  for (auto& [name, v] : g.outputs()) h.add_output(name, map[size_t(v)]);
  // Each rank's KV cache holds only its K/V heads.
  for (auto& [i, attrs] : new_attrs)
    if (nodes[i].op == "Attention") {
      out.info.num_heads = std::get<int64_t>(attrs.at("num_heads"));
      out.info.num_kv_heads = std::get<int64_t>(attrs.at("num_kv_heads"));
    }
  log_debug("tensor parallel: rank ", rank, "/", world, ": ", plan.split.size(), " Linear nodes split");
  return out;
}

}  // namespace kiln
