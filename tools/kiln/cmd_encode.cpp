// `kiln embed`, `kiln classify`, `kiln rerank` (encoders) and `kiln tokenize`.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "commands.h"
#include "core/status.h"
#include "runtime/encoder_runner.h"
#include "runtime/model_tokenizer.h"

namespace kiln::cli {

namespace {

struct EncodeArgs {
  ModelArgs model;
  std::vector<std::string> texts;
  std::vector<std::string> ids;
  bool no_normalize = false;
  std::string pooling = "model";
};

std::vector<EncoderInput> encoder_inputs(const Model& model, const EncodeArgs& a) {
  std::vector<EncoderInput> batch;
  if (!a.texts.empty()) {
    auto tokenizer = load_model_tokenizer(model);
    if (!tokenizer)
      throw_error(ErrorCode::kInvalidArgument, "'", a.model.model, "' has no tokenizer; use --ids");
    tok::EncodeOptions eo;
    eo.max_length = size_t(model.info().max_positions);
    for (auto& t : a.texts) {
      tok::Encoding e = tokenizer->encode_full(t, eo);
      batch.push_back({e.ids, e.type_ids});
    }
  }
  for (auto& s : a.ids) batch.push_back({parse_ids(s), {}});
  if (batch.empty()) throw_error(ErrorCode::kInvalidArgument, "give at least one --text or --ids");
  return batch;
}

void print_vector(const std::vector<float>& v) {
  std::printf("[");
  for (size_t i = 0; i < v.size(); ++i) std::printf("%s%.6g", i ? ", " : "", v[i]);
  std::printf("]");
}

int run_embed(const EncodeArgs& a) {
  auto model = load_model(a.model);
  auto out = encode(*model, encoder_inputs(*model, a));
  std::vector<std::vector<float>> vs;
  for (const EncoderOutput& o : out) {  // every vector first: an error leaves stdout empty
    std::vector<float> v = a.pooling == "model" ? o.embedding
                           : a.pooling == "mean" ? o.mean_pooled
                           : a.pooling == "cls"  ? o.cls_hidden
                                                 : o.pooled;
    if (v.empty())
      throw_error(ErrorCode::kUnsupported, a.pooling == "pooler" ? "the model has no pooler (pooler.dense) for --pooling pooler"
                                                                 : "the model's graph has no [CLS] output for --pooling cls");
    if (!a.no_normalize) {
      double n = 0;
      for (float x : v) n += double(x) * x;
      float inv = n > 0 ? float(1.0 / std::sqrt(n)) : 0.0f;
      for (float& x : v) x *= inv;
    }
    vs.push_back(std::move(v));
  }
  std::printf("[\n");
  for (size_t i = 0; i < vs.size(); ++i) {
    std::printf("  ");
    print_vector(vs[i]);
    std::printf("%s\n", i + 1 < vs.size() ? "," : "");
  }
  std::printf("]\n");
  return 0;
}

int run_classify(const EncodeArgs& a) {
  auto model = load_model(a.model);
  if (model->info().num_labels == 0)
    throw_error(ErrorCode::kUnsupported, "'", a.model.model,
                "' has no classification head (classifier.weight); use `kiln embed`");
  auto out = encode(*model, encoder_inputs(*model, a));
  for (size_t i = 0; i < out.size(); ++i) {
    const auto& l = out[i].logits;
    float mx = *std::max_element(l.begin(), l.end());
    double sum = 0;
    for (float x : l) sum += std::exp(double(x - mx));
    size_t best = size_t(std::max_element(l.begin(), l.end()) - l.begin());
    auto label = [&](size_t k) {
      return k < model->info().labels.size() ? model->info().labels[k] : "LABEL_" + std::to_string(k);
    };
    std::printf("%zu: %s", i, label(best).c_str());
    for (size_t k = 0; k < l.size(); ++k)
      std::printf("  %s=%.4f", label(k).c_str(), std::exp(double(l[k] - mx)) / sum);
    std::printf("\n");
  }
  return 0;
}

struct RerankArgs {
  ModelArgs model;
  std::string query;
  std::vector<std::string> documents;
  int top_n = 0;
};

int run_rerank(const RerankArgs& a) {
  auto model = load_model(a.model);
  const ModelInfo& info = model->info();
  check_rerank_model(info, a.model.model);
  auto tokenizer = load_model_tokenizer(*model);
  if (!tokenizer) throw_error(ErrorCode::kInvalidArgument, "'", a.model.model, "' has no tokenizer");
  auto out = encode(*model, rerank_inputs(*tokenizer, info, a.query, a.documents), {.hidden = false});
  const std::vector<float> scores = rerank_scores(info, out);
  std::fprintf(stderr, "scores: %s\n",
               is_cross_encoder(info) ? "sigmoid of the cross-encoder's logit for each (query, document) pair"
                                      : "cosine of the query's and each document's sentence embeddings");
  for (size_t i : rerank_order(scores, a.top_n)) std::printf("%.6f  [%zu] %s\n", scores[i], i, a.documents[i].c_str());
  return 0;
}

}  // namespace

Runner add_rerank(CLI::App& app) {
  auto a = std::make_shared<RerankArgs>();
  CLI::App* cmd = app.add_subcommand("rerank", "rank documents by their relevance to a query (a cross-encoder, or an "
                                               "embedding model's cosine)");
  add_model_options(cmd, a->model);
  cmd->add_option("-q,--query", a->query, "the query")->required();
  cmd->add_option("-d,--document", a->documents, "a document (repeat for each)")->required();
  cmd->add_option("--top-n", a->top_n, "print the best n only (default: all)")->check(CLI::NonNegativeNumber);
  return [a] { return run_rerank(*a); };
}

static Runner add_encoder_command(CLI::App& app, const char* name, const char* help, bool embed) {
  auto a = std::make_shared<EncodeArgs>();
  CLI::App* cmd = app.add_subcommand(name, help);
  add_model_options(cmd, a->model);
  cmd->add_option("-t,--text", a->texts, "input text (repeat for a batch)");
  cmd->add_option("--ids", a->ids, "input as token ids \"101,2023,102\" (repeatable)");
  if (embed) {
    cmd->add_option("--pooling", a->pooling,
                    "model (the checkpoint's: modules.json's Pooling, a GGUF's pooling_type, else mean; a "
                    "decoder's last token), mean, cls (the [CLS] row) or pooler (BertModel's tanh pooler over [CLS])")
        ->check(CLI::IsMember({"model", "mean", "cls", "pooler"}))
        ->capture_default_str();
    cmd->add_flag("--no-normalize", a->no_normalize, "do not L2-normalize the embeddings");
  }
  return [a, embed] { return embed ? run_embed(*a) : run_classify(*a); };
}

Runner add_embed(CLI::App& app) {
  return add_encoder_command(app, "embed", "sentence embeddings from an encoder (BERT family) or a decoder (its last "
                             "token: Qwen3-Embedding and other decoder embedding models)", true);
}

Runner add_classify(CLI::App& app) {
  return add_encoder_command(app, "classify",
                             "sequence classification (BertForSequenceClassification)", false);
}

Runner add_tokenize(CLI::App& app) {
  auto model = std::make_shared<ModelArgs>();
  auto text = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand("tokenize", "show the token ids and pieces of a text");
  add_model_options(cmd, *model);
  cmd->add_option("-t,--text", *text, "text to tokenize")->required();
  return [model, text] {
    auto m = load_model(*model);
    auto tokenizer = load_model_tokenizer(*m);
    if (!tokenizer) throw_error(ErrorCode::kNotFound, "'", model->model, "' has no tokenizer");
    for (int32_t id : tokenizer->encode(*text))
      std::printf("%6d  %s\n", id, tokenizer->id_to_token(id).c_str());
    return 0;
  };
}

}  // namespace kiln::cli
