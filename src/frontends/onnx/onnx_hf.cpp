// Recognising HF families in ONNX exports (see onnx_hf.h).
#include "frontends/onnx/onnx_hf.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstring>
#include <iomanip>
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
      if (n.op_type == "Constant" && !n.outputs.empty() && n.attr("value") && n.attr("value")->t)
        consts[n.outputs[0]] = &n.attr("value")->t->value;
      // The exporter shares equal parameters (norm weights still at their init) through
      // Identity nodes: their outputs are the constant too.
      if (n.op_type == "Identity" && !n.inputs.empty() && !n.outputs.empty())
        if (auto c = consts.find(n.inputs[0]); c != consts.end()) consts[n.outputs[0]] = c->second;
      for (auto& o : n.outputs) producer[o] = &n;
      for (auto& i : n.inputs) consumers[i].push_back(&n);
    }
  }
  // A one-element constant, also behind Unsqueeze/Squeeze (an export without constant
  // folding builds a Reshape target of Unsqueezed scalars).
  std::optional<double> scalar(const std::string& name) const {
    auto it = consts.find(name);
    if (it == consts.end())
      if (auto p = producer.find(name);
          p != producer.end() && !p->second->inputs.empty() &&
          (p->second->op_type == "Unsqueeze" || p->second->op_type == "Squeeze"))
        it = consts.find(p->second->inputs[0]);
    if (it == consts.end() || it->second->numel() != 1) return std::nullopt;
    const Tensor& t = *it->second;
    if (t.dtype() == DType::kI64) return double(t.data_as<int64_t>()[0]);
    return double(t.to(DType::kF32).data_as<float>()[0]);
  }
};

// The target of a Reshape as far as it is constant: a constant, or a Concat of scalars
// (the leading dims computed, the trailing ones constants), nullopt for computed dims.
std::vector<std::optional<double>> reshape_target(const Index& ix, const OnnxNode& n) {
  std::vector<std::optional<double>> dims;
  if (n.op_type != "Reshape" || n.inputs.size() < 2) return dims;
  auto c = ix.consts.find(n.inputs[1]);
  if (c != ix.consts.end() && c->second->dtype() == DType::kI64) {
    for (int64_t i = 0; i < c->second->numel(); ++i)
      dims.push_back(double(c->second->data_as<int64_t>()[i]));
  } else if (auto p = ix.producer.find(n.inputs[1]);
             p != ix.producer.end() && p->second->op_type == "Concat") {
    for (auto& in : p->second->inputs) dims.push_back(ix.scalar(in));
  }
  return dims;
}

