// GPT-2: learned positions, pre-LayerNorm blocks, tanh-GELU MLP, Conv1D weights stored
// [in, out] (transposed on load), LM head tied to the token embedding. Tested in
// tests/models/decoder_golden_test.cpp against transformers' GPT2LMHeadModel.
#include <cmath>

#include "core/status.h"
#include "models/model_builder.h"

namespace kiln {

BuiltModel build_gpt2(const nlohmann::json& c, const WeightSource& src) {
  BuiltModel m;
  ModelInfo& info = m.info;
  info.family = "gpt2";
  info.vocab_size = config_int(c, "vocab_size");
  info.hidden_size = config_int(c, "n_embd");
  info.num_layers = config_int(c, "n_layer");
  info.num_heads = config_int(c, "n_head");
  info.num_kv_heads = info.num_heads;
  info.max_positions = config_int(c, "n_positions");
  info.bos_token_id = config_int(c, "bos_token_id", -1);
  info.eos_token_id = config_int(c, "eos_token_id", -1);
  const int64_t h = info.hidden_size, v = info.vocab_size, L = info.num_layers;
  if (h % info.num_heads)
    throw_error(ErrorCode::kInvalidFile, "config.json: n_embd ", h, " is not divisible by n_head ",
                info.num_heads);
  info.head_dim = h / info.num_heads;
  const int64_t inner = config_int(c, "n_inner", 4 * h);
  const double eps = config_float(c, "layer_norm_epsilon", 1e-5);
  std::string act = config_str(c, "activation_function", "gelu_new");
  std::string approx;
  if (act == "gelu_new" || act == "gelu_pytorch_tanh" || act == "gelu_fast") approx = "tanh";
  else if (act == "gelu") approx = "none";
  else throw_error(ErrorCode::kUnsupported, "gpt2: activation_function '", act, "'");

  // Hub checkpoints name tensors "h.0..." or "transformer.h.0..." depending on the class
  // that saved them.
  const std::string p = src.has("transformer.wte.weight") ? "transformer." : "";
  std::vector<WeightSpec> specs = {
      {p + "wte.weight", {v, h}, true, "", false, false, /*table=*/true},
      {p + "wpe.weight", {info.max_positions, h}},
      {p + "ln_f.weight", {h}},
      {p + "ln_f.bias", {h}},
      {"lm_head.weight", {v, h}, true, p + "wte.weight", false, /*linear=*/true},
  };
  for (int64_t l = 0; l < L; ++l) {
    std::string b = p + "h." + std::to_string(l) + ".";
    specs.push_back({b + "ln_1.weight", {h}});
    specs.push_back({b + "ln_1.bias", {h}});
    specs.push_back({b + "attn.c_attn.weight", {3 * h, h}, true, "", /*transpose=*/true, /*linear=*/true});
    specs.push_back({b + "attn.c_attn.bias", {3 * h}});
    specs.push_back({b + "attn.c_proj.weight", {h, h}, true, "", /*transpose=*/true, /*linear=*/true});
    specs.push_back({b + "attn.c_proj.bias", {h}});
    specs.push_back({b + "ln_2.weight", {h}});
    specs.push_back({b + "ln_2.bias", {h}});
    specs.push_back({b + "mlp.c_fc.weight", {inner, h}, true, "", /*transpose=*/true, /*linear=*/true});
    specs.push_back({b + "mlp.c_fc.bias", {inner}});
    specs.push_back({b + "mlp.c_proj.weight", {h, inner}, true, "", /*transpose=*/true, /*linear=*/true});
    specs.push_back({b + "mlp.c_proj.bias", {h}});
  }
  auto w = load_declared_weights(specs, src);

  ir::Graph& g = m.graph;
  auto W = [&](const std::string& name) { return g.add_weight(name, w.at(name)); };
  // c_attn packs Q, K and V; the faithful graph keeps three projections (the QKV-merge
  // pass fuses them back), so split the rows here.
  auto split_rows = [&](const std::string& name, int64_t part, int64_t rows) {
    const Tensor& t = w.at(name);
    int64_t cols = t.rank() == 2 ? t.dim(1) : 1;
    Tensor s = t.slice_rows(part * rows, (part + 1) * rows).clone();
    return g.add_weight(name + "." + "qkv"[part], t.rank() == 2 ? s.reshape({rows, cols}) : s);
  };

  ir::ValueId tokens = g.add_input("tokens", DType::kI32, {"T"});
  ir::ValueId positions = g.add_input("positions", DType::kI32, {"T"});
  ir::ValueId rows = g.add_input("logit_rows", DType::kI32, {"R"});
  // A GGUF's quantized Linears and token table stay q8/q4 row images (load_declared_weights);
  // the graph marks them with their format and K.
  auto linear = [&](ir::ValueId x, ir::ValueId weight, ir::ValueId bias, int64_t k, const std::string& node) {
    std::vector<ir::ValueId> in = {x, weight};
    if (bias != ir::kNoValue) in.push_back(bias);
    return g.add("Linear", in, kept_quant_linear_attrs(g.weight(weight), k), node);
  };
  const ir::ValueId wte = W(p + "wte.weight");
  ir::ValueId x = g.add("Add", {g.add("Embedding", {wte, tokens}, kept_quant_table_attrs(g.weight(wte), h), "embed_tokens"),
                                g.add("Embedding", {W(p + "wpe.weight"), positions}, {}, "embed_positions")},
                        {}, "embed");
  const double scale = 1.0 / std::sqrt(double(info.head_dim));
  for (int64_t l = 0; l < L; ++l) {
    std::string b = p + "h." + std::to_string(l) + ".";
    std::string n = "h" + std::to_string(l) + ".";
    ir::ValueId a = g.add("LayerNorm", {x, W(b + "ln_1.weight"), W(b + "ln_1.bias")}, {{"eps", eps}},
                          n + "ln_1");
    ir::ValueId qkv[3];
    for (int i = 0; i < 3; ++i)
      qkv[i] = linear(a, split_rows(b + "attn.c_attn.weight", i, h), split_rows(b + "attn.c_attn.bias", i, h), h,
                      n + "attn." + "qkv"[i] + "_proj");
    ir::ValueId att = g.add("Attention", {qkv[0], qkv[1], qkv[2]},
                            {{"layer", l}, {"num_heads", info.num_heads}, {"num_kv_heads", info.num_heads},
                             {"head_dim", info.head_dim}, {"scale", scale}, {"causal", int64_t(1)}},
                            n + "attn");
    ir::ValueId o = linear(att, W(b + "attn.c_proj.weight"), W(b + "attn.c_proj.bias"), h, n + "attn.c_proj");
    x = g.add("Add", {x, o}, {}, n + "residual_1");
    ir::ValueId f = g.add("LayerNorm", {x, W(b + "ln_2.weight"), W(b + "ln_2.bias")}, {{"eps", eps}},
                          n + "ln_2");
    f = linear(f, W(b + "mlp.c_fc.weight"), W(b + "mlp.c_fc.bias"), h, n + "mlp.c_fc");
    f = g.add("Gelu", {f}, {{"approximate", approx}}, n + "mlp.act");
    f = linear(f, W(b + "mlp.c_proj.weight"), W(b + "mlp.c_proj.bias"), inner, n + "mlp.c_proj");
    x = g.add("Add", {x, f}, {}, n + "residual_2");
  }
  ir::ValueId hidden = g.add("LayerNorm", {x, W(p + "ln_f.weight"), W(p + "ln_f.bias")},
                             {{"eps", eps}}, "ln_f");
  ir::ValueId last = g.add("GatherRows", {hidden, rows}, {}, "select_rows");
  ir::ValueId logits = linear(last, W("lm_head.weight"), ir::kNoValue, h, "lm_head");
  g.add_output("hidden", hidden);
  g.add_output("logits", logits);
  return m;
}

}  // namespace kiln
