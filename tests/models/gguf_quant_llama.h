// A small GGUF llama written in memory with quantized Linear weights (Q4_0 / Q4_1 / Q5_0 /
// Q8_0 / Q4_K / Q6_K blocks of random codes), the GPT-2 fixture as a Q8_0 GGUF and BERT
// directories as llama.cpp's BertModel GGUFs: the models of gguf_quant_test.cpp,
// bert_gguf_test.cpp and the CUDA backend's gguf_auto_models_test.cpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <random>
#include <string>
#include <vector>

#include "../frontends/gguf_writer.h"
#include "../frontends/test_util.h"
#include "core/dtype.h"
#include "core/mapped_file.h"
#include "frontends/gguf_quants.h"
#include "frontends/weight_source.h"

namespace kiln::test {

// n rows of k random ggml blocks of `t` (Q4_0 with negative and positive d; Q4_K with
// magnitudes like llama.cpp's: sub-block scales ~ 1e-3..1e-2, mins ~ 0..0.05).
inline std::string blocks(GgmlType t, int64_t n, int64_t k, std::mt19937& rng) {
  const GgmlTypeTraits* tr = ggml_type_traits(uint32_t(t));
  if (t == GgmlType::kQ4_K) {
    std::uniform_real_distribution<float> dd(1e-4f, 2e-4f), mm(5e-4f, 1e-3f);
    std::string out;
    for (int64_t b = 0; b < n * k / 256; ++b) {
      uint8_t sc[8], m[8], codes[256];
      for (int j = 0; j < 8; ++j) {
        sc[j] = uint8_t(rng() % 64);
        m[j] = uint8_t(rng() % 64);
      }
      for (uint8_t& c : codes) c = uint8_t(rng() % 16);
      out += test::q4_k_block(f32_to_f16(dd(rng)), f32_to_f16(mm(rng)), sc, m, codes);
    }
    return out;
  }
  if (t == GgmlType::kQ6_K) {  // random 6-bit codes and int8 sub-block scales; d ~ 2e-5..5e-5
    std::uniform_real_distribution<float> dd(2e-5f, 5e-5f);
    std::string out;
    for (int64_t b = 0; b < n * k / 256; ++b) {
      std::string blk(210, '\0');
      for (size_t j = 0; j < 208; ++j) blk[j] = char(rng());
      const uint16_t d = f32_to_f16(dd(rng));
      std::memcpy(blk.data() + 208, &d, 2);
      out += blk;
    }
    return out;
  }
  std::uniform_real_distribution<float> dd(-0.02f, 0.02f), mm(-0.1f, 0.0f);
  std::string out;
  for (int64_t b = 0; b < n * k / 32; ++b) {
    std::string blk(tr->type_size, '\0');
    const uint16_t d = f32_to_f16(t == GgmlType::kQ4_0 ? dd(rng) : std::fabs(dd(rng)) + 1e-3f), m = f32_to_f16(mm(rng));
    std::memcpy(blk.data(), &d, 2);
    if (t == GgmlType::kQ4_1) std::memcpy(blk.data() + 2, &m, 2);
    for (size_t j = t == GgmlType::kQ4_1 ? 4 : 2; j < blk.size(); ++j) {
      blk[j] = char(rng());
      if (t == GgmlType::kQ8_0 && uint8_t(blk[j]) == 0x80) blk[j] = 0;
    }
    out += blk;
  }
  return out;
}

// The metadata of the small 2-layer llamas here (2 heads, 1 KV head, context 64) and a
// vocabulary of t0, t1, ...
inline void small_llama_header(GgufWriter& w, int64_t h, int64_t inter, int64_t vocab) {
  w.kv_string("general.architecture", "llama");
  w.kv_u32("llama.embedding_length", uint32_t(h));
  w.kv_u32("llama.feed_forward_length", uint32_t(inter));
  w.kv_u32("llama.block_count", 2);
  w.kv_u32("llama.attention.head_count", 2);
  w.kv_u32("llama.attention.head_count_kv", 1);
  w.kv_u32("llama.context_length", 64);
  w.kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.kv_f32("llama.rope.freq_base", 10000.f);
  std::vector<std::string> toks;
  for (int64_t i = 0; i < vocab; ++i) toks.push_back("t" + std::to_string(i));
  w.kv_strings("tokenizer.ggml.tokens", toks);
}

// K-quants need K % 256 == 0: h and inter 256 for them, else 64 and 96. The token
// embedding (also the tied LM head) is f32 unless `embd` names a quantized type;
// `pooling_type` >= 0 writes llama.pooling_type (an embedding model's GGUF).
inline std::string quant_llama(GgmlType attn, GgmlType mlp, GgmlType embd = GgmlType::kF32, int pooling_type = -1) {
  const auto is_k = [](GgmlType t) { return t == GgmlType::kQ4_K || t == GgmlType::kQ6_K; };
  const bool k_quant = is_k(attn) || is_k(mlp);
  const int64_t h = k_quant ? 256 : 64, inter = k_quant ? 256 : 96, vocab = 16, kv = h / 2;
  GgufWriter w;
  small_llama_header(w, h, inter, vocab);
  if (pooling_type >= 0) w.kv_u32("llama.pooling_type", uint32_t(pooling_type));
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> emb(size_t(vocab * h)), ones(size_t(h), 1.f);
  for (float& v : emb) v = nd(rng);
  if (embd != GgmlType::kF32)
    w.tensor("token_embd.weight", uint32_t(embd), {uint64_t(h), uint64_t(vocab)}, blocks(embd, vocab, h, rng));
  else
    w.tensor("token_embd.weight", 0, {uint64_t(h), uint64_t(vocab)}, raw_bytes(emb));
  w.tensor("output_norm.weight", 0, {uint64_t(h)}, raw_bytes(ones));
  for (int l = 0; l < 2; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    w.tensor(b + "attn_norm.weight", 0, {uint64_t(h)}, raw_bytes(ones));
    w.tensor(b + "ffn_norm.weight", 0, {uint64_t(h)}, raw_bytes(ones));
    w.tensor(b + "attn_q.weight", uint32_t(attn), {uint64_t(h), uint64_t(h)}, blocks(attn, h, h, rng));
    w.tensor(b + "attn_k.weight", uint32_t(attn), {uint64_t(h), uint64_t(kv)}, blocks(attn, kv, h, rng));
    w.tensor(b + "attn_v.weight", uint32_t(attn), {uint64_t(h), uint64_t(kv)}, blocks(attn, kv, h, rng));
    w.tensor(b + "attn_output.weight", uint32_t(attn), {uint64_t(h), uint64_t(h)}, blocks(attn, h, h, rng));
    w.tensor(b + "ffn_gate.weight", uint32_t(mlp), {uint64_t(h), uint64_t(inter)}, blocks(mlp, inter, h, rng));
    w.tensor(b + "ffn_up.weight", uint32_t(mlp), {uint64_t(h), uint64_t(inter)}, blocks(mlp, inter, h, rng));
    w.tensor(b + "ffn_down.weight", uint32_t(mlp), {uint64_t(inter), uint64_t(h)}, blocks(mlp, h, inter, rng));
  }
  return w.bytes();
}

// A checkpoint's tensors written into a GGUF as llama.cpp's converter stores them: f32 as
// read, rounded to F16, or Q8_0 blocks of the [n, k] rows (transposed from HF's [k, n]
// when `conv1d`). HF names are read under `prefix`.
struct CheckpointToGguf {
  GgufWriter& w;
  std::unique_ptr<WeightSource> st;
  std::string prefix;