// Heads from the attention's Reshape target [.., .., heads or -1, head_dim] (a Concat
// of the leading dims and two constants, or a constant). A wrong guess cannot slip
// through: the runtime compares the rebuilt model with the op-by-op import.
int64_t find_heads(const OnnxModel& m, const Index& ix, int64_t hidden) {
  for (auto& n : m.graph.nodes) {
    std::vector<std::optional<double>> dims = reshape_target(ix, n);
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
    if (n.op_type != "Sqrt" || n.inputs.empty()) continue;
    auto p = ix.producer.find(n.inputs[0]);
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
    if ((n.op_type != "MatMul" && n.op_type != "Gemm") || n.inputs.size() < 2 || n.outputs.empty())
      continue;
    auto b = ix.consts.find(n.inputs[1]);
    if (b == ix.consts.end() || b->second->rank() != 2 || n.inputs[1].rfind(prefix, 0) == 0) continue;
    std::string bias;
    if (n.op_type == "Gemm" && n.inputs.size() > 2) bias = n.inputs[2];
    auto cons = ix.consumers.find(n.outputs[0]);
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

// ---- Llama (and Qwen2) ----------------------------------------------------------------
// Its linears have no bias, so their weights are anonymous MatMul initializers
// (onnx::MatMul_N, [in, out]); torch.onnx.export names each node after the module that
// made it ("/model/layers.0/self_attn/q_proj/MatMul"), which is what maps them. Qwen2 is
// the same graph plus a bias Added to q_proj, k_proj and v_proj: read at those Adds, it
// makes the config a qwen2 one (kiln's llama graph with those biases).

// "/m/model/layers.3/mlp/up_proj/MatMul" -> {3, "mlp/up_proj"}; {-1, ""} outside the
// decoder layers.
std::pair<int64_t, std::string> layer_module(const std::string& node_name) {
  const size_t at = node_name.find("/layers."), end = node_name.rfind('/');
  if (at == std::string::npos || end <= at) return {-1, ""};
  size_t i = at + 8, j = i;
  while (j < node_name.size() && j - i < 6 &&
         std::isdigit(static_cast<unsigned char>(node_name[j])))
    ++j;
  if (j == i || j >= end || node_name[j] != '/') return {-1, ""};
  return {std::atoll(node_name.c_str() + i), node_name.substr(j + 1, end - j - 1)};
}

// The module path of a node outside the layers: "/m/model/norm/Mul_1" -> "/m/model/norm".
std::string node_scope(const std::string& node_name) {
  const size_t end = node_name.rfind('/');
  return end == std::string::npos ? "" : node_name.substr(0, end);
}

// A float's shortest decimal, as a double ("0.001" for the float nearest 1e-3): the value
// the export's config held.
double shortest(float f) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, f);
  return std::strtod(std::string(buf, r.ptr).c_str(), nullptr);
}

// "mlp/up_proj" -> "mlp.up_proj".
std::string dotted(std::string module) {
  std::replace(module.begin(), module.end(), '/', '.');
  return module;
}

const char* const kLlamaProjections[] = {"self_attn/q_proj", "self_attn/k_proj", "self_attn/v_proj",
                                         "self_attn/o_proj", "mlp/gate_proj",    "mlp/up_proj",
                                         "mlp/down_proj"};

// A projection's weight [out, in]: the MatMul's constant [in, out] operand (what
// constant folding leaves), a Gemm's (transB: [out, in]), or the Transpose of a constant
// [out, in] (the named parameter, exported with do_constant_folding=False).
std::optional<Tensor> linear_weight(const Index& ix, const OnnxNode& n) {
  if (n.inputs.size() < 2) return std::nullopt;
  const bool trans_b = n.op_type == "Gemm" && n.attr("transB") && n.attr("transB")->i;
  if (auto b = ix.consts.find(n.inputs[1]); b != ix.consts.end())
    return b->second->rank() == 2 ? std::optional<Tensor>(trans_b ? b->second->to(DType::kF32)
                                                                  : transpose2d(*b->second))
                                  : std::nullopt;
  auto p = ix.producer.find(n.inputs[1]);
  if (n.op_type != "MatMul" || p == ix.producer.end() || p->second->op_type != "Transpose" ||
      p->second->inputs.empty())
    return std::nullopt;
  const OnnxAttribute* perm = p->second->attr("perm");
  auto c = ix.consts.find(p->second->inputs[0]);
  if ((perm && perm->ints != std::vector<int64_t>{1, 0}) || c == ix.consts.end() ||
      c->second->rank() != 2)
    return std::nullopt;
  return c->second->to(DType::kF32);
}

// RoPE's inverse frequencies: the float constant of head_dim / 2 values among the
// producers of the rotary Cos (positions x inv_freq, concatenated with itself).
const Tensor* find_inv_freq(const OnnxModel& m, const Index& ix, int64_t half, std::string* name) {
  for (auto& n : m.graph.nodes) {
    if (n.op_type != "Cos" || n.inputs.empty()) continue;
    std::vector<std::string> frontier = {n.inputs[0]};
    std::set<std::string> seen;
    for (int depth = 0; depth < 6 && !frontier.empty(); ++depth) {
      std::vector<std::string> next;
      for (auto& v : frontier) {
        if (!seen.insert(v).second) continue;
        if (auto c = ix.consts.find(v); c != ix.consts.end()) {
          if (c->second->dtype() == DType::kF32 && c->second->numel() == half)
            return *name = v, c->second;
          continue;
        }
        if (auto p = ix.producer.find(v); p != ix.producer.end())
          for (auto& in : p->second->inputs) next.push_back(in);
      }
      frontier = std::move(next);
    }
  }
  return nullptr;
}

