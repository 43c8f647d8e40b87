// Perplexity evaluation against HuggingFace logits: the perplexity kiln reports for a
// prompt equals exp(mean NLL) computed from transformers' logits for the same tokens;
// strided windows cover every token once (also fed one token per step, --decode); KL of a
// model against itself is zero.
#include <gtest/gtest.h>

#include <cmath>

#include "golden_util.h"
#include "runtime/eval.h"

namespace kiln {
namespace {

TEST(Eval, PerplexityMatchesTransformersLogits) {
  auto model = Model::load(testing::fixture_dir("llama"));
  testing::Reference ref("llama");
  auto ids = ref.ids("input_ids");
  auto lengths = ref.ids("lengths");
  auto logits = ref.f32("logits");
  const int64_t smax = ref.shape("input_ids")[1], v = model->info().vocab_size;
  const int b = 2;  // the longest prompt
  std::vector<int32_t> tokens(ids.begin() + b * smax, ids.begin() + b * smax + lengths[b]);
  double nll = 0;
  for (size_t t = 1; t < tokens.size(); ++t) {
    const float* row = logits.data() + (b * smax + int64_t(t) - 1) * v;
    double mx = *std::max_element(row, row + v), sum = 0;
    for (int64_t i = 0; i < v; ++i) sum += std::exp(double(row[i]) - mx);
    nll -= double(row[tokens[t]]) - mx - std::log(sum);
  }
  double want = std::exp(nll / double(tokens.size() - 1));
  PerplexityResult r = evaluate_perplexity(*model, tokens, {.context = 16, .stride = 16});
  EXPECT_EQ(r.scored, int64_t(tokens.size()) - 1);
  EXPECT_NEAR(r.perplexity(), want, 1e-4 * want);
  // --decode: the same windows fed one token per step score the same tokens alike.
  PerplexityResult d = evaluate_perplexity(*model, tokens, {.context = 16, .stride = 16, .decode = true});
  EXPECT_EQ(d.scored, r.scored);
  EXPECT_NEAR(d.perplexity(), want, 1e-4 * want);
}

TEST(Eval, StridedWindowsScoreEveryTokenOnceAndSelfKlIsZero) {
  auto model = Model::load(testing::fixture_dir("gpt2"));
  std::vector<int32_t> tokens;
  for (int i = 0; i < 100; ++i) tokens.push_back((i * 37 + 5) % 500);
  PerplexityResult r = evaluate_perplexity(*model, tokens, {.context = 32, .stride = 8}, model.get());
  EXPECT_EQ(r.scored, 99);
  EXPECT_NEAR(r.mean_kl(), 0.0, 1e-9);
  EXPECT_NEAR(r.perplexity(), r.ref_perplexity(), 1e-9);
  EXPECT_EQ(r.top1_agree, r.scored);
  EXPECT_THROW(evaluate_perplexity(*model, {1}, {}), Error);
  EXPECT_THROW(evaluate_perplexity(*model, tokens, {.context = 32, .stride = 64}), Error);
}

}  // namespace
}  // namespace kiln