  void f32(const std::string& gguf, const std::string& hf) { write(GgmlType::kF32, gguf, hf); }
  // A Llama-shaped layer's seven Linears (blk.N. prefix g, HF layer prefix h) in `type`.
  void llama_linears(GgmlType type, const std::string& g, const std::string& h) {
    for (const auto& [gg, hf] : {std::pair{"attn_q", "self_attn.q_proj"}, std::pair{"attn_k", "self_attn.k_proj"},
                                 std::pair{"attn_v", "self_attn.v_proj"}, std::pair{"attn_output", "self_attn.o_proj"},
                                 std::pair{"ffn_gate", "mlp.gate_proj"}, std::pair{"ffn_up", "mlp.up_proj"},
                                 std::pair{"ffn_down", "mlp.down_proj"}})
      write(type, g + gg + ".weight", h + hf + ".weight");
  }
  // `permute_heads` > 0: the rows of each of that many heads reordered as the converter
  // permutes Llama's q_proj / k_proj (HF's rotate-half pairs (d, d + half) to llama.cpp's
  // adjacent pairs (2d, 2d + 1)), before the rows are stored or quantized.
  void write(GgmlType type, const std::string& gguf, const std::string& hf, bool conv1d = false,
             int64_t permute_heads = 0) {
    Tensor t = st->load(prefix + hf, DType::kF32);
    if (permute_heads > 0) {
      const int64_t rows = t.dim(0), cols = t.numel() / rows, hd = rows / permute_heads, half = hd / 2;
      Tensor p(DType::kF32, t.shape());
      for (int64_t h = 0; h < permute_heads; ++h)
        for (int64_t d = 0; d < half; ++d)
          for (int64_t j = 0; j < 2; ++j)
            std::memcpy(p.data_as<float>() + (h * hd + 2 * d + j) * cols, t.data_as<float>() + (h * hd + j * half + d) * cols,
                        size_t(cols) * sizeof(float));
      t = std::move(p);
    }
    if (type == GgmlType::kQ8_0) return q8(gguf, t, conv1d);
    std::vector<uint64_t> ne(t.shape().rbegin(), t.shape().rend());
    if (type == GgmlType::kF32) return w.tensor(gguf, 0, ne, std::string(static_cast<const char*>(t.data()), t.nbytes()));
    if (type != GgmlType::kF16) throw std::invalid_argument("CheckpointToGguf: F32, F16 or Q8_0");
    std::vector<uint16_t> half(size_t(t.numel()));
    for (size_t i = 0; i < half.size(); ++i) half[i] = f32_to_f16(t.data_as<float>()[i]);
    w.tensor(gguf, uint32_t(GgmlType::kF16), ne, raw_bytes(half));
  }

