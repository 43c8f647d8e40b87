// Recognising HF families in ONNX exports (see onnx_hf.h).
#include "frontends/onnx/onnx_hf.h"

#include <cmath>
#include <map>
#include <set>

#include "core/status.h"

namespace kiln::onnx {

namespace {

class MapWeightSource final : public WeightSource {
 public:
  MapWeightSource(std::map<std::string, Tensor> t, std::string label) : t_(std::move(t)), label_(std::move(label)) {}
  std::vector<std::string> names() const override {
    std::vector<std::string> v;
    for (auto& [k, x] : t_) v.push_back(k);
    return v;
  }
  bool has(const std::string& n) const override { return t_.count(n) != 0; }
  TensorInfo info(const std::string& n) const override {
    const Tensor& t = get(n);
    return {t.dtype(), t.shape(), t.nbytes(), ""};
  }
  Tensor load(const std::string& n, DType want) const override { return get(n).to(want); }
  std::string describe() const override { return "onnx '" + label_ + "'"; }

 private:
  const Tensor& get(const std::string& n) const {
    auto it = t_.find(n);
    if (it == t_.end()) throw_error(ErrorCode::kNotFound, describe(), " has no tensor '", n, "' (HF view of the export)");
    return it->second;
  }
  std::map<std::string, Tensor> t_;
  std::string label_;
};

Tensor transpose2d(const Tensor& w) {
  Tensor f = w.to(DType::kF32), t(DType::kF32, {w.dim(1), w.dim(0)});
  for (int64_t i = 0; i < w.dim(0); ++i)
    for (int64_t j = 0; j < w.dim(1); ++j) t.data_as<float>()[j * w.dim(0) + i] = f.data_as<float>()[i * w.dim(1) + j];
  return t;
}

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

struct Index {
  std::map<std::string, const Tensor*> consts;
  std::map<std::string, const OnnxNode*> producer;
  std::map<std::string, std::vector<const OnnxNode*>> consumers;
  explicit Index(const OnnxModel& m) {
    for (auto& t : m.graph.initializers) consts[t.name] = &t.value;
    for (auto& n : m.graph.nodes) {
      if (n.op_type == "Constant" && n.attr("value") && n.attr("value")->t) consts[n.outputs.at(0)] = &n.attr("value")->t->value;
      for (auto& o : n.outputs) producer[o] = &n;
      for (auto& i : n.inputs) consumers[i].push_back(&n);
    }
  }
  std::optional<double> scalar(const std::string& name) const {
    auto it = consts.find(name);
    if (it == consts.end() || it->second->numel() != 1) return std::nullopt;
    const Tensor& t = *it->second;
    if (t.dtype() == DType::kI64) return double(t.data_as<int64_t>()[0]);
    return double(t.to(DType::kF32).data_as<float>()[0]);
  }
};

// Heads from the attention's Reshape target [.., .., heads or -1, head_dim] (a Concat
// of the leading dims and two constants, or a constant). A wrong guess cannot slip
// through: the runtime compares the rebuilt model with the op-by-op import.
int64_t find_heads(const OnnxModel& m, const Index& ix, int64_t hidden) {
  for (auto& n : m.graph.nodes) {
    if (n.op_type != "Reshape" || n.inputs.size() < 2) continue;
    std::vector<std::optional<double>> dims;
    auto c = ix.consts.find(n.inputs[1]);
    if (c != ix.consts.end() && c->second->dtype() == DType::kI64) {
      for (int64_t i = 0; i < c->second->numel(); ++i) dims.push_back(double(c->second->data_as<int64_t>()[i]));
    } else if (auto p = ix.producer.find(n.inputs[1]); p != ix.producer.end() && p->second->op_type == "Concat") {
      for (auto& in : p->second->inputs) dims.push_back(ix.scalar(in));
    }
    if (dims.size() != 4 || !dims[2] || !dims[3] || !(*dims[3] > 0 && *dims[3] <= double(hidden)) ||
        !(*dims[2] >= -1 && *dims[2] <= double(hidden)) || hidden % int64_t(*dims[3]))
      continue;
    // transformers writes view(*shape, -1, head_dim) or (heads, head_dim).
    if (*dims[2] == -1 || int64_t(*dims[2] * *dims[3]) == hidden) return hidden / int64_t(*dims[3]);
  }
  return 0;
}

// LayerNorm eps: LayerNormalization's attribute, or the constant added to the variance.
std::optional<double> find_eps(const OnnxModel& m, const Index& ix) {
  for (auto& n : m.graph.nodes) {
    if (n.op_type == "LayerNormalization") return n.attr("epsilon") ? double(n.attr("epsilon")->f) : 1e-5;
    if (n.op_type != "Sqrt") continue;
    auto p = ix.producer.find(n.inputs.at(0));
    if (p != ix.producer.end() && p->second->op_type == "Add" && p->second->inputs.size() == 2)
      if (auto e = ix.scalar(p->second->inputs[1])) return *e;
  }
  return std::nullopt;
}

// Dim `axis` of tensor `name` in `w`, 0 when absent or of a smaller rank (a crafted
// file may reuse a name with another shape).
int64_t dim_of(const std::map<std::string, Tensor>& w, const std::string& name, int axis) {
  auto it = w.find(name);
  return it == w.end() || it->second.rank() <= axis ? 0 : it->second.dim(axis);
}

bool has_op(const OnnxModel& m, const char* op) {
  for (auto& n : m.graph.nodes)
    if (n.op_type == op) return true;
  return false;
}

// Names every anonymous constant right operand of a MatMul/Gemm after the bias that is
// Added to its output ("x.bias" -> "x.weight", stored [out, in]).
void name_projections(const OnnxModel& m, const Index& ix, const std::string& prefix,
                      std::map<std::string, Tensor>& w) {
  for (auto& n : m.graph.nodes) {
    if ((n.op_type != "MatMul" && n.op_type != "Gemm") || n.inputs.size() < 2) continue;
    auto b = ix.consts.find(n.inputs[1]);
    if (b == ix.consts.end() || b->second->rank() != 2 || n.inputs[1].rfind(prefix, 0) == 0) continue;
    std::string bias;
    if (n.op_type == "Gemm" && n.inputs.size() > 2) bias = n.inputs[2];
    auto cons = ix.consumers.find(n.outputs.at(0));
    if (bias.empty() && cons != ix.consumers.end() && cons->second.size() == 1 && cons->second[0]->op_type == "Add")
      for (auto& in : cons->second[0]->inputs)
        if (in != n.outputs[0]) bias = in;
    if (bias.rfind(prefix, 0) != 0 || !ends_with(bias, ".bias")) continue;
    std::string name = bias.substr(prefix.size(), bias.size() - prefix.size() - 5) + ".weight";
    bool trans_b = n.op_type == "Gemm" && n.attr("transB") && n.attr("transB")->i;
    w[name] = trans_b ? b->second->to(DType::kF32) : transpose2d(*b->second);
  }
}

std::optional<OnnxHfView> bert_view(const OnnxModel& m, const Index& ix, const std::string& prefix, std::string* why) {
  std::map<std::string, Tensor> w;
  int64_t layers = 0;
  for (auto& t : m.graph.initializers)
    if (t.name.rfind("classifier.", 0) == 0) {  // a task head outside the encoder's prefix
      w[t.name] = t.value.to(DType::kF32);
    } else if (t.name.rfind(prefix, 0) == 0) {
      std::string hf = t.name.substr(prefix.size());
      w[hf] = t.value.to(DType::kF32);
      if (hf.rfind("encoder.layer.", 0) == 0) layers = std::max<int64_t>(layers, std::atoll(hf.c_str() + 14) + 1);
    }
  name_projections(m, ix, prefix, w);
  // A named Gemm weight (pooler) keeps PyTorch's [out, in] only with transB.
  const int64_t hidden = dim_of(w, "embeddings.word_embeddings.weight", 1);
  if (hidden <= 0) return *why = "embeddings.word_embeddings.weight is not a matrix", std::nullopt;
  const int64_t heads = find_heads(m, ix, hidden);
  auto eps = find_eps(m, ix);
  auto need = [&](const std::string& k) {
    if (!w.count(k)) *why = "no tensor for " + k;
    return w.count(k) != 0;
  };
  if (!heads) return *why = "cannot tell the number of attention heads (no [.., .., heads, head_dim] Reshape)", std::nullopt;
  if (!has_op(m, "Erf")) return *why = "no erf GELU", std::nullopt;
  if (!need("embeddings.position_embeddings.weight") || !need("embeddings.token_type_embeddings.weight") ||
      !need("encoder.layer.0.intermediate.dense.bias") || layers <= 0 || layers > 4096)
    return std::nullopt;
  OnnxHfView v;
  v.family = "bert";
  v.config = {{"model_type", "bert"},
              {"vocab_size", dim_of(w, "embeddings.word_embeddings.weight", 0)},
              {"hidden_size", hidden},
              {"num_hidden_layers", layers},
              {"num_attention_heads", heads},
              {"intermediate_size", dim_of(w, "encoder.layer.0.intermediate.dense.bias", 0)},
              {"max_position_embeddings", dim_of(w, "embeddings.position_embeddings.weight", 0)},
              {"type_vocab_size", dim_of(w, "embeddings.token_type_embeddings.weight", 0)},
              {"layer_norm_eps", eps.value_or(1e-12)},
              {"hidden_act", "gelu"}};
  v.weights = std::make_unique<MapWeightSource>(std::move(w), "bert");
  return v;
}

std::optional<OnnxHfView> gpt2_view(const OnnxModel& m, const Index& ix, const std::string& prefix, std::string* why) {
  std::map<std::string, Tensor> w;
  int64_t layers = 0;
  for (auto& t : m.graph.initializers)
    if (t.name.rfind(prefix, 0) == 0) {
      std::string hf = "transformer." + t.name.substr(prefix.size());
      w[hf] = t.value.to(DType::kF32);
      if (hf.rfind("transformer.h.", 0) == 0) layers = std::max<int64_t>(layers, std::atoll(hf.c_str() + 14) + 1);
    }
  const int64_t hidden = dim_of(w, "transformer.wte.weight", 1), vocab = dim_of(w, "transformer.wte.weight", 0);
  if (hidden <= 0 || layers <= 0 || layers > 4096) return *why = "transformer.wte.weight is not a matrix", std::nullopt;
  // The LM head: the MatMul onto the vocabulary (a transposed copy of wte when tied).
  for (auto& n : m.graph.nodes)
    if (n.op_type == "MatMul" && n.inputs.size() == 2)
      if (auto b = ix.consts.find(n.inputs[1]);
          b != ix.consts.end() && b->second->rank() == 2 && b->second->dim(0) == hidden && b->second->dim(1) == vocab)
        w["lm_head.weight"] = transpose2d(*b->second);
  const int64_t heads = find_heads(m, ix, hidden);
  if (!heads) return *why = "cannot tell the number of attention heads (no [.., .., heads, head_dim] Reshape)", std::nullopt;
  if (!w.count("transformer.h.0.mlp.c_fc.bias") || !w.count("transformer.wpe.weight"))
    return *why = "no transformer.wpe / h.0.mlp.c_fc tensors", std::nullopt;
  OnnxHfView v;
  v.family = "gpt2";
  v.config = {{"model_type", "gpt2"},
              {"vocab_size", vocab},
              {"n_embd", hidden},
              {"n_layer", layers},
              {"n_head", heads},
              {"n_inner", dim_of(w, "transformer.h.0.mlp.c_fc.bias", 0)},
              {"n_positions", dim_of(w, "transformer.wpe.weight", 0)},
              {"layer_norm_epsilon", find_eps(m, ix).value_or(1e-5)},
              {"activation_function", has_op(m, "Erf") ? "gelu" : "gelu_new"}};
  v.weights = std::make_unique<MapWeightSource>(std::move(w), "gpt2");
  return v;
}

// The export's KV-cache tensors must be exactly the family's cache: one key/value pair
// per layer, [batch, heads, sequence, hidden / heads] (GPT-2 has no GQA).
void check_kv(const OnnxKvCache& kv, const nlohmann::json& config, const std::string& label) {
  if (kv.empty()) return;
  const int64_t layers = config.at("n_layer"), heads = config.at("n_head"), hd = int64_t(config.at("n_embd")) / heads;
  const std::string& first = kv.layers[0].past_key.empty() ? kv.layers[0].present_key : kv.layers[0].past_key;
  const std::string want = str_cat(" (expected [batch, ", heads, ", sequence, ", hd, "])");
  if (int64_t(kv.layers.size()) != layers)
    throw_error(ErrorCode::kInvalidFile, label, ": the KV-cache tensors (", kv.describe(), ") are for ", kv.layers.size(),
                " layers, but the gpt2 graph has ", layers, " (transformer.h.0..", layers - 1, ")");
  if (kv.kv_heads && kv.kv_heads != heads)
    throw_error(ErrorCode::kInvalidFile, label, ": '", first, "' has ", kv.kv_heads,
                " KV heads (dim 1), but the gpt2 graph has ", heads, " attention heads of ", hd, want);
  if (kv.head_dim && kv.head_dim != hd)
    throw_error(ErrorCode::kInvalidFile, label, ": '", first, "' has head_dim ", kv.head_dim,
                " (dim 3), but the gpt2 graph has ", heads, " attention heads of ", hd, want);
}

}  // namespace

std::optional<OnnxHfView> onnx_hf_view(const OnnxModel& m, const std::string& label, std::string* why) {
  Index ix(m);
  OnnxKvCache kv = onnx_kv_cache(m, label);
  for (auto& t : m.graph.initializers) {
    if (ends_with(t.name, "embeddings.word_embeddings.weight") && t.value.rank() == 2) {
      if (!kv.empty()) return *why = "a BERT export with KV-cache tensors (" + kv.describe() + ")", std::nullopt;
      return bert_view(m, ix, t.name.substr(0, t.name.size() - 33), why);
    }
    if (ends_with(t.name, "wte.weight") && t.value.rank() == 2) {
      auto v = gpt2_view(m, ix, t.name.substr(0, t.name.size() - 10), why);
      if (v) check_kv(kv, v->config, label), v->kv = std::move(kv);
      return v;
    }
  }
  *why = "no HF BERT or GPT-2 tensor names among the initializers";
  return std::nullopt;
}

}  // namespace kiln::onnx
