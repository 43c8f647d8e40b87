// Tensor-parallel sharding of a faithful or optimized graph (see tensor_parallel.h).
#include "parallel/tensor_parallel.h"

#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "core/fp8.h"
#include "core/log.h"
#include "core/status.h"
#include "core/weight_quant.h"
#include "ir/rewrite.h"

namespace kiln {

namespace {

enum class Split { kNone, kColumns /* output rows */, kRows /* input columns */ };
using Ranges = std::vector<std::pair<int64_t, int64_t>>;

struct Plan {
  std::map<size_t, Split> split;
  // Column-parallel Linears: the [begin, end) rows of the full weight (and bias) this rank keeps.
  std::map<size_t, Ranges> rows;
  // Row-parallel Linears: the input columns [begin, end) this rank keeps.
  std::map<size_t, std::pair<int64_t, int64_t>> cols;
  // (node, input) -> the elements of a 1-D weight this rank keeps: the per-head weights of
  // a packed q|k HeadRMSNorm, the per-channel factor of a Mul on a sharded activation.
  std::map<std::pair<size_t, size_t>, Ranges> slices;
};

const std::set<std::string> kElementwise = {"Gelu", "Silu", "Mul"};
// [T, 2I] -> [T, I]: their input's gate and up halves are split together.
const std::set<std::string> kGated = {"SwiGLU", "GeGLU"};

// The node producing value v, or -1.
int producer(const ir::Graph& g, ir::ValueId v) {
  return v == ir::kNoValue ? -1 : g.value(v).producer;
}

// The rows (output channels) and input width of a Linear's weight, a q4/q8 row image's too.
int64_t linear_rows(const ir::Graph& g, const ir::Node& n) {
  return g.value(n.inputs[1]).shape[0].value;
}
int64_t linear_k(const ir::Graph& g, const ir::Node& n) {
  return n.has_attr("weight_quant") ? n.attr_int("weight_k") : g.value(n.inputs[1]).shape[1].value;
}

// Which input of Mul node m multiplies value x by a per-channel weight of `width`
// elements (SmoothQuant's smoothing, an AWQ scale), or -1.
int per_channel_input(const ir::Graph& g, const ir::Node& m, ir::ValueId x, int64_t width) {
  if (m.op != "Mul" || m.inputs.size() != 2) return -1;
  for (int j = 0; j < 2; ++j)
    if (m.inputs[size_t(1 - j)] == x && g.is_weight(m.inputs[size_t(j)]) &&
        g.weight(m.inputs[size_t(j)]).rank() == 1 && g.weight(m.inputs[size_t(j)]).numel() == width)
      return j;
  return -1;
}

Tensor take_rows(const Tensor& t, const Ranges& ranges) {
  int64_t rows = 0;
  for (auto& [b, e] : ranges) rows += e - b;
  std::vector<int64_t> shape = t.shape();
  shape[0] = rows;
  Tensor out(t.dtype(), shape);
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
  const size_t es = dtype_size(t.dtype());
  Tensor out(t.dtype(), {rows, c1 - c0});
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(static_cast<char*>(out.data()) + size_t(r * (c1 - c0)) * es,
                static_cast<const char*>(t.data()) + size_t(r * cols + c0) * es,
                size_t(c1 - c0) * es);
  return out;
}

// Columns [c0, c1) of a q4/q8 row image of width k (whole groups): each row keeps its codes,
// scales and mins of those groups and its row factor, so its values are the unsharded row's.
Tensor take_image_columns(const Tensor& img, QuantFormat f, int64_t k, int64_t c0, int64_t c1) {
  const int64_t n = img.dim(0), kl = c1 - c0, g0 = c0 / kQuantGroup, gl = kl / kQuantGroup;
  QuantizedRows full = quant_rows_from_image(img.data_as<uint8_t>(), n, k, f);
  QuantizedRows part;
  part.format = f;
  part.n = n;
  part.k = kl;
  const size_t cb = quant_row_code_bytes(f, k), cbl = quant_row_code_bytes(f, kl),
               b0 = quant_row_code_bytes(f, c0);
  part.codes.reset(new uint8_t[size_t(n) * cbl]);
  part.scales.reset(new uint16_t[size_t(n * gl)]);
  if (f == QuantFormat::kQ4) part.mins.reset(new uint16_t[size_t(n * gl)]);
  part.row_factor.reset(new float[size_t(n)]);
  for (int64_t r = 0; r < n; ++r) {
    std::memcpy(part.codes.get() + size_t(r) * cbl, full.codes.get() + size_t(r) * cb + b0, cbl);
    for (int64_t q = 0; q < gl; ++q) {
      part.scales[size_t(r * gl + q)] = full.scales[size_t(r * full.groups() + g0 + q)];
      if (part.mins) part.mins[size_t(r * gl + q)] = full.mins[size_t(r * full.groups() + g0 + q)];
    }
    part.row_factor[size_t(r)] = full.row_factor[size_t(r)];
  }
  Tensor out(DType::kU8, {n, int64_t(quant_image_row_bytes(f, kl))});
  quant_rows_to_image(part, out.data_as<uint8_t>());
  return out;
}

Tensor f32_of(const Tensor& t) { return t.dtype() == DType::kF32 ? t : t.to(DType::kF32); }

// The weight storage of Linear n (its precision attr, else the ranks' weight dtype).
std::string linear_storage(const ir::Node& n, const ShardOptions& o) {
  return n.attr_str("precision", o.weight_dtype);
}

}  // namespace

BuiltModel shard_tensor_parallel(const BuiltModel& model, int rank, int world,
                                 const ShardOptions& options) {
  KILN_THROW_IF(world < 1 || rank < 0 || rank >= world, kInvalidArgument, "tensor parallel rank ",
                rank, " of ", world);
  const ir::Graph& g = model.graph;
  const auto& nodes = g.nodes();
  const ir::Uses uses = ir::compute_uses(g);
  Plan plan;
  std::map<size_t, std::map<std::string, ir::Attr>> new_attrs;  // Rope / Attention heads

  // Linears reading v [T, width], directly or through per-channel Muls, become
  // row-parallel over its columns [c0, c1).
  auto row_parallel = [&](ir::ValueId v, int64_t width, int64_t c0, int64_t c1) {
    std::vector<ir::ValueId> values = {v};
    while (!values.empty()) {
      const ir::ValueId x = values.back();
      values.pop_back();
      for (int32_t c : uses.consumers[size_t(x)]) {
        const ir::Node& cn = nodes[size_t(c)];
        if (cn.op == "Linear" && cn.inputs[0] == x) {
          plan.split[size_t(c)] = Split::kRows;
          plan.cols[size_t(c)] = {c0, c1};
        } else if (const int j = per_channel_input(g, cn, x, width); j >= 0) {
          plan.slices[{size_t(c), size_t(j)}] = {{c0, c1}};
          values.push_back(cn.outputs[0]);
        }
      }
    }
  };

  for (size_t i = 0; i < nodes.size(); ++i) {
    const ir::Node& n = nodes[i];
    if (n.op != "Attention") continue;
    const int64_t hq = n.attr_int("num_heads"), hkv = n.attr_int("num_kv_heads"),
                  d = n.attr_int("head_dim");
    if (hq % world)
      throw_error(ErrorCode::kUnsupported, "tensor parallel: ", hq,
                  " attention heads do not split over ", world, " ranks");
    if (hkv % world && world % hkv)
      throw_error(ErrorCode::kUnsupported, "tensor parallel: ", hkv,
                  " K/V heads neither split over nor replicate across ", world, " ranks");
    const int64_t q0 = rank * hq / world, q1 = (rank + 1) * hq / world;
    // K/V heads of this rank: a slice when they divide, else the one its Q heads use.
    int64_t k0, k1;
    if (hkv % world == 0)
      k0 = rank * hkv / world, k1 = (rank + 1) * hkv / world;
    else
      k0 = q0 / (hq / hkv), k1 = k0 + 1;
    const int64_t local_q = q1 - q0, local_kv = k1 - k0;
    new_attrs[i] = {{"num_heads", local_q}, {"num_kv_heads", local_kv}};
    if (n.attr_int("packed_qkv", 0)) {
      // One [q | k | v] Linear (fuse_qkv_attention), maybe through one HeadRMSNorm whose
      // weight stacks a weight per q and k head (groups = hq + hkv; v is copied).
      int p = producer(g, n.inputs[0]);
      if (p >= 0 && nodes[size_t(p)].op == "HeadRMSNorm") {
        const ir::Node& nm = nodes[size_t(p)];
        const int64_t groups = nm.attr_int("groups", 0);
        if (!g.is_weight(nm.inputs[1]) ||
            (groups ? groups != hq + hkv || g.weight(nm.inputs[1]).numel() != groups * d
                    : g.weight(nm.inputs[1]).numel() != d))
          throw_error(ErrorCode::kUnsupported, "tensor parallel: '", nm.name,
                      "' does not normalize the packed q and k heads with one weight per head");
        if (groups) {
          plan.slices[{size_t(p), 1}] = {{q0 * d, q1 * d}, {(hq + k0) * d, (hq + k1) * d}};
          new_attrs[size_t(p)] = {{"groups", local_q + local_kv}};
        }
        p = producer(g, nm.inputs[0]);
      }
      if (p < 0 || nodes[size_t(p)].op != "Linear")
        throw_error(ErrorCode::kUnsupported, "tensor parallel: packed attention '", n.name,
                    "' does not read a Linear's q|k|v rows");
      plan.split[size_t(p)] = Split::kColumns;
      plan.rows[size_t(p)] = {{q0 * d, q1 * d},
                              {(hq + k0) * d, (hq + k1) * d},
                              {(hq + hkv + k0) * d, (hq + hkv + k1) * d}};
    } else {
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
        plan.rows[size_t(p)] = j == 0 ? Ranges{{q0 * d, q1 * d}} : Ranges{{k0 * d, k1 * d}};
      }
    }
    // The output projection reads the attention output (maybe smoothed by a Mul).
    row_parallel(n.outputs[0], hq * d, q0 * d, q1 * d);
  }
  // MLPs: a Linear fed by an elementwise chain (Gelu/Silu/Mul, SwiGLU/GeGLU, per-channel
  // Muls) of Linears, or by a Linear with an activation epilogue, is the down projection;
  // the Linears at the chain's roots are its up/gate projections ([gate | up] rows
  // split by halves where a gated op or a swiglu epilogue reads them).
  for (size_t i = 0; i < nodes.size(); ++i) {
    const ir::Node& n = nodes[i];
    if (n.op != "Linear" || plan.split.count(i)) continue;
    const int64_t k = linear_k(g, n);
    std::vector<std::pair<int, bool>> stack = {{producer(g, n.inputs[0]), false}}, roots;
    std::vector<std::pair<size_t, size_t>> muls;  // per-channel factors on the way
    bool ok =
        stack[0].first >= 0 && (kElementwise.count(nodes[size_t(stack[0].first)].op) ||
                                kGated.count(nodes[size_t(stack[0].first)].op) ||
                                nodes[size_t(stack[0].first)].attr_str("activation", "") != "");
    while (ok && !stack.empty()) {
      auto [p, halves] = stack.back();
      stack.pop_back();
      if (p < 0) {
        ok = false;
        break;
      }
      const ir::Node& pn = nodes[size_t(p)];
      if (pn.op == "Linear") {
        roots.push_back({p, halves || pn.attr_str("activation", "") == "swiglu"});
      } else if (kGated.count(pn.op)) {
        stack.push_back({producer(g, pn.inputs[0]), true});
      } else if (kElementwise.count(pn.op)) {
        for (size_t j = 0; j < pn.inputs.size() && ok; ++j) {
          const ir::ValueId in = pn.inputs[j];
          if (!g.is_weight(in))
            stack.push_back({producer(g, in), halves});
          else if (pn.op == "Mul" && g.weight(in).rank() == 1 && g.weight(in).numel() == k)
            muls.push_back({size_t(p), j});
          else
            ok = g.weight(in).numel() == 1;  // a scalar factor is the same on every rank
        }
      } else {
        ok = false;
      }
    }
    if (!ok || roots.empty()) continue;
    // Each root makes the width the down projection reads (both halves for [gate | up]).
    for (auto [r, halves] : roots)
      ok = ok && !plan.split.count(size_t(r)) &&
           linear_rows(g, nodes[size_t(r)]) == (halves ? 2 * k : k);
    if (!ok) continue;
    if (k % world)
      throw_error(ErrorCode::kUnsupported, "tensor parallel: MLP width ", k, " of '",
                  nodes[size_t(roots[0].first)].name, "' does not split over ", world, " ranks");
    const int64_t c0 = rank * k / world, c1 = (rank + 1) * k / world;
    for (auto [r, halves] : roots) {
      plan.split[size_t(r)] = Split::kColumns;
      plan.rows[size_t(r)] = halves ? Ranges{{c0, c1}, {k + c0, k + c1}} : Ranges{{c0, c1}};
    }
    for (auto& m : muls) plan.slices[m] = {{c0, c1}};
    plan.split[i] = Split::kRows;
    plan.cols[i] = {c0, c1};
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
  const std::string tp = ".tp" + std::to_string(rank);
  for (size_t i = 0; i < nodes.size(); ++i) {
    const ir::Node& n = nodes[i];
    const Split split = plan.split.count(i) ? plan.split.at(i) : Split::kNone;
    auto attrs = n.attrs;
    if (new_attrs.count(i))
      for (auto& [k, a] : new_attrs.at(i)) attrs[k] = a;
    // A split Linear's weight as the ranks slice it: FP8 E4M3 codes under the unsharded
    // tensor's scale (per tensor: a slice's own max would differ).
    Tensor w;
    if (split != Split::kNone) {
      if (n.has_attr("norm") || n.inputs.size() > 3)
        throw_error(ErrorCode::kUnsupported, "tensor parallel: Linear '", n.name,
                    "' has a fused norm or residual (fuse_norm_linear); shard the graph before "
                    "that pass");
      if (!g.is_weight(n.inputs[1]))
        throw_error(ErrorCode::kUnsupported, "tensor parallel: Linear '", n.name,
                    "' has a computed weight");
      w = g.weight(n.inputs[1]);
      if (n.attr_str("quant", "") == "fp8" && w.dtype() != DType::kFP8E4M3) {
        const Tensor wf = f32_of(w);
        Tensor codes(DType::kFP8E4M3, wf.shape());
        attrs["weight_scale"] = double(
            fp8_quantize_tensor(wf.data_as<float>(), size_t(wf.numel()), codes.data_as<uint8_t>())
                .scale);
        w = std::move(codes);
      }
    }
    if (split == Split::kRows && world > 1) {
      const auto [c0, c1] = plan.cols.at(i);
      const int64_t k = linear_k(g, n);
      if (!n.attr_str("activation", "").empty())
        throw_error(
            ErrorCode::kUnsupported, "tensor parallel: row-parallel Linear '", n.name,
            "' has an activation ",
            "epilogue; its partial sums must be all-reduced before anything else touches them");
      const std::string quant = n.attr_str("quant", ""), storage = linear_storage(n, options);
      if (quant == "w8a8") {
        if (n.attr_int("act_dynamic", 0))
          throw_error(ErrorCode::kUnsupported, "tensor parallel: row-parallel W8A8 Linear '",
                      n.name, "' uses ",
                      "per-token activation scales (--act-scale per-token): each of the ", world,
                      " ranks would scale ", "a row by the max of its own ", c1 - c0, " of ", k,
                      " input channels, not the row's, and round it ",
                      "differently from the unsharded model; use --act-scale static, or keep the "
                      "row-parallel Linears ",
                      "in float (--keep o_proj,down_proj or their names)");
        if (n.attr_int("act_hadamard", 0))
          throw_error(ErrorCode::kUnsupported, "tensor parallel: row-parallel W8A8 Linear '",
                      n.name, "' rotates its ", k, " input channels in Hadamard blocks of ",
                      n.attr_int("act_hadamard"), " (--hadamard), which ", "its split over ", world,
                      " ranks (", c1 - c0, " channels each) would cut; drop it from --hadamard");
        // The int8 weight scale of each output row is the unsharded row's max |w| / 127.
        const Tensor wf = f32_of(w);
        std::vector<double> amax(size_t(wf.dim(0)), 0.0);
        for (int64_t r = 0; r < wf.dim(0); ++r) {
          float m = 0.0f;
          for (int64_t j = 0; j < k; ++j)
            m = std::fmax(m, std::fabs(wf.data_as<float>()[r * k + j]));
          amax[size_t(r)] = double(m);
        }
        attrs["weight_amax"] = std::move(amax);
      } else if (quant.empty() &&
                 (storage == "q8" || storage == "q4" || n.has_attr("weight_quant"))) {
        // q4/q8 groups of 32 run along K: the ranks' columns must hold whole groups, and
        // each row's factor is the unsharded row's (the row image is made whole, then split).
        const std::string fmt = n.has_attr("weight_quant") ? n.attr_str("weight_quant") : storage;
        if ((c1 - c0) % kQuantGroup)
          throw_error(ErrorCode::kUnsupported, "tensor parallel: row-parallel ", fmt, " Linear '",
                      n.name, "' has input width ", k, " in groups of ", kQuantGroup, "; over ",
                      world, " ranks (--tp ", world, ") each rank's ", c1 - c0,
                      " columns would cut a group; use a --tp that leaves each rank a ",
                      "multiple of ", kQuantGroup, " columns, or another --weight-dtype");
        const QuantFormat f = quant_format_from_name(fmt, "Linear '" + n.name + "'");
        if (!n.has_attr("weight_quant")) {
          const Tensor wf = f32_of(w);
          QuantizedRows q = quantize_rows(wf.data_as<float>(), wf.dim(0), k, f);
          w = Tensor(DType::kU8, {wf.dim(0), int64_t(quant_image_row_bytes(f, k))});
          quant_rows_to_image(q, w.data_as<uint8_t>());
          attrs["weight_quant"] = fmt;
          attrs["precision"] = fmt;
        }
        w = take_image_columns(w, f, k, c0, c1);
        attrs["weight_k"] = c1 - c0;
      }
      if (!attrs.count("weight_quant")) w = take_columns(w, c0, c1);
    }
    std::vector<ir::ValueId> ins;
    for (size_t j = 0; j < n.inputs.size(); ++j) {
      const ir::ValueId v = n.inputs[j];
      if (v == ir::kNoValue) {
        ins.push_back(ir::kNoValue);
      } else if (!g.is_weight(v)) {
        ins.push_back(map[size_t(v)]);
      } else if (auto s = plan.slices.find({i, j}); s != plan.slices.end()) {
        ins.push_back(h.add_weight(g.value(v).name + tp, take_rows(g.weight(v), s->second)));
      } else if (split == Split::kColumns && (j == 1 || j == 2)) {  // weight rows and bias
        ins.push_back(h.add_weight(g.value(v).name + tp,
                                   take_rows(j == 1 ? w : g.weight(v), plan.rows.at(i))));
      } else if (split == Split::kRows && j == 1) {
        ins.push_back(h.add_weight(g.value(v).name + tp, std::move(w)));
      } else if (split == Split::kRows && j == 2) {
        // The bias is added once, after the sum: rank 0 keeps it.
        if (rank == 0) ins.push_back(weight(v));
      } else {
        ins.push_back(weight(v));
      }
    }
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
