// Decoder embeddings (encode() on a decoder): the last token's final hidden state against
// transformers' hidden_states[-1] of the golden fixtures, over ragged steps and chunked
// long inputs; decoder embedding models declared by a sentence-transformers directory
// (lasttoken pooling) or a GGUF's pooling_type; what a decoder cannot pool is an error.
#include <gtest/gtest.h>

#include "gguf_quant_llama.h"
#include "golden_util.h"
#include "runtime/encoder_runner.h"

namespace kiln {
namespace {

using test::expect_error;
using test::TempDir;
using test::write_file;
using testing::Reference;

std::vector<EncoderInput> inputs_of(const std::vector<std::vector<int32_t>>& prompts) {
  std::vector<EncoderInput> batch;
  for (auto& p : prompts) batch.push_back({p, {}});
  return batch;
}

// Each prompt's outputs against the fixture's hidden_last ([B, Smax, H], after the final
// norm): every row, their mean, the first row and the last row (the embedding).
void expect_transformers_rows(const std::string& family, const std::vector<EncoderOutput>& out, double tol) {
  Reference ref(family);
  const auto prompts = ref.prompts();
  const auto hidden = ref.f32("hidden_last");
  const int64_t smax = ref.shape("hidden_last")[1], h = ref.shape("hidden_last")[2];
  ASSERT_EQ(out.size(), prompts.size());
  for (size_t b = 0; b < prompts.size(); ++b) {
    const int64_t n = int64_t(prompts[b].size());
    const float* rows = hidden.data() + int64_t(b) * smax * h;
    const std::string what = family + " prompt " + std::to_string(b);
    ASSERT_EQ(out[b].hidden.size(), size_t(n * h)) << what;
    KILN_EXPECT_CLOSE(out[b].hidden.data(), rows, size_t(n * h), tol, what + " hidden");
    ASSERT_EQ(out[b].embedding.size(), size_t(h)) << what;
    KILN_EXPECT_CLOSE(out[b].embedding.data(), rows + (n - 1) * h, size_t(h), tol, what + " last-token embedding");
    KILN_EXPECT_CLOSE(out[b].cls_hidden.data(), rows, size_t(h), tol, what + " first row");
    std::vector<float> mean(size_t(h), 0.0f);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < h; ++j) mean[size_t(j)] += rows[t * h + j] / float(n);
    KILN_EXPECT_CLOSE(out[b].mean_pooled.data(), mean.data(), size_t(h), tol, what + " mean");
  }
}

class DecoderEmbed : public ::testing::TestWithParam<std::string> {};

TEST_P(DecoderEmbed, LastTokenRowIsTransformersFinalHiddenState) {
  auto model = Model::load(testing::fixture_dir(GetParam()));
  EXPECT_EQ(model->info().pooling, "") << "a plain decoder declares no sentence-embedding pooling";
  const auto batch = inputs_of(Reference(GetParam()).prompts());
  expect_transformers_rows(GetParam(), encode(*model, batch), 1e-4);
  // Steps of 7 token rows: the 5-token prompt alone, the 11- and 16-token ones in chunks
  // whose caches carry over; the same rows as one ragged step.
  EncodeOptions small;
  small.decoder_step_tokens = 7;
  expect_transformers_rows(GetParam(), encode(*model, batch, small), 1e-4);
  // Without the per-token rows: the same embeddings.
  const auto lean = encode(*model, batch, {.hidden = false});
  const auto full = encode(*model, batch);
  for (size_t b = 0; b < batch.size(); ++b) {
    EXPECT_TRUE(lean[b].hidden.empty());
    EXPECT_EQ(lean[b].embedding, full[b].embedding) << GetParam() << " prompt " << b;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, DecoderEmbed, ::testing::Values("gpt2", "llama", "qwen2", "qwen3", "phi3", "gemma3", "mistral", "gemma2"));

// A sentence-transformers directory of a decoder with lasttoken pooling (as
// Qwen3-Embedding ships) is an embedding model: pooling "last".
TEST(DecoderEmbedModel, LastTokenPoolingModuleMakesAnEmbeddingModel) {
  TempDir dir;
  testing::write_decoder_embedding_dir("llama", dir.path());
  auto model = Model::load(dir.path());
  EXPECT_EQ(model->info().pooling, "last");
  expect_transformers_rows("llama", encode(*model, inputs_of(Reference("llama").prompts())), 1e-4);
  check_rerank_model(model->info(), "llama-embed");  // an embedding model reranks by cosine
  // Mean pooling is not what kiln's decoder embedding models do: an error, not other vectors.
  write_file(dir.file("1_Pooling/config.json"), R"({"pooling_mode_mean_tokens": true})");
  expect_error([&] { Model::load(dir.path()); }, ErrorCode::kUnsupported, {"pooling 'mean'", "last token"});
}

// A GGUF's <arch>.pooling_type 3 (llama.cpp's LLAMA_POOLING_TYPE_LAST) is the same; 4 (a
// reranker) is refused.
TEST(DecoderEmbedModel, GgufPoolingTypeLast) {
  TempDir dir;
  const std::string path = dir.file("llama.gguf");
  write_file(path, test::quant_llama(GgmlType::kQ8_0, GgmlType::kQ8_0, GgmlType::kF32, /*pooling_type=*/3));
  auto model = Model::load(path);
  EXPECT_EQ(model->info().pooling, "last");
  const auto out = encode(*model, {{{1, 5, 9, 3}, {}}, {{2, 7}, {}}});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].embedding.size(), size_t(model->info().hidden_size));
  write_file(path, test::quant_llama(GgmlType::kQ8_0, GgmlType::kQ8_0, GgmlType::kF32, /*pooling_type=*/4));
  expect_error([&] { Model::load(path); }, ErrorCode::kUnsupported, {"pooling_type 4", "reranker"});
}

TEST(DecoderEmbedModel, BadInputsAreErrors) {
  auto model = Model::load(testing::fixture_dir("llama"));
  expect_error([&] { encode(*model, {{{}, {}}}); }, ErrorCode::kInvalidArgument, {"input 0", "empty"});
  expect_error([&] { encode(*model, {{{1, 2}, {}}, {{1, 100000}, {}}}); }, ErrorCode::kOutOfRange, {"input 1", "vocabulary"});
  expect_error([&] { encode(*model, {{std::vector<int32_t>(200, 5), {}}}); }, ErrorCode::kOutOfRange,
               {"input 0", "200 tokens"});
  EXPECT_TRUE(encode(*model, {}).empty());
}

}  // namespace
}  // namespace kiln