 private:
  void q8(const std::string& gguf, const Tensor& t, bool conv1d) {
    const int64_t n = conv1d ? t.dim(1) : t.dim(0), k = conv1d ? t.dim(0) : t.dim(1);
    std::string bytes;
    std::vector<float> row(static_cast<size_t>(k));
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t c = 0; c < k; ++c) row[size_t(c)] = t.data_as<float>()[conv1d ? c * n + r : r * k + c];
      for (int64_t b = 0; b < k; b += 32) {
        float amax = 0;
        for (int64_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(row[size_t(b + i)]));
        const uint16_t d = f32_to_f16(amax / 127);
        const float dd = f16_to_f32(d);
        bytes.append(reinterpret_cast<const char*>(&d), 2);
        for (int64_t i = 0; i < 32; ++i)
          bytes += char(int8_t(dd > 0 ? std::clamp(std::nearbyint(row[size_t(b + i)] / dd), -127.f, 127.f) : 0.f));
      }
    }
    w.tensor(gguf, uint32_t(GgmlType::kQ8_0), {uint64_t(k), uint64_t(n)}, bytes);
  }
};

// The gpt2 fixture (`fixture`: its directory) as llama.cpp's converter writes a Q8_0 GGUF of it: Linears and the
// token table Q8_0 (the Conv1D weights stored [out, in], the transpose of HF's [in, out]),
// position table, norms and biases F32, the LM head tied to the table.
inline std::string q8_gpt2(const std::string& fixture) {
  GgufWriter w;
  CheckpointToGguf c{w, open_safetensors_source(fixture + "/model.safetensors"), ""};
  if (c.st->has("transformer.wte.weight")) c.prefix = "transformer.";
  w.kv_string("general.architecture", "gpt2");
  for (const auto& [key, value] : {std::pair{"embedding_length", 64}, std::pair{"block_count", 2},
                                   std::pair{"attention.head_count", 4}, std::pair{"context_length", 128},
                                   std::pair{"feed_forward_length", 256}})
    w.kv_u32(std::string("gpt2.") + key, uint32_t(value));
  w.kv_f32("gpt2.attention.layer_norm_epsilon", 1e-5f);
  c.write(GgmlType::kQ8_0, "token_embd.weight", "wte.weight");
  c.f32("position_embd.weight", "wpe.weight");
  c.f32("output_norm.weight", "ln_f.weight");
  c.f32("output_norm.bias", "ln_f.bias");
  for (int l = 0; l < 2; ++l) {
    const std::string g = "blk." + std::to_string(l) + ".", h = "h." + std::to_string(l) + ".";
    for (const char* part : {"weight", "bias"}) {
      c.f32(g + "attn_norm." + part, h + "ln_1." + part);
      c.f32(g + "ffn_norm." + part, h + "ln_2." + part);
    }
    for (const auto& [gg, hf] : {std::pair{"attn_qkv", "attn.c_attn"}, std::pair{"attn_output", "attn.c_proj"},
                                 std::pair{"ffn_up", "mlp.c_fc"}, std::pair{"ffn_down", "mlp.c_proj"}}) {
      c.write(GgmlType::kQ8_0, g + gg + ".weight", h + hf + ".weight", /*conv1d=*/true);
      c.f32(g + gg + ".bias", h + hf + ".bias");
    }
  }
  return w.bytes();
}

