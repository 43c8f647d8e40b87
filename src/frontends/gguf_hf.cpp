// GGUF -> HF config and tensor names (see gguf_hf.h). Key names follow llama.cpp's
// gguf-py constants (LLM_KV_*); HF keys follow transformers' integrations/ggml.py.
#include "frontends/gguf_hf.h"

#include "frontends/gguf_quants.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <span>

#include "core/log.h"
#include "core/status.h"
#include "frontends/hf_dir.h"

namespace kiln {
namespace {

using nlohmann::json;

// f32 metadata is passed on as the exact double of the float (1e-5 becomes
// 9.999999747378752e-06), as transformers' GGUF loader does; rounding it to float
// again gives back the same value.
double f32_to_decimal(float f) { return double(f); }

struct NameRule {
  const char* gguf;  // suffix after "blk.N." (or a whole name when not per-layer)
  const char* hf;
};

const NameRule kLlamaGlobal[] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};
const NameRule kLlamaLayer[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_q.bias", "self_attn.q_proj.bias"},
    {"attn_k.bias", "self_attn.k_proj.bias"},
    {"attn_v.bias", "self_attn.v_proj.bias"},
    {"attn_q_norm.weight", "self_attn.q_norm.weight"},
    {"attn_k_norm.weight", "self_attn.k_norm.weight"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
};
const NameRule kGpt2Global[] = {
    {"token_embd.weight", "wte.weight"},      {"position_embd.weight", "wpe.weight"},
    {"output_norm.weight", "ln_f.weight"},    {"output_norm.bias", "ln_f.bias"},
    {"output.weight", "lm_head.weight"},
};
const NameRule kGpt2Layer[] = {
    {"attn_norm.weight", "ln_1.weight"},       {"attn_norm.bias", "ln_1.bias"},
    {"attn_qkv.weight", "attn.c_attn.weight"}, {"attn_qkv.bias", "attn.c_attn.bias"},
    {"attn_output.weight", "attn.c_proj.weight"}, {"attn_output.bias", "attn.c_proj.bias"},
    {"ffn_norm.weight", "ln_2.weight"},        {"ffn_norm.bias", "ln_2.bias"},
    {"ffn_up.weight", "mlp.c_fc.weight"},      {"ffn_up.bias", "mlp.c_fc.bias"},
    {"ffn_down.weight", "mlp.c_proj.weight"},  {"ffn_down.bias", "mlp.c_proj.bias"},
};

// Gemma 2 / 3 (llama.cpp's GEMMA2 / GEMMA3 tensors): the Llama names plus the sandwich
// norms; ffn_norm is the pre-feed-forward norm here.
const NameRule kGemmaLayer[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_q_norm.weight", "self_attn.q_norm.weight"},
    {"attn_k_norm.weight", "self_attn.k_norm.weight"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"post_attention_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_norm.weight", "pre_feedforward_layernorm.weight"},
    {"post_ffw_norm.weight", "post_feedforward_layernorm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
};

// Phi-3 (llama.cpp's PHI3 tensors): q|k|v in one attn_qkv and gate|up in one ffn_up, as
// transformers' Phi3 stores them (qkv_proj, gate_up_proj: the llama builder reads row views).
const NameRule kPhi3Layer[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn_qkv.weight", "self_attn.qkv_proj.weight"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_up.weight", "mlp.gate_up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
};

// llama.cpp's names for BertModel (gguf-py's TensorNameMap for MODEL_ARCH.BERT). Its
// converter drops the pooler and renames a classifier to cls.output, which have no HF
// counterpart here.
const NameRule kBertGlobal[] = {
    {"token_embd.weight", "embeddings.word_embeddings.weight"},
    {"position_embd.weight", "embeddings.position_embeddings.weight"},
    {"token_types.weight", "embeddings.token_type_embeddings.weight"},
    {"token_embd_norm.weight", "embeddings.LayerNorm.weight"},
    {"token_embd_norm.bias", "embeddings.LayerNorm.bias"},
};
const NameRule kBertLayer[] = {
    {"attn_q.weight", "attention.self.query.weight"},      {"attn_q.bias", "attention.self.query.bias"},
    {"attn_k.weight", "attention.self.key.weight"},        {"attn_k.bias", "attention.self.key.bias"},
    {"attn_v.weight", "attention.self.value.weight"},      {"attn_v.bias", "attention.self.value.bias"},
    {"attn_output.weight", "attention.output.dense.weight"}, {"attn_output.bias", "attention.output.dense.bias"},
    {"attn_output_norm.weight", "attention.output.LayerNorm.weight"},
    {"attn_output_norm.bias", "attention.output.LayerNorm.bias"},
    {"ffn_up.weight", "intermediate.dense.weight"},        {"ffn_up.bias", "intermediate.dense.bias"},
    {"ffn_down.weight", "output.dense.weight"},            {"ffn_down.bias", "output.dense.bias"},
    {"layer_output_norm.weight", "output.LayerNorm.weight"}, {"layer_output_norm.bias", "output.LayerNorm.bias"},
};

// An architecture's name rules: whole names, then "blk.N.<suffix>" -> prefix + N + "." + hf.
struct ArchNames {
  std::span<const NameRule> global, layer;
  const char* layer_prefix;
};

std::optional<ArchNames> arch_names(const std::string& arch) {
  if (arch == "llama" || arch == "qwen2" || arch == "qwen3" || arch == "smollm3" || arch == "granite")
    return ArchNames{kLlamaGlobal, kLlamaLayer, "model.layers."};
  if (arch == "gemma2" || arch == "gemma3") return ArchNames{kLlamaGlobal, kGemmaLayer, "model.layers."};
  if (arch == "gemma") return ArchNames{kLlamaGlobal, kLlamaLayer, "model.layers."};  // Gemma 1: Llama's layout
  if (arch == "phi3") return ArchNames{kLlamaGlobal, kPhi3Layer, "model.layers."};
  // OLMo 2: Gemma's names for its output and q / k norms, and no pre-norms (so no attn_norm /
  // ffn_norm tensors).
  if (arch == "olmo2") return ArchNames{kLlamaGlobal, kGemmaLayer, "model.layers."};
  if (arch == "gpt2") return ArchNames{kGpt2Global, kGpt2Layer, "h."};
  if (arch == "bert") return ArchNames{kBertGlobal, kBertLayer, "encoder.layer."};
  return std::nullopt;
}

bool is_llama_like(const std::string& arch) {
  return arch == "llama" || arch == "qwen2" || arch == "qwen3" || arch == "smollm3" || arch == "granite" ||
         arch == "olmo2";
}

uint32_t opt_u32(const GgufFile& f, const std::string& key, uint32_t dflt) {
  return f.has_key(key) ? f.get_u32(key) : dflt;
}

double opt_f32(const GgufFile& f, const std::string& key, double dflt) {
  return f.has_key(key) ? f32_to_decimal(f.get_f32(key)) : dflt;
}

// <a>rope.scaling.* as an HF rope_scaling object (type, factor, original context); null
// without one or for type "none".
json rope_scaling(const GgufFile& f, const std::string& a) {
  if (!f.has_key(a + "rope.scaling.type") || f.get_string(a + "rope.scaling.type") == "none") return nullptr;
  json rs;
  rs["type"] = rs["rope_type"] = f.get_string(a + "rope.scaling.type");
  if (f.has_key(a + "rope.scaling.factor")) rs["factor"] = opt_f32(f, a + "rope.scaling.factor", 1.0);
  if (f.has_key(a + "rope.scaling.original_context_length"))
    rs["original_max_position_embeddings"] = f.get_u32(a + "rope.scaling.original_context_length");
  return rs;
}

uint32_t req_u32(const GgufFile& f, const std::string& key) {
  if (!f.has_key(key))
    throw_error(ErrorCode::kInvalidFile, f.path(), ": required metadata key '", key,
                "' is missing");
  return f.get_u32(key);
}

int64_t vocab_size(const GgufFile& f, const std::string& arch) {
  if (f.has_key("tokenizer.ggml.tokens")) return int64_t(f.get_array_size("tokenizer.ggml.tokens"));
  if (f.has_key(arch + ".vocab_size")) return f.get_u32(arch + ".vocab_size");
  if (const GgufTensorInfo* t = f.find_tensor("token_embd.weight"); t && t->shape.size() == 2)
    return t->shape[0];
  throw_error(ErrorCode::kInvalidFile, f.path(),
              ": cannot tell the vocabulary size (no tokenizer.ggml.tokens, ", arch,
              ".vocab_size or token_embd.weight)");
}

void add_token_ids(const GgufFile& f, json& c) {
  if (f.has_key("tokenizer.ggml.bos_token_id")) c["bos_token_id"] = f.get_u32("tokenizer.ggml.bos_token_id");
  if (f.has_key("tokenizer.ggml.eos_token_id")) c["eos_token_id"] = f.get_u32("tokenizer.ggml.eos_token_id");
}

// llama.cpp's enum llama_pooling_type (<arch>.pooling_type, written for embedding
// models): 0 none, 1 mean, 2 cls, 3 last, 4 rank (a reranker, which kiln does not read).
// Encoders (bert) pool by mean or [CLS]; decoders by their last token.
void add_pooling(const GgufFile& f, const std::string& a, bool decoder, json& c) {
  const uint32_t pooling = opt_u32(f, a + "pooling_type", 0);
  if (!decoder && (pooling == 1 || pooling == 2)) c[kPoolingConfigKey] = pooling == 1 ? "mean" : "cls";
  else if (decoder && pooling == 3) c[kPoolingConfigKey] = "last";
  else if (pooling != 0)
    throw_error(ErrorCode::kUnsupported, f.path(), ": ", a, "pooling_type ", pooling,
                pooling == 4 ? " (a reranker)" : pooling == 3 ? " (last token)" : "",
                decoder ? "; kiln's decoder embedding models pool their last token (3)"
                        : "; kiln's bert pools by mean (1) or by the [CLS] row (2)");
}

// llama.cpp's Gemma 2 / Gemma 3 (src/models/gemma2.cpp, gemma3.cpp) as a transformers
// config. What the file does not say, llama.cpp fixes, and so does this: the attention
// scale (head_dim^-1/2; (hidden / heads)^-1/2 for the 27B shapes: 46 layers of Gemma 2, 62
// of Gemma 3), which layers slide (<arch>.attention.sliding_window_pattern: per-layer bools
// or every n-th layer full, n = 2 for Gemma 2 and 6 for Gemma 3), Gemma 2's window (4096)
// and soft-caps (50 and 30) when absent, Gemma 3's local RoPE base (rope.freq_base_swa,
// else 10000, unscaled). The norms come as (1 + w) (kNormsOnePlusConfigKey).
json gemma_config(const GgufFile& f, const std::string& arch) {
  const std::string a = arch + ".";
  const bool g3 = arch == "gemma3", g1 = arch == "gemma";
  json c;
  c["model_type"] = g3 ? "gemma3_text" : g1 ? "gemma" : "gemma2";
  c["architectures"] = {g3 ? "Gemma3ForCausalLM" : g1 ? "GemmaForCausalLM" : "Gemma2ForCausalLM"};
  c["hidden_activation"] = "gelu_pytorch_tanh";
  const uint32_t hidden = req_u32(f, a + "embedding_length"), heads = req_u32(f, a + "attention.head_count");
  const uint32_t layers = req_u32(f, a + "block_count");
  // The per-layer types below are one entry a layer: a bound keeps a corrupt count from
  // asking for billions of them (the largest Gemma has 62 layers).
  constexpr uint32_t kMaxLayers = 4096;
  if (heads == 0 || layers == 0 || layers > kMaxLayers)
    throw_error(ErrorCode::kInvalidFile, f.path(), ": ", a, "attention.head_count (", heads, ") and block_count (",
                layers, ") must be > 0, block_count at most ", kMaxLayers);
  const uint32_t head_dim = opt_u32(f, a + "attention.key_length", hidden / heads);
  c["hidden_size"] = hidden;
  c["intermediate_size"] = req_u32(f, a + "feed_forward_length");
  c["num_hidden_layers"] = layers;
  c["num_attention_heads"] = heads;
  c["num_key_value_heads"] = opt_u32(f, a + "attention.head_count_kv", heads);
  c["head_dim"] = head_dim;
  c["query_pre_attn_scalar"] = layers == (g3 ? 62u : 46u) ? hidden / heads : head_dim;
  c["rms_norm_eps"] = opt_f32(f, a + "attention.layer_norm_rms_epsilon", 1e-6);
  c["max_position_embeddings"] = opt_u32(f, a + "context_length", g3 ? 32768 : 8192);
  c["vocab_size"] = vocab_size(f, arch);
  c["tie_word_embeddings"] = f.find_tensor("output.weight") == nullptr;
  c[kNormsOnePlusConfigKey] = true;
  if (g1) {  // Gemma 1: no window, soft-caps or per-layer types; scaled by head_dim^-1/2
    c.erase("query_pre_attn_scalar");
    c["hidden_act"] = "gelu_pytorch_tanh";
    c["rope_theta"] = opt_f32(f, a + "rope.freq_base", 10000.0);
    add_pooling(f, a, /*decoder=*/true, c);
    add_token_ids(f, c);
    return c;
  }

  const uint32_t window = opt_u32(f, a + "attention.sliding_window", g3 ? 0 : 4096);
  std::vector<bool> slides(layers, false);
  if (window > 0) {
    const std::string key = a + "attention.sliding_window_pattern";
    if (f.has_key(key) && f.value(key).type == GgufType::kArray) {
      const GgufValue& v = f.value(key);
      if (v.elem_type != GgufType::kBool || v.count != layers || v.raw.size() != layers)
        throw_error(ErrorCode::kInvalidFile, f.path(), ": ", key, " must be ", layers, " bools (one per layer), found ",
                    v.count, " of type ", gguf_type_name(v.elem_type));
      for (uint32_t l = 0; l < layers; ++l) slides[l] = v.raw[l] != 0;
    } else {
      const uint32_t n = opt_u32(f, key, g3 ? 6 : 2);
      for (uint32_t l = 0; l < layers; ++l) slides[l] = n == 0 || l % n < n - 1;
    }
    c["sliding_window"] = window;
  } else {
    c["sliding_window"] = nullptr;  // explicitly none (transformers' default would be 4096)
  }
  json types = json::array();
  for (bool s : slides) types.push_back(s ? "sliding_attention" : "full_attention");
  c["layer_types"] = types;

  const double theta = opt_f32(f, a + "rope.freq_base", g3 ? 1000000.0 : 10000.0);
  const json scaling = rope_scaling(f, a);  // the global layers' (Gemma 3) or every layer's (Gemma 2)
  if (g3) {
    json global = scaling.is_null() ? json{{"rope_type", "default"}} : scaling;
    global["rope_theta"] = theta;
    c["rope_parameters"] = {
        {"full_attention", global},
        {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", opt_f32(f, a + "rope.freq_base_swa", 10000.0)}}}};
    if (const double cap = opt_f32(f, a + "final_logit_softcapping", 0.0); cap > 0.0) c["final_logit_softcapping"] = cap;
  } else {
    if (opt_f32(f, a + "rope.freq_base_swa", theta) != theta)
      throw_error(ErrorCode::kUnsupported, f.path(), ": ", a, "rope.freq_base_swa differs from rope.freq_base (kiln's ",
                  "Gemma 2 has one RoPE)");
    c["rope_theta"] = theta;
    if (!scaling.is_null()) c["rope_scaling"] = scaling;
    c["attn_logit_softcapping"] = opt_f32(f, a + "attn_logit_softcapping", 50.0);
    c["final_logit_softcapping"] = opt_f32(f, a + "final_logit_softcapping", 30.0);
  }
  add_pooling(f, a, /*decoder=*/true, c);
  add_token_ids(f, c);
  return c;
}

// llama.cpp's Phi-3 (convert_hf_to_gguf.py's Phi3MiniModel; Phi-3.5 and Phi-4-mini are
// this arch too) as a transformers Phi3 config: the rotary dims as partial_rotary_factor,
// a sliding window of 0 as none, and LongRoPE as the converter stores it - the factors as
// the tensors rope_factors_short / rope_factors_long, the original context and the
// attention factor as rope.scaling.* keys.
json phi3_config(const GgufFile& f) {
  const std::string a = "phi3.";
  json c;
  c["model_type"] = "phi3";
  c["architectures"] = {"Phi3ForCausalLM"};
  c["hidden_act"] = "silu";
  const uint32_t hidden = req_u32(f, a + "embedding_length"), heads = req_u32(f, a + "attention.head_count");
  if (heads == 0 || hidden % heads != 0)
    throw_error(ErrorCode::kInvalidFile, f.path(), ": ", a, "attention.head_count (", heads,
                ") must divide embedding_length (", hidden, ")");
  const uint32_t head_dim = hidden / heads;
  c["hidden_size"] = hidden;
  c["intermediate_size"] = req_u32(f, a + "feed_forward_length");
  c["num_hidden_layers"] = req_u32(f, a + "block_count");
  c["num_attention_heads"] = heads;
  c["num_key_value_heads"] = opt_u32(f, a + "attention.head_count_kv", heads);
  c["rms_norm_eps"] = opt_f32(f, a + "attention.layer_norm_rms_epsilon", 1e-5);
  c["rope_theta"] = opt_f32(f, a + "rope.freq_base", 10000.0);
  const uint32_t rot = opt_u32(f, a + "rope.dimension_count", head_dim);
  if (rot == 0 || rot > head_dim || rot % 2 != 0)
    throw_error(ErrorCode::kInvalidFile, f.path(), ": ", a, "rope.dimension_count ", rot,
                " must be even and in [2, head dim ", head_dim, "]");
  c["partial_rotary_factor"] = double(rot) / double(head_dim);
  const uint32_t ctx = opt_u32(f, a + "context_length", 4096);
  c["max_position_embeddings"] = ctx;
  c["original_max_position_embeddings"] = opt_u32(f, a + "rope.scaling.original_context_length", ctx);
  const uint32_t window = opt_u32(f, a + "attention.sliding_window", 0);
  c["sliding_window"] = window > 0 ? json(window) : json(nullptr);
  c["vocab_size"] = vocab_size(f, "phi3");
  c["tie_word_embeddings"] = f.find_tensor("output.weight") == nullptr;
  const GgufTensorInfo* shortf = f.find_tensor("rope_factors_short.weight");
  const GgufTensorInfo* longf = f.find_tensor("rope_factors_long.weight");
  if (shortf || longf) {
    if (!shortf || !longf)
      throw_error(ErrorCode::kInvalidFile, f.path(), ": LongRoPE needs both rope_factors_short.weight and "
                  "rope_factors_long.weight, found only ", shortf ? "the short" : "the long", " one");
    json rs = {{"type", "longrope"}, {"rope_type", "longrope"},
               {"original_max_position_embeddings", c["original_max_position_embeddings"]}};
    for (const auto& [key, name] : {std::pair{"short_factor", "rope_factors_short.weight"},
                                    std::pair{"long_factor", "rope_factors_long.weight"}}) {
      if (const int64_t n = f.find_tensor(name)->numel; n != int64_t(rot / 2))
        throw_error(ErrorCode::kInvalidFile, f.path(), ": ", name, " holds ", n, " factors, expected ", rot / 2,
                    " (rotary dims / 2)");
      const Tensor t = f.load(name, DType::kF32);
      json v = json::array();
      for (int64_t i = 0; i < t.numel(); ++i) v.push_back(f32_to_decimal(t.data_as<float>()[i]));
      rs[key] = std::move(v);
    }
    if (f.has_key(a + "rope.scaling.attn_factor")) rs["attention_factor"] = opt_f32(f, a + "rope.scaling.attn_factor", 1.0);
    c["rope_scaling"] = std::move(rs);
  }
  add_pooling(f, a, /*decoder=*/true, c);
  add_token_ids(f, c);
  return c;
}

}  // namespace

json gguf_to_hf_config(const GgufFile& f) {
  if (!f.has_key("general.architecture"))
    throw_error(ErrorCode::kInvalidFile, f.path(), ": no general.architecture key");
  const std::string arch = f.get_string("general.architecture");
  const std::string a = arch + ".";
  json c;
  if (is_llama_like(arch)) {
    c["model_type"] = arch;
    c["architectures"] = {arch == "llama"     ? "LlamaForCausalLM"
                          : arch == "qwen2"   ? "Qwen2ForCausalLM"
                          : arch == "qwen3"   ? "Qwen3ForCausalLM"
                          : arch == "granite" ? "GraniteForCausalLM"
                          : arch == "olmo2"   ? "Olmo2ForCausalLM"
                                              : "SmolLM3ForCausalLM"};
    // SmolLM3: llama.cpp writes no NoPE key and takes every 4th layer as one, as
    // transformers' default no_rope_layer_interval does.
    if (arch == "smollm3") c["no_rope_layer_interval"] = 4;
    // Granite: the converter writes its multipliers as these scales (absent: 1).
    if (arch == "granite")
      for (const auto& [key, hf] : {std::pair{"embedding_scale", "embedding_multiplier"},
                                    std::pair{"residual_scale", "residual_multiplier"},
                                    std::pair{"attention.scale", "attention_multiplier"},
                                    std::pair{"logit_scale", "logits_scaling"}})
        if (f.has_key(a + key)) c[hf] = opt_f32(f, a + key, 1.0);
    c["hidden_act"] = "silu";
    const uint32_t hidden = req_u32(f, a + "embedding_length");
    const uint32_t heads = req_u32(f, a + "attention.head_count");
    if (heads == 0) throw_error(ErrorCode::kInvalidFile, f.path(), ": ", a, "attention.head_count is 0");
    c["hidden_size"] = hidden;
    c["intermediate_size"] = req_u32(f, a + "feed_forward_length");
    c["num_hidden_layers"] = req_u32(f, a + "block_count");
    c["num_attention_heads"] = heads;
    c["num_key_value_heads"] = opt_u32(f, a + "attention.head_count_kv", heads);
    c["head_dim"] = opt_u32(f, a + "attention.key_length", hidden / heads);
    c["rms_norm_eps"] = opt_f32(f, a + "attention.layer_norm_rms_epsilon", 1e-6);
    c["rope_theta"] = opt_f32(f, a + "rope.freq_base", 10000.0);
    c["max_position_embeddings"] = opt_u32(f, a + "context_length", 2048);
    c["vocab_size"] = vocab_size(f, arch);
    c["tie_word_embeddings"] = f.find_tensor("output.weight") == nullptr;
    c["attention_bias"] = f.find_tensor("blk.0.attn_q.bias") != nullptr;
    if (json rs = rope_scaling(f, a); !rs.is_null()) c["rope_scaling"] = rs;
    if (const GgufTensorInfo* t = f.find_tensor("rope_freqs.weight")) {
      const uint32_t rot = opt_u32(f, a + "rope.dimension_count", c["head_dim"].get<uint32_t>());
      if (t->numel != int64_t(rot / 2))
        throw_error(ErrorCode::kInvalidFile, f.path(), ": rope_freqs.weight holds ", t->numel,
                    " frequency factors, expected ", rot / 2, " (rotary dims / 2)");
      const Tensor v = f.load("rope_freqs.weight", DType::kF32);
      json factors = json::array();
      for (int64_t i = 0; i < v.numel(); ++i) {
        const float x = v.data_as<float>()[i];
        if (!(x > 0.0f) || !std::isfinite(x))
          throw_error(ErrorCode::kInvalidFile, f.path(), ": rope_freqs.weight[", i, "] is ", x,
                      " (frequency divisors are positive)");
        factors.push_back(f32_to_decimal(x));
      }
      c[kRopeFreqFactorsConfigKey] = std::move(factors);
    }
    add_pooling(f, a, /*decoder=*/true, c);
    add_token_ids(f, c);
    return c;
  }
  if (arch == "gemma" || arch == "gemma2" || arch == "gemma3") return gemma_config(f, arch);
  if (arch == "phi3") return phi3_config(f);
  if (arch == "gpt2") {
    c["model_type"] = "gpt2";
    c["architectures"] = {"GPT2LMHeadModel"};
    const uint32_t hidden = req_u32(f, a + "embedding_length");
    c["n_embd"] = hidden;
    c["n_layer"] = req_u32(f, a + "block_count");
    c["n_head"] = req_u32(f, a + "attention.head_count");
    c["n_positions"] = c["n_ctx"] = opt_u32(f, a + "context_length", 1024);
    c["n_inner"] = opt_u32(f, a + "feed_forward_length", 4 * hidden);
    c["layer_norm_epsilon"] = opt_f32(f, a + "attention.layer_norm_epsilon", 1e-5);
    c["activation_function"] = "gelu_new";
    c["vocab_size"] = vocab_size(f, arch);
    c["tie_word_embeddings"] = f.find_tensor("output.weight") == nullptr;
    add_token_ids(f, c);
    return c;
  }
  if (arch == "bert") {
    c["model_type"] = "bert";
    c["architectures"] = {"BertModel"};
    const uint32_t hidden = req_u32(f, a + "embedding_length");
    c["hidden_size"] = hidden;
    c["intermediate_size"] = opt_u32(f, a + "feed_forward_length", 4 * hidden);
    c["num_hidden_layers"] = req_u32(f, a + "block_count");
    c["num_attention_heads"] = req_u32(f, a + "attention.head_count");
    c["max_position_embeddings"] = opt_u32(f, a + "context_length", 512);
    c["layer_norm_eps"] = opt_f32(f, a + "attention.layer_norm_epsilon", 1e-12);
    c["hidden_act"] = "gelu";
    c["vocab_size"] = vocab_size(f, arch);
    if (const GgufTensorInfo* t = f.find_tensor("token_types.weight"); t && t->shape.size() == 2)
      c["type_vocab_size"] = t->shape[0];
    else
      c["type_vocab_size"] = opt_u32(f, "tokenizer.ggml.token_type_count", 2);
    if (f.find_tensor("blk.0.attn_qkv.weight"))
      throw_error(ErrorCode::kUnsupported, f.path(), ": a bert GGUF with fused attn_qkv tensors "
                  "(kiln reads llama.cpp's BertModel layout: attn_q, attn_k, attn_v)");
    add_pooling(f, a, /*decoder=*/false, c);
    if (f.find_tensor("cls.output.weight"))
      log_warn(f.path(), ": its classification head (cls.output) is not used: llama.cpp's converter drops "
               "the pooler that HF's BertForSequenceClassification applies before it; embeddings only");
    add_token_ids(f, c);
    return c;
  }
  throw_error(ErrorCode::kUnsupported, f.path(), ": GGUF architecture '", arch,
              "' has no HF mapping in kiln (supported: llama, qwen2, qwen3, smollm3, granite, olmo2, phi3, gemma, gemma2, gemma3, gpt2, bert)");
}

std::string gguf_to_hf_name(const std::string& arch, const std::string& g) {
  const std::optional<ArchNames> names = arch_names(arch);
  if (!names) return "";
  for (const NameRule& r : names->global)
    if (g == r.gguf) return r.hf;
  // Per-layer names: "blk.<N>.<suffix>".
  if (g.rfind("blk.", 0) != 0) return "";
  const size_t dot = g.find('.', 4);
  if (dot == std::string::npos || dot == 4) return "";
  const std::string layer = g.substr(4, dot - 4);
  if (layer.find_first_not_of("0123456789") != std::string::npos) return "";
  const std::string suffix = g.substr(dot + 1);
  for (const NameRule& r : names->layer)
    if (suffix == r.gguf) return names->layer_prefix + layer + "." + r.hf;
  return "";
}

Tensor gguf_unpermute_rows(const Tensor& t, int n_head, int64_t rotary_dim) {
  const int64_t rows = t.rank() >= 1 ? t.dim(0) : 0;
  if (n_head <= 0 || rows % (2 * int64_t(n_head)) != 0)
    throw_error(ErrorCode::kInvalidFile, "cannot undo the rotary permutation of a tensor with ",
                rows, " rows over ", n_head, " heads (rows must divide into 2 * heads)");
  const int64_t head_dim = rows / n_head;
  if (rotary_dim == 0) rotary_dim = head_dim;
  if (rotary_dim < 0 || rotary_dim > head_dim || rotary_dim % 2 != 0)
    throw_error(ErrorCode::kInvalidFile, "cannot undo the rotary permutation of ", rotary_dim, " rotary rows in heads of ",
                head_dim, " (expected an even count up to the head's)");
  const int64_t half = rotary_dim / 2;
  const size_t row_bytes = rows ? t.nbytes() / size_t(rows) : 0;
  Tensor out(t.dtype(), t.shape());
  const auto* src = static_cast<const uint8_t*>(t.data());
  auto* dst = static_cast<uint8_t*>(out.data());
  std::memcpy(dst, src, t.nbytes());  // rows past the rotary ones stay
  for (int64_t h = 0; h < n_head; ++h)
    for (int64_t d = 0; d < half; ++d)
      for (int64_t j = 0; j < 2; ++j)
        std::memcpy(dst + size_t(h * head_dim + j * half + d) * row_bytes,
                    src + size_t(h * head_dim + 2 * d + j) * row_bytes, row_bytes);
  return out;
}

GgufWeightSource::GgufWeightSource(std::shared_ptr<const GgufFile> file) : file_(std::move(file)) {
  const GgufFile& f = *file_;
  const std::string arch =
      f.has_key("general.architecture") ? f.get_string("general.architecture") : "";
  int heads = 0, kv_heads = 0;
  // The converters that permute (LlamaModel and its subclasses SmolLM3Model, GraniteModel).
  if (arch == "llama" || arch == "smollm3" || arch == "granite") {
    heads = int(req_u32(f, arch + ".attention.head_count"));
    kv_heads = int(opt_u32(f, arch + ".attention.head_count_kv", uint32_t(heads)));
  }
  for (const auto& t : f.tensors()) {
    Mapping m;
    m.gguf_name = t.name;
    std::string hf = gguf_to_hf_name(arch, t.name);
    // Tensors with no HF counterpart (rope_freqs.weight...) stay under their GGUF name.
    if (hf.empty()) hf = t.name;
    if (heads > 0) {
      if (hf.find("self_attn.q_proj.") != std::string::npos) m.permute_heads = heads;
      if (hf.find("self_attn.k_proj.") != std::string::npos) m.permute_heads = kv_heads;
    }
    if (arch == "gpt2" && t.shape.size() == 2 &&
        (hf.find("c_attn.weight") != std::string::npos ||
         hf.find("c_proj.weight") != std::string::npos ||
         hf.find("c_fc.weight") != std::string::npos))
      m.transpose = true;
    map_[hf] = m;
  }
}

std::vector<std::string> GgufWeightSource::names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : map_) out.push_back(k);
  return out;
}

const GgufWeightSource::Mapping& GgufWeightSource::mapping(const std::string& name) const {
  auto it = map_.find(name);
  if (it == map_.end())
    throw_error(ErrorCode::kNotFound, describe(), ": no tensor maps to HF name '", name, "'");
  return it->second;
}

const std::string& GgufWeightSource::gguf_name(const std::string& hf_name) const {
  return mapping(hf_name).gguf_name;
}

TensorInfo GgufWeightSource::info(const std::string& name) const {
  const Mapping& m = mapping(name);
  const GgufTensorInfo& t = file_->tensor_info(m.gguf_name);
  TensorInfo i;
  i.dtype = GgufFile::natural_dtype(t.type);
  i.shape = t.shape;
  if (m.transpose) std::swap(i.shape[0], i.shape[1]);
  i.nbytes = size_t(t.numel) * dtype_size(i.dtype);
  if (GgufFile::natural_dtype(t.type) == DType::kF32 && t.type != uint32_t(GgmlType::kF32))
    i.storage = ggml_type_name(t.type);
  return i;
}

Tensor GgufWeightSource::load(const std::string& name, DType want) const {
  const Mapping& m = mapping(name);
  Tensor t = file_->load(m.gguf_name, want);
  if (m.permute_heads > 0) {
    try {
      t = gguf_unpermute_rows(t, m.permute_heads);
    } catch (const Error& e) {
      throw_error(ErrorCode::kInvalidFile, describe(), ": tensor '", m.gguf_name, "': ", e.what());
    }
  }
  if (m.transpose) {
    const int64_t r = t.dim(0), c = t.dim(1);
    const size_t es = dtype_size(t.dtype());
    Tensor out(t.dtype(), {c, r});
    const auto* s = static_cast<const uint8_t*>(t.data());
    auto* d = static_cast<uint8_t*>(out.data());
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j) std::memcpy(d + size_t(j * r + i) * es, s + size_t(i * c + j) * es, es);
    t = out;
  }
  return t;
}

std::optional<Tensor> GgufWeightSource::view(const std::string& name) const {
  const Mapping& m = mapping(name);
  const GgufTensorInfo& t = file_->tensor_info(m.gguf_name);
  const DType d = GgufFile::natural_dtype(t.type);
  const bool plain = t.type == uint32_t(GgmlType::kF32) || d != DType::kF32;  // F32, F16, BF16: no codes
  const uint8_t* data = file_->tensor_data(t);
  if (!plain || m.permute_heads > 0 || m.transpose || reinterpret_cast<uintptr_t>(data) % dtype_size(d) != 0)
    return std::nullopt;
  // const_cast: Tensor has no const view; the mapping is read-only, so a write faults.
  return Tensor::view(const_cast<uint8_t*>(data), d, t.shape, std::shared_ptr<const void>(file_));
}

std::optional<QuantFormat> GgufWeightSource::native_quant(const std::string& name) const {
  const Mapping& m = mapping(name);
  const GgufTensorInfo& t = file_->tensor_info(m.gguf_name);
  if (t.shape.size() != 2) return std::nullopt;
  return ggml_kept_quant_format(t.type);
}

std::optional<Tensor> GgufWeightSource::load_quantized(const std::string& name, QuantFormat f) const {
  const Mapping& m = mapping(name);
  const GgufTensorInfo& t = file_->tensor_info(m.gguf_name);
  // A transposed mapping's image holds the file's rows (stored_transposed).
  if (t.shape.size() != 2 || ggml_kept_quant_format(t.type) != f) return std::nullopt;
  const int64_t n = t.shape[0], k = t.shape[1];
  std::optional<Tensor> image = ggml_to_quantized_image(t.type, file_->tensor_data(t), n, k);
  if (!image) return std::nullopt;
  if (ggml_requantized_to_q8(t.type)) {
    std::lock_guard<std::mutex> lock(requantized_mu_);
    ++requantized_[ggml_type_name(t.type)];
  }
  Tensor img = std::move(*image);
  if (m.permute_heads > 0) {  // image rows are self-contained: permute them like f32 rows
    try {
      img = gguf_unpermute_rows(img, m.permute_heads);
    } catch (const Error& e) {
      throw_error(ErrorCode::kInvalidFile, describe(), ": tensor '", m.gguf_name, "': ", e.what());
    }
  }
  return img;
}

std::string GgufWeightSource::requantized_summary() const {
  std::lock_guard<std::mutex> lock(requantized_mu_);
  std::string out;
  int total = 0;
  for (const auto& [type, count] : requantized_) {
    out += (out.empty() ? "" : ", ") + std::to_string(count) + " " + type;
    total += count;
  }
  return total == 0 ? out : out + (total == 1 ? " tensor" : " tensors");
}

}  // namespace kiln
