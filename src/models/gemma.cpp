// Gemma 3 text decoders (Gemma3ForCausalLM, model_type gemma3_text): the token
// embedding scaled by sqrt(hidden), RMSNorms that scale by (1 + w), per-head q/k norms,
// "sandwich" norms (each block's output normalized again before its residual add), a
// GELU(tanh)-gated MLP, attention scaled by query_pre_attn_scalar^-1/2, and RoPE whose base
// differs between the sliding-window (local) and full-attention (global) layers. The local
// layers attend to their last `sliding_window` keys (Attention's window attribute).
// Soft-capping (Gemma 2) is refused.
// Tested in tests/models/decoder_golden_test.cpp against transformers' Gemma3ForCausalLM.
#include <cmath>

#include "core/log.h"
#include "core/status.h"
#include "core/weight_quant.h"
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

}  // namespace

BuiltModel build_gemma3(const nlohmann::json& c, const WeightSource& src) {
  BuiltModel m;
  ModelInfo& info = m.info;
  info.family = "gemma3";
  read_decoder_info(c, 32768, info);
  info.head_dim = config_int(c, "head_dim", 256);  // transformers' Gemma3TextConfig default
  const int64_t h = info.hidden_size, v = info.vocab_size, hd = info.head_dim;
  const int64_t hq = info.num_heads, hkv = info.num_kv_heads, inter = config_int(c, "intermediate_size");
  const double eps = config_float(c, "rms_norm_eps", 1e-6);
  for (const char* cap : {"attn_logit_softcapping", "final_logit_softcapping"})
    if (c.contains(cap) && !c[cap].is_null())
      throw_error(ErrorCode::kUnsupported, "gemma3: ", cap, " (Gemma 2's soft-capping) is not supported");
  const std::string act = config_str(c, "hidden_activation", "gelu_pytorch_tanh");
  if (act != "gelu_pytorch_tanh")
    throw_error(ErrorCode::kUnsupported, "gemma3: hidden_activation '", act, "' (expected gelu_pytorch_tanh)");
  if (c.value("use_bidirectional_attention", false))
    throw_error(ErrorCode::kUnsupported, "gemma3: use_bidirectional_attention (an encoder variant) is not supported");
  if (c.value("attention_bias", false)) throw_error(ErrorCode::kUnsupported, "gemma3: attention_bias");

  // Which layers slide: layer_types, else every sliding_window_pattern-th layer is global.
  std::vector<std::string> types;
  if (auto lt = c.find("layer_types"); lt != c.end() && lt->is_array()) {
    for (const auto& t : *lt) types.push_back(t.is_string() ? t.get<std::string>() : "");
  } else {
    const int64_t pattern = config_int(c, "sliding_window_pattern", 6);
    for (int64_t l = 0; l < info.num_layers; ++l)
      types.push_back(pattern > 0 && (l + 1) % pattern == 0 ? "full_attention" : "sliding_attention");
  }
  if (int64_t(types.size()) != info.num_layers)
    throw_error(ErrorCode::kInvalidFile, "config.json: layer_types has ", types.size(), " entries for ", info.num_layers,
                " layers");
  std::vector<bool> slides;
  for (const auto& t : types) {
    if (t != "sliding_attention" && t != "full_attention")
      throw_error(ErrorCode::kInvalidFile, "config.json: layer type '", t, "' (sliding_attention or full_attention)");
    slides.push_back(t == "sliding_attention");
  }
  const std::vector<int64_t> window = sliding_windows(c, slides, info);

  std::vector<WeightSpec> specs = {
      {"model.embed_tokens.weight", {v, h}, true, "", false, false, /*table=*/true},
      {"model.norm.weight", {h}},
      {"lm_head.weight", {v, h}, true, "model.embed_tokens.weight", false, /*linear=*/true},
  };
  for (int64_t l = 0; l < info.num_layers; ++l) {
    const std::string b = "model.layers." + std::to_string(l) + ".";
    for (const char* n : {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                          "post_feedforward_layernorm"})
      specs.push_back({b + n + ".weight", {h}});
    specs.push_back({b + "self_attn.q_norm.weight", {hd}});
    specs.push_back({b + "self_attn.k_norm.weight", {hd}});
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
  auto norm_w = [&](const std::string& name) { return g.add_weight(name + ".one_plus", one_plus(w.at(name))); };
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
  ir::ValueId inv_freq[2] = {g.add_weight("rope.local_inv_freq", gemma_inv_freq(c, "sliding_attention", hd)),
                             g.add_weight("rope.global_inv_freq", gemma_inv_freq(c, "full_attention", hd))};
  const ir::ValueId table = W("model.embed_tokens.weight");
  ir::ValueId x = g.add("Embedding", {table, tokens}, kept_quant_table_attrs(g.weight(table), h), "embed_tokens");
  Tensor scale(DType::kF32, {h});
  for (int64_t i = 0; i < h; ++i) scale.data_as<float>()[i] = float(std::sqrt(double(h)));
  x = g.add("Mul", {x, g.add_weight("embed_scale", scale)}, {}, "embed_scale");
  const double att_scale = 1.0 / std::sqrt(config_float(c, "query_pre_attn_scalar", double(hd)));
  for (int64_t l = 0; l < info.num_layers; ++l) {
    const std::string b = "model.layers." + std::to_string(l) + ".", n = "layers." + std::to_string(l) + ".";
    const ir::ValueId freq = inv_freq[types[size_t(l)] == "full_attention" ? 1 : 0];
    const int64_t rot = 2 * g.weight(freq).dim(0);
    ir::ValueId a = rms(x, b + "input_layernorm.weight", n + "input_layernorm");
    ir::ValueId q = linear(a, b + "self_attn.q_proj", h, n + "q_proj");
    ir::ValueId k = linear(a, b + "self_attn.k_proj", h, n + "k_proj");
    ir::ValueId vv = linear(a, b + "self_attn.v_proj", h, n + "v_proj");
    q = g.add("HeadRMSNorm", {q, norm_w(b + "self_attn.q_norm.weight")}, {{"eps", eps}, {"head_dim", hd}}, n + "q_norm");
    k = g.add("HeadRMSNorm", {k, norm_w(b + "self_attn.k_norm.weight")}, {{"eps", eps}, {"head_dim", hd}}, n + "k_norm");
    q = g.add("Rope", {q, positions, freq}, {{"num_heads", hq}, {"head_dim", hd}, {"rotary_dim", rot}}, n + "q_rope");
    k = g.add("Rope", {k, positions, freq}, {{"num_heads", hkv}, {"head_dim", hd}, {"rotary_dim", rot}}, n + "k_rope");
    std::map<std::string, ir::Attr> att_attrs = {{"layer", l},        {"num_heads", hq},       {"num_kv_heads", hkv},
                                                 {"head_dim", hd},    {"scale", att_scale}, {"causal", int64_t(1)}};
    if (window[size_t(l)]) att_attrs["window"] = window[size_t(l)];
    ir::ValueId att = g.add("Attention", {q, k, vv}, std::move(att_attrs), n + "attn");
    ir::ValueId o = rms(linear(att, b + "self_attn.o_proj", hq * hd, n + "o_proj"), b + "post_attention_layernorm.weight",
                        n + "post_attention_layernorm");
    x = g.add("Add", {x, o}, {}, n + "residual_1");
    ir::ValueId f = rms(x, b + "pre_feedforward_layernorm.weight", n + "pre_feedforward_layernorm");
    ir::ValueId gate = g.add("Gelu", {linear(f, b + "mlp.gate_proj", h, n + "gate_proj")}, {{"approximate", "tanh"}},
                             n + "act");
    ir::ValueId up = linear(f, b + "mlp.up_proj", h, n + "up_proj");
    f = linear(g.add("Mul", {gate, up}, {}, n + "gate_mul"), b + "mlp.down_proj", inter, n + "down_proj");
    f = rms(f, b + "post_feedforward_layernorm.weight", n + "post_feedforward_layernorm");
    x = g.add("Add", {x, f}, {}, n + "residual_2");
  }
  ir::ValueId hidden = rms(x, "model.norm.weight", "norm");
  ir::ValueId last = g.add("GatherRows", {hidden, rows}, {}, "select_rows");
  g.add_output("hidden", hidden);
  g.add_output("logits", linear(last, "lm_head", h, "lm_head"));
  return m;
}

}  // namespace kiln
