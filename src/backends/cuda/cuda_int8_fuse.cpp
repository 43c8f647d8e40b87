// Where the W8A8 Linear's activation quantize is fused into the node that feeds it (see
// cuda_int8_fuse.h): the decision both ends of the value ask while preparing, the dual
// outputs' rewrite of the compiled graph's copy, and the profile's tags.
#include "backends/cuda/cuda_int8_fuse.h"

#include <cmath>

#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/cuda_w8a8_linear.h"
#include "core/env_switch.h"
#include "core/int8.h"
#include "core/status.h"

namespace kiln::cuda {

namespace {

// The output of a norm that is the normalized rows: 0, or 1 after the residual sum.
std::optional<size_t> norm_output(const ir::Node& n) {
  if (n.op == "RMSNorm" || n.op == "LayerNorm") return 0;
  if (n.op == "AddRMSNorm" || n.op == "AddLayerNorm") return 1;
  return std::nullopt;
}

// Whether node n writes output `out` through an int8 kernel when asked to: the norms (their
// normalized output, or the codes output int8_add_dual_outputs gave them after it), the
// SmoothQuant Mul (an activation times a weight row), a W8A8 Linear whose activation
// runs in a pass after its GEMM (elementwise_int8.h's launch_unary_int8), and the
// attention (static scales only: int8_fused_output).
bool int8_codes_producer(const ir::Node& n, size_t out, const ir::Graph& g) {
  if (const auto yo = norm_output(n)) return out == *yo || out == *yo + 1;
  if (n.op == "Attention") return out == 0;
  if (n.op == "Mul")
    return out == 0 && n.inputs.size() == 2 && !g.is_weight(n.inputs[0]) && g.is_weight(n.inputs[1]) &&
           g.weight(n.inputs[1]).rank() == 1;
  if (n.op == "Linear") {
    const std::string act = n.attr_str("activation", "");
    return out == 0 && n.attr_str("quant", "") == "w8a8" && (act == "gelu_erf" || act == "gelu_tanh" || act == "silu") &&
           !n.has_attr("norm") && n.input(3) == ir::kNoValue && w8a8_linear_supported(n, g, nullptr) &&
           !w8a8_act_in_epilogue();
  }
  return false;
}

// The codes W8A8 Linear m would read as its input i, or none: m is a quant="w8a8" Linear
// that runs here (w8a8_linear_supported, no fused norm) and i is its x, whose codes (with
// the row scales) fit the activation's buffer, and its act_amax is usable (else its
// prepare reports it).
std::optional<Int8Codes> int8_reader_codes(const ir::Node& m, size_t i, const ir::Graph& g, DType act) {
  if (i != 0 || m.op != "Linear" || m.attr_str("quant", "") != "w8a8" || !w8a8_linear_supported(m, g, nullptr) ||
      m.has_attr("norm") || m.has_attr("act_hadamard"))  // a rotated input is quantized by its Linear
    return std::nullopt;
  if (!int8_codes_fit(g.weight(m.inputs[1]).dim(1), dtype_size(act))) return std::nullopt;
  const double amax = m.attr_float("act_amax", -1.0);
  if (!(amax >= 0) || !std::isfinite(amax)) return std::nullopt;
  Int8Codes c;
  c.per_token = m.attr_int("act_dynamic", 0) != 0;
  if (!c.per_token) c.inv = 1.0f / int8_act_scale(amax);  // as prepare_w8a8_linear computes it
  return c;
}

bool same_codes(const Int8Codes& a, const Int8Codes& b) {
  return a.per_token == b.per_token && (a.per_token || a.inv == b.inv);
}

}  // namespace

bool int8_fuse_enabled() {
  return env_switch("KILN_CUDA_INT8_FUSE", "the quantize fused into the norm or Mul that feeds the W8A8 Linear",
                    "a separate quantize pass before each W8A8 Linear");
}

std::optional<Int8Codes> int8_fused_output(const ir::Node& n, size_t out, const ir::Graph& g, DType act) {
  if ((act != DType::kBF16 && act != DType::kF16) || out >= n.outputs.size() || !int8_codes_producer(n, out, g) ||
      !int8_fuse_enabled())
    return std::nullopt;
  const ir::ValueId v = n.outputs[out];
  for (auto& [name, id] : g.outputs())
    if (id == v) return std::nullopt;  // the caller reads it in the activation dtype
  std::optional<Int8Codes> codes;
  for (const ir::Node& m : g.nodes())
    for (size_t i = 0; i < m.inputs.size(); ++i) {
      if (m.inputs[i] != v) continue;
      const std::optional<Int8Codes> c = int8_reader_codes(m, i, g, act);
      if (!c) return std::nullopt;
      if (n.op == "Mul" && g.weight(n.inputs[1]).dim(0) != g.weight(m.inputs[1]).dim(1))
        return std::nullopt;  // not one row per token
      if (codes && !same_codes(*c, *codes)) return std::nullopt;
      codes = c;
    }
  // A per-token scale needs the max over the whole row (all heads), which no attention CTA
  // sees: the Linear keeps its quantize pass.
  if (codes && codes->per_token && n.op == "Attention") return std::nullopt;
  return codes;
}

std::optional<Int8Codes> int8_dual_output(const ir::Node& n, size_t out, const ir::Graph& g, DType act) {
  if ((act != DType::kBF16 && act != DType::kF16) || norm_output(n) != out || out >= n.outputs.size() ||
      !int8_fuse_enabled())
    return std::nullopt;
  const ir::ValueId v = n.outputs[out];
  bool others = false;
  for (auto& [name, id] : g.outputs()) others = others || id == v;
  std::optional<Int8Codes> codes;
  for (const ir::Node& m : g.nodes())
    for (size_t i = 0; i < m.inputs.size(); ++i) {
      if (m.inputs[i] != v) continue;
      const std::optional<Int8Codes> c = int8_reader_codes(m, i, g, act);
      if (!c) {
        others = true;
        continue;
      }
      if (codes && !same_codes(*c, *codes)) return std::nullopt;
      codes = c;
    }
  // Read by Linears only: int8_fused_output's codes alone, no T output.
  return others ? codes : std::nullopt;
}

int int8_add_dual_outputs(ir::Graph& g, DType act) {
  int added = 0;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const std::optional<size_t> yo = norm_output(g.nodes()[i]);
    if (!yo || !int8_dual_output(g.nodes()[i], *yo, g, act)) continue;
    const ir::ValueId y = g.nodes()[i].outputs[*yo];
    const ir::Value yv = g.value(y);  // a copy: add_node_output grows the values
    const ir::ValueId q = g.add_node_output(i, yv.dtype, yv.shape, "int8");
    for (ir::Node& m : g.nodes())
      if (!m.inputs.empty() && m.inputs[0] == y && int8_reader_codes(m, 0, g, act)) m.inputs[0] = q;
    ++added;
  }
  return added;
}

