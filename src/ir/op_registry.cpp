// Schemas and shape inference of every IR op. Shapes are [T, features] for token-wise
// ops (T = the ragged token axis of one engine step, DESIGN.md); attention reads the
// step's sequence layout and KV cache from the runtime, not from graph values.
#include "ir/op_registry.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/status.h"
#include "core/weight_quant.h"
#include "ir/generic_ops.h"
#include "ir/plugin.h"

namespace kiln::ir {

namespace {

using In = std::vector<const Value*>;

[[noreturn]] void shape_error(const Node& n, const std::string& what) {
  throw_error(ErrorCode::kInvalidArgument, "node '", n.name, "' (", n.op, "): ", what);
}

// Concrete dims must match; symbolic dims are assumed to agree (checked at run time).
bool dims_agree(const Dim& a, const Dim& b) {
  if (a.is_concrete() && b.is_concrete()) return a.value == b.value;
  return true;
}

const Value& need(const Node& n, const In& in, size_t i, const char* role) {
  if (i >= in.size() || !in[i]) shape_error(n, str_cat("input ", i, " (", role, ") is required"));
  return *in[i];
}

void need_rank(const Node& n, const Value& v, size_t rank, const char* role) {
  if (v.shape.rank() != rank)
    shape_error(n, str_cat(role, " %", v.name, " must have rank ", rank, ", got ", v.shape.str()));
}

void need_float(const Node& n, const Value& v, const char* role) {
  if (!dtype_is_float(v.dtype))
    shape_error(n, str_cat(role, " %", v.name, " must be a float type, got ", dtype_name(v.dtype)));
}

void need_index(const Node& n, const Value& v, const char* role) {
  if (v.dtype != DType::kI32 || v.shape.rank() != 1)
    shape_error(n, str_cat(role, " %", v.name, " must be i32 of rank 1, got ", dtype_name(v.dtype),
                           v.shape.str()));
}

std::vector<ValueType> infer_unary(const Node& n, const In& in) {
  const Value& x = need(n, in, 0, "x");
  need_float(n, x, "x");
  return {{x.dtype, x.shape}};
}

// HeadRMSNorm: x [..., W]; the first `groups` (default W / head_dim) groups of head_dim
// values normalized, each by the shared weight [head_dim] or its slice of [groups *
// head_dim]; the rest of the row copied (q and k heads of a packed q|k|v row).
std::vector<ValueType> infer_head_norm(const Node& n, const In& in) {
  const Value& x = need(n, in, 0, "x");
  const Value& w = need(n, in, 1, "weight");
  need_float(n, x, "x");
  need_rank(n, w, 1, "weight");
  const int64_t d = n.attr_int("head_dim");
  if (d <= 0) shape_error(n, str_cat("head_dim ", d, " must be positive"));
  if (x.shape.rank() < 1 || !x.shape.back().is_concrete() || !w.shape[0].is_concrete())
    shape_error(n, str_cat("needs x with a concrete last dim and a weight of concrete length, got x ", x.shape.str(),
                           ", weight ", w.shape.str()));
  const int64_t width = x.shape.back().value, groups = n.attr_int("groups", width / d);
  if (groups <= 0 || groups * d > width || (!n.has_attr("groups") && width % d != 0))
    shape_error(n, str_cat(groups, " groups of head_dim ", d, " do not fit the last dim of x ", x.shape.str()));
  if (w.shape[0].value != d && w.shape[0].value != groups * d)
    shape_error(n, str_cat("weight ", w.shape.str(), " is neither [head_dim] = [", d, "] nor [groups * head_dim] = [",
                           groups * d, "]"));
  return {{x.dtype, x.shape}};
}

std::vector<ValueType> infer_norm(const Node& n, const In& in) {
  const Value& x = need(n, in, 0, "x");
  const Value& w = need(n, in, 1, "weight");
  need_float(n, x, "x");
  need_rank(n, w, 1, "weight");
  if (x.shape.rank() < 1 || !dims_agree(x.shape.back(), w.shape[0]))
    shape_error(n, str_cat("weight ", w.shape.str(), " does not match the last dim of ", x.shape.str()));
  if (in.size() > 2 && in[2] && !(in[2]->shape == w.shape))
    shape_error(n, str_cat("bias ", in[2]->shape.str(), " differs from weight ", w.shape.str()));
  return {{x.dtype, x.shape}};
}

// A Linear's output [T, out], or [T, out / 2] with the swiglu epilogue ([gate | up] rows
// -> silu(gate) * up), whether its weight is plain or prepacked.
std::vector<ValueType> linear_output(const Node& n, const Value& x, const Dim& out) {
  if (n.attr_str("activation", "") != "swiglu") return {{x.dtype, Shape{x.shape[0], out}}};
  if (!out.is_concrete() || out.value % 2 != 0)
    shape_error(n, str_cat("activation swiglu needs an even number of weight rows, got ", out.str()));
  return {{x.dtype, Shape{x.shape[0], Dim(out.value / 2)}}};
}

// A weight prepacked by a backend at build time (attr weight_layout, e.g. the CPU's
// "cpu_panels16"): opaque u8 bytes; the logical [out, in] shape is in weight_n/weight_k.
std::vector<ValueType> infer_packed_linear(const Node& n, const In& in) {
  const Value& x = need(n, in, 0, "x");
  const Value& w = need(n, in, 1, "weight");
  need_rank(n, x, 2, "x");
  if (w.dtype != DType::kU8 || w.shape.rank() != 1)
    shape_error(n, str_cat("packed weight %", w.name, " must be u8 bytes of rank 1, got ", dtype_name(w.dtype),
                           w.shape.str()));
  const int64_t out = n.attr_int("weight_n", -1), k = n.attr_int("weight_k", -1);
  if (out <= 0 || k <= 0 || out > (int64_t(1) << 31) || k > (int64_t(1) << 31))
    shape_error(n, str_cat("a packed weight needs weight_n and weight_k in [1, 2^31], got ", out, " and ", k));
  if (!dims_agree(x.shape[1], Dim(k)))
    shape_error(n, str_cat("x ", x.shape.str(), " times packed weight [", out, ", ", k, "]: inner dims differ"));
  if (in.size() > 2 && in[2] && (in[2]->shape.rank() != 1 || !dims_agree(in[2]->shape[0], Dim(out))))
    shape_error(n, str_cat("bias ", in[2]->shape.str(), " vs packed weight [", out, ", ", k, "]"));
  return linear_output(n, x, Dim(out));
}

// A weight kept quantized (attrs weight_quant, weight_k): u8 [rows, row bytes], the row
// image of core/weight_quant.h (a Linear's [out, K] weight, an Embedding's [vocab, dim]
// table). Checks the attrs and w's shape; returns weight_k.
int64_t check_quant_image(const Node& n, const Value& w, const char* role, const char* rows) {
  const std::string f = n.attr_str("weight_quant");
  if (f != "q8" && f != "q4") shape_error(n, str_cat("weight_quant must be q8 or q4, got '", f, "'"));
  const int64_t k = n.attr_int("weight_k", -1);
  if (k <= 0 || k % kQuantGroup != 0 || k > (int64_t(1) << 31))
    shape_error(n, str_cat("a quantized ", role, " needs weight_k a positive multiple of ", kQuantGroup, ", got ", k));
  const size_t row = quant_image_row_bytes(f == "q8" ? QuantFormat::kQ8 : QuantFormat::kQ4, k);
  if (w.dtype != DType::kU8 || w.shape.rank() != 2 || !dims_agree(w.shape[1], Dim(int64_t(row))))
    shape_error(n, str_cat(f, " ", role, " %", w.name, " must be u8 [", rows, ", ", row, "] for K=", k, ", got ",
                           dtype_name(w.dtype), w.shape.str()));
  return k;
}

std::vector<ValueType> infer_quant_image_linear(const Node& n, const In& in) {
  const Value& x = need(n, in, 0, "x");
  const Value& w = need(n, in, 1, "weight");
  need_rank(n, x, 2, "x");
  const int64_t k = check_quant_image(n, w, "weight", "out");
  const std::string f = n.attr_str("weight_quant");
  if (!dims_agree(x.shape[1], Dim(k)))
    shape_error(n, str_cat("x ", x.shape.str(), " times ", f, " weight [", w.shape[0].str(), ", ", k, "]: inner dims differ"));
  if (in.size() > 2 && in[2] && (in[2]->shape.rank() != 1 || !dims_agree(in[2]->shape[0], w.shape[0])))
    shape_error(n, str_cat("bias ", in[2]->shape.str(), " vs ", f, " weight rows ", w.shape[0].str()));
  return linear_output(n, x, w.shape[0]);
}

std::vector<ValueType> infer_plain_linear(const Node& n, const In& in);

// The fused prologue and epilogue of a Linear (pass fuse_norm_linear): inputs 3-5 are
// residual [T, out], norm_weight [K] and norm_bias [K]. attr norm = rms | layer (with
// norm_eps) normalizes x row by row before the product; a residual is added to the
// output after the bias and any activation.
std::vector<ValueType> infer_linear(const Node& n, const In& in) {
  const In base(in.begin(), in.begin() + std::min<size_t>(in.size(), 3));
  auto out = n.has_attr("weight_layout")  ? infer_packed_linear(n, base)
             : n.has_attr("weight_quant") ? infer_quant_image_linear(n, base)
                                          : infer_plain_linear(n, base);
  auto opt = [&](size_t i) { return i < in.size() ? in[i] : nullptr; };
  if (const Value* r = opt(3)) {
    if (!(r->shape == out[0].shape) || r->dtype != out[0].dtype)
      shape_error(n, str_cat("residual %", r->name, " ", dtype_name(r->dtype), r->shape.str(), " differs from the output ",
                             dtype_name(out[0].dtype), out[0].shape.str()));
  }
  const std::string norm = n.attr_str("norm", "");
  if (norm.empty()) {
    if (opt(4) || opt(5)) shape_error(n, "norm_weight/norm_bias inputs need attr norm (rms or layer)");
    return out;
  }
  if (norm != "rms" && norm != "layer") shape_error(n, str_cat("attr norm must be rms or layer, got '", norm, "'"));
  if (!n.has_attr("norm_eps")) shape_error(n, "attr norm needs attr norm_eps");
  const Value* gamma = opt(4);
  if (!gamma) shape_error(n, str_cat("attr norm=", norm, " needs input 4 (norm_weight)"));
  need_rank(n, *gamma, 1, "norm_weight");
  const Value& x = *in[0];
  if (!dims_agree(x.shape[1], gamma->shape[0]))
    shape_error(n, str_cat("norm_weight ", gamma->shape.str(), " does not match x ", x.shape.str()));
  if (const Value* beta = opt(5)) {
    if (norm != "layer") shape_error(n, "norm_bias is only for norm=layer");
    if (!(beta->shape == gamma->shape))
      shape_error(n, str_cat("norm_bias ", beta->shape.str(), " differs from norm_weight ", gamma->shape.str()));
  }
  return out;
}

std::vector<ValueType> infer_plain_linear(const Node& n, const In& in) {
  const Value& x = need(n, in, 0, "x");
  const Value& w = need(n, in, 1, "weight");
  need_rank(n, x, 2, "x");
  need_rank(n, w, 2, "weight");
  if (!dims_agree(x.shape[1], w.shape[1]))
    shape_error(n, str_cat("x ", x.shape.str(), " times weight[out, in] ", w.shape.str(),
                           ": inner dims differ"));
  if (in.size() > 2 && in[2]) {
    need_rank(n, *in[2], 1, "bias");
    if (!dims_agree(in[2]->shape[0], w.shape[0]))
      shape_error(n, str_cat("bias ", in[2]->shape.str(), " vs weight ", w.shape.str()));
  }
  return linear_output(n, x, w.shape[0]);
}

std::vector<ValueType> infer_embedding(const Node& n, const In& in) {
  const Value& table = need(n, in, 0, "table");
  const Value& ids = need(n, in, 1, "ids");
  if (n.has_attr("weight_layout")) {  // the packed panels of a tied LM head (see Linear)
    need_index(n, ids, "ids");
    if (table.dtype != DType::kU8 || table.shape.rank() != 1)
      shape_error(n, str_cat("packed table %", table.name, " must be u8 bytes of rank 1"));
    const int64_t vocab = n.attr_int("weight_n", -1), dim = n.attr_int("weight_k", -1);
    if (vocab <= 0 || dim <= 0 || vocab > (int64_t(1) << 31) || dim > (int64_t(1) << 31))
      shape_error(n, str_cat("a packed table needs weight_n and weight_k in [1, 2^31], got ", vocab, " and ", dim));
    return {{DType::kF32, Shape{ids.shape[0], Dim(dim)}}};
  }
  need_rank(n, table, 2, "table");
  need_index(n, ids, "ids");
  if (n.has_attr("weight_quant"))  // a table kept quantized: rows of weight_k values
    return {{DType::kF32, Shape{ids.shape[0], Dim(check_quant_image(n, table, "table", "vocab"))}}};
  return {{DType::kF32, Shape{ids.shape[0], table.shape[1]}}};
}

// BERT's embeddings fused with their LayerNorm: inputs (gamma, beta?, table_0, ids_0,
// table_1, ids_1, ...); every table is [vocab_j, H] and every ids vector has T entries.
std::vector<ValueType> infer_embedding_layer_norm(const Node& n, const In& in) {
  const Value& gamma = need(n, in, 0, "gamma");
  need_rank(n, gamma, 1, "gamma");
  if (in.size() > 1 && in[1] && !(in[1]->shape == gamma.shape))
    shape_error(n, str_cat("beta ", in[1]->shape.str(), " differs from gamma ", gamma.shape.str()));
  if (in.size() < 4 || in.size() % 2)
    shape_error(n, "takes gamma, beta and one or more (table, ids) pairs");
  const Value* first_ids = nullptr;
  for (size_t i = 2; i < in.size(); i += 2) {
    const Value& table = need(n, in, i, "table");
    const Value& ids = need(n, in, i + 1, "ids");
    need_rank(n, table, 2, "table");
    need_float(n, table, "table");
    need_index(n, ids, "ids");
    if (!dims_agree(table.shape[1], gamma.shape[0]))
      shape_error(n, str_cat("table %", table.name, " ", table.shape.str(), " does not have gamma's width ",
                             gamma.shape.str()));
    if (first_ids && !dims_agree(ids.shape[0], first_ids->shape[0]))
      shape_error(n, str_cat("ids %", ids.name, " ", ids.shape.str(), " and %", first_ids->name, " ",
                             first_ids->shape.str(), " differ in length"));
    if (!first_ids) first_ids = &ids;
  }
  return {{DType::kF32, Shape{first_ids->shape[0], gamma.shape[0]}}};
}

std::vector<ValueType> infer_rope(const Node& n, const In& in) {
  const Value& x = need(n, in, 0, "x");
  need_index(n, need(n, in, 1, "positions"), "positions");
  const Value& inv_freq = need(n, in, 2, "inv_freq");
  need_rank(n, x, 2, "x");
  int64_t heads = n.attr_int("num_heads"), hd = n.attr_int("head_dim");
  if (x.shape[1].is_concrete() && x.shape[1].value != heads * hd)
    shape_error(n, str_cat("x ", x.shape.str(), " is not num_heads*head_dim = ", heads * hd));
  int64_t rot = n.attr_int("rotary_dim", hd);
  if (rot > hd || rot % 2 || (inv_freq.shape[0].is_concrete() && inv_freq.shape[0].value != rot / 2))
    shape_error(n, str_cat("inv_freq ", inv_freq.shape.str(), " must hold rotary_dim/2 = ", rot / 2,
                           " frequencies (head_dim ", hd, ")"));
  return {{x.dtype, x.shape}};
}

std::vector<ValueType> infer_attention(const Node& n, const In& in) {
  int64_t hq = n.attr_int("num_heads"), hkv = n.attr_int("num_kv_heads"), d = n.attr_int("head_dim");
  if (hq <= 0 || hkv <= 0 || d <= 0 || hq % hkv)
    shape_error(n, str_cat("num_heads ", hq, " must be a positive multiple of num_kv_heads ", hkv));
  if (const int64_t w = n.attr_int("window", 0); w < 0 || (w > 0 && n.attr_int("causal", 1) == 0))
    shape_error(n, str_cat("a sliding window (window ", w, ") must be positive and causal"));
  if (const double cap = n.attr_float("softcap", 0.0); !(cap >= 0.0) || std::isinf(cap))
    shape_error(n, str_cat("softcap ", cap, " (0: none, or a finite positive cap)"));
  auto check = [&](const Value& t, int64_t width, const char* role) {
    need_rank(n, t, 2, role);
    if (t.shape[1].is_concrete() && t.shape[1].value != width)
      shape_error(n, str_cat(role, " ", t.shape.str(), " must have ", width, " features"));
  };
  const Value& q = need(n, in, 0, n.attr_int("packed_qkv", 0) ? "qkv" : "q");
  if (n.attr_int("packed_qkv", 0)) {
    // One [T, (hq + 2 hkv) * d] input (a merged Q/K/V projection), optionally with
    // positions and inv_freq: RoPE is then applied to q and k inside the op.
    if (in.size() != 1 && in.size() != 3)
      shape_error(n, "packed_qkv attention takes qkv, optionally with positions and inv_freq");
    check(q, (hq + 2 * hkv) * d, "qkv");
    if (in.size() == 3) {
      need_index(n, need(n, in, 1, "positions"), "positions");
      const Value& inv_freq = need(n, in, 2, "inv_freq");
      need_rank(n, inv_freq, 1, "inv_freq");
      int64_t rot = n.attr_int("rotary_dim", d);
      if (rot > d || rot <= 0 || rot % 2 ||
          (inv_freq.shape[0].is_concrete() && inv_freq.shape[0].value != rot / 2))
        shape_error(n, str_cat("inv_freq ", inv_freq.shape.str(), " must hold rotary_dim/2 = ",
                               rot / 2, " frequencies (head_dim ", d, ")"));
    }
    return {{q.dtype, Shape{q.shape[0], hq * d}}};
  }
  if (in.size() != 3) shape_error(n, "attention takes q, k, v (or one input with packed_qkv=1)");
  check(q, hq * d, "q");
  check(need(n, in, 1, "k"), hkv * d, "k");
  check(need(n, in, 2, "v"), hkv * d, "v");
  return {{q.dtype, Shape{q.shape[0], hq * d}}};
}

// Residual add fused with a norm: outputs the sum (the next residual) and its norm.
std::vector<ValueType> infer_add_norm(const Node& n, const In& in) {
  const Value& a = need(n, in, 0, "a");
  const Value& b = need(n, in, 1, "b");
  if (!(a.shape == b.shape)) shape_error(n, str_cat("a ", a.shape.str(), " and b ", b.shape.str(), " differ"));
  In norm_in = {in[0]};
  for (size_t i = 2; i < in.size(); ++i) norm_in.push_back(in[i]);
  auto t = infer_norm(n, norm_in);
  return {t[0], t[0]};
}

// gate and up packed side by side ([T, 2I], from one merged Linear) -> silu(gate) * up.
std::vector<ValueType> infer_swiglu(const Node& n, const In& in) {
  const Value& x = need(n, in, 0, "gate_up");
  need_rank(n, x, 2, "gate_up");
  need_float(n, x, "gate_up");
  if (!x.shape[1].is_concrete() || x.shape[1].value % 2)
    shape_error(n, str_cat("gate_up ", x.shape.str(), " must have an even, concrete feature count"));
  return {{x.dtype, Shape{x.shape[0], x.shape[1].value / 2}}};
}

std::vector<ValueType> infer_gather_rows(const Node& n, const In& in) {
  const Value& x = need(n, in, 0, "x");
  const Value& rows = need(n, in, 1, "rows");
  need_rank(n, x, 2, "x");
  need_index(n, rows, "rows");
  return {{x.dtype, Shape{rows.shape[0], x.shape[1]}}};
}

// The k largest logits of each row with their ids and log-softmax values (the runtime
// samples from these instead of copying whole rows; see runtime/sampling.h). k is fixed
// at compile time: rows narrower than k are padded (id -1, value and logprob -inf).
std::vector<ValueType> infer_topk_logits(const Node& n, const In& in) {
  const Value& x = need(n, in, 0, "logits");
  need_rank(n, x, 2, "logits");
  need_float(n, x, "logits");
  const int64_t k = n.attr_int("k");
  if (k < 1 || k > kTopKLogitsMaxK)
    shape_error(n, str_cat("k must be in [1, ", kTopKLogitsMaxK, "], got ", k));
  const Shape s{x.shape[0], k};
  return {{DType::kF32, s}, {DType::kI32, s}, {DType::kF32, s}};
}

std::vector<ValueType> infer_seq_pool(const Node& n, const In& in) {
  const Value& x = need(n, in, 0, "x");
  need_rank(n, x, 2, "x");
  return {{x.dtype, Shape{"B", x.shape[1]}}};
}

std::map<std::string, OpSchema> make_registry() {
  std::map<std::string, OpSchema> r;
  auto add = [&](OpSchema s) { r.emplace(s.name, std::move(s)); };
  add({"Embedding", 2, 2, {}, "out[t] = table[ids[t]]", infer_embedding});
  add({"EmbeddingLayerNorm", 4, 8, {"eps"},
       "LayerNorm(sum_j table_j[ids_j]) with gamma, beta: inputs (gamma, beta, table_0, ids_0, ...), "
       "up to 3 lookups (fused BERT embeddings)",
       infer_embedding_layer_norm});
  add({"AddLayerNorm", 3, 4, {"eps"}, "s = a + b; outputs s and LayerNorm(s) (fused residual add)",
       infer_add_norm});
  add({"AddRMSNorm", 3, 3, {"eps"}, "s = a + b; outputs s and RMSNorm(s) (fused residual add)",
       infer_add_norm});
  add({"SwiGLU", 1, 1, {}, "x = [gate | up] on the last dim -> silu(gate) * up", infer_swiglu});
  add({"GeGLU", 1, 1, {}, "x = [gate | up] on the last dim -> gelu_tanh(gate) * up (Gemma's MLP)", infer_swiglu});
  add({"LayerNorm", 2, 3, {"eps"}, "(x - mean) / sqrt(var + eps) * w + b over the last dim", infer_norm});
  add({"RMSNorm", 2, 2, {"eps"}, "x / sqrt(mean(x^2) + eps) * w over the last dim", infer_norm});
  add({"HeadRMSNorm", 2, 2, {"eps", "head_dim"}, "RMSNorm over each group of head_dim values of the last dim "
       "(per-head q/k norm, Qwen3); weight [head_dim] shared or [groups * head_dim]; optional attr groups: only "
       "the first groups * head_dim values are normalized, the rest copied", infer_head_norm});
  add({"Linear", 2, 6, {}, "x[T,K] . weight[N,K]^T + bias[N]; optional attr activation = gelu_erf | gelu_tanh | silu "
       "| swiglu (an epilogue; swiglu: silu(first N/2 outputs) * last N/2 -> [T, N/2]); fused forms "
       "(fuse_norm_linear): inputs 3-5 residual[T,N'], norm_weight[K], norm_bias[K]; attr norm = rms | layer "
       "with norm_eps normalizes x first, the residual is added last", infer_linear});
  add({"Gelu", 1, 1, {}, "GELU; attr approximate = none (erf) | tanh", infer_unary});
  add({"Silu", 1, 1, {}, "x * sigmoid(x)", infer_unary});
  add({"Tanh", 1, 1, {}, "tanh(x)", infer_unary});
  add({"Rope", 3, 3, {"num_heads", "head_dim"},
       "rotary embedding (rotate-half convention) of x[T, heads*head_dim] at positions", infer_rope});
  add({"Attention", 1, 3, {"layer", "num_heads", "num_kv_heads", "head_dim", "scale", "causal"},
       "paged attention: writes k,v into the KV cache, attends over each sequence's context; "
       "packed_qkv=1 takes one [T, (hq+2hkv)*d] input (+ positions, inv_freq: RoPE inside); optional "
       "window > 0: sliding window, the query at position p sees keys (p - window, p]; optional softcap > 0: "
       "scores s (q.k times scale) become softcap * tanh(s / softcap) before the softmax (Gemma 2)",
       infer_attention});
  add({"GatherRows", 2, 2, {}, "out[r] = x[rows[r]]", infer_gather_rows});
  add({"SeqMeanPool", 1, 1, {}, "mean of each sequence's rows of x (one row per sequence)",
       infer_seq_pool});
  add({"TopKLogits", 1, 1, {"k"},
       "per row of logits[R,V]: the k largest values (f32, descending; ties: lower index first; NaN "
       "last), their ids (i32; -1 pads rows with V < k) and log-softmax values (f32) -> 3 outputs [R,k]",
       infer_topk_logits});
  add({"AllReduce", 1, 1, {}, "sum of x over the tensor-parallel ranks (identity with one rank)",
       infer_unary});
  // Add and Mul among them: numpy broadcasting, any dtype (model builders use the
  // [T, H] + [T, H] and [T, H] + [H] forms every backend implements).
  add_generic_op_schemas(r);
  // Custom ops of plugin libraries: one generic op, shapes from the plugin (ir/plugin.h).
  add(plugin_op_schema());
  return r;
}

const std::map<std::string, OpSchema>& registry() {
  static const auto r = make_registry();
  return r;
}

}  // namespace

const OpSchema* find_op_schema(const std::string& op) {
  auto it = registry().find(op);
  return it == registry().end() ? nullptr : &it->second;
}

const OpSchema& get_op_schema(const std::string& op) {
  if (auto s = find_op_schema(op)) return *s;
  std::string known;
  for (auto& [k, v] : registry()) known += (known.empty() ? "" : ", ") + k;
  throw_error(ErrorCode::kUnsupported, "unknown op '", op, "' (known ops: ", known, ")");
}

std::vector<std::string> registered_ops() {
  std::vector<std::string> v;
  for (auto& [k, s] : registry()) v.push_back(k);
  return v;
}

}  // namespace kiln::ir
