// AWQ scale search and folding (see awq.h).
#include "quant/awq.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "core/status.h"
#include "core/thread_pool.h"
#include "ir/rewrite.h"
#include "quant/norm_slots.h"

namespace kiln::quant {

namespace {

Tensor f32_copy(const Tensor& t) {
  if (t.dtype() != DType::kF32) return t.to(DType::kF32);
  Tensor c(DType::kF32, t.shape());
  std::copy(t.data_as<float>(), t.data_as<float>() + t.numel(), c.data_as<float>());
  return c;
}

// v is read only by nodes in `readers` (and is no graph output).
bool only_read_by(const ir::Uses& u, ir::ValueId v, const std::vector<int32_t>& readers) {
  if (u.is_output[size_t(v)]) return false;
  for (int32_t c : u.consumers[size_t(v)])
    if (std::find(readers.begin(), readers.end(), c) == readers.end()) return false;
  return true;
}

// A Linear (no epilogue unless `activation`) with a constant weight whose output only `reader` reads.
bool foldable_linear(const ir::Graph& g, const ir::Uses& u, int32_t p, int32_t reader, const std::string& activation) {
  if (p < 0) return false;
  const ir::Node& n = g.nodes()[size_t(p)];
  return n.op == "Linear" && n.attr_str("activation", "") == activation && g.is_weight(n.inputs[1]) &&
         g.weight(n.inputs[1]).rank() == 2 &&
         (n.input(2) == ir::kNoValue || g.is_weight(n.inputs[2])) && only_read_by(u, n.outputs[0], {reader});
}

// Where the inverse scales of a group reading x go (see AwqFold).
void plan_fold(const ir::Graph& g, const ir::Uses& u, AwqGroup& grp) {
  grp.fold = AwqFold::kMul;
  ir::ValueId v = grp.input;
  if (!only_read_by(u, v, grp.linears)) return;
  int32_t prod = g.value(v).producer;
  std::vector<int32_t> readers = grp.linears;
  // A row selection (the logits' GatherRows) keeps channels: look through it.
  while (prod >= 0 && g.nodes()[size_t(prod)].op == "GatherRows" && only_read_by(u, g.nodes()[size_t(prod)].inputs[0], {prod})) {
    v = g.nodes()[size_t(prod)].inputs[0];
    prod = g.value(v).producer;
  }
  if (prod < 0) return;
  const ir::Node& p = g.nodes()[size_t(prod)];
  const NormSlots ns = norm_slots(p.op);
  if (ns.out >= 0 && p.outputs[size_t(ns.out)] == v && g.is_weight(p.inputs[size_t(ns.gamma)]) &&
      (ns.beta < 0 || p.input(size_t(ns.beta)) == ir::kNoValue || g.is_weight(p.inputs[size_t(ns.beta)]))) {
    grp.fold = AwqFold::kNorm;
    grp.producer = prod;
    return;
  }
  if (v != grp.input) return;  // only norms are looked through GatherRows for
  if (p.op == "Attention" && p.outputs[0] == v) {
    const int64_t h = p.attr_int("num_heads"), kv = p.attr_int("num_kv_heads"), d = p.attr_int("head_dim");
    if (h <= 0 || kv <= 0 || d <= 0 || h % kv != 0 || h * d != grp.k) return;
    const bool packed = p.attr_int("packed_qkv", 0) != 0;
    const ir::ValueId vin = packed ? p.inputs[0] : p.input(2);
    if (vin == ir::kNoValue) return;
    const int32_t lin = g.value(vin).producer;
    if (!foldable_linear(g, u, lin, prod, "")) return;
    const int64_t rows = g.weight(g.nodes()[size_t(lin)].inputs[1]).dim(0);
    if (rows != (packed ? (h + 2 * kv) * d : kv * d)) return;
    grp.fold = AwqFold::kAttentionV;
    grp.producer = lin;
    grp.row_offset = packed ? (h + kv) * d : 0;
    grp.tie.resize(size_t(grp.k));
    for (int64_t j = 0; j < grp.k; ++j) grp.tie[size_t(j)] = (j / d) / (h / kv) * d + j % d;
    return;
  }
  // silu(gate) * up: the up rows scale the product exactly.
  if (p.op == "Linear" && p.attr_str("activation", "") == "swiglu") {
    if (g.is_weight(p.inputs[1]) && g.weight(p.inputs[1]).rank() == 2 && g.weight(p.inputs[1]).dim(0) == 2 * grp.k &&
        (p.input(2) == ir::kNoValue || g.is_weight(p.inputs[2]))) {
      grp.fold = AwqFold::kSwiGluUp;
      grp.producer = prod;
      grp.row_offset = grp.k;
    }
    return;
  }
  if (p.op == "SwiGLU" || p.op == "GeGLU") {  // act(gate) * up: likewise
    const int32_t lin = g.value(p.inputs[0]).producer;
    if (foldable_linear(g, u, lin, prod, "") && g.weight(g.nodes()[size_t(lin)].inputs[1]).dim(0) == 2 * grp.k) {
      grp.fold = AwqFold::kSwiGluUp;
      grp.producer = lin;
      grp.row_offset = grp.k;
    }
    return;
  }
  if (p.op == "Mul" && p.inputs.size() == 2 && p.inputs[0] != p.inputs[1]) {
    for (int side = 0; side < 2; ++side) {
      const ir::ValueId a = p.inputs[size_t(side)], b = p.inputs[size_t(1 - side)];
      const int32_t lin = g.value(a).producer;
      // Elementwise with equal shapes only: a broadcast operand would spread one row's scale.
      if (!(g.value(a).shape == g.value(b).shape) || !foldable_linear(g, u, lin, prod, "")) continue;
      if (g.weight(g.nodes()[size_t(lin)].inputs[1]).dim(0) != grp.k) continue;
      grp.fold = AwqFold::kSwiGluUp;
      grp.producer = lin;
      grp.row_offset = 0;
      return;
    }
  }
}

// One output row of a weight, scaled by s, quantized and dequantized, divided by s, minus
// the original: the row's contribution to the error.
void error_row(const float* w, int64_t k, const std::vector<float>& s, kiln::QuantFormat f, float* e,
               std::vector<float>& tmp, std::vector<uint8_t>& codes, std::vector<uint16_t>& scales,
               std::vector<uint16_t>& mins) {
  for (int64_t j = 0; j < k; ++j) tmp[size_t(j)] = s.empty() ? w[j] : w[j] * s[size_t(j)];
  float factor = 1.0f;
  quantize_row(tmp.data(), k, f, codes.data(), scales.data(), mins.data(), &factor);
  dequantize_row(codes.data(), scales.data(), mins.data(), factor, k, f, tmp.data());
  for (int64_t j = 0; j < k; ++j) e[j] = (s.empty() ? tmp[size_t(j)] : tmp[size_t(j)] / s[size_t(j)]) - w[j];
}

// Sixteen partial sums: the compiler vectorizes them without reassociating one sum.
float dot(const float* a, const float* b, int64_t k) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= k; i += 16)
    for (int j = 0; j < 16; ++j) acc[j] += a[i + j] * b[i + j];
  float s = 0;
  for (; i < k; ++i) s += a[i] * b[i];
  for (float v : acc) s += v;
  return s;
}

}  // namespace

