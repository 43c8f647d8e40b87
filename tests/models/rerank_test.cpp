// Reranking (rerank_inputs / rerank_scores, what `kiln rerank` and /v1/rerank run): a
// cross-encoder's score is the sigmoid of transformers' logit for the pair, pairs are
// encoded as one sequence with longest-first truncation, and an embedding model ranks by
// cosine - with the real all-MiniLM-L6-v2 on sentence-transformers' own example.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "../frontends/test_util.h"
#include "golden_util.h"
#include "runtime/encoder_runner.h"
#include "runtime/model_tokenizer.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using test::TempDir;
using testing::Reference;

std::string minilm_dir() { return testing::models_dir() + "/all-minilm-l6-v2"; }

// The tiny classifier fixture with one label (its first): on transformers' reference
// inputs - pairs, token types 0 then 1 - each score is sigmoid of the reference's first logit.
TEST(Rerank, CrossEncoderScoreIsTheSigmoidOfTransformersLogit) {
  TempDir dir;
  auto model = Model::load(testing::write_cross_encoder(testing::fixture_dir("bert"), dir.file("ce")));
  ASSERT_TRUE(is_cross_encoder(model->info()));
  const Reference ref("bert");
  const auto shape = ref.shape("input_ids");
  const auto inputs = encoder_inputs_from_padded(ref.ids("input_ids"), ref.ids("token_type_ids"),
                                                 ref.ids("attention_mask"), shape[0], shape[1]);
  const std::vector<float> scores = rerank_scores(model->info(), encode(*model, inputs, {.hidden = false}));
  const auto logits = ref.f32("logits");
  ASSERT_EQ(scores.size(), inputs.size());
  for (size_t i = 0; i < scores.size(); ++i) {
    const double want = 1 / (1 + std::exp(-double(logits[i * 3])));
    EXPECT_NEAR(scores[i], want, 1e-5 * want) << i;
  }
}

TEST(Rerank, PairsAreOneSequenceTruncatedLongestFirst) {
  if (!fs::exists(minilm_dir() + "/config.json"))
    GTEST_SKIP() << "real model not found at " << minilm_dir() << " (run .ci/fetch_models.sh)";
  TempDir dir;
  auto model = Model::load(testing::write_cross_encoder(minilm_dir(), dir.file("ce")));
  auto tokenizer = load_model_tokenizer(*model);
  ASSERT_TRUE(tokenizer);
  ModelInfo info = model->info();
  ASSERT_TRUE(is_cross_encoder(info));
  const std::string query = "how do plants make food", doc = "Plants use photosynthesis to turn light into sugar.";
  const tok::Encoding q = tokenizer->encode_full(query, {}), d = tokenizer->encode_full(doc, {});
  auto in = rerank_inputs(*tokenizer, info, query, {doc, "short"});
  ASSERT_EQ(in.size(), 2u);
  // [CLS] query [SEP] document [SEP]: the single encodings joined, the document's [CLS] dropped.
  std::vector<int32_t> want(q.ids);
  want.insert(want.end(), d.ids.begin() + 1, d.ids.end());
  EXPECT_EQ(in[0].tokens, want);
  std::vector<int32_t> types(q.ids.size(), 0);
  types.resize(want.size(), 1);
  EXPECT_EQ(in[0].token_types, types);
  // Longest first: the longer document loses tokens until the pair fits (here before the
  // query would: 5 query and 11 document tokens into 3 specials + 11).
  info.max_positions = int64_t(q.ids.size()) + 7;
  in = rerank_inputs(*tokenizer, info, query, {doc});
  EXPECT_EQ(in[0].tokens.size(), size_t(info.max_positions));
  EXPECT_EQ(std::vector<int32_t>(in[0].tokens.begin(), in[0].tokens.begin() + long(q.ids.size())), q.ids);
  // One encode of the pairs and each pair alone give the same scores (to rounding: the f32
  // GEMM tiles of one row and of several sum in different orders).
  in = rerank_inputs(*tokenizer, model->info(), query, {doc, "short", "The stock market fell."});
  const auto all = rerank_scores(model->info(), encode(*model, in, {.hidden = false}));
  for (size_t i = 0; i < in.size(); ++i)
    EXPECT_NEAR(rerank_scores(model->info(), encode(*model, {in[i]}, {.hidden = false})).at(0), all[i], 1e-5) << i;
}

// sentence-transformers' semantic-search example: the embedding model ranks the bread
// sentence first and the unrelated ones last, each score the cosine of the embeddings.
TEST(Rerank, EmbeddingModelRanksByCosine) {
  if (!fs::exists(minilm_dir() + "/config.json"))
    GTEST_SKIP() << "real model not found at " << minilm_dir() << " (run .ci/fetch_models.sh)";
  auto model = Model::load(minilm_dir());
  auto tokenizer = load_model_tokenizer(*model);
  ASSERT_TRUE(tokenizer);
  ASSERT_FALSE(is_cross_encoder(model->info()));
  const std::string query = "A man is eating food.";
  const std::vector<std::string> docs = {"A man is eating a piece of bread.", "A monkey is playing drums.",
                                         "The girl is carrying a baby.", "A man is riding a horse."};
  const auto in = rerank_inputs(*tokenizer, model->info(), query, docs);
  ASSERT_EQ(in.size(), docs.size() + 1) << "the query, then each document";
  const auto out = encode(*model, in, {.hidden = false});
  const auto scores = rerank_scores(model->info(), out);
  ASSERT_EQ(scores.size(), docs.size());
  for (size_t i = 0; i < docs.size(); ++i) {
    const auto& a = out[0].embedding;
    const auto& b = out[i + 1].embedding;
    double ab = 0, aa = 0, bb = 0;
    for (size_t k = 0; k < a.size(); ++k) {
      ab += double(a[k]) * b[k];
      aa += double(a[k]) * a[k];
      bb += double(b[k]) * b[k];
    }
    EXPECT_NEAR(scores[i], ab / std::sqrt(aa * bb), 1e-6) << docs[i];
  }
  EXPECT_GT(scores[0], 0.7) << "the bread sentence";
  EXPECT_GT(scores[0], scores[3]);
  EXPECT_GT(scores[3], std::max(scores[1], scores[2]));
}

}  // namespace
}  // namespace kiln