std::optional<OnnxHfView> llama_view(const OnnxModel& m, const Index& ix, const OnnxTensor& embed,
                                     std::string* why) {
  std::map<std::string, Tensor> w;
  std::map<std::string, std::string> from;  // HF name -> the ONNX node it was read at
  std::string q_out;                        // layer 0's q_proj output
  const int64_t vocab = embed.value.dim(0), hidden = embed.value.dim(1);
  auto fail = [&](const std::string& what) { return *why = "llama: " + what, std::nullopt; };
  if (vocab <= 0 || hidden <= 0) return fail(str_cat("'", embed.name, "' is empty"));
  w["model.embed_tokens.weight"] = embed.value.to(DType::kF32);
  auto put = [&](const std::string& hf, Tensor t, const OnnxNode& n) {
    if (from.count(hf))
      return fail("two nodes read " + hf + " ('" + from[hf] + "' and '" + n.name + "')"), false;
    w[hf] = std::move(t), from[hf] = n.name;
    return true;
  };
  int64_t layers = 0;
  std::map<std::string, double> eps;  // norm weight -> the constant added to its mean square
  bool silu = false;
  bool has_head = false;
  for (auto& n : m.graph.nodes) {
    if (n.outputs.empty()) continue;
    auto [layer, module] = layer_module(n.name);
    const std::string scope = node_scope(n.name);
    if (layer >= 4096) return fail("node '" + n.name + "' is in layer " + std::to_string(layer));
    if (layer >= 0) layers = std::max(layers, layer + 1);
    const std::string hf = layer >= 0 ? str_cat("model.layers.", layer, ".") : "model.";
    if (n.op_type == "MatMul" || n.op_type == "Gemm") {
      const bool is_head = ends_with(scope, "/lm_head");
      const char* proj = nullptr;
      for (const char* p : kLlamaProjections)
        if (layer >= 0 && module == p) proj = p;
      if (!proj && !is_head) continue;
      const std::string what = is_head ? std::string("lm_head") : hf + dotted(proj);
      std::optional<Tensor> weight = linear_weight(ix, n);
      if (!weight)
        return fail(str_cat("node '", n.name, "' (", what,
                            ") does not multiply by a constant matrix (or its transpose)"));
      // The bias: a Gemm's C, or the constant of an Add on the product. Qwen2 has one on
      // q_proj, k_proj and v_proj (kiln's qwen2 graph); no other projection takes one.
      std::string bias, at = n.name, out = n.outputs[0];
      if (n.op_type == "Gemm" && n.inputs.size() > 2 && !n.inputs[2].empty()) bias = n.inputs[2];
      if (auto c = ix.consumers.find(n.outputs[0]); bias.empty() && c != ix.consumers.end())
        for (const OnnxNode* add : c->second)
          if (add->op_type == "Add" && !add->outputs.empty())
            for (auto& in : add->inputs)
              if (ix.consts.count(in)) bias = in, at = add->name, out = add->outputs[0];
      if (!bias.empty()) {
        const bool qkv =
            !is_head && module.rfind("self_attn/", 0) == 0 && module != "self_attn/o_proj";
        if (!qkv)
          return fail(
              str_cat(what, " adds a bias ('", bias, "' at node '", at,
                      "'); kiln's llama graph takes a bias on q_proj, k_proj and v_proj only "
                      "(Qwen2's), not on o_proj, the MLP or lm_head"));
        auto b = ix.consts.find(bias);
        if (b == ix.consts.end() || b->second->rank() != 1 || b->second->dim(0) != weight->dim(0))
          return fail(
              str_cat(what, "'s bias '", bias, "' at node '", at, "' is ",
                      b == ix.consts.end() ? std::string("computed") : b->second->shape_str(),
                      ", expected a constant [", weight->dim(0), "]"));
        if (!put(what + ".bias", b->second->to(DType::kF32), n)) return std::nullopt;
      }
      has_head |= is_head;
      if (what == "model.layers.0.self_attn.q_proj") q_out = out;
      if (!put(is_head ? "lm_head.weight" : what + ".weight", std::move(*weight), n))
        return std::nullopt;
      continue;
    }
    const bool layer_norm =
        layer >= 0 && (module == "input_layernorm" || module == "post_attention_layernorm");
    const bool final_norm = layer < 0 && ends_with(scope, "/model/norm");
    if (layer_norm || final_norm) {
      const std::string name = final_norm ? "model.norm.weight" : hf + module + ".weight";
      if (n.op_type == "Mul")
        for (auto& in : n.inputs)
          if (auto c = ix.consts.find(in);
              c != ix.consts.end() && c->second->rank() == 1 && c->second->dim(0) == hidden)
            if (!put(name, c->second->to(DType::kF32), n)) return std::nullopt;
      if (n.op_type == "Add")
        for (auto& in : n.inputs)
          if (auto c = ix.consts.find(in);
              c != ix.consts.end() && c->second->numel() == 1 && c->second->dtype() == DType::kF32)
            eps[name] = double(c->second->data_as<float>()[0]);
      continue;
    }
    if (n.op_type == "Sigmoid" && layer == 0 && module.rfind("mlp", 0) == 0) silu = true;
  }
  // Every tensor of every layer, and the norms' eps (one value throughout).
  if (layers <= 0)
    return fail("no nodes under /model/layers.N/ (the node names torch.onnx.export writes)");
  std::vector<std::string> need = {"model.norm.weight"};
  for (int64_t l = 0; l < layers; ++l) {
    for (const char* p : kLlamaProjections)
      need.push_back(str_cat("model.layers.", l, ".", dotted(p), ".weight"));
    for (const char* norm : {"input_layernorm", "post_attention_layernorm"})
      need.push_back(str_cat("model.layers.", l, ".", norm, ".weight"));
  }
  for (auto& name : need) {
    if (!w.count(name))
      return fail("no weight for " + name + " (a MatMul or RMSNorm Mul node under its module)");
    const bool norm = name.find("norm.weight") != std::string::npos;
    if (norm && !eps.count(name))
      return fail("cannot read the RMSNorm eps of " + name + " (no constant Add)");
    if (norm && eps.at(name) != eps.begin()->second)
      return fail(str_cat("RMSNorm eps ", eps.at(name), " at ", name, " but ", eps.begin()->second,
                          " at ", eps.begin()->first, " (kiln's llama graph has one eps)"));
  }
  // Qwen2: a bias on q_proj, k_proj and v_proj of every layer, or on none.
  std::string biased;
  for (auto& [name, t] : w)
    if (ends_with(name, ".bias")) biased = name;
  for (int64_t l = 0; !biased.empty() && l < layers; ++l)
    for (const char* p : {"q_proj", "k_proj", "v_proj"})
      if (const std::string proj = str_cat("model.layers.", l, ".self_attn.", p);
          !w.count(proj + ".bias"))
        return fail(
            str_cat(biased.substr(0, biased.size() - 5), " adds a bias but ", proj, " ('",
                    from.at(proj + ".weight"),
                    "') has none (kiln's qwen2 graph has a bias on q_proj, k_proj and v_proj of "
                    "every layer)"));
  if (!has_head) return fail("no lm_head MatMul (a node under /lm_head/)");
  if (!silu) return fail("the MLP of layer 0 has no Sigmoid (kiln's llama graph has a SiLU MLP)");
  // Heads: head_dim from q_proj's Reshape to [batch, seq, heads or -1, head_dim]; query
  // and KV heads from q_proj's and k_proj's widths.
  int64_t hd = 0;
  const int64_t q_width = w.at("model.layers.0.self_attn.q_proj.weight").dim(0);
  const int64_t kv_width = w.at("model.layers.0.self_attn.k_proj.weight").dim(0);
  // Bounded by q's width before the cast: a crafted target may hold any double.
  if (auto c = ix.consumers.find(q_out); c != ix.consumers.end())
    for (const OnnxNode* r : c->second)
      if (auto dims = reshape_target(ix, *r);
          dims.size() == 4 && dims[3] && *dims[3] >= 1 && *dims[3] <= double(q_width))
        hd = int64_t(*dims[3]);
  if (hd <= 0 || q_width % hd || kv_width % hd || kv_width < hd || q_width < kv_width ||
      (q_width / hd) % (kv_width / hd))
    return fail(
        str_cat("cannot tell the heads: q_proj of layer 0 ('",
                from.at("model.layers.0.self_attn.q_proj.weight"),
                "') is not reshaped to [.., .., heads, head_dim] with head_dim dividing its ",
                q_width, " columns and k_proj's ", kv_width, " (no wider than q_proj's)"));
  // RoPE: inv_freq[i] = 1 / (factor * theta^(2i / head_dim)); theta from the last entry
  // (the best conditioned), factor (linear scaling) from the first.
  std::string freq_name;
  const Tensor* freq = find_inv_freq(m, ix, hd / 2, &freq_name);
  if (!freq || hd < 4)
    return fail(str_cat(
        "cannot find RoPE's inverse frequencies (a float constant of head_dim / 2 = ", hd / 2,
        " values feeding the rotary Cos)"));
  const float* f = freq->data_as<float>();
  const int64_t half = hd / 2;
  const double factor = 1.0 / double(f[0]);
  double theta = std::pow(double(f[half - 1]) * factor, -double(hd) / double(2 * (half - 1)));
  auto fits = [&](double t, double tol) {
    for (int64_t i = 0; i < half; ++i)
      if (std::fabs(1.0 / (factor * std::pow(t, double(2 * i) / double(hd))) - f[i]) > tol * f[i])
        return false;
    return true;
  };
  if (!(theta > 1.0) || !std::isfinite(theta) || !(factor >= 1.0) || !fits(theta, 1e-4))
    return fail(str_cat(
        "RoPE's inverse frequencies '", freq_name, "' are not 1 / (factor * theta^(2i / ", hd,
        ")) for one theta and factor (a rope scaling kiln does not read from an ONNX graph)"));
  if (const double nice = std::stod(str_cat(std::setprecision(6), theta)); fits(nice, 1e-6))
    theta = nice;
  // The llama graph's cos / sin are unscaled (rope_type default or linear).
  for (auto& n : m.graph.nodes)
    if ((n.op_type == "Cos" || n.op_type == "Sin") && !n.outputs.empty() &&
        ix.consumers.count(n.outputs[0]))
      for (const OnnxNode* mul : ix.consumers.at(n.outputs[0]))
        if (mul->op_type == "Mul")
          for (auto& in : mul->inputs)
            if (auto s = ix.scalar(in); s && std::fabs(*s - 1.0) > 1e-6)
              return fail(str_cat("RoPE's ", n.op_type, " is scaled by ", *s, " ('", in,
                                  "': an attention factor kiln does not read from an ONNX graph)"));
  // Tied: the LM head is the embedding's transpose, bit for bit.
  const Tensor& head = w.at("lm_head.weight");
  const bool tied =
      head.shape() == w.at("model.embed_tokens.weight").shape() &&
      std::memcmp(head.data(), w.at("model.embed_tokens.weight").data(), head.nbytes()) == 0;
  if (head.dim(0) != vocab || head.dim(1) != hidden)
    return fail(str_cat("lm_head ('", from.at("lm_head.weight"), "') is [", head.dim(1), ", ",
                        head.dim(0), "], expected [", hidden, ", ", vocab, "]"));
  if (tied) w.erase("lm_head.weight");
  const std::string model_type = biased.empty() ? "llama" : "qwen2";
  OnnxHfView v;
  v.family = "llama";
  v.config = {{"model_type", model_type},
              {"vocab_size", vocab},
              {"hidden_size", hidden},
              {"num_hidden_layers", layers},
              {"num_attention_heads", q_width / hd},
              {"num_key_value_heads", kv_width / hd},
              {"head_dim", hd},
              {"intermediate_size", w.at("model.layers.0.mlp.gate_proj.weight").dim(0)},
              {"rms_norm_eps", shortest(float(eps.begin()->second))},
              {"rope_theta", theta},
              {"hidden_act", "silu"},
              {"tie_word_embeddings", tied}};
  if (std::fabs(factor - 1.0) > 1e-6)
    v.config["rope_scaling"] = {{"rope_type", "linear"}, {"factor", factor}};
  v.weights = std::make_unique<MapWeightSource>(std::move(w), model_type);
  return v;
}