// A decoder's architecture and shape as llama.cpp's converter writes them (<arch>.*
// keys from the HF config `cfg`).
inline void write_decoder_shape(GgufWriter& w, const std::string& arch, const nlohmann::json& cfg) {
  w.kv_string("general.architecture", arch);
  for (const auto& [key, hf] : {std::pair{"embedding_length", "hidden_size"}, std::pair{"block_count", "num_hidden_layers"},
                                std::pair{"attention.head_count", "num_attention_heads"},
                                std::pair{"attention.head_count_kv", "num_key_value_heads"},
                                std::pair{"attention.key_length", "head_dim"},
                                std::pair{"attention.value_length", "head_dim"},
                                std::pair{"context_length", "max_position_embeddings"},
                                std::pair{"feed_forward_length", "intermediate_size"}})
    w.kv_u32(arch + "." + key, cfg.at(hf).get<uint32_t>());
  w.kv_f32(arch + ".attention.layer_norm_rms_epsilon", cfg.at("rms_norm_eps").get<float>());
}

// The qwen3 or qwen3_yarn fixture (`fixture`: its directory) as llama.cpp's converter writes
// a GGUF of it (arch qwen3: no q/k row permutation, per-head attn_q_norm / attn_k_norm,
// YaRN as rope.scaling.* keys): the
// Linears in `matrices` (F32, F16 or Q8_0), the token table (also the tied LM head) F32,
// norms F32.
inline std::string qwen3_gguf(const std::string& fixture, GgmlType matrices) {
  const nlohmann::json cfg = nlohmann::json::parse(read_text_file(fixture + "/config.json"));
  GgufWriter w;
  CheckpointToGguf c{w, open_safetensors_source(fixture + "/model.safetensors"), "model."};
  write_decoder_shape(w, "qwen3", cfg);
  w.kv_f32("qwen3.rope.freq_base", cfg.at("rope_theta").get<float>());
  if (cfg.contains("rope_scaling") && cfg.at("rope_scaling").is_object()) {  // YaRN, as the converter writes it
    const nlohmann::json& rs = cfg.at("rope_scaling");
    w.kv_string("qwen3.rope.scaling.type", rs.at("rope_type").get<std::string>());
    w.kv_f32("qwen3.rope.scaling.factor", rs.at("factor").get<float>());
    w.kv_u32("qwen3.rope.scaling.original_context_length", rs.at("original_max_position_embeddings").get<uint32_t>());
  }
  c.f32("token_embd.weight", "embed_tokens.weight");
  c.f32("output_norm.weight", "norm.weight");
  for (int l = 0; l < cfg.at("num_hidden_layers").get<int>(); ++l) {
    const std::string g = "blk." + std::to_string(l) + ".", h = "layers." + std::to_string(l) + ".";
    c.f32(g + "attn_norm.weight", h + "input_layernorm.weight");
    c.f32(g + "ffn_norm.weight", h + "post_attention_layernorm.weight");
    c.f32(g + "attn_q_norm.weight", h + "self_attn.q_norm.weight");
    c.f32(g + "attn_k_norm.weight", h + "self_attn.k_norm.weight");
    c.llama_linears(matrices, g, h);
  }
  return w.bytes();
}

