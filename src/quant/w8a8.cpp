// SmoothQuant folding and W8A8 attributes (see w8a8.h).
#include "quant/w8a8.h"

#include <algorithm>
#include <cmath>

#include "core/hadamard.h"
#include "core/status.h"
#include "ir/rewrite.h"
#include "quant/norm_slots.h"

namespace kiln::quant {

namespace {

Tensor f32_copy(const Tensor& t) {
  Tensor c = t.dtype() == DType::kF32 ? Tensor(DType::kF32, t.shape()) : t.to(DType::kF32);
  if (t.dtype() == DType::kF32) std::copy(t.data_as<float>(), t.data_as<float>() + t.numel(), c.data_as<float>());
  return c;
}

// Linears to quantize grouped by their input value, in node order.
std::map<ir::ValueId, std::vector<int32_t>> groups_by_input(const ir::Graph& g, const W8A8Options& o) {
  std::map<ir::ValueId, std::vector<int32_t>> groups;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const ir::Node& n = g.nodes()[i];
    if (n.op != "Linear" || w8a8_keeps(g, n, o)) continue;
    if (!g.is_weight(n.inputs[1])) continue;
    groups[n.inputs[0]].push_back(int32_t(i));
  }
  return groups;
}

// Whether a group's input is rotated: any of its Linears is named by options.hadamard
// (they share the input, so all of them read it rotated).
bool group_rotates(const ir::Graph& g, const std::vector<int32_t>& nodes, const W8A8Options& o) {
  for (int32_t ni : nodes)
    if (w8a8_rotates(g.nodes()[size_t(ni)].name, o.hadamard)) return true;
  return false;
}

}  // namespace

bool w8a8_rotates(const std::string& node, const std::vector<std::string>& hadamard) {
  for (auto& h : hadamard)
    if (!h.empty() && node.find(h) != std::string::npos) return true;
  return false;
}

std::string hadamard_calib_name(const std::string& node, int64_t b) { return node + "#hadamard" + std::to_string(b); }

bool w8a8_keeps(const ir::Graph& g, const ir::Node& n, const W8A8Options& o) {
  for (auto& k : o.keep)
    if (!k.empty() && (n.name.find(k) != std::string::npos || g.value(n.inputs[1]).name.find(k) != std::string::npos))
      return true;
  return false;
}

std::map<std::string, std::vector<float>> smooth_factors(const ir::Graph& g, const CalibrationTable& table,
                                                         const W8A8Options& o) {
  std::map<std::string, std::vector<float>> out;
  if (o.smooth_alpha < 0) return out;
  for (auto& [x, nodes] : groups_by_input(g, o)) {
    if (group_rotates(g, nodes, o)) continue;  // rotated inputs are not smoothed
    const int64_t k = g.value(x).shape[g.value(x).shape.rank() - 1].value;
    std::vector<float> act(size_t(k), 0.0f), wmax(size_t(k), 0.0f);
    for (int32_t ni : nodes) {
      const ir::Node& n = g.nodes()[size_t(ni)];
      auto it = table.tensors.find(n.name);
      if (it == table.tensors.end()) {
        auto rotated = table.tensors.lower_bound(n.name + "#hadamard");
        if (rotated != table.tensors.end() && rotated->first.starts_with(n.name + "#hadamard"))
          throw_error(ErrorCode::kNotFound, "calibration table has Linear '", n.name, "' only as a rotated input (",
                      rotated->first, "): it was calibrated with --hadamard naming it; pass the same --hadamard, or "
                      "calibrate again");
        throw_error(ErrorCode::kNotFound, "calibration table has no entry for Linear '", n.name,
                    "' (calibrated on a different model or opt level?)");
      }
      if (int64_t(it->second.channel_absmax.size()) != k)
        throw_error(ErrorCode::kInvalidArgument, "calibration entry '", n.name, "' has ",
                    it->second.channel_absmax.size(), " channels, the Linear reads ", k);
      for (int64_t j = 0; j < k; ++j) act[size_t(j)] = std::max(act[size_t(j)], it->second.channel_absmax[size_t(j)]);
      Tensor w = f32_copy(g.weight(n.inputs[1]));
      const float* wp = w.data_as<float>();
      for (int64_t r = 0; r < w.dim(0); ++r)
        for (int64_t j = 0; j < k; ++j) wmax[size_t(j)] = std::max(wmax[size_t(j)], std::fabs(wp[r * k + j]));
    }
    std::vector<float> s(size_t(k), 1.0f);
    for (int64_t j = 0; j < k; ++j) {
      // A channel never active (or a zero weight column) is left alone.
      if (act[size_t(j)] <= 0 || wmax[size_t(j)] <= 0) continue;
      const double v = std::pow(double(act[size_t(j)]), o.smooth_alpha) / std::pow(double(wmax[size_t(j)]), 1 - o.smooth_alpha);
      s[size_t(j)] = float(std::clamp(v, 1e-5, 1e5));
    }
    for (int32_t ni : nodes) out[g.nodes()[size_t(ni)].name] = s;
  }
  return out;
}

