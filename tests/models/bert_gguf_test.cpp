// BERT-family GGUFs (llama.cpp's `bert` architecture: embedding models such as
// all-MiniLM-L6-v2 or bge) and the sentence embedding's pooling, from a GGUF's
// pooling_type or a sentence-transformers directory's modules.json, against transformers'
// outputs: the tiny BertForSequenceClassification fixture and the real all-MiniLM-L6-v2
// (skipped when absent) written as llama.cpp's converter writes them (bert_gguf).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "gguf_quant_llama.h"
#include "golden_util.h"
#include "runtime/encoder_runner.h"
#include "runtime/model_tokenizer.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using test::expect_error;
using test::TempDir;
using test::write_file;
using testing::Reference;

struct RefBatch {
  std::vector<EncoderInput> inputs;
  int64_t smax = 0;
};

RefBatch reference_batch(const Reference& ref) {
  const auto shape = ref.shape("input_ids");
  return {encoder_inputs_from_padded(ref.ids("input_ids"), ref.ids("token_type_ids"), ref.ids("attention_mask"),
                                     shape[0], shape[1]),
          shape[1]};
}

double cosine(const float* a, const float* b, size_t n) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < n; ++i) {
    ab += double(a[i]) * b[i];
    aa += double(a[i]) * a[i];
    bb += double(b[i]) * b[i];
  }
  return ab / std::sqrt(aa * bb);
}

// The encoder's hidden states and mean-pooled rows against the reference: within `tol`
// (relative to each vector's largest magnitude) when tol > 0, else by cosine >= min_cos.
void check_against_reference(Model& model, const Reference& ref, const std::string& what, double tol,
                             double min_cos = 0) {
  const RefBatch b = reference_batch(ref);
  const auto out = encode(model, b.inputs);
  const auto hidden = ref.f32("last_hidden"), mean = ref.f32("mean_pooled");
  const size_t h = size_t(model.info().hidden_size);
  for (size_t i = 0; i < b.inputs.size(); ++i) {
    const std::string tag = what + " seq " + std::to_string(i);
    const float* want_hidden = hidden.data() + i * size_t(b.smax) * h;
    const size_t rows = b.inputs[i].tokens.size();
    if (tol > 0) {
      KILN_EXPECT_CLOSE(out[i].hidden.data(), want_hidden, rows * h, tol, tag + " hidden");
      KILN_EXPECT_CLOSE(out[i].mean_pooled.data(), mean.data() + i * h, h, tol, tag + " mean pooled");
    } else {
      const double pooled = cosine(out[i].mean_pooled.data(), mean.data() + i * h, h);
      double worst = 1;
      for (size_t r = 0; r < rows; ++r)
        worst = std::min(worst, cosine(out[i].hidden.data() + r * h, want_hidden + r * h, h));
      std::printf("  %-40s 1 - cosine: mean pooled %.3g, worst row %.3g\n", tag.c_str(), 1 - pooled, 1 - worst);
      EXPECT_GE(pooled, min_cos) << tag << " mean pooled";
      EXPECT_GE(worst, min_cos) << tag << " hidden rows";
    }
    // The sentence embedding is the model's pooling of these rows, the [CLS] row its first.
    EXPECT_EQ(out[i].embedding, model.info().pooling == "cls" ? out[i].cls_hidden : out[i].mean_pooled) << tag;
    EXPECT_EQ(out[i].cls_hidden, std::vector<float>(out[i].hidden.begin(), out[i].hidden.begin() + long(h))) << tag;
  }
}

// The Linears of the model's graph, and how many of them keep `quant` codes.
std::pair<size_t, size_t> linears_keeping(const Model& model, const std::string& quant) {
  size_t n = 0, kept = 0;
  for (const ir::Node& node : model.graph().nodes())
    if (node.op == "Linear") {
      ++n;
      kept += node.attr_str("weight_quant", "") == quant;
    }
  return {n, kept};
}

std::string minilm_dir() { return testing::models_dir() + "/all-minilm-l6-v2"; }

TEST(BertGguf, TinyF32FileComputesTransformersHiddenStates) {
  TempDir dir;
  const std::string path = dir.file("bert.gguf");
  write_file(path, test::bert_gguf(testing::fixture_dir("bert"), GgmlType::kF32, /*pooling_type=*/-1));
  auto model = Model::load(path);
  EXPECT_EQ(model->info().family, "bert");
  EXPECT_FALSE(model->info().is_decoder);
  EXPECT_EQ(model->info().num_labels, 0) << "llama.cpp's converter drops the pooler and classifier";
  EXPECT_EQ(model->info().pooling, "mean") << "no pooling_type: mean";
  check_against_reference(*model, Reference("bert"), "tiny bert GGUF", 1e-4);
}

TEST(BertGguf, PoolingTypeChoosesTheSentenceEmbedding) {
  TempDir dir;
  for (const auto& [type, pooling] : {std::pair{1, "mean"}, std::pair{2, "cls"}}) {
    const std::string path = dir.file("bert" + std::to_string(type) + ".gguf");
    write_file(path, test::bert_gguf(testing::fixture_dir("bert"), GgmlType::kF32, type));
    auto model = Model::load(path);
    EXPECT_EQ(model->info().pooling, pooling);
    check_against_reference(*model, Reference("bert"), std::string("pooling ") + pooling, 1e-4);
  }
  for (const auto& [type, needle] : {std::pair{3, "last token"}, std::pair{4, "reranker"}, std::pair{7, "pooling_type 7"}}) {
    const std::string path = dir.file("bad" + std::to_string(type) + ".gguf");
    write_file(path, test::bert_gguf(testing::fixture_dir("bert"), GgmlType::kF32, type));
    expect_error([&] { Model::load(path); }, ErrorCode::kUnsupported, {path, "bert.pooling_type", needle});
  }
}

