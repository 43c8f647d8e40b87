// FP8 E4M3 rewrite (see fp8.h).
#include "quant/fp8.h"

#include <cmath>
#include <map>

#include "core/fp8.h"
#include "core/status.h"
#include "quant/w8a8.h"

namespace kiln::quant {

bool fp8_shape_ok(int64_t n, int64_t k) { return n > 0 && k > 0 && n % 16 == 0 && k % 16 == 0; }

Fp8Report apply_fp8(ir::Graph& g, const CalibrationTable& table, const Fp8Options& o) {
  Fp8Report rep;
  // Smoothing first (the same migration as W8A8, quantize=false: float-preserving).
  W8A8Options wo;
  wo.smooth_alpha = o.smooth_alpha;
  wo.keep = o.keep;
  wo.quantize = false;
  if (o.smooth_alpha >= 0) {
    W8A8Report w = apply_w8a8(g, table, wo);
    rep.folded_into_norm = w.folded_into_norm;
    rep.smoothing_muls = w.smoothing_muls;
  }
  for (ir::Node& n : g.nodes()) {
    if (n.op != "Linear") continue;
    if (w8a8_keeps(g, n, wo)) {
      ++rep.kept;
      rep.kept_names.push_back(n.name);
      continue;
    }
    if (!g.is_weight(n.inputs[1]) || n.has_attr("weight_layout")) continue;
    const Tensor& w = g.weight(n.inputs[1]);
    if (w.rank() != 2 || !fp8_shape_ok(w.dim(0), w.dim(1))) {
      ++rep.kept_shape;
      rep.kept_names.push_back(n.name);
      continue;
    }
    const double amax = table.amax(n.name, o.method, QuantFormat::kFp8E4M3);
    n.attrs["quant"] = std::string("fp8");
    n.attrs["act_amax"] = amax;
    ++rep.quantized;
    if (o.gate_up_out && n.attr_str("activation", "") == "swiglu") {
      n.attrs["out_amax"] = table.out_amax(n.name);
      ++rep.gate_up_out;
    }
  }
  ir::verify(g);
  return rep;
}

int store_fp8_weights(ir::Graph& g) {
  std::map<ir::ValueId, std::pair<ir::ValueId, double>> done;  // source -> (codes, scale)
  int converted = 0;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const ir::Node& n = g.nodes()[i];
    if (n.op != "Linear" || n.attr_str("quant", "") != "fp8") continue;
    const ir::ValueId src = n.inputs[1];
    if (g.weight(src).dtype() == DType::kFP8E4M3) continue;  // already stored so
    auto it = done.find(src);
    if (it == done.end()) {
      const Tensor& w = g.weight(src);
      Tensor wf = w.dtype() == DType::kF32 ? w : w.to(DType::kF32);
      Tensor q(DType::kFP8E4M3, wf.shape());
      const Fp8Scale s = fp8_quantize_tensor(wf.data_as<float>(), size_t(wf.numel()), q.data_as<uint8_t>());
      const ir::ValueId v = g.add_weight(g.value(src).name + ".fp8", std::move(q));
      it = done.emplace(src, std::make_pair(v, double(s.scale))).first;
    }
    ir::Node& m = g.nodes()[i];
    m.inputs[1] = it->second.first;
    m.attrs["weight_scale"] = it->second.second;
    ++converted;
  }
  if (converted) g.compact();
  ir::verify(g);
  return converted;
}

}  // namespace kiln::quant
