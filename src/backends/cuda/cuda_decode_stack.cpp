#include "backends/cuda/cuda_decode_stack.h"

#include <cstdlib>
#include <set>
#include <vector>

#include "core/status.h"

namespace kiln::cuda {
namespace {

// The attributes an Attention node of the stack may carry (any other changes what it
// computes: the kernel does not know it).
const std::set<std::string> kAttnAttrs = {"layer", "num_heads", "num_kv_heads", "head_dim", "scale",
                                          "causal", "packed_qkv", "rotary_dim"};

}  // namespace

bool CudaDecodeStack::enabled_from_env() {
  const char* e = std::getenv("KILN_CUDA_DECODE_STACK");
  if (!e || !*e || std::string(e) == "0") return false;
  if (std::string(e) == "1") return true;
  throw_error(ErrorCode::kInvalidArgument, "KILN_CUDA_DECODE_STACK must be 0 or 1, got '", e, "'");
}

std::unique_ptr<CudaDecodeStack> CudaDecodeStack::plan(const ir::Graph& g, PrepareContext& pc, std::string* why) {
  auto no = [&](const std::string& w) -> std::unique_ptr<CudaDecodeStack> {
    if (why) *why = w;
    return nullptr;
  };
  if (pc.act != DType::kBF16 && pc.act != DType::kF16) return no("activations are not 16-bit");
  const auto& nodes = g.nodes();
  std::vector<std::vector<size_t>> readers(g.num_values());
  for (size_t i = 0; i < nodes.size(); ++i)
    for (ir::ValueId v : nodes[i].inputs)
      if (v != ir::kNoValue) readers[size_t(v)].push_back(i);
  std::set<ir::ValueId> graph_outs;
  for (auto& [name, v] : g.outputs()) graph_outs.insert(v);

  size_t i0 = 0;
  while (i0 < nodes.size() && nodes[i0].op != "RMSNorm") ++i0;
  if (i0 == nodes.size()) return no("no RMSNorm");
  auto node_is = [&](size_t i, const char* op) { return i < nodes.size() && nodes[i].op == op; };
  // A Linear of the stack: 16-bit weight [n, k] in the activation dtype, input `in`, no
  // residual input, no fused norm, no quantization; bias only where allowed.
  auto plain_linear = [&](size_t i, ir::ValueId in, int64_t n, int64_t k, bool bias_ok, const std::string& act) {
    const ir::Node& nd = nodes[i];
    if (nd.op != "Linear" || nd.input(0) != in || nd.input(3) != ir::kNoValue || nd.has_attr("norm") ||
        nd.has_attr("quant") || cuda_linear_quant_format(nd, g, pc.weight_dtype) ||
        nd.attr_str("activation", "") != act || (!bias_ok && nd.input(2) != ir::kNoValue))
      return false;
    if (nd.has_attr("precision") && nd.attr_str("precision") != dtype_name(pc.act)) return false;
    const Tensor& w = g.weight(nd.inputs[1]);
    return w.rank() == 2 && w.dim(0) == n && w.dim(1) == k;
  };
  auto rms_eps = [](const ir::Node& n) { return float(n.attr_float("eps")); };

  auto st = std::unique_ptr<CudaDecodeStack>(new CudaDecodeStack());
  st->act_ = pc.act;
  st->first_ = i0;
  st->x_ = nodes[i0].inputs[0];
  const int64_t hidden = g.weight(nodes[i0].inputs[1]).numel();
  std::vector<DecodeStackLayer> layers;
  size_t i = i0;
  ir::ValueId resid = st->x_, normed = nodes[i0].outputs.at(0);
  const float* in_norm = static_cast<const float*>(pc.weights->get(g, nodes[i0].inputs[1], DType::kF32));
  float in_eps = rms_eps(nodes[i0]);
  int64_t hq = 0, hkv = 0, d = 0, inter = 0;
  ir::ValueId inv_freq = ir::kNoValue;
  while (node_is(i + 1, "Linear") && node_is(i + 2, "Attention")) {
    const ir::Node& qkv = nodes[i + 1];
    const ir::Node& at = nodes[i + 2];
    const int l = int(layers.size());
    for (auto& [k, v] : at.attrs)
      if (!kAttnAttrs.count(k)) return no("attention attribute '" + k + "'");
    const int64_t ahq = at.attr_int("num_heads"), ahkv = at.attr_int("num_kv_heads"), ad = at.attr_int("head_dim");
    if (at.attr_int("packed_qkv", 0) != 1 || at.attr_int("causal") != 1 || at.attr_int("layer") != l ||
        at.attr_int("rotary_dim", ad) != ad || at.input(0) != qkv.outputs.at(0) || at.input(2) == ir::kNoValue)
      return no("attention '" + at.name + "' is not packed causal attention with RoPE over the whole head");
    if (l == 0) {
      hq = ahq, hkv = ahkv, d = ad;
      st->scale_ = float(at.attr_float("scale"));
      st->positions_ = at.inputs.at(1);
      inv_freq = at.inputs[2];
      st->inv_freq_ = static_cast<const float*>(pc.weights->get(g, inv_freq, DType::kF32));
    } else if (ahq != hq || ahkv != hkv || ad != d || float(at.attr_float("scale")) != st->scale_ ||
               at.inputs.at(1) != st->positions_ || at.inputs[2] != inv_freq) {
      return no("layers differ in their attention");
    }
    if (!plain_linear(i + 1, normed, (hq + 2 * hkv) * d, hidden, true, "") ||
        !plain_linear(i + 3, at.outputs.at(0), hidden, hq * d, false, ""))
      return no("layer " + std::to_string(l) + "'s q|k|v or o projection is not a plain 16-bit Linear");
    const ir::Node& mid = nodes[i + 4];
    const ir::ValueId o_out = nodes[i + 3].outputs.at(0);
    if (mid.op != "AddRMSNorm" || !((mid.inputs[0] == resid && mid.inputs[1] == o_out) ||
                                    (mid.inputs[1] == resid && mid.inputs[0] == o_out)))
      return no("layer " + std::to_string(l) + " has no AddRMSNorm after its attention");
    const int64_t li = node_is(i + 5, "Linear") ? g.weight(nodes[i + 5].inputs[1]).dim(0) / 2 : 0;
    if (l == 0) inter = li;
    if (li != inter || inter <= 0 || !plain_linear(i + 5, mid.outputs.at(1), 2 * inter, hidden, false, "swiglu") ||
        !plain_linear(i + 6, nodes[i + 5].outputs.at(0), hidden, inter, false, ""))
      return no("layer " + std::to_string(l) + "'s MLP is not gate|up with SwiGLU and down, plain 16-bit");
    const ir::ValueId down_out = nodes[i + 6].outputs.at(0);
    if (!node_is(i + 7, "AddRMSNorm") ||
        !((nodes[i + 7].inputs[0] == mid.outputs[0] && nodes[i + 7].inputs[1] == down_out) ||
          (nodes[i + 7].inputs[1] == mid.outputs[0] && nodes[i + 7].inputs[0] == down_out)))
      return no("layer " + std::to_string(l) + " has no AddRMSNorm after its MLP");
    DecodeStackLayer ly;
    ly.w_qkv = pc.weights->get(g, qkv.inputs[1], pc.act);
    ly.b_qkv = qkv.input(2) != ir::kNoValue ? pc.weights->get(g, qkv.inputs[2], pc.act) : nullptr;
    ly.w_o = pc.weights->get(g, nodes[i + 3].inputs[1], pc.act);
    ly.w_gate_up = pc.weights->get(g, nodes[i + 5].inputs[1], pc.act);
    ly.w_down = pc.weights->get(g, nodes[i + 6].inputs[1], pc.act);
    ly.attn_norm = in_norm;
    ly.attn_eps = in_eps;
    ly.mlp_norm = static_cast<const float*>(pc.weights->get(g, mid.inputs[2], DType::kF32));
    ly.mlp_eps = rms_eps(mid);
    layers.push_back(ly);
    i += 7;
    const ir::Node& out = nodes[i];
    resid = out.outputs.at(0);
    normed = out.outputs.at(1);
    in_norm = static_cast<const float*>(pc.weights->get(g, out.inputs[2], DType::kF32));
    in_eps = rms_eps(out);
  }
  if (layers.empty()) return no("no decoder layer after the first RMSNorm");
  st->last_ = i;
  st->final_norm_ = in_norm;
  st->final_eps_ = in_eps;
  // Nothing outside the range reads what the range computes, but the last norm's outputs.
  for (size_t n = i0; n < i; ++n)
    for (ir::ValueId v : nodes[n].outputs) {
      if (graph_outs.count(v)) return no("'" + nodes[n].name + "' is a graph output");
      for (size_t r : readers[size_t(v)])
        if (r <= i0 || r > i) return no("'" + nodes[n].name + "' is read outside the layers");
    }
  st->shape_ = {int(layers.size()), int(hidden), int(inter), int(hq), int(hkv), int(d)};
  st->grid_ = decode_stack_grid();
  if (st->grid_ == 0) return no("the device cannot keep one CTA of the kernel on every SM");
  std::string w;
  if (!decode_stack_supports(pc.act, st->shape_, st->grid_, &w)) return no(w);
  st->layers_.grow(layers.size() * sizeof(DecodeStackLayer), nullptr);
  KILN_CUDA_CHECK(cudaMemcpy(st->layers_.get(), layers.data(), layers.size() * sizeof(DecodeStackLayer),
                             cudaMemcpyHostToDevice));
  st->scratch_.grow(decode_stack_scratch_bytes(st->shape_, st->grid_), nullptr);
  KILN_CUDA_CHECK(cudaMemset(st->scratch_.get(), 0, st->scratch_.size()));
  return st;
}

bool CudaDecodeStack::takes(const StepInfo& step, const CudaKv* kv) const {
  return kv && kv->code() == KvCode::kNone && kv->dtype() == act_ && step.seqs.size() == 1 &&
         step.num_tokens() == 1 && step.seqs[0].q_len == 1 && step.slot_mapping.size() == 1 &&
         kv->layout().num_layers >= shape_.layers;
}

void CudaDecodeStack::run(OpContext& c, const std::vector<DevTensor>& vals) const {
  const DevTensor& x = vals[size_t(x_)];
  KILN_THROW_IF(x.numel() != shape_.hidden || x.dtype != act_, kInvalidArgument,
                "decode stack: the first norm's input must be one ", dtype_name(act_), " row of ", shape_.hidden,
                " features, got ", x.numel(), " ", dtype_name(x.dtype), " elements");
  DecodeStackArgs a;
  a.dtype = act_;
  a.shape = shape_;
  a.layers = static_cast<const DecodeStackLayer*>(layers_.get());
  a.scale = scale_;
  a.inv_freq = inv_freq_;
  a.final_norm = final_norm_;
  a.final_eps = final_eps_;
  a.x = x.data;
  a.out_sum = c.out(0, x.shape).data;
  a.out_norm = c.out(1, x.shape).data;
  a.positions = static_cast<const int32_t*>(vals[size_t(positions_)].data);
  a.slot_mapping = c.dev->slot_mapping;
  a.seq = c.dev->seqs;
  a.block_tables = c.dev->block_tables;
  a.k_cache = c.kv->k(0);
  a.v_cache = c.kv->v(0);
  a.kv_layer_bytes = c.kv->layer_bytes();
  a.block_size = int(c.kv->layout().block_size);
  a.scratch = scratch_.get();
  launch_decode_stack(a, grid_, c.cx->stream);
}

}  // namespace kiln::cuda
