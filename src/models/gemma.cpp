// Gemma 2 (Gemma2ForCausalLM, model_type gemma2) and Gemma 3 text (Gemma3ForCausalLM,
// gemma3_text) decoders: the token embedding scaled by sqrt(hidden), RMSNorms that scale by
// (1 + w), "sandwich" norms (each block's output normalized again before its residual
// add), a GELU(tanh)-gated MLP, attention scaled by query_pre_attn_scalar^-1/2, local
// layers that attend to their last `sliding_window` keys (Attention's window attribute)
// beside global ones, and soft-capping where the config sets it: attention scores s become
// c tanh(s / c) (Attention's softcap attribute), the logits z the same with their own cap.
// Gemma 3 adds per-head q/k norms and a RoPE base per layer type; Gemma 2 has one RoPE.
// Tested in tests/models/decoder_golden_test.cpp against transformers' Gemma2ForCausalLM
// and Gemma3ForCausalLM.
#include <algorithm>
#include <cmath>

#include "core/log.h"
#include "core/status.h"
#include "core/weight_quant.h"
#include "frontends/hf_dir.h"
#include "models/model_builder.h"

namespace kiln {

namespace {

// RoPE inverse frequencies of one layer type: transformers v5's rope_parameters[type],
// else the older keys (global layers: rope_theta + rope_scaling; local layers:
// rope_local_base_freq, unscaled).
Tensor gemma_inv_freq(const nlohmann::json& c, const std::string& type, int64_t head_dim) {
  nlohmann::json rc = nlohmann::json::object();
  if (auto rp = c.find("rope_parameters"); rp != c.end() && rp->is_object() && rp->contains(type)) {
    const nlohmann::json& p = (*rp)[type];
    rc["rope_theta"] = p.value("rope_theta", 10000.0);
    if (p.value("rope_type", std::string("default")) != "default") rc["rope_scaling"] = p;
  } else if (type == "sliding_attention") {
    rc["rope_theta"] = config_float(c, "rope_local_base_freq", 10000.0);
  } else {
    rc["rope_theta"] = config_float(c, "rope_theta", 1000000.0);
    if (c.contains("rope_scaling")) rc["rope_scaling"] = c["rope_scaling"];
  }
  return rope_inv_freq(rc, head_dim);
}

// A Gemma RMSNorm weight as the (1 + w) that the norm scales by (in f32, as transformers).
Tensor one_plus(const Tensor& w) {
  Tensor t(DType::kF32, w.shape());
  const Tensor f = w.dtype() == DType::kF32 ? w : w.to(DType::kF32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = 1.0f + f.data_as<float>()[i];
  return t;
}

// A soft-cap from config.json: 0 where absent or null; kInvalidFile unless positive.
double softcap(const nlohmann::json& c, const char* key) {
  auto it = c.find(key);
  if (it == c.end() || it->is_null()) return 0.0;
  const double cap = config_float(c, key);
  if (!(cap > 0.0)) throw_error(ErrorCode::kInvalidFile, "config.json: ", key, " ", cap, " (expected > 0)");
  return cap;
}

// config.json with transformers' GemmaConfig / Gemma2Config / Gemma3TextConfig defaults for
// the keys it leaves out (an explicit null stays: no window, no soft-cap). Gemma 1 has no
// window, soft-caps or query_pre_attn_scalar (head_dim^-1/2).
nlohmann::json with_gemma_defaults(nlohmann::json c, int version) {
  const bool gemma3 = version == 3;
  const nlohmann::json defaults =
      version == 1 ? nlohmann::json{{"vocab_size", 256000}}
                   : nlohmann::json{{"vocab_size", gemma3 ? 262208 : 256000},
                                    {"query_pre_attn_scalar", 256},
                                    {"sliding_window", 4096},
                                    {"attn_logit_softcapping", gemma3 ? nlohmann::json() : nlohmann::json(50.0)},
                                    {"final_logit_softcapping", gemma3 ? nlohmann::json() : nlohmann::json(30.0)}};
  for (const auto& [key, value] : defaults.items())
    if (!c.contains(key)) c[key] = value;
  return c;
}

// Gemma 1, 2 or 3 (text). Gemma 1 has Llama's layout: input_layernorm before attention,
// post_attention_layernorm before the MLP, no sandwich norms, windows or soft-caps.
BuiltModel build_gemma(const nlohmann::json& config, const WeightSource& src, int version) {
  const nlohmann::json c = with_gemma_defaults(config, version);
  const bool gemma3 = version == 3, gemma1 = version == 1;
  BuiltModel m;
  ModelInfo& info = m.info;
  info.family = gemma3 ? "gemma3" : gemma1 ? "gemma" : "gemma2";
  const std::string what = info.family;
  read_decoder_info(c, gemma3 ? 131072 : 8192, info);
  info.head_dim = config_int(c, "head_dim", 256);  // transformers' Gemma2Config / Gemma3TextConfig default
  const int64_t h = info.hidden_size, v = info.vocab_size, hd = info.head_dim;
  const int64_t hq = info.num_heads, hkv = info.num_kv_heads, inter = config_int(c, "intermediate_size");
  const double eps = config_float(c, "rms_norm_eps", 1e-6);
  const double attn_cap = softcap(c, "attn_logit_softcapping"), final_cap = softcap(c, "final_logit_softcapping");
  // Gemma 1 names it hidden_act, whose legacy "gelu" transformers' GemmaConfig reads as the
  // tanh approximation.
  std::string act = config_str(c, "hidden_activation", gemma1 ? "" : "gelu_pytorch_tanh");
  if (gemma1 && act.empty()) act = config_str(c, "hidden_act", "gelu_pytorch_tanh");
  if (gemma1 && act == "gelu") act = "gelu_pytorch_tanh";
  if (act != "gelu_pytorch_tanh")
    throw_error(ErrorCode::kUnsupported, what, ": hidden_activation '", act, "' (expected gelu_pytorch_tanh)");
  auto flag = [&](const char* key) {  // absent or null: false (transformers writes null for unset ones)
    auto it = c.find(key);
    return it != c.end() && !it->is_null() && it->is_boolean() && it->get<bool>();
  };
  if (flag("use_bidirectional_attention"))
    throw_error(ErrorCode::kUnsupported, what, ": use_bidirectional_attention (an encoder variant) is not supported");
  if (flag("attention_bias")) throw_error(ErrorCode::kUnsupported, what, ": attention_bias");

  // Which layers slide: layer_types, else Gemma 3 every sliding_window_pattern-th layer
  // global, Gemma 2 every other one (layer 0 slides).
  std::vector<bool> pattern_slides;
  const int64_t pattern = gemma3 ? config_int(c, "sliding_window_pattern", 6) : 2;
  for (int64_t l = 0; l < info.num_layers; ++l)
    pattern_slides.push_back(!gemma1 && !(pattern > 0 && (l + 1) % pattern == 0));
  const std::vector<bool> slides = sliding_layers(c, info, std::move(pattern_slides));
  const std::vector<int64_t> window = sliding_windows(c, slides, info);

  std::vector<WeightSpec> specs = {
      {"model.embed_tokens.weight", {v, h}, true, "", false, false, /*table=*/true},
      {"model.norm.weight", {h}},
      {"lm_head.weight", {v, h}, true, "model.embed_tokens.weight", false, /*linear=*/true},
  };
  for (int64_t l = 0; l < info.num_layers; ++l) {
    const std::string b = "model.layers." + std::to_string(l) + ".";
    specs.push_back({b + "input_layernorm.weight", {h}});
    specs.push_back({b + "post_attention_layernorm.weight", {h}});
    if (!gemma1) {  // the sandwich norms
      specs.push_back({b + "pre_feedforward_layernorm.weight", {h}});
      specs.push_back({b + "post_feedforward_layernorm.weight", {h}});
    }
    if (gemma3) {
      specs.push_back({b + "self_attn.q_norm.weight", {hd}});
      specs.push_back({b + "self_attn.k_norm.weight", {hd}});
    }
    specs.push_back({b + "self_attn.q_proj.weight", {hq * hd, h}, true, "", false, /*linear=*/true});
    specs.push_back({b + "self_attn.k_proj.weight", {hkv * hd, h}, true, "", false, /*linear=*/true});
    specs.push_back({b + "self_attn.v_proj.weight", {hkv * hd, h}, true, "", false, /*linear=*/true});
    specs.push_back({b + "self_attn.o_proj.weight", {h, hq * hd}, true, "", false, /*linear=*/true});
    specs.push_back({b + "mlp.gate_proj.weight", {inter, h}, true, "", false, /*linear=*/true});
    specs.push_back({b + "mlp.up_proj.weight", {inter, h}, true, "", false, /*linear=*/true});
    specs.push_back({b + "mlp.down_proj.weight", {h, inter}, true, "", false, /*linear=*/true});
  }
  auto w = load_declared_weights(specs, src);

  ir::Graph& g = m.graph;
  auto W = [&](const std::string& name) { return g.add_weight(name, w.at(name)); };
  // The (1 + w) each norm scales by: a GGUF stores it so already (kNormsOnePlusConfigKey).
  const bool one_plus_stored = c.value(kNormsOnePlusConfigKey, false);
  auto norm_w = [&](const std::string& name) {
    const Tensor& t = w.at(name);
    return g.add_weight(name + ".one_plus",
                        one_plus_stored ? (t.dtype() == DType::kF32 ? t : t.to(DType::kF32)) : one_plus(t));
  };
  auto linear = [&](ir::ValueId x, const std::string& weight, int64_t k, const std::string& node) {
    const ir::ValueId wt = W(weight + ".weight");
    return g.add("Linear", {x, wt}, kept_quant_linear_attrs(g.weight(wt), k), node);
  };
  auto rms = [&](ir::ValueId x, const std::string& weight, const std::string& node) {
    return g.add("RMSNorm", {x, norm_w(weight)}, {{"eps", eps}}, node);
  };

  ir::ValueId tokens = g.add_input("tokens", DType::kI32, {"T"});
  ir::ValueId positions = g.add_input("positions", DType::kI32, {"T"});
  ir::ValueId rows = g.add_input("logit_rows", DType::kI32, {"R"});
  ir::ValueId inv_freq[2];
  if (gemma3) {
    inv_freq[0] = g.add_weight("rope.local_inv_freq", gemma_inv_freq(c, "sliding_attention", hd));
    inv_freq[1] = g.add_weight("rope.global_inv_freq", gemma_inv_freq(c, "full_attention", hd));
  } else {
    inv_freq[0] = inv_freq[1] = g.add_weight("rope.inv_freq", rope_inv_freq(c, hd));
  }
  const ir::ValueId table = W("model.embed_tokens.weight");
  ir::ValueId x = g.add("Embedding", {table, tokens}, kept_quant_table_attrs(g.weight(table), h), "embed_tokens");
  Tensor scale(DType::kF32, {h});
  for (int64_t i = 0; i < h; ++i) scale.data_as<float>()[i] = float(std::sqrt(double(h)));
  x = g.add("Mul", {x, g.add_weight("embed_scale", scale)}, {}, "embed_scale");
  const double att_scale = 1.0 / std::sqrt(config_float(c, "query_pre_attn_scalar", double(hd)));
  for (int64_t l = 0; l < info.num_layers; ++l) {
    const std::string b = "model.layers." + std::to_string(l) + ".", n = "layers." + std::to_string(l) + ".";
    const ir::ValueId freq = inv_freq[slides[size_t(l)] ? 0 : 1];
    const int64_t rot = 2 * g.weight(freq).dim(0);
    ir::ValueId a = rms(x, b + "input_layernorm.weight", n + "input_layernorm");
    ir::ValueId q = linear(a, b + "self_attn.q_proj", h, n + "q_proj");
    ir::ValueId k = linear(a, b + "self_attn.k_proj", h, n + "k_proj");
    ir::ValueId vv = linear(a, b + "self_attn.v_proj", h, n + "v_proj");
    if (gemma3) {
      q = g.add("HeadRMSNorm", {q, norm_w(b + "self_attn.q_norm.weight")}, {{"eps", eps}, {"head_dim", hd}},
                n + "q_norm");
      k = g.add("HeadRMSNorm", {k, norm_w(b + "self_attn.k_norm.weight")}, {{"eps", eps}, {"head_dim", hd}},
                n + "k_norm");
    }
    q = g.add("Rope", {q, positions, freq}, {{"num_heads", hq}, {"head_dim", hd}, {"rotary_dim", rot}}, n + "q_rope");
    k = g.add("Rope", {k, positions, freq}, {{"num_heads", hkv}, {"head_dim", hd}, {"rotary_dim", rot}}, n + "k_rope");
    std::map<std::string, ir::Attr> att_attrs = {{"layer", l},        {"num_heads", hq},       {"num_kv_heads", hkv},
                                                 {"head_dim", hd},    {"scale", att_scale}, {"causal", int64_t(1)}};
    if (window[size_t(l)]) att_attrs["window"] = window[size_t(l)];
    if (attn_cap > 0.0) att_attrs["softcap"] = attn_cap;
    ir::ValueId att = g.add("Attention", {q, k, vv}, std::move(att_attrs), n + "attn");
    ir::ValueId o = linear(att, b + "self_attn.o_proj", hq * hd, n + "o_proj");
    if (!gemma1) o = rms(o, b + "post_attention_layernorm.weight", n + "post_attention_layernorm");
    x = g.add("Add", {x, o}, {}, n + "residual_1");
    ir::ValueId f = gemma1 ? rms(x, b + "post_attention_layernorm.weight", n + "post_attention_layernorm")
                           : rms(x, b + "pre_feedforward_layernorm.weight", n + "pre_feedforward_layernorm");
    ir::ValueId gate = g.add("Gelu", {linear(f, b + "mlp.gate_proj", h, n + "gate_proj")}, {{"approximate", "tanh"}},
                             n + "act");
    ir::ValueId up = linear(f, b + "mlp.up_proj", h, n + "up_proj");
    f = linear(g.add("Mul", {gate, up}, {}, n + "gate_mul"), b + "mlp.down_proj", inter, n + "down_proj");
    if (!gemma1) f = rms(f, b + "post_feedforward_layernorm.weight", n + "post_feedforward_layernorm");
    x = g.add("Add", {x, f}, {}, n + "residual_2");
  }
  ir::ValueId hidden = rms(x, "model.norm.weight", "norm");
  ir::ValueId last = g.add("GatherRows", {hidden, rows}, {}, "select_rows");
  g.add_output("hidden", hidden);
  ir::ValueId logits = linear(last, "lm_head", h, "lm_head");
  if (final_cap > 0.0) {
    // z -> cap tanh(z / cap), as transformers computes it (divide, tanh, multiply).
    Tensor inv(DType::kF32, {v}), cap(DType::kF32, {v});
    for (int64_t i = 0; i < v; ++i) {
      inv.data_as<float>()[i] = float(1.0 / final_cap);
      cap.data_as<float>()[i] = float(final_cap);
    }
    logits = g.add("Mul", {logits, g.add_weight("logit_softcap.inv", std::move(inv))}, {}, "logit_softcap_in");
    logits = g.add("Tanh", {logits}, {}, "logit_softcap_tanh");
    logits = g.add("Mul", {logits, g.add_weight("logit_softcap.cap", std::move(cap))}, {}, "logit_softcap");
  }
  g.add_output("logits", logits);
  return m;
}

}  // namespace

BuiltModel build_gemma1(const nlohmann::json& c, const WeightSource& src) { return build_gemma(c, src, 1); }
BuiltModel build_gemma2(const nlohmann::json& c, const WeightSource& src) { return build_gemma(c, src, 2); }
BuiltModel build_gemma3(const nlohmann::json& c, const WeightSource& src) { return build_gemma(c, src, 3); }

namespace {

// The language model of a multimodal Gemma 3 checkpoint under the text model's names:
// "model.X" is transformers v5's "model.language_model.X" (v4: "language_model.model.X"),
// "lm_head.weight" v5's "lm_head.weight" (v4: "language_model.lm_head.weight"); the vision
// tower and projector are not read.
class GemmaTextTower final : public WeightSource {
 public:
  explicit GemmaTextTower(const WeightSource& inner) : inner_(inner) {
    if (inner.has("model.language_model.embed_tokens.weight")) {
      prefix_ = "model.language_model.";
      head_ = "lm_head.weight";
    } else if (inner.has("language_model.model.embed_tokens.weight")) {
      prefix_ = "language_model.model.";
      head_ = "language_model.lm_head.weight";
    } else {
      throw_error(ErrorCode::kInvalidFile, inner.describe(), ": a multimodal Gemma 3 checkpoint without its language ",
                  "model's weights (model.language_model.embed_tokens.weight or language_model.model.embed_tokens.weight)");
    }
    keep_quantized(inner.kept_quantized());
    keep_native(inner.keeps_native());
    keep_16bit(inner.keeps_16bit());
  }
  std::vector<std::string> names() const override {
    std::vector<std::string> out;
    for (const std::string& n : inner_.names()) {
      if (n.rfind(prefix_, 0) == 0) out.push_back("model." + n.substr(prefix_.size()));
      else if (n == head_) out.push_back("lm_head.weight");
    }
    std::sort(out.begin(), out.end());
    return out;
  }
  bool has(const std::string& name) const override { return inner_.has(outer(name)); }
  TensorInfo info(const std::string& name) const override { return inner_.info(outer(name)); }
  Tensor load(const std::string& name, DType want) const override { return inner_.load(outer(name), want); }
  std::string describe() const override { return inner_.describe() + " (its language model)"; }
  std::optional<Tensor> view(const std::string& name) const override { return inner_.view(outer(name)); }
  std::optional<Tensor> load_quantized(const std::string& name, QuantFormat f) const override {
    return inner_.load_quantized(outer(name), f);
  }
  bool stored_transposed(const std::string& name) const override { return inner_.stored_transposed(outer(name)); }
  std::optional<QuantFormat> native_quant(const std::string& name) const override {
    return inner_.native_quant(outer(name));
  }

 private:
  std::string outer(const std::string& name) const {
    if (name == "lm_head.weight") return head_;
    if (name.rfind("model.", 0) == 0) return prefix_ + name.substr(6);
    return name;
  }
  const WeightSource& inner_;
  std::string prefix_, head_;
};

}  // namespace

BuiltModel build_gemma3_multimodal(const nlohmann::json& c, const WeightSource& src) {
  auto it = c.find("text_config");
  if (it == c.end() || !it->is_object())
    throw_error(ErrorCode::kInvalidFile, "config.json: a gemma3 (multimodal) config without its text_config object");
  nlohmann::json text = *it;
  text["model_type"] = "gemma3_text";
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id", kPoolingConfigKey})
    if (!text.contains(key) && c.contains(key)) text[key] = c[key];
  const GemmaTextTower tower(src);
  log_info("gemma3: a multimodal checkpoint; kiln runs its language model (text in, text out), not the vision tower");
  return build_gemma(text, tower, 3);
}

}  // namespace kiln