kiln::QuantFormat awq_format_parse(const std::string& s) {
  if (s == "q4") return kiln::QuantFormat::kQ4;
  if (s == "q8") return kiln::QuantFormat::kQ8;
  throw_error(ErrorCode::kInvalidArgument, "AWQ quantizes weights to q4 or q8, not '", s, "'");
}

const char* awq_fold_name(AwqFold f) {
  switch (f) {
    case AwqFold::kNorm: return "norm";
    case AwqFold::kAttentionV: return "attention V";
    case AwqFold::kSwiGluUp: return "up projection";
    case AwqFold::kMul: return "Mul";
  }
  return "?";
}

bool linear_kept(const ir::Graph& g, const ir::Node& n, const std::vector<std::string>& keep) {
  for (auto& k : keep)
    if (!k.empty() && (n.name.find(k) != std::string::npos || g.value(n.inputs[1]).name.find(k) != std::string::npos))
      return true;
  return false;
}

bool awq_quantizes(const ir::Graph& g, const ir::Node& n, const AwqOptions& o) {
  if (n.op != "Linear" || n.inputs.size() < 2 || !g.is_weight(n.inputs[1])) return false;
  const Tensor& w = g.weight(n.inputs[1]);
  if (w.rank() != 2 || w.dim(1) % kQuantGroup != 0 || linear_kept(g, n, o.keep)) return false;
  const std::string p = n.attr_str("precision", "");
  return p.empty() || p == "q4" || p == "q8";
}

