// The Llama family (Llama 2/3, Mistral, Qwen2, Qwen3, Phi-3, SmolLM, TinyLlama): RMSNorm,
// RoPE with optional Llama-3/linear scaling and partial rotary dims, GQA/MQA, SwiGLU MLP,
// optional QKV bias (Qwen2), per-head q/k RMSNorm before RoPE (Qwen3), fused qkv_proj and
// gate_up_proj (Phi-3), tied or untied LM head. Tested in tests/models/decoder_golden_test.cpp
// against transformers' LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM and
// Phi3ForCausalLM.
#include <algorithm>
#include <cmath>

#include "core/log.h"
#include "core/status.h"
#include "core/weight_quant.h"
#include "frontends/gguf_hf.h"
#include "frontends/hf_dir.h"
#include "models/model_builder.h"

namespace kiln {

namespace {

Tensor rope_inv_freq_of_type(const nlohmann::json& c, int64_t head_dim, RopeExtras* extras) {
  // transformers v5 writes the rope settings only under "rope_parameters" (rope_theta,
  // rope_type with its parameters, partial_rotary_factor); older configs keep rope_theta,
  // rope_scaling and partial_rotary_factor at the top level. As transformers reads them:
  // a rope_scaling replaces rope_parameters, and a value missing from the one in use comes
  // from the top level. (A rope_parameters nested by layer type is the caller's: Gemma 3.)
  const nlohmann::json* rp = nullptr;
  if (auto it = c.find("rope_scaling"); it != c.end() && it->is_object()) {
    rp = &*it;
  } else if (auto jt = c.find("rope_parameters"); jt != c.end() && jt->is_object() &&
                                                  (jt->contains("rope_theta") || jt->contains("rope_type"))) {
    rp = &*jt;
  }
  auto number = [&](const char* key, double fallback) {
    if (rp && rp->contains(key) && (*rp)[key].is_number()) return (*rp)[key].get<double>();
    return config_float(c, key, fallback);
  };
  const float base = float(number("rope_theta", 10000.0));
  const int64_t dim = int64_t(double(head_dim) * number("partial_rotary_factor", 1.0));
  Tensor t(DType::kF32, {dim / 2});
  float* f = t.data_as<float>();
  for (int64_t i = 0; i < dim / 2; ++i)
    f[i] = 1.0f / std::pow(base, float(2 * i) / float(dim));
  if (!rp) return t;
  const nlohmann::json& s = *rp;
  std::string type = s.value("rope_type", s.value("type", std::string("default")));
  // transformers' Phi3Config reads the older names "su" and "yarn" as "longrope".
  if (c.value("model_type", "") == "phi3" && (type == "su" || type == "yarn")) type = "longrope";
  if (type == "default") return t;
  auto num = [&](const char* k) {
    if (!s.contains(k) || !s[k].is_number())
      throw_error(ErrorCode::kInvalidFile, "config.json: rope_scaling (", type, ") needs '", k, "'");
    return s[k].get<double>();
  };
  if (type == "linear") {
    float factor = float(num("factor"));
    for (int64_t i = 0; i < dim / 2; ++i) f[i] /= factor;
    return t;
  }
  if (type == "llama3") {
    // transformers' _compute_llama3_parameters: long wavelengths are divided by
    // `factor`, short ones kept, the band between is interpolated smoothly.
    const float factor = float(num("factor")), lo = float(num("low_freq_factor"));
    const float hi = float(num("high_freq_factor"));
    const float old_ctx = float(num("original_max_position_embeddings"));
    const float lo_wavelen = old_ctx / lo, hi_wavelen = old_ctx / hi;
    for (int64_t i = 0; i < dim / 2; ++i) {
      float inv = f[i];
      float wavelen = 2.0f * float(M_PI) / inv;
      float scaled = wavelen > lo_wavelen ? inv / factor : inv;
      if (!(wavelen < hi_wavelen) && !(wavelen > lo_wavelen)) {
        float smooth = (old_ctx / wavelen - lo) / (hi - lo);
        scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
      }
      f[i] = scaled;
    }
    return t;
  }
  if (type == "longrope") {
    // transformers' _compute_longrope_parameters: inv_freq / short_factor at sequence
    // lengths up to original_max_position_embeddings, inv_freq / long_factor past it, and
    // cos / sin times the attention factor (sqrt(1 + ln(factor) / ln(original)) unless
    // given) at both. The short ones are returned, the long ones go to the caller.
    if (!extras)
      throw_error(ErrorCode::kUnsupported, "config.json: rope_scaling type 'longrope' in this model family");
    for (const char* key : {"short_factor", "long_factor"})
      if (!s.contains(key) || !s[key].is_array() || int64_t(s[key].size()) != dim / 2)
        throw_error(ErrorCode::kInvalidFile, "config.json: rope_scaling (longrope) needs '", key, "' with ", dim / 2,
                    " values (rotary dims / 2)");
    const double original = number("original_max_position_embeddings", 0.0);
    if (!(original > 0.0))
      throw_error(ErrorCode::kInvalidFile, "config.json: rope_scaling (longrope) needs original_max_position_embeddings");
    const double factor = s.contains("factor") && s["factor"].is_number()
                              ? s["factor"].get<double>()
                              : config_float(c, "max_position_embeddings", original) / original;
    extras->original_max_positions = int64_t(original);
    extras->attention_factor = s.contains("attention_factor") && s["attention_factor"].is_number()
                                     ? s["attention_factor"].get<double>()
                                     : factor <= 1.0 ? 1.0 : std::sqrt(1.0 + std::log(factor) / std::log(original));
    // 1 / (factor * base^(2i/dim)) in f32, as transformers divides.
    extras->long_inv_freq = Tensor(DType::kF32, {dim / 2});
    for (const char* key : {"short_factor", "long_factor"}) {
      float* out = key[0] == 's' ? f : extras->long_inv_freq.data_as<float>();
      for (int64_t i = 0; i < dim / 2; ++i) {
        const nlohmann::json& e = s[key][size_t(i)];
        if (!e.is_number())
          throw_error(ErrorCode::kInvalidFile, "config.json: longrope ", key, "[", i, "] is not a number");
        out[i] = 1.0f / (float(e.get<double>()) * std::pow(base, float(2 * i) / float(dim)));
      }
    }
    return t;
  }
  if (type == "yarn") {
    // transformers' _compute_yarn_parameters (static: every position): each frequency a
    // blend of itself (extrapolation) and itself / factor (interpolation), by a linear ramp
    // over the dims between the correction range of beta_fast and beta_slow rotations in
    // the original context; cos / sin times the attention factor (0.1 ln(factor) + 1, or
    // the mscale / mscale_all_dim ratio, unless given).
    if (!extras) throw_error(ErrorCode::kUnsupported, "config.json: rope_scaling type 'yarn' in this model family");
    const double max_pos = config_float(c, "max_position_embeddings", 0.0);
    const double original = number("original_max_position_embeddings", max_pos);
    if (!(original > 0.0))
      throw_error(ErrorCode::kInvalidFile, "config.json: rope_scaling (yarn) needs original_max_position_embeddings");
    const double factor = s.contains("factor") && s["factor"].is_number() ? s["factor"].get<double>() : max_pos / original;
    if (!(factor > 0.0) || !std::isfinite(factor))
      throw_error(ErrorCode::kInvalidFile, "config.json: rope_scaling (yarn) factor ", factor, " (expected > 0)");
    auto opt = [&](const char* k, double fallback) {
      // transformers reads these with `or`: a 0 or null takes the default too.
      return s.contains(k) && s[k].is_number() && s[k].get<double>() != 0.0 ? s[k].get<double>() : fallback;
    };
    auto get_mscale = [](double scale, double m) { return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
    if (s.contains("attention_factor") && s["attention_factor"].is_number())
      extras->attention_factor = s["attention_factor"].get<double>();
    else if (opt("mscale", 0.0) != 0.0 && opt("mscale_all_dim", 0.0) != 0.0)
      extras->attention_factor = get_mscale(factor, opt("mscale", 0.0)) / get_mscale(factor, opt("mscale_all_dim", 0.0));
    else
      extras->attention_factor = get_mscale(factor, 1.0);
    const double beta_fast = opt("beta_fast", 32.0), beta_slow = opt("beta_slow", 1.0);
    const bool truncate = !s.contains("truncate") || !s["truncate"].is_boolean() || s["truncate"].get<bool>();
    auto correction_dim = [&](double rotations) {
      return double(dim) * std::log(original / (rotations * 2.0 * M_PI)) / (2.0 * std::log(double(base)));
    };
    double low = correction_dim(beta_fast), high = correction_dim(beta_slow);
    if (truncate) low = std::floor(low), high = std::ceil(high);
    low = std::max(low, 0.0);
    high = std::min(high, double(dim - 1));
    if (low == high) high += 0.001;  // as transformers: no division by zero
    for (int64_t i = 0; i < dim / 2; ++i) {
      const float pos_freq = std::pow(base, float(2 * i) / float(dim));
      const float extrapolation = 1.0f / pos_freq, interpolation = 1.0f / (float(factor) * pos_freq);
      const float ramp = std::clamp((float(i) - float(low)) / (float(high) - float(low)), 0.0f, 1.0f);
      f[i] = interpolation * ramp + extrapolation * (1.0f - ramp);
    }
    return t;
  }
  throw_error(ErrorCode::kUnsupported, "config.json: rope_scaling type '", type,
              "' is not supported (supported: default, linear, llama3, longrope, yarn)");
}

}  // namespace

Tensor rope_inv_freq(const nlohmann::json& c, int64_t head_dim, RopeExtras* extras) {
  Tensor t = rope_inv_freq_of_type(c, head_dim, extras);
  // A GGUF's rope_freqs.weight (kRopeFreqFactorsConfigKey): llama.cpp divides each
  // frequency by its entry.
  auto it = c.find(kRopeFreqFactorsConfigKey);
  if (it == c.end()) return t;
  if (!it->is_array() || int64_t(it->size()) != t.dim(0))
    throw_error(ErrorCode::kInvalidFile, "rope frequency factors: ", it->is_array() ? it->size() : 0, " values for ",
                t.dim(0), " rotary frequencies");
  float* f = t.data_as<float>();
  for (int64_t i = 0; i < t.dim(0); ++i) f[i] /= (*it)[size_t(i)].get<float>();
  return t;
}

void read_decoder_info(const nlohmann::json& c, int64_t default_max_positions, ModelInfo& info) {
  info.vocab_size = config_int(c, "vocab_size");
  info.hidden_size = config_int(c, "hidden_size");
  info.num_layers = config_int(c, "num_hidden_layers");
  // Builders make per-layer specs and types: a corrupt count must not ask for billions.
  if (info.num_layers < 1 || info.num_layers > 4096)
    throw_error(ErrorCode::kInvalidFile, "config.json: num_hidden_layers ", info.num_layers, " (expected 1 to 4096)");
  info.num_heads = config_int(c, "num_attention_heads");
  if (info.num_heads < 1)
    throw_error(ErrorCode::kInvalidFile, "config.json: num_attention_heads ", info.num_heads,
                " (expected >= 1)");
  info.num_kv_heads = config_int(c, "num_key_value_heads", info.num_heads);
  info.head_dim = config_int(c, "head_dim", info.hidden_size / info.num_heads);
  info.max_positions = config_int(c, "max_position_embeddings", default_max_positions);
  info.bos_token_id = config_int(c, "bos_token_id", -1);
  if (c.contains("eos_token_id") && c["eos_token_id"].is_array() && !c["eos_token_id"].empty())
    info.eos_token_id = c["eos_token_id"][0].get<int64_t>();
  else
    info.eos_token_id = config_int(c, "eos_token_id", -1);
  if (info.num_kv_heads <= 0 || info.num_heads % info.num_kv_heads)
    throw_error(ErrorCode::kInvalidFile, "config.json: num_attention_heads ", info.num_heads,
                " is not a multiple of num_key_value_heads ", info.num_kv_heads);
}

std::vector<int64_t> sliding_windows(const nlohmann::json& c, const std::vector<bool>& slides,
                                     const ModelInfo& info) {
  std::vector<int64_t> windows(slides.size(), 0);
  auto it = c.find("sliding_window");
  if (it == c.end() || it->is_null()) return windows;
  const int64_t window = config_int(c, "sliding_window");
  if (window < 1) throw_error(ErrorCode::kInvalidFile, "config.json: sliding_window ", window, " (expected >= 1)");
  for (size_t l = 0; l < slides.size(); ++l)
    if (slides[l] && window < info.max_positions) windows[l] = window;
  return windows;
}

std::vector<bool> sliding_layers(const nlohmann::json& c, const ModelInfo& info, std::vector<bool> fallback) {
  auto lt = c.find("layer_types");
  if (lt == c.end() || !lt->is_array()) return fallback;
  if (int64_t(lt->size()) != info.num_layers)
    throw_error(ErrorCode::kInvalidFile, "config.json: layer_types has ", lt->size(), " entries for ", info.num_layers,
                " layers");
  std::vector<bool> slides;
  for (const auto& t : *lt) {
    if (!t.is_string() || (t.get<std::string>() != "sliding_attention" && t.get<std::string>() != "full_attention"))
      throw_error(ErrorCode::kInvalidFile, "config.json: layer type ", t.dump(),
                  " (expected \"sliding_attention\" or \"full_attention\")");
    slides.push_back(t.get<std::string>() == "sliding_attention");
  }
  return slides;
}

BuiltModel build_llama(const nlohmann::json& c, const WeightSource& src) {
  BuiltModel m;
  ModelInfo& info = m.info;
  info.family = "llama";
  read_decoder_info(c, 2048, info);
  const std::string type = c.value("model_type", "");
  // SmolLM3: layers whose no_rope_layers entry is 0 take no RoPE (NoPE); without the list,
  // every no_rope_layer_interval-th layer (transformers' SmolLM3Config).
  std::vector<bool> rotates(size_t(info.num_layers), true);
  if (type == "smollm3") {
    if (auto it = c.find("no_rope_layers"); it != c.end() && !it->is_null()) {
      if (!it->is_array() || int64_t(it->size()) != info.num_layers)
        throw_error(ErrorCode::kInvalidFile, "config.json: no_rope_layers must hold one 0/1 entry per layer (",
                    info.num_layers, ")");
      for (size_t l = 0; l < rotates.size(); ++l) {
        if (!(*it)[l].is_number_integer())
          throw_error(ErrorCode::kInvalidFile, "config.json: no_rope_layers[", l, "] is not 0 or 1");
        rotates[l] = (*it)[l].get<int64_t>() != 0;
      }
    } else {
      const int64_t every = config_int(c, "no_rope_layer_interval", 4);
      if (every < 1) throw_error(ErrorCode::kInvalidFile, "config.json: no_rope_layer_interval ", every, " (expected >= 1)");
      for (size_t l = 0; l < rotates.size(); ++l) rotates[l] = int64_t(l + 1) % every != 0;
    }
  }
  // Which layers slide (transformers): layer_types where given; else Mistral, Ministral and
  // Phi-3 every layer, Qwen2/Qwen3 with use_sliding_window the layers from max_window_layers on,
  // SmolLM3 with use_sliding_window its NoPE layers (and no layer without it); Llama configs
  // have no sliding window.
  std::vector<bool> fallback(size_t(info.num_layers), false);
  if (type == "mistral" || type == "ministral" || type == "phi3") {
    fallback.assign(fallback.size(), true);
  } else if ((type == "qwen2" || type == "qwen3") && c.value("use_sliding_window", false)) {
    const int64_t from = config_int(c, "max_window_layers", 0);
    for (size_t l = 0; l < fallback.size(); ++l) fallback[l] = int64_t(l) >= from;
  } else if (type == "smollm3") {
    for (size_t l = 0; l < fallback.size(); ++l) fallback[l] = !rotates[l];
  }
  // Ministral's config leaves out a window of 4096 (transformers' MinistralConfig default).
  nlohmann::json with_window;
  if (type == "ministral" && !c.contains("sliding_window")) {
    with_window = c;
    with_window["sliding_window"] = 4096;
  }
  std::vector<int64_t> window =
      sliding_windows(with_window.is_null() ? c : with_window, sliding_layers(c, info, std::move(fallback)), info);
  if (type == "smollm3" && !c.value("use_sliding_window", false)) window.assign(window.size(), 0);
  const int64_t h = info.hidden_size, v = info.vocab_size, hd = info.head_dim;
  const int64_t hq = info.num_heads, hkv = info.num_kv_heads;
  const int64_t inter = config_int(c, "intermediate_size");
  const double eps = config_float(c, "rms_norm_eps", 1e-6);
  std::string act = config_str(c, "hidden_act", "silu");
  if (act != "silu") throw_error(ErrorCode::kUnsupported, "llama: hidden_act '", act, "' (expected silu)");
  const bool qkv_bias = type == "qwen2" || c.value("attention_bias", false);
  // GLM-4: attention_bias is q/k/v's only.
  const bool o_bias = type != "qwen2" && type != "glm4" && c.value("attention_bias", false);
  const bool mlp_bias = c.value("mlp_bias", false);
  const bool qk_norm = type == "qwen3";
  // OLMo 2: no norm before attention or MLP; each one's output RMS-normalized before its
  // residual add (post_attention_layernorm, post_feedforward_layernorm), and q and k
  // RMS-normalized over the whole projection (q_norm [hq * hd], k_norm [hkv * hd]).
  const bool olmo2 = type == "olmo2";
  // GLM-4: Llama's pre-norms plus each block's output RMS-normalized before its residual
  // add (post_self_attn_layernorm, post_mlp_layernorm), gate|up in one gate_up_proj, and
  // RoPE on interleaved pairs (2i, 2i + 1) of its rotary dims, taken to kiln's halves by a
  // row permutation of q_proj / k_proj at load (q.k is the same under one permutation of
  // both).
  const bool glm4 = type == "glm4";
  // Phi-3: q|k|v in one qkv_proj and gate|up in one gate_up_proj, read as row views of
  // them under the Llama names (fuse_qkv_attention and fuse_swiglu stack the views back
  // into the same bytes, without a copy).
  const bool fused_proj = type == "phi3";
  const bool fused_gate_up = fused_proj || glm4;
  std::vector<WeightSpec> specs = {
      {"model.embed_tokens.weight", {v, h}, true, "", false, false, /*table=*/true},
      {"model.norm.weight", {h}},
      {"lm_head.weight", {v, h}, true, "model.embed_tokens.weight", false, /*linear=*/true},
  };
  for (int64_t l = 0; l < info.num_layers; ++l) {
    std::string b = "model.layers." + std::to_string(l) + ".";
    if (!olmo2) specs.push_back({b + "input_layernorm.weight", {h}});
    if (fused_proj) {
      specs.push_back({b + "self_attn.qkv_proj.weight", {(hq + 2 * hkv) * hd, h}, true, "", false, /*linear=*/true});
    } else {
      specs.push_back({b + "self_attn.q_proj.weight", {hq * hd, h}, true, "", false, /*linear=*/true});
      specs.push_back({b + "self_attn.k_proj.weight", {hkv * hd, h}, true, "", false, /*linear=*/true});
      specs.push_back({b + "self_attn.v_proj.weight", {hkv * hd, h}, true, "", false, /*linear=*/true});
    }
    if (fused_gate_up) {
      specs.push_back({b + "mlp.gate_up_proj.weight", {2 * inter, h}, true, "", false, /*linear=*/true});
    } else {
      specs.push_back({b + "mlp.gate_proj.weight", {inter, h}, true, "", false, /*linear=*/true});
      specs.push_back({b + "mlp.up_proj.weight", {inter, h}, true, "", false, /*linear=*/true});
    }
    if (glm4) {
      specs.push_back({b + "post_self_attn_layernorm.weight", {h}});
      specs.push_back({b + "post_mlp_layernorm.weight", {h}});
    }
    specs.push_back({b + "self_attn.o_proj.weight", {h, hq * hd}, true, "", false, /*linear=*/true});
    specs.push_back({b + "self_attn.q_proj.bias", {hq * hd}, qkv_bias});
    specs.push_back({b + "self_attn.k_proj.bias", {hkv * hd}, qkv_bias});
    specs.push_back({b + "self_attn.v_proj.bias", {hkv * hd}, qkv_bias});
    specs.push_back({b + "self_attn.o_proj.bias", {h}, o_bias});
    if (olmo2) {
      specs.push_back({b + "self_attn.q_norm.weight", {hq * hd}});
      specs.push_back({b + "self_attn.k_norm.weight", {hkv * hd}});
      specs.push_back({b + "post_feedforward_layernorm.weight", {h}});
    }
    if (qk_norm) {
      specs.push_back({b + "self_attn.q_norm.weight", {hd}});
      specs.push_back({b + "self_attn.k_norm.weight", {hd}});
    }
    specs.push_back({b + "post_attention_layernorm.weight", {h}});
    specs.push_back({b + "mlp.down_proj.weight", {h, inter}, true, "", false, /*linear=*/true});
    specs.push_back({b + "mlp.gate_proj.bias", {inter}, mlp_bias});
    specs.push_back({b + "mlp.up_proj.bias", {inter}, mlp_bias});
    specs.push_back({b + "mlp.down_proj.bias", {h}, mlp_bias});
  }
  auto w = load_declared_weights(specs, src);
  if (fused_gate_up)
    for (int64_t l = 0; l < info.num_layers; ++l) {
      const std::string b = "model.layers." + std::to_string(l) + ".";
      // Rows of f32 / 16-bit weights, or of a kept q8/q4 image (a GGUF's codes: [rows,
      // bytes a row], each row self-contained).
      auto split = [&](const std::string& fused, std::vector<std::pair<std::string, int64_t>> parts) {
        const Tensor t = w.at(b + fused);
        if (t.dtype() != DType::kF32 && t.dtype() != DType::kBF16 && t.dtype() != DType::kF16 &&
            !(t.dtype() == DType::kU8 && t.rank() == 2))
          throw_error(ErrorCode::kUnsupported, type, ": ", b, fused, " is stored as ", dtype_name(t.dtype()),
                      "; kiln splits fused projections of f32/bf16/f16 weights and q8/q4 images only");
        int64_t row = 0;
        for (auto& [name, rows] : parts) {
          w[b + name] = t.slice_rows(row, row + rows);
          row += rows;
        }
        w.erase(b + fused);
      };
      if (fused_proj)
        split("self_attn.qkv_proj.weight", {{"self_attn.q_proj.weight", hq * hd},
                                            {"self_attn.k_proj.weight", hkv * hd},
                                            {"self_attn.v_proj.weight", hkv * hd}});
      split("mlp.gate_up_proj.weight", {{"mlp.gate_proj.weight", inter}, {"mlp.up_proj.weight", inter}});
    }

  RopeExtras rope;
  Tensor inv_freq_t = rope_inv_freq(c, hd, &rope);
  const int64_t rotary_dim = 2 * inv_freq_t.dim(0);
  // Granite: the attention's scale is attention_multiplier; the embeddings are multiplied
  // by embedding_multiplier, each block's output by residual_multiplier before its residual
  // add, and the logits divided by logits_scaling.
  const bool granite = type == "granite";
  auto multiplier = [&](const char* key) {
    const double v = granite ? config_float(c, key, 1.0) : 1.0;
    if (!(v > 0.0) || !std::isfinite(v)) throw_error(ErrorCode::kInvalidFile, "config.json: ", key, " ", v, " (expected > 0)");
    return v;
  };
  const double embedding_mult = multiplier("embedding_multiplier"), residual_mult = multiplier("residual_multiplier"),
               logits_scaling = multiplier("logits_scaling");
  double scale = granite ? multiplier("attention_multiplier") : 1.0 / std::sqrt(double(hd));
  if (const double f = rope.attention_factor; f != 1.0) {
    // LongRoPE and YaRN multiply cos and sin by an attention factor f: the rotated dims of
    // q and k come out scaled by it. Where every dim is rotated (Phi-3.5-mini, Qwen), q.k is
    // f^2 times what it was, which the attention's scale takes (whatever the weights'
    // storage). Else (Phi-4-mini rotates 3/4 of each head) the rotated rows of q_proj and
    // k_proj (and their biases) are scaled at load: a rotation commutes with a scalar.
    if (rotary_dim == hd) {
      scale *= f * f;
    } else {
      if (qk_norm)
        throw_error(ErrorCode::kUnsupported, "llama: RoPE's attention factor with per-head q/k norms and a "
                    "partial rotary");
      for (int64_t l = 0; l < info.num_layers; ++l)
        for (const auto& [proj, heads] : {std::pair{"q_proj", hq}, std::pair{"k_proj", hkv}})
          for (const char* part : {".weight", ".bias"}) {
            const std::string name = "model.layers." + std::to_string(l) + ".self_attn." + proj + part;
            auto it = w.find(name);
            if (it == w.end()) continue;
            const Tensor& t = it->second;
            if (t.dtype() != DType::kF32 && t.dtype() != DType::kBF16 && t.dtype() != DType::kF16)
              throw_error(ErrorCode::kUnsupported, "llama: RoPE's attention factor on ", name, " stored as ",
                          dtype_name(t.dtype()), " with a partial rotary (f32/bf16/f16 weights only: load with "
                          "--weight-dtype f32, bf16 or f16)");
            Tensor scaled = t.to(DType::kF32).clone();
            const int64_t cols = scaled.rank() == 2 ? scaled.dim(1) : 1;
            for (int64_t hh = 0; hh < heads; ++hh)
              for (int64_t r = 0; r < rotary_dim; ++r)
                for (int64_t k = 0; k < cols; ++k) scaled.data_as<float>()[(hh * hd + r) * cols + k] *= float(f);
            it->second = std::move(scaled);
          }
    }
  }
  if (glm4)  // each head's interleaved rotary rows to halves, as a GGUF's (any row storage)
    for (int64_t l = 0; l < info.num_layers; ++l)
      for (const auto& [proj, heads] : {std::pair{"q_proj", hq}, std::pair{"k_proj", hkv}})
        for (const char* part : {".weight", ".bias"})
          if (auto it = w.find("model.layers." + std::to_string(l) + ".self_attn." + proj + part); it != w.end())
            it->second = gguf_unpermute_rows(it->second, int(heads), rotary_dim);
  if (rope.original_max_positions > 0 && rope.original_max_positions < info.max_positions) {
    log_info(c.value("model_type", "llama"), ": LongRoPE's short factors, good to original_max_position_embeddings ",
             rope.original_max_positions, " tokens; --max-context N (up to ", info.max_positions,
             ") takes its long factors for every position");
    m.long_context = BuiltModel::LongContext{{}, std::move(rope.long_inv_freq), info.max_positions};
    info.max_positions = rope.original_max_positions;
  }

  ir::Graph& g = m.graph;
  auto W = [&](const std::string& name) { return g.add_weight(name, w.at(name)); };
  auto Wopt = [&](const std::string& name) { return w.count(name) ? W(name) : ir::kNoValue; };
  // A weight kept quantized (WeightSource::load_quantized; a tied head's codes are the
  // embedding's) carries its format and K.
  auto linear = [&](ir::ValueId x, const std::string& weight, const std::string& node) {
    std::vector<ir::ValueId> in = {x, W(weight + ".weight")};
    ir::ValueId bias = Wopt(weight + ".bias");
    if (bias != ir::kNoValue) in.push_back(bias);
    const bool ends_o = weight.size() >= 6 && weight.compare(weight.size() - 6, 6, "o_proj") == 0;
    const bool ends_down = weight.size() >= 9 && weight.compare(weight.size() - 9, 9, "down_proj") == 0;
    const int64_t k = ends_o ? hq * hd : ends_down ? inter : h;
    return g.add("Linear", in, kept_quant_linear_attrs(g.weight(in[1]), k), node);
  };

  ir::ValueId tokens = g.add_input("tokens", DType::kI32, {"T"});
  ir::ValueId positions = g.add_input("positions", DType::kI32, {"T"});
  ir::ValueId rows = g.add_input("logit_rows", DType::kI32, {"R"});
  ir::ValueId inv_freq = g.add_weight("rope.inv_freq", std::move(inv_freq_t));
  if (m.long_context) m.long_context->inv_freq = {inv_freq};
  // A table kept quantized (WeightSpec::table): rows of h values in the image's format.
  const ir::ValueId table = W("model.embed_tokens.weight");
  ir::ValueId x = g.add("Embedding", {table, tokens}, kept_quant_table_attrs(g.weight(table), h), "embed_tokens");
  // A constant [h] multiplier (Granite's), or none where it is 1.
  auto times = [&](ir::ValueId v, double k, const std::string& node) {
    if (k == 1.0) return v;
    Tensor t(DType::kF32, {h});
    std::fill_n(t.data_as<float>(), t.numel(), float(k));
    return g.add("Mul", {v, g.add_weight(node + ".multiplier", std::move(t))}, {}, node);
  };
  x = times(x, embedding_mult, "embed_multiplier");
  for (int64_t l = 0; l < info.num_layers; ++l) {
    std::string b = "model.layers." + std::to_string(l) + ".";
    std::string n = "layers." + std::to_string(l) + ".";
    auto rms = [&](ir::ValueId v, const std::string& weight, const std::string& node) {
      return g.add("RMSNorm", {v, W(b + weight + ".weight")}, {{"eps", eps}}, n + node);
    };
    ir::ValueId a = olmo2 ? x : rms(x, "input_layernorm", "input_layernorm");
    ir::ValueId q = linear(a, b + "self_attn.q_proj", n + "q_proj");
    ir::ValueId k = linear(a, b + "self_attn.k_proj", n + "k_proj");
    ir::ValueId vv = linear(a, b + "self_attn.v_proj", n + "v_proj");
    if (qk_norm || olmo2) {  // Qwen3: each head's q and k RMS-normalized before RoPE; OLMo 2: all of q, all of k
      q = g.add("HeadRMSNorm", {q, W(b + "self_attn.q_norm.weight")}, {{"eps", eps}, {"head_dim", olmo2 ? hq * hd : hd}},
                n + "q_norm");
      k = g.add("HeadRMSNorm", {k, W(b + "self_attn.k_norm.weight")}, {{"eps", eps}, {"head_dim", olmo2 ? hkv * hd : hd}},
                n + "k_norm");
    }
    if (rotates[size_t(l)]) {
      q = g.add("Rope", {q, positions, inv_freq},
                {{"num_heads", hq}, {"head_dim", hd}, {"rotary_dim", rotary_dim}}, n + "q_rope");
      k = g.add("Rope", {k, positions, inv_freq},
                {{"num_heads", hkv}, {"head_dim", hd}, {"rotary_dim", rotary_dim}}, n + "k_rope");
    }
    std::map<std::string, ir::Attr> att_attrs = {{"layer", l}, {"num_heads", hq},   {"num_kv_heads", hkv},
                                                 {"head_dim", hd}, {"scale", scale}, {"causal", int64_t(1)}};
    if (window[size_t(l)]) att_attrs["window"] = window[size_t(l)];
    ir::ValueId att = g.add("Attention", {q, k, vv}, std::move(att_attrs), n + "attn");
    ir::ValueId o = times(linear(att, b + "self_attn.o_proj", n + "o_proj"), residual_mult, n + "attn_multiplier");
    if (olmo2) o = rms(o, "post_attention_layernorm", "post_attention_layernorm");
    if (glm4) o = rms(o, "post_self_attn_layernorm", "post_self_attn_layernorm");
    x = g.add("Add", {x, o}, {}, n + "residual_1");
    ir::ValueId f = olmo2 ? x : rms(x, "post_attention_layernorm", "post_attention_layernorm");
    ir::ValueId gate = g.add("Silu", {linear(f, b + "mlp.gate_proj", n + "gate_proj")}, {}, n + "act");
    ir::ValueId up = linear(f, b + "mlp.up_proj", n + "up_proj");
    f = linear(g.add("Mul", {gate, up}, {}, n + "gate_mul"), b + "mlp.down_proj", n + "down_proj");
    if (olmo2) f = rms(f, "post_feedforward_layernorm", "post_feedforward_layernorm");
    if (glm4) f = rms(f, "post_mlp_layernorm", "post_mlp_layernorm");
    x = g.add("Add", {x, times(f, residual_mult, n + "mlp_multiplier")}, {}, n + "residual_2");
  }
  ir::ValueId hidden = g.add("RMSNorm", {x, W("model.norm.weight")}, {{"eps", eps}}, "norm");
  ir::ValueId last = g.add("GatherRows", {hidden, rows}, {}, "select_rows");
  g.add_output("hidden", hidden);
  // Granite's logits / logits_scaling, as the LM head's input rows times its inverse (the
  // LM head stays the graph's logits GEMM).
  last = times(last, 1.0 / logits_scaling, "logits_scaling");
  g.add_output("logits", linear(last, "lm_head", "lm_head"));
  return m;
}

}  // namespace kiln
