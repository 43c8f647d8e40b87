// The BERT family (BERT, MiniLM, Chinese BERT): word + position + token-type embeddings,
// post-LayerNorm encoder blocks with erf-GELU, bidirectional attention within each
// sequence, the tanh pooler over [CLS], an optional sequence-classification head, and
// the sentence embedding's poolings: the mean of the rows and the [CLS] row. Tested in
// tests/models/bert_golden_test.cpp against transformers' BertForSequenceClassification
// and the real all-MiniLM-L6-v2, and in bert_gguf_test.cpp (GGUFs, pooling).
#include <cmath>

#include "core/status.h"
#include "frontends/hf_dir.h"
#include "models/model_builder.h"

namespace kiln {

BuiltModel build_bert(const nlohmann::json& c, const WeightSource& src) {
  BuiltModel m;
  ModelInfo& info = m.info;
  info.family = "bert";
  info.is_decoder = false;
  info.vocab_size = config_int(c, "vocab_size");
  info.hidden_size = config_int(c, "hidden_size");
  info.num_layers = config_int(c, "num_hidden_layers");
  info.num_heads = config_int(c, "num_attention_heads");
  info.num_kv_heads = info.num_heads;
  info.max_positions = config_int(c, "max_position_embeddings");
  info.pooling = config_str(c, kPoolingConfigKey, "mean");
  if (info.pooling != "mean" && info.pooling != "cls")
    throw_error(ErrorCode::kUnsupported, "bert: pooling '", info.pooling, "' (mean or cls)");
  const int64_t h = info.hidden_size, L = info.num_layers;
  if (h % info.num_heads)
    throw_error(ErrorCode::kInvalidFile, "config.json: hidden_size ", h,
                " is not divisible by num_attention_heads ", info.num_heads);
  info.head_dim = h / info.num_heads;
  const int64_t inter = config_int(c, "intermediate_size");
  const int64_t types = config_int(c, "type_vocab_size", 2);
  const double eps = config_float(c, "layer_norm_eps", 1e-12);
  std::string act = config_str(c, "hidden_act", "gelu");
  std::string approx;
  if (act == "gelu") approx = "none";
  else if (act == "gelu_new" || act == "gelu_pytorch_tanh") approx = "tanh";
  else throw_error(ErrorCode::kUnsupported, "bert: hidden_act '", act, "'");
  std::string pos_type = config_str(c, "position_embedding_type", "absolute");
  if (pos_type != "absolute")
    throw_error(ErrorCode::kUnsupported, "bert: position_embedding_type '", pos_type, "'");

  // BertModel checkpoints have bare names; task models prefix the encoder with "bert.".
  const std::string p = src.has("bert.embeddings.word_embeddings.weight") ? "bert." : "";
  const bool has_pooler = src.has(p + "pooler.dense.weight");
  const bool has_classifier = src.has("classifier.weight");
  if (has_classifier) {
    info.num_labels = src.info("classifier.weight").shape.at(0);
    if (c.contains("id2label") && c["id2label"].is_object())
      for (int64_t i = 0; i < info.num_labels; ++i)
        info.labels.push_back(c["id2label"].value(std::to_string(i), "LABEL_" + std::to_string(i)));
  }
  std::vector<WeightSpec> specs = {
      {p + "embeddings.word_embeddings.weight", {info.vocab_size, h}, true, "", false, false, /*table=*/true},
      {p + "embeddings.position_embeddings.weight", {info.max_positions, h}},
      {p + "embeddings.token_type_embeddings.weight", {types, h}},
      {p + "embeddings.LayerNorm.weight", {h}},
      {p + "embeddings.LayerNorm.bias", {h}},
      {p + "pooler.dense.weight", {h, h}, has_pooler},
      {p + "pooler.dense.bias", {h}, has_pooler},
      {"classifier.weight", {info.num_labels, h}, has_classifier},
      {"classifier.bias", {info.num_labels}, has_classifier},
  };
  const char* kLinears[] = {"attention.self.query", "attention.self.key", "attention.self.value",
                            "attention.output.dense", "intermediate.dense", "output.dense"};
  for (int64_t l = 0; l < L; ++l) {
    std::string b = p + "encoder.layer." + std::to_string(l) + ".";
    for (const char* lin : kLinears) {
      std::string s = lin;
      int64_t out = s == "intermediate.dense" ? inter : h;
      int64_t in = s == "output.dense" ? inter : h;
      specs.push_back({b + s + ".weight", {out, in}, true, "", false, /*linear=*/true});
      specs.push_back({b + s + ".bias", {out}});
    }
    for (const char* ln : {"attention.output.LayerNorm", "output.LayerNorm"}) {
      specs.push_back({b + ln + ".weight", {h}});
      specs.push_back({b + ln + ".bias", {h}});
    }
  }
  auto w = load_declared_weights(specs, src);

  ir::Graph& g = m.graph;
  auto W = [&](const std::string& name) { return g.add_weight(name, w.at(name)); };
  // A GGUF's quantized Linears and token table stay q8 row images (load_declared_weights).
  auto linear = [&](ir::ValueId x, const std::string& weight, const std::string& node, int64_t k) {
    const ir::ValueId wt = W(weight + ".weight");
    return g.add("Linear", {x, wt, W(weight + ".bias")}, kept_quant_linear_attrs(g.weight(wt), k), node);
  };
  auto layer_norm = [&](ir::ValueId x, const std::string& weight, const std::string& node) {
    return g.add("LayerNorm", {x, W(weight + ".weight"), W(weight + ".bias")}, {{"eps", eps}}, node);
  };

  ir::ValueId tokens = g.add_input("tokens", DType::kI32, {"T"});
  ir::ValueId positions = g.add_input("positions", DType::kI32, {"T"});
  ir::ValueId token_types = g.add_input("token_types", DType::kI32, {"T"});
  ir::ValueId cls_rows = g.add_input("cls_rows", DType::kI32, {"B"});
  std::string e = p + "embeddings.";
  ir::ValueId x = g.add("Add", {g.add("Embedding", {W(e + "word_embeddings.weight"), tokens},
                                       kept_quant_table_attrs(w.at(e + "word_embeddings.weight"), h), "embed_words"),
                                g.add("Embedding", {W(e + "position_embeddings.weight"), positions}, {},
                                      "embed_positions")},
                        {}, "embed_sum");
  x = g.add("Add", {x, g.add("Embedding", {W(e + "token_type_embeddings.weight"), token_types}, {},
                             "embed_token_types")},
            {}, "embed_sum_types");
  x = layer_norm(x, e + "LayerNorm", "embed_norm");
  const double scale = 1.0 / std::sqrt(double(info.head_dim));
  for (int64_t l = 0; l < L; ++l) {
    std::string b = p + "encoder.layer." + std::to_string(l) + ".";
    std::string n = "layer." + std::to_string(l) + ".";
    ir::ValueId q = linear(x, b + "attention.self.query", n + "query", h);
    ir::ValueId k = linear(x, b + "attention.self.key", n + "key", h);
    ir::ValueId v = linear(x, b + "attention.self.value", n + "value", h);
    ir::ValueId att = g.add("Attention", {q, k, v},
                            {{"layer", l}, {"num_heads", info.num_heads}, {"num_kv_heads", info.num_heads},
                             {"head_dim", info.head_dim}, {"scale", scale}, {"causal", int64_t(0)}},
                            n + "attn");
    att = linear(att, b + "attention.output.dense", n + "attn_out", h);
    x = layer_norm(g.add("Add", {att, x}, {}, n + "residual_1"), b + "attention.output.LayerNorm",
                   n + "attn_norm");
    ir::ValueId f = g.add("Gelu", {linear(x, b + "intermediate.dense", n + "intermediate", h)},
                          {{"approximate", approx}}, n + "act");
    f = linear(f, b + "output.dense", n + "ffn_out", inter);
    x = layer_norm(g.add("Add", {f, x}, {}, n + "residual_2"), b + "output.LayerNorm", n + "ffn_norm");
  }
  g.add_output("hidden", x);
  g.add_output("mean_pooled", g.add("SeqMeanPool", {x}, {}, "mean_pool"));
  ir::ValueId cls = g.add("GatherRows", {x, cls_rows}, {}, "select_cls");
  g.add_output("cls_hidden", cls);
  if (has_pooler) {
    ir::ValueId pooled = g.add("Tanh", {linear(cls, p + "pooler.dense", "pooler", h)}, {}, "pooler_act");
    g.add_output("pooled", pooled);
    if (has_classifier) g.add_output("logits", linear(pooled, "classifier", "classifier", h));
  }
  return m;
}

}  // namespace kiln