std::vector<AwqGroup> awq_groups(const ir::Graph& g, const AwqOptions& o) {
  std::map<ir::ValueId, size_t> index;
  std::vector<AwqGroup> groups;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const ir::Node& n = g.nodes()[i];
    if (!awq_quantizes(g, n, o)) continue;
    auto [it, fresh] = index.try_emplace(n.inputs[0], groups.size());
    if (fresh) {
      groups.emplace_back();
      groups.back().input = n.inputs[0];
      groups.back().k = g.weight(n.inputs[1]).dim(1);
    }
    groups[it->second].linears.push_back(int32_t(i));
  }
  const ir::Uses u = ir::compute_uses(g);
  for (AwqGroup& grp : groups) plan_fold(g, u, grp);
  return groups;
}

AwqCollector::AwqCollector(std::string name, int64_t stride) : name_(std::move(name)), stride_(std::max<int64_t>(1, stride)) {}

void AwqCollector::observe(const float* x, int64_t rows, int64_t k) {
  if (k_ == 0) k_ = k, abs_sum_.assign(size_t(k), 0.0);
  KILN_CHECK(k == k_, "awq calibration: '", name_, "' input width changed from ", k_, " to ", k);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * k;
    for (int64_t j = 0; j < k; ++j) {
      if (!std::isfinite(xr[j]))
        throw_error(ErrorCode::kInvalidArgument, "awq calibration: the input of Linear '", name_, "' is ", xr[j],
                    " at row ", rows_, ", channel ", j,
                    ": the float model's activations are not finite on the calibration text (a broken checkpoint, "
                    "or a text the model overflows on); check it with kiln eval perplexity");
      abs_sum_[size_t(j)] += std::fabs(xr[j]);
    }
    if (rows_ % stride_ == 0) samples_.insert(samples_.end(), xr, xr + k);
    ++rows_;
  }
}

std::vector<float> AwqCollector::channel_absmean() const {
  std::vector<float> m(abs_sum_.size());
  for (size_t j = 0; j < m.size(); ++j) m[j] = rows_ > 0 ? float(abs_sum_[j] / double(rows_)) : 0.0f;
  return m;
}