// The real all-MiniLM-L6-v2 as F32, F16 and Q8_0 GGUFs: the GGUF's own tokenizer gives
// transformers' ids, and the encoder its outputs - to 1e-4 from the F32 file, by cosine
// from the rounded ones, whose Q8_0 Linears run on their own codes.
TEST(BertGguf, RealMiniLmInEachTypeMatchesTransformers) {
  if (!fs::exists(minilm_dir() + "/config.json"))
    GTEST_SKIP() << "real model not found at " << minilm_dir() << " (run .ci/fetch_models.sh)";
  const Reference ref("minilm");
  const nlohmann::json meta = nlohmann::json::parse(read_text_file(testing::fixture_dir("minilm") + "/reference.json"));
  const RefBatch want = reference_batch(ref);
  TempDir dir;
  for (const auto& [type, name, min_cos] : {std::tuple{GgmlType::kF32, "F32", 0.0}, std::tuple{GgmlType::kF16, "F16", 0.99999},
                                            std::tuple{GgmlType::kQ8_0, "Q8_0", 0.999}}) {
    const std::string path = dir.file(std::string("minilm-") + name + ".gguf");
    write_file(path, test::bert_gguf(minilm_dir(), type, /*pooling_type=*/1));
    ModelOptions o;
    o.weight_dtype = "auto";  // what the run commands default to: Q8_0 keeps its codes, F16 its halves
    auto model = Model::load(path, o);
    EXPECT_EQ(model->info().pooling, "mean") << name;
    auto tokenizer = load_model_tokenizer(*model);
    ASSERT_TRUE(tokenizer) << name;
    const auto sentences = meta.at("sentences").get<std::vector<std::string>>();
    ASSERT_EQ(sentences.size(), want.inputs.size());
    for (size_t i = 0; i < sentences.size(); ++i)
      EXPECT_EQ(tokenizer->encode_full(sentences[i], {}).ids, want.inputs[i].tokens) << name << ": " << sentences[i];
    // An F16 file runs on its F16 Linears under auto, though llama.cpp's converter keeps the
    // position and token-type tables F32.
    if (type == GgmlType::kF16) EXPECT_EQ(model->compile_options().weight_dtype, "f16");
    if (type == GgmlType::kQ8_0) {
      const auto [linears, kept] = linears_keeping(*model, "q8");
      EXPECT_GE(linears, 24u) << "6 layers: Q|K|V merged, output, up, down";
      EXPECT_EQ(kept, linears) << "every Linear keeps the file's Q8_0 codes";
    }
    check_against_reference(*model, ref, std::string("MiniLM ") + name, type == GgmlType::kF32 ? 1e-4 : 0, min_cos);
  }
}

// A sentence-transformers directory: modules.json's Pooling module chooses the pooling,
// engines keep it, and what kiln cannot apply is an error naming the file.
class SentenceTransformersDir : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* f : {"config.json", "model.safetensors"})
      fs::copy_file(testing::fixture_dir("bert") + "/" + f, dir.file(f));
    fs::create_directories(dir.file("1_Pooling"));
  }
  void modules(const std::string& extra = "") {
    write_file(dir.file("modules.json"),
               R"([{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                   {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"})" +
                   extra + R"(,
                   {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}])");
  }
  void pooling(const std::string& json) { write_file(dir.file("1_Pooling/config.json"), json); }
  TempDir dir;
};

TEST_F(SentenceTransformersDir, PoolingModuleChoosesTheSentenceEmbedding) {
  modules();
  for (const auto& [config, want] :
       {std::pair{R"({"pooling_mode_cls_token": true, "pooling_mode_mean_tokens": false})", "cls"},
        std::pair{R"({"pooling_mode_mean_tokens": true, "pooling_mode_max_tokens": false})", "mean"},
        std::pair{R"({"pooling_mode": "cls", "pooling_mode_cls_token": true})", "cls"}}) {
    pooling(config);
    auto model = Model::load(dir.path());
    EXPECT_EQ(model->info().pooling, want) << config;
    check_against_reference(*model, Reference("bert"), config, 1e-4);
  }
}

TEST_F(SentenceTransformersDir, WhatKilnCannotApplyIsAnError) {
  modules();
  pooling(R"({"pooling_mode_max_tokens": true})");
  expect_error([&] { Model::load(dir.path()); }, ErrorCode::kUnsupported, {"1_Pooling/config.json", "max_tokens"});
  pooling(R"({"pooling_mode_cls_token": true, "pooling_mode_mean_tokens": true})");
  expect_error([&] { Model::load(dir.path()); }, ErrorCode::kUnsupported, {"2 pooling modes"});
  pooling("{\"pooling_mode_cls_token\": tru");
  expect_error([&] { Model::load(dir.path()); }, ErrorCode::kInvalidFile, {"1_Pooling/config.json", "not valid JSON"});
  pooling(R"({"pooling_mode_cls_token": true})");
  modules(R"(, {"idx": 3, "name": "3", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})");
  expect_error([&] { Model::load(dir.path()); }, ErrorCode::kUnsupported,
               {"modules.json", "sentence_transformers.models.Dense", "2_Dense"});
  write_file(dir.file("modules.json"), R"({"not": "a list"})");
  expect_error([&] { Model::load(dir.path()); }, ErrorCode::kInvalidFile, {"modules.json", "array"});
  fs::remove(dir.file("1_Pooling/config.json"));
  modules();
  expect_error([&] { Model::load(dir.path()); }, ErrorCode::kNotFound, {"1_Pooling/config.json"});
}

}  // namespace
}  // namespace kiln