// A Phi-3 fixture (phi3, phi3_longrope; `fixture`: its directory) as llama.cpp's converter
// (Phi3MiniModel) writes a GGUF of it: arch phi3 with the rotary dims, the original context
// and the sliding window (0: none) as keys, q|k|v and gate|up fused (attn_qkv, ffn_up) in
// `matrices` (F32, F16 or Q8_0) like the other Linears, the token table, LM head and norms
// F32, and LongRoPE's factors as the tensors rope_factors_short / rope_factors_long with
// its attention factor as rope.scaling.attn_factor (the converter's sqrt(1 + ln(s) /
// ln(original)), s = max / original positions).
inline std::string phi3_gguf(const std::string& fixture, GgmlType matrices) {
  const nlohmann::json cfg = nlohmann::json::parse(read_text_file(fixture + "/config.json"));
  GgufWriter w;
  CheckpointToGguf c{w, open_safetensors_source(fixture + "/model.safetensors"), ""};
  const uint32_t hidden = cfg.at("hidden_size").get<uint32_t>(), heads = cfg.at("num_attention_heads").get<uint32_t>();
  const uint32_t ctx = cfg.at("max_position_embeddings").get<uint32_t>();
  const uint32_t orig = cfg.value("original_max_position_embeddings", ctx);
  const uint32_t window = cfg.at("sliding_window").is_null() ? 0u : cfg.at("sliding_window").get<uint32_t>();
  w.kv_string("general.architecture", "phi3");
  for (const auto& [key, value] :
       {std::pair{"context_length", ctx}, std::pair{"rope.scaling.original_context_length", orig},
        std::pair{"embedding_length", hidden}, std::pair{"feed_forward_length", cfg.at("intermediate_size").get<uint32_t>()},
        std::pair{"block_count", cfg.at("num_hidden_layers").get<uint32_t>()}, std::pair{"attention.head_count", heads},
        std::pair{"attention.head_count_kv", cfg.at("num_key_value_heads").get<uint32_t>()},
        std::pair{"rope.dimension_count", uint32_t(cfg.at("partial_rotary_factor").get<double>() * hidden) / heads},
        std::pair{"attention.sliding_window", window}})
    w.kv_u32(std::string("phi3.") + key, value);
  w.kv_f32("phi3.attention.layer_norm_rms_epsilon", cfg.at("rms_norm_eps").get<float>());
  w.kv_f32("phi3.rope.freq_base", cfg.at("rope_theta").get<float>());
  if (cfg.contains("rope_scaling") && cfg.at("rope_scaling").is_object()) {
    const nlohmann::json& rs = cfg.at("rope_scaling");
    const double s = double(ctx) / double(orig);
    w.kv_f32("phi3.rope.scaling.attn_factor", float(s > 1.0 ? std::sqrt(1.0 + std::log(s) / std::log(double(orig))) : 1.0));
    for (const auto& [name, key] : {std::pair{"rope_factors_long.weight", "long_factor"},
                                    std::pair{"rope_factors_short.weight", "short_factor"}}) {
      std::vector<float> v;
      for (const auto& e : rs.at(key)) v.push_back(e.get<float>());
      w.tensor(name, 0, {uint64_t(v.size())}, std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4));
    }
  }
  c.f32("token_embd.weight", "model.embed_tokens.weight");
  c.f32("output_norm.weight", "model.norm.weight");
  c.f32("output.weight", "lm_head.weight");
  for (int l = 0; l < cfg.at("num_hidden_layers").get<int>(); ++l) {
    const std::string g = "blk." + std::to_string(l) + ".", h = "model.layers." + std::to_string(l) + ".";
    c.f32(g + "attn_norm.weight", h + "input_layernorm.weight");
    c.f32(g + "ffn_norm.weight", h + "post_attention_layernorm.weight");
    for (const auto& [gg, hf] : {std::pair{"attn_qkv", "self_attn.qkv_proj"}, std::pair{"attn_output", "self_attn.o_proj"},
                                 std::pair{"ffn_up", "mlp.gate_up_proj"}, std::pair{"ffn_down", "mlp.down_proj"}})
      c.write(matrices, g + gg + ".weight", h + hf + ".weight");
  }
  return w.bytes();
}