std::optional<Int8Codes> int8_dual_codes(const ir::Node& n, const ir::Graph& g, DType act) {
  const std::optional<size_t> yo = norm_output(n);
  if (!yo || n.outputs.size() != *yo + 2) return std::nullopt;
  const std::optional<Int8Codes> codes = int8_fused_output(n, *yo + 1, g, act);
  KILN_CHECK(codes, "cuda: norm '", n.name, "' has a codes output its readers do not take");
  return codes;
}

Int8Out int8_out(OpContext& c, size_t o, const std::vector<int64_t>& shape, const Int8Codes& codes) {
  DevTensor& y = c.out(o, shape);
  const int64_t k = y.dim(-1), t = k ? y.numel() / k : 0;
  KILN_CHECK(!codes.per_token || int8_row_scales_offset(t, k) + size_t(t) * 4 <= size_t(y.numel()) * dtype_size(y.dtype),
             "cuda: ", t, " rows of ", k, " int8 codes and their scales do not fit the activation's buffer");
  y.dtype = DType::kI8;
  auto* q = static_cast<int8_t*>(y.data);
  return {q, codes.per_token ? reinterpret_cast<float*>(static_cast<char*>(y.data) + int8_row_scales_offset(t, k))
                             : nullptr};
}

std::string int8_profile_tag(const ir::Node& n, const ir::Graph& g, DType act) {
  std::string tag;
  if (n.op == "Linear" && n.attr_str("quant", "") == "w8a8" && !n.inputs.empty()) {
    const auto [p, o] = value_producer(g, n.inputs[0]);
    if (p && int8_fused_output(*p, o, g, act)) tag += "{int8 in}";
  }
  for (size_t o = 0; o < n.outputs.size(); ++o)
    if (int8_fused_output(n, o, g, act)) tag += "{+int8 quantize}";
  return tag;
}

}  // namespace kiln::cuda