double awq_output_error(const std::vector<AwqLayer>& layers, int64_t k, const float* x, int64_t rows,
                        const std::vector<float>& s, kiln::QuantFormat f, int64_t max_out_rows) {
  KILN_CHECK(s.empty() || int64_t(s.size()) == k, "awq: scales width");
  q4_free_scales();  // its switch read here, not first in a pool thread
  // The output rows measured, over all layers.
  std::vector<const float*> wrows;
  for (const AwqLayer& l : layers) {
    const int64_t m = std::min(l.n, std::max<int64_t>(1, max_out_rows));
    for (int64_t i = 0; i < m; ++i) wrows.push_back(l.w + (i * l.n / m) * k);
  }
  ThreadPool& pool = ThreadPool::global();
  std::vector<double> partial(size_t(pool.num_threads()), 0.0);
  pool.parallel_for(int64_t(wrows.size()), [&](int64_t i0, int64_t i1, int t) {
    std::vector<float> e(static_cast<size_t>(k)), tmp(static_cast<size_t>(k));
    std::vector<uint8_t> codes(static_cast<size_t>(k));
    std::vector<uint16_t> sc(static_cast<size_t>(k / kQuantGroup)), mn(static_cast<size_t>(k / kQuantGroup));
    double acc = 0;
    for (int64_t i = i0; i < i1; ++i) {
      error_row(wrows[size_t(i)], k, s, f, e.data(), tmp, codes, sc, mn);
      for (int64_t r = 0; r < rows; ++r) {
        const double y = dot(e.data(), x + r * k, k);
        acc += y * y;
      }
    }
    partial[size_t(t)] += acc;
  });
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

std::vector<float> awq_scales_for(const std::vector<float>& absmean, const std::vector<int64_t>& tie, double alpha) {
  const size_t k = absmean.size();
  std::vector<double> a(absmean.begin(), absmean.end());
  if (!tie.empty()) {
    std::map<int64_t, std::pair<double, int>> cls;
    for (size_t j = 0; j < k; ++j) cls[tie[j]].first += a[j], cls[tie[j]].second += 1;
    for (size_t j = 0; j < k; ++j) a[j] = cls[tie[j]].first / cls[tie[j]].second;
  }
  double lo = INFINITY;
  for (double v : a)
    if (v > 0) lo = std::min(lo, v);
  std::vector<double> s(k);
  double smax = 0, smin = INFINITY;
  for (size_t j = 0; j < k; ++j) {
    const double v = a[j] > 0 ? a[j] : (std::isfinite(lo) ? lo : 1.0);
    s[j] = std::max(std::pow(v, alpha), 1e-4);
    smax = std::max(smax, s[j]);
    smin = std::min(smin, s[j]);
  }
  const double norm = std::sqrt(smax * smin);
  std::vector<float> out(k);
  for (size_t j = 0; j < k; ++j) out[j] = float(s[j] / norm);
  return out;
}

AwqSearchResult awq_search(const std::vector<AwqLayer>& layers, int64_t k, const float* x, int64_t rows,
                           const std::vector<float>& absmean, const std::vector<int64_t>& tie,
                           const AwqOptions& o) {
  if (k <= 0 || k % kQuantGroup != 0)
    throw_error(ErrorCode::kInvalidArgument, "awq: the input width ", k, " is not a positive multiple of ", kQuantGroup);
  if (rows <= 0 || x == nullptr)
    throw_error(ErrorCode::kInvalidArgument, "awq: no calibration rows to measure the output error on");
  if (int64_t(absmean.size()) != k)
    throw_error(ErrorCode::kInvalidArgument, "awq: ", absmean.size(), " channel means for an input of width ", k);
  for (size_t j = 0; j < absmean.size(); ++j)
    if (!std::isfinite(absmean[j]) || absmean[j] < 0)
      throw_error(ErrorCode::kInvalidArgument, "awq: channel ", j, " has mean |x| ", absmean[j]);
  if (!tie.empty() && int64_t(tie.size()) != k)
    throw_error(ErrorCode::kInvalidArgument, "awq: ", tie.size(), " tie entries for an input of width ", k);
  if (o.grid < 1) throw_error(ErrorCode::kInvalidArgument, "awq: the alpha grid needs at least 1 step, got ", o.grid);
  for (const AwqLayer& l : layers)
    if (l.w == nullptr || l.n <= 0) throw_error(ErrorCode::kInvalidArgument, "awq: an empty layer in the group");
  AwqSearchResult best;
  best.scales.assign(size_t(k), 1.0f);
  best.error = best.error_plain = awq_output_error(layers, k, x, rows, {}, o.format, o.max_out_rows);
  for (int i = 1; i <= o.grid; ++i) {
    const double alpha = double(i) / o.grid;
    std::vector<float> s = awq_scales_for(absmean, tie, alpha);
    const double e = awq_output_error(layers, k, x, rows, s, o.format, o.max_out_rows);
    if (e < best.error) best = {std::move(s), alpha, e, best.error_plain};
  }
  return best;
}

AwqReport apply_awq(ir::Graph& g, const CalibrationTable& table, const AwqOptions& o) {
  const std::string fmt = quant_format_name(o.format);
  if (table.awq_format != fmt)
    throw_error(ErrorCode::kInvalidArgument, "calibration table holds ",
                table.awq_format.empty() ? std::string("no AWQ scales") : "AWQ scales for " + table.awq_format,
                ", not for ", fmt, " (recalibrate with --quant awq --weight-dtype ", fmt, ")");
  AwqReport rep;
  for (ir::Node& n : g.nodes())
    if (n.op == "Linear" && n.inputs.size() >= 2 && g.is_weight(n.inputs[1]) && linear_kept(g, n, o.keep)) {
      n.attrs["precision"] = std::string("f32");
      ++rep.kept;
    }
  const std::vector<AwqGroup> groups = awq_groups(g, o);
  bool added_nodes = false;
  // Replaces weight input `slot` of node `ni` by a scaled copy: element (r, j) of a [rows, k]
  // tensor (or j of a vector) times row_mul(r) * col_mul(j).
  auto rescale = [&](int32_t ni, size_t slot, const std::string& suffix, auto&& mul) {
    const ir::ValueId src = g.nodes()[size_t(ni)].inputs[slot];
    Tensor t = f32_copy(g.weight(src));
    const int64_t cols = t.rank() == 2 ? t.dim(1) : t.numel(), rows = t.rank() == 2 ? t.dim(0) : 1;
    float* p = t.data_as<float>();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < cols; ++j) p[r * cols + j] *= mul(t.rank() == 2 ? r : j, j);
    const ir::ValueId nv = g.add_weight(g.value(src).name + suffix, std::move(t));
    g.nodes()[size_t(ni)].inputs[slot] = nv;
  };
  for (const AwqGroup& grp : groups) {
    const std::string& first = g.nodes()[size_t(grp.linears[0])].name;
    auto it = table.awq.find(first);
    if (it == table.awq.end())
      throw_error(ErrorCode::kNotFound, "calibration table has no AWQ scales for Linear '", first,
                  "' (calibrated on a different model or opt level?)");
    const std::vector<float>& s = it->second.scales;
    if (int64_t(s.size()) != grp.k)
      throw_error(ErrorCode::kInvalidArgument, "calibration table: AWQ scales of '", first, "' have ", s.size(),
                  " channels, the Linear reads ", grp.k);
    for (int32_t ni : grp.linears) {
      auto m = table.awq.find(g.nodes()[size_t(ni)].name);
      if (m != table.awq.end() && m->second.scales != s)
        throw_error(ErrorCode::kInvalidArgument, "calibration table: Linears '", first, "' and '",
                    g.nodes()[size_t(ni)].name, "' read one input but have different AWQ scales");
      rescale(ni, 1, ".awq", [&](int64_t, int64_t j) { return s[size_t(j)]; });
      ++rep.scaled;
    }
    AwqFold fold = grp.fold;
    // Stored scales that break the tie (calibrated on another graph) cannot fold into V.
    if (fold == AwqFold::kAttentionV) {
      std::map<int64_t, float> seen;
      for (int64_t j = 0; j < grp.k && fold == AwqFold::kAttentionV; ++j) {
        auto [e, fresh] = seen.try_emplace(grp.tie[size_t(j)], s[size_t(j)]);
        if (!fresh && e->second != s[size_t(j)]) fold = AwqFold::kMul;
      }
    }
    switch (fold) {
      case AwqFold::kNorm: {
        const NormSlots ns = norm_slots(g.nodes()[size_t(grp.producer)].op);
        for (int slot : {ns.gamma, ns.beta})
          if (slot >= 0 && g.nodes()[size_t(grp.producer)].input(size_t(slot)) != ir::kNoValue)
            rescale(grp.producer, size_t(slot), ".awq", [&](int64_t, int64_t j) { return 1.0f / s[size_t(j)]; });
        ++rep.folded_into_norm;
        break;
      }
      case AwqFold::kAttentionV:
      case AwqFold::kSwiGluUp: {
        // Output row (or bias entry) row_offset + c takes 1/s of the input channels reading it.
        std::map<int64_t, float> inv;
        for (int64_t j = 0; j < grp.k; ++j)
          inv[grp.row_offset + (grp.tie.empty() ? j : grp.tie[size_t(j)])] = 1.0f / s[size_t(j)];
        auto row_mul = [&](int64_t r, int64_t) {
          auto f = inv.find(r);
          return f == inv.end() ? 1.0f : f->second;
        };
        rescale(grp.producer, 1, ".awq_out", row_mul);
        if (g.nodes()[size_t(grp.producer)].input(2) != ir::kNoValue) rescale(grp.producer, 2, ".awq_out", row_mul);
        ++(fold == AwqFold::kAttentionV ? rep.folded_into_v : rep.folded_into_up);
        break;
      }
      case AwqFold::kMul: {
        Tensor invt(DType::kF32, {grp.k});
        for (int64_t j = 0; j < grp.k; ++j) invt.data_as<float>()[j] = 1.0f / s[size_t(j)];
        const ir::ValueId iv = g.add_weight(first + ".awq_inv", std::move(invt));
        const ir::ValueId xs = g.add("Mul", {grp.input, iv}, {}, first + ".awq");
        for (int32_t ni : grp.linears) g.nodes()[size_t(ni)].inputs[0] = xs;
        added_nodes = true;
        ++rep.muls;
        break;
      }
    }
  }
  if (added_nodes) ir::topo_sort(g);
  g.compact();
  ir::verify(g);
  return rep;
}

}  // namespace kiln::quant