// The llama (or smollm3 / granite, `arch` smollm3 / granite) fixture (`fixture`: its
// directory) as llama.cpp's converter (LlamaModel, SmolLM3Model, GraniteModel: its
// multipliers as <arch>.*_scale keys) writes a GGUF of it: q_proj / k_proj rows permuted to
// llama.cpp's rotary pairs, the Linears in `matrices` (F32, F16 or Q8_0), the token table
// (also the tied LM head) and norms F32, and Llama 3's RoPE scaling not as keys but as the
// tensor rope_freqs.weight: each frequency's divisor (1 for short wavelengths, `factor` for
// long ones, smoothed between), as the converter's generate_extra_tensors computes it.
inline std::string llama_gguf(const std::string& fixture, GgmlType matrices, const std::string& arch) {
  nlohmann::json cfg = nlohmann::json::parse(read_text_file(fixture + "/config.json"));
  if (!cfg.contains("head_dim"))
    cfg["head_dim"] = cfg.at("hidden_size").get<int64_t>() / cfg.at("num_attention_heads").get<int64_t>();
  GgufWriter w;
  CheckpointToGguf c{w, open_safetensors_source(fixture + "/model.safetensors"), "model."};
  write_decoder_shape(w, arch, cfg);
  const double base = cfg.at("rope_theta").get<double>();
  const int64_t dim = cfg.at("head_dim").get<int64_t>();
  w.kv_f32(arch + ".rope.freq_base", float(base));
  w.kv_u32(arch + ".rope.dimension_count", uint32_t(dim));
  if (arch == "granite")  // GraniteModel: the multipliers as scales
    for (const auto& [key, hf] : {std::pair{"embedding_scale", "embedding_multiplier"},
                                  std::pair{"residual_scale", "residual_multiplier"},
                                  std::pair{"attention.scale", "attention_multiplier"},
                                  std::pair{"logit_scale", "logits_scaling"}})
      w.kv_f32(arch + "." + key, cfg.at(hf).get<float>());
  if (cfg.contains("rope_scaling") && cfg.at("rope_scaling").is_object()) {
    const nlohmann::json& rs = cfg.at("rope_scaling");
    const double factor = rs.at("factor").get<double>(), lo = rs.at("low_freq_factor").get<double>(),
                 hi = rs.at("high_freq_factor").get<double>(),
                 old_ctx = rs.at("original_max_position_embeddings").get<double>();
    std::vector<float> factors;
    for (int64_t i = 0; i < dim; i += 2) {
      const double freq = 1.0 / std::pow(base, double(float(i) / float(dim)));
      const double wavelen = 2 * M_PI / freq;
      if (wavelen < old_ctx / hi) {
        factors.push_back(1.0f);
      } else if (wavelen > old_ctx / lo) {
        factors.push_back(float(factor));
      } else {
        const double smooth = (old_ctx / wavelen - lo) / (hi - lo);
        factors.push_back(float(1.0 / ((1 - smooth) / factor + smooth)));
      }
    }
    w.tensor("rope_freqs.weight", 0, {uint64_t(factors.size())},
             std::string(reinterpret_cast<const char*>(factors.data()), factors.size() * 4));
  }
  c.f32("token_embd.weight", "embed_tokens.weight");
  c.f32("output_norm.weight", "norm.weight");
  const int64_t heads = cfg.at("num_attention_heads").get<int64_t>(), kv = cfg.at("num_key_value_heads").get<int64_t>();
  for (int l = 0; l < cfg.at("num_hidden_layers").get<int>(); ++l) {
    const std::string g = "blk." + std::to_string(l) + ".", h = "layers." + std::to_string(l) + ".";
    c.f32(g + "attn_norm.weight", h + "input_layernorm.weight");
    c.f32(g + "ffn_norm.weight", h + "post_attention_layernorm.weight");
    c.write(matrices, g + "attn_q.weight", h + "self_attn.q_proj.weight", false, heads);
    c.write(matrices, g + "attn_k.weight", h + "self_attn.k_proj.weight", false, kv);
    for (const auto& [gg, hf] : {std::pair{"attn_v", "self_attn.v_proj"}, std::pair{"attn_output", "self_attn.o_proj"},
                                 std::pair{"ffn_gate", "mlp.gate_proj"}, std::pair{"ffn_up", "mlp.up_proj"},
                                 std::pair{"ffn_down", "mlp.down_proj"}})
      c.write(matrices, g + gg + ".weight", h + hf + ".weight");
  }
  return w.bytes();
}
inline std::string llama_gguf(const std::string& fixture, GgmlType matrices) {
  return llama_gguf(fixture, matrices, "llama");
}
inline std::string smollm3_gguf(const std::string& fixture, GgmlType matrices) {
  return llama_gguf(fixture, matrices, "smollm3");
}
inline std::string granite_gguf(const std::string& fixture, GgmlType matrices) {
  return llama_gguf(fixture, matrices, "granite");
}

// The olmo2 fixture (`fixture`: its directory) as llama.cpp's converter (Olmo2Model) writes a
// GGUF of it: no q/k permutation, the block outputs' norms as post_attention_norm /
// post_ffw_norm, q / k norms over the whole projection, the Linears in `matrices`, the token
// table, LM head and norms F32.
inline std::string olmo2_gguf(const std::string& fixture, GgmlType matrices) {
  nlohmann::json cfg = nlohmann::json::parse(read_text_file(fixture + "/config.json"));
  if (!cfg.contains("head_dim"))
    cfg["head_dim"] = cfg.at("hidden_size").get<int64_t>() / cfg.at("num_attention_heads").get<int64_t>();
  GgufWriter w;
  CheckpointToGguf c{w, open_safetensors_source(fixture + "/model.safetensors"), "model."};
  write_decoder_shape(w, "olmo2", cfg);
  w.kv_f32("olmo2.rope.freq_base", cfg.at("rope_theta").get<float>());
  c.f32("token_embd.weight", "embed_tokens.weight");
  c.f32("output_norm.weight", "norm.weight");
  c.prefix = "";  // the LM head is not under model.
  c.f32("output.weight", "lm_head.weight");
  c.prefix = "model.";
  for (int l = 0; l < cfg.at("num_hidden_layers").get<int>(); ++l) {
    const std::string g = "blk." + std::to_string(l) + ".", h = "layers." + std::to_string(l) + ".";
    c.f32(g + "attn_q_norm.weight", h + "self_attn.q_norm.weight");
    c.f32(g + "attn_k_norm.weight", h + "self_attn.k_norm.weight");
    c.f32(g + "post_attention_norm.weight", h + "post_attention_layernorm.weight");
    c.f32(g + "post_ffw_norm.weight", h + "post_feedforward_layernorm.weight");
    c.llama_linears(matrices, g, h);
  }
  return w.bytes();
}