W8A8Report apply_w8a8(ir::Graph& g, const CalibrationTable& table, const W8A8Options& o) {
  W8A8Report rep;
  for (auto& n : g.nodes())
    if (n.op == "Linear" && w8a8_keeps(g, n, o)) ++rep.kept, rep.kept_names.push_back(n.name);
  const auto smooth = smooth_factors(g, table, o);
  const auto groups = groups_by_input(g, o);
  const ir::Uses uses = ir::compute_uses(g);
  bool added_nodes = false;
  for (auto& [x, nodes] : groups) {
    const std::string& first = g.nodes()[size_t(nodes[0])].name;
    // Rotated inputs are int8 inputs: a smoothing-only rewrite leaves such groups as they are.
    const bool rotate = group_rotates(g, nodes, o);
    if (rotate && !o.quantize) continue;
    if (rotate) {
      // W H / b as new weights: (x H) (W H / b)^T = x W^T.
      for (int32_t ni : nodes) {
        ir::Node& n = g.nodes()[size_t(ni)];
        Tensor w = f32_copy(g.weight(n.inputs[1]));
        const int64_t k = w.dim(1), b = hadamard_block(k);
        float* wp = w.data_as<float>();
        for (int64_t r = 0; r < w.dim(0); ++r) {
          hadamard_transform(wp + r * k, k);
          for (int64_t j = 0; j < k; ++j) wp[r * k + j] /= float(b);
        }
        const std::string wname = g.value(n.inputs[1]).name + ".hadamard";
        g.nodes()[size_t(ni)].inputs[1] = g.add_weight(wname, std::move(w));
        g.nodes()[size_t(ni)].attrs["act_hadamard"] = b;
        ++rep.rotated;
      }
    } else if (o.smooth_alpha >= 0) {
      const std::vector<float>& s = smooth.at(first);
      const int64_t k = int64_t(s.size());
      // W·s as new weights (a tied embedding stays untouched).
      for (int32_t ni : nodes) {
        ir::Node& n = g.nodes()[size_t(ni)];
        Tensor w = f32_copy(g.weight(n.inputs[1]));
        float* wp = w.data_as<float>();
        for (int64_t r = 0; r < w.dim(0); ++r)
          for (int64_t j = 0; j < k; ++j) wp[r * k + j] *= s[size_t(j)];
        const std::string wname = g.value(n.inputs[1]).name + ".smoothed";
        g.nodes()[size_t(ni)].inputs[1] = g.add_weight(wname, std::move(w));
      }
      // X/s: into the producing norm when nothing else reads its output.
      const int32_t prod = g.value(x).producer;
      bool folded = false;
      if (prod >= 0) {
        ir::Node& p = g.nodes()[size_t(prod)];
        NormSlots ns = norm_slots(p.op);
        bool only_group = ns.out >= 0 && p.outputs[size_t(ns.out)] == x && !uses.is_output[size_t(x)];
        if (only_group)
          for (int32_t c : uses.consumers[size_t(x)]) only_group = only_group && std::count(nodes.begin(), nodes.end(), c);
        if (only_group && g.is_weight(p.inputs[size_t(ns.gamma)]) &&
            (ns.beta < 0 || p.input(size_t(ns.beta)) == ir::kNoValue || g.is_weight(p.inputs[size_t(ns.beta)]))) {
          for (int slot : {ns.gamma, ns.beta}) {
            if (slot < 0 || p.input(size_t(slot)) == ir::kNoValue) continue;
            Tensor t = f32_copy(g.weight(p.inputs[size_t(slot)]));
            for (int64_t j = 0; j < k; ++j) t.data_as<float>()[j] /= s[size_t(j)];
            const std::string name = g.value(p.inputs[size_t(slot)]).name + ".smoothed";
            const ir::ValueId nv = g.add_weight(name, std::move(t));
            g.nodes()[size_t(prod)].inputs[size_t(slot)] = nv;
          }
          folded = true;
          ++rep.folded_into_norm;
        }
      }
      if (!folded) {
        Tensor inv(DType::kF32, {k});
        for (int64_t j = 0; j < k; ++j) inv.data_as<float>()[j] = 1.0f / s[size_t(j)];
        const ir::ValueId iv = g.add_weight(first + ".smooth_inv", std::move(inv));
        const ir::ValueId xs = g.add("Mul", {x, iv}, {}, first + ".smooth");
        for (int32_t ni : nodes) g.nodes()[size_t(ni)].inputs[0] = xs;
        added_nodes = true;
        ++rep.smoothing_muls;
      }
    }
    if (!o.quantize) continue;
    for (int32_t ni : nodes) {
      ir::Node& n = g.nodes()[size_t(ni)];
      const std::string entry = rotate ? hadamard_calib_name(n.name, n.attr_int("act_hadamard", 0)) : n.name;
      const bool have = table.tensors.count(entry) > 0;
      if (rotate && !have && !o.per_token)
        throw_error(ErrorCode::kNotFound, "calibration table has no entry for the rotated input of Linear '", n.name,
                    "' (", entry, "): the table was calibrated without --hadamard naming it; calibrate again "
                    "(a new --calib-cache, or delete the old one)");
      const double amax = rotate && !have ? 0.0 : table.amax(entry, o.method);  // per-token: unused
      n.attrs["quant"] = std::string("w8a8");
      n.attrs["act_amax"] = amax;
      if (o.per_token) n.attrs["act_dynamic"] = int64_t(1);
      ++rep.quantized;
    }
  }
  if (added_nodes) ir::topo_sort(g);
  g.compact();
  ir::verify(g);
  return rep;
}

}  // namespace kiln::quant