// The export's KV-cache tensors must be exactly the family's cache: one key/value pair
// per layer, [batch, kv_heads, sequence, head_dim] with the graph's KV heads and head
// size (GPT-2 has no GQA: its KV heads are its heads).
void check_kv(const OnnxKvCache& kv, const OnnxHfView& v, const std::string& label) {
  if (kv.empty()) return;
  const nlohmann::json& c = v.config;
  const bool gpt2 = v.family == "gpt2";
  const int64_t layers = c.at(gpt2 ? "n_layer" : "num_hidden_layers");
  const int64_t heads = c.at(gpt2 ? "n_head" : "num_attention_heads");
  const int64_t kv_heads = gpt2 ? heads : int64_t(c.at("num_key_value_heads"));
  const int64_t hd = gpt2 ? int64_t(c.at("n_embd")) / heads : int64_t(c.at("head_dim"));
  const std::string& first = kv.layers[0].past_key.empty() ? kv.layers[0].present_key : kv.layers[0].past_key;
  const std::string graph = gpt2 ? str_cat("the gpt2 graph has ", heads, " attention heads of ", hd)
                                 : str_cat("the llama graph has ", kv_heads, " KV heads of ", hd,
                                           " (", heads, " query heads)");
  const std::string want = str_cat(" (expected [batch, ", kv_heads, ", sequence, ", hd, "])");
  if (int64_t(kv.layers.size()) != layers)
    throw_error(ErrorCode::kInvalidFile, label, ": the KV-cache tensors (", kv.describe(),
                ") are for ", kv.layers.size(), " layers, but the ", v.family, " graph has ",
                layers, gpt2 ? " (transformer.h.0.." : " (model.layers.0..", layers - 1, ")");
  if (kv.kv_heads && kv.kv_heads != kv_heads)
    throw_error(ErrorCode::kInvalidFile, label, ": '", first, "' has ", kv.kv_heads,
                " KV heads (dim 1), but ", graph, want);
  if (kv.head_dim && kv.head_dim != hd)
    throw_error(ErrorCode::kInvalidFile, label, ": '", first, "' has head_dim ", kv.head_dim,
                " (dim 3), but ", graph, want);
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
      if (v) check_kv(kv, *v, label), v->kv = std::move(kv);
      return v;
    }
    if (ends_with(t.name, "model.embed_tokens.weight") && t.value.rank() == 2) {
      auto v = llama_view(m, ix, t, why);
      if (v) check_kv(kv, *v, label), v->kv = std::move(kv);
      return v;
    }
  }
  *why = "no HF BERT, GPT-2 or Llama tensor names among the initializers";
  return std::nullopt;
}

}  // namespace kiln::onnx