// The gemma, gemma2 or gemma3 fixture (`fixture`: its directory) as llama.cpp's converter
// writes a GGUF of it (arch gemma / gemma2 / gemma3; Gemma 1 without the sandwich norms,
// window and soft-caps): every RMSNorm weight stored as (1 + w), the sandwich
// norms as post_attention_norm / ffn_norm / post_ffw_norm, the Linears in `matrices` (F32,
// F16 or Q8_0), the token table (also the tied LM head) and norms F32; the window, the
// soft-caps and Gemma 3's two RoPE bases and linear scaling as metadata. Which layers slide:
// gemma3 as a per-layer bool array, gemma2 by llama.cpp's default (every other layer from
// layer 0). No query_pre_attn_scalar: llama.cpp scales by head_dim^-1/2.
inline std::string gemma_gguf(const std::string& fixture, const std::string& arch, GgmlType matrices) {
  const nlohmann::json cfg = nlohmann::json::parse(read_text_file(fixture + "/config.json"));
  GgufWriter w;
  CheckpointToGguf c{w, open_safetensors_source(fixture + "/model.safetensors"), "model."};
  const std::string a = arch + ".";
  write_decoder_shape(w, arch, cfg);
  const int layers = cfg.at("num_hidden_layers").get<int>();
  if (arch != "gemma") w.kv_u32(a + "attention.sliding_window", cfg.at("sliding_window").get<uint32_t>());
  if (arch == "gemma") {
    w.kv_f32(a + "rope.freq_base", cfg.at("rope_theta").get<float>());
  } else if (arch == "gemma3") {
    const nlohmann::json& rp = cfg.at("rope_parameters");
    w.kv_f32(a + "rope.freq_base", rp.at("full_attention").at("rope_theta").get<float>());
    w.kv_string(a + "rope.scaling.type", rp.at("full_attention").at("rope_type").get<std::string>());
    w.kv_f32(a + "rope.scaling.factor", rp.at("full_attention").at("factor").get<float>());
    w.kv_f32(a + "rope.freq_base_swa", rp.at("sliding_attention").at("rope_theta").get<float>());
    std::vector<uint8_t> slides;
    for (const auto& t : cfg.at("layer_types")) slides.push_back(t.get<std::string>() == "sliding_attention");
    w.kv_array(a + "attention.sliding_window_pattern", 7 /*bool*/, slides);
  } else {
    w.kv_f32(a + "rope.freq_base", cfg.at("rope_theta").get<float>());
    w.kv_f32(a + "attn_logit_softcapping", cfg.at("attn_logit_softcapping").get<float>());
    w.kv_f32(a + "final_logit_softcapping", cfg.at("final_logit_softcapping").get<float>());
  }
  // (1 + w), as the converter stores every Gemma norm.
  auto norm = [&](const std::string& gguf, const std::string& hf) {
    Tensor t = c.st->load("model." + hf, DType::kF32);
    for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] += 1.0f;
    w.tensor(gguf, 0, {uint64_t(t.numel())}, std::string(static_cast<const char*>(t.data()), t.nbytes()));
  };
  c.f32("token_embd.weight", "embed_tokens.weight");
  norm("output_norm.weight", "norm.weight");
  for (int l = 0; l < layers; ++l) {
    const std::string g = "blk." + std::to_string(l) + ".", h = "layers." + std::to_string(l) + ".";
    norm(g + "attn_norm.weight", h + "input_layernorm.weight");
    if (arch == "gemma") {  // Gemma 1: Llama's names, ffn_norm before the MLP
      norm(g + "ffn_norm.weight", h + "post_attention_layernorm.weight");
    } else {
      norm(g + "post_attention_norm.weight", h + "post_attention_layernorm.weight");
      norm(g + "ffn_norm.weight", h + "pre_feedforward_layernorm.weight");
      norm(g + "post_ffw_norm.weight", h + "post_feedforward_layernorm.weight");
    }
    if (arch == "gemma3") {
      norm(g + "attn_q_norm.weight", h + "self_attn.q_norm.weight");
      norm(g + "attn_k_norm.weight", h + "self_attn.k_norm.weight");
    }
    c.llama_linears(matrices, g, h);
  }
  return w.bytes();
}
inline std::string gemma1_gguf(const std::string& fixture, GgmlType matrices) {
  return gemma_gguf(fixture, "gemma", matrices);
}

// A BERT directory (config.json + model.safetensors, a vocab.txt when it has one) as
// llama.cpp's converter writes a BertModel GGUF: the token table and the Linears in
// `matrices` (F32, F16 or Q8_0), the position and token-type tables, norms and biases
// F32, no pooler or classifier, `pooling_type` as llama.cpp numbers it (0 none, 1 mean,
// 2 cls, 3 last, 4 rank) unless negative, and the vocabulary in llama.cpp's "phantom
// space" form (a word start's "\u2581" prefix, continuations without "##", control tokens
// as they are); without vocab.txt, tokens t0, t1, ...
inline std::string bert_gguf(const std::string& dir, GgmlType matrices, int pooling_type) {
  const nlohmann::json c = nlohmann::json::parse(read_text_file(dir + "/config.json"));
  GgufWriter w;
  CheckpointToGguf t{w, open_safetensors_source(dir + "/model.safetensors"), ""};
  if (t.st->has("bert.embeddings.word_embeddings.weight")) t.prefix = "bert.";
  const int layers = c.at("num_hidden_layers");
  w.kv_string("general.architecture", "bert");
  w.kv_u32("bert.embedding_length", c.at("hidden_size"));
  w.kv_u32("bert.feed_forward_length", c.at("intermediate_size"));
  w.kv_u32("bert.block_count", uint32_t(layers));
  w.kv_u32("bert.attention.head_count", c.at("num_attention_heads"));
  w.kv_u32("bert.context_length", c.at("max_position_embeddings"));
  w.kv_f32("bert.attention.layer_norm_epsilon", c.value("layer_norm_eps", 1e-12f));
  if (pooling_type >= 0) w.kv_u32("bert.pooling_type", uint32_t(pooling_type));
  w.kv_u32("tokenizer.ggml.token_type_count", c.value("type_vocab_size", 2u));
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::map<std::string, uint32_t> ids;
  if (std::filesystem::exists(dir + "/vocab.txt")) {
    std::istringstream in(read_text_file(dir + "/vocab.txt"));
    for (std::string tok; std::getline(in, tok);) {
      ids[tok] = uint32_t(tokens.size());
      const bool control = tok == "[PAD]" || tok == "[UNK]" || tok == "[CLS]" || tok == "[SEP]" || tok == "[MASK]";
      types.push_back(control ? 3 : 1);
      tokens.push_back(control ? tok : tok.rfind("##", 0) == 0 ? tok.substr(2) : "\xE2\x96\x81" + tok);
    }
  } else {
    for (int i = 0; i < int(c.at("vocab_size")); ++i) tokens.push_back("t" + std::to_string(i));
    types.assign(tokens.size(), 1);
  }
  w.kv_string("tokenizer.ggml.model", "bert");
  w.kv_strings("tokenizer.ggml.tokens", tokens);
  w.kv_array<int32_t>("tokenizer.ggml.token_type", 5, types);
  // As the converter's SpecialVocab writes them: [CLS] as the BOS, [SEP] as the EOS and separator.
  for (const auto& [key, tok] : {std::pair{"unknown", "[UNK]"}, std::pair{"seperator", "[SEP]"}, std::pair{"bos", "[CLS]"},
                                 std::pair{"eos", "[SEP]"}, std::pair{"padding", "[PAD]"}, std::pair{"mask", "[MASK]"}})
    if (ids.count(tok)) w.kv_u32(std::string("tokenizer.ggml.") + key + "_token_id", ids[tok]);
  t.write(matrices, "token_embd.weight", "embeddings.word_embeddings.weight");
  t.f32("position_embd.weight", "embeddings.position_embeddings.weight");
  t.f32("token_types.weight", "embeddings.token_type_embeddings.weight");
  t.f32("token_embd_norm.weight", "embeddings.LayerNorm.weight");
  t.f32("token_embd_norm.bias", "embeddings.LayerNorm.bias");
  for (int l = 0; l < layers; ++l) {
    const std::string g = "blk." + std::to_string(l) + ".", h = "encoder.layer." + std::to_string(l) + ".";
    for (const auto& [gg, hf] : {std::pair{"attn_q", "attention.self.query"}, std::pair{"attn_k", "attention.self.key"},
                                 std::pair{"attn_v", "attention.self.value"},
                                 std::pair{"attn_output", "attention.output.dense"},
                                 std::pair{"ffn_up", "intermediate.dense"}, std::pair{"ffn_down", "output.dense"}}) {
      t.write(matrices, g + gg + ".weight", h + hf + ".weight");
      t.f32(g + gg + ".bias", h + hf + ".bias");
    }
    for (const auto& [gg, hf] : {std::pair{"attn_output_norm", "attention.output.LayerNorm"},
                                 std::pair{"layer_output_norm", "output.LayerNorm"}})
      for (const char* part : {".weight", ".bias"}) t.f32(g + gg + part, h + hf + part);
  }
  return w.bytes();
}

}  // namespace kiln::test
