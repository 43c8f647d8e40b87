// Helpers of the CUDA model tests (fp8_models_test.cpp, w8a8_models_test.cpp): a
// decoder's logits over a prefill and single-token decode steps, and the relative RMS
// difference of two logit vectors.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "../../models/golden_util.h"
#include "cuda_test_util.h"
#include "runtime/llm_runner.h"

namespace kiln::cuda::testing {

// Prefill logits of every token, then `decode` more tokens fed one per step.
inline std::vector<float> logits_of(Model& m, const std::vector<int32_t>& prompt,
                                    const std::vector<int32_t>& decode) {
  LlmRunner runner(m, {.max_total_tokens = int64_t(prompt.size() + decode.size()) + 16});
  const int32_t id = runner.add_sequence(prompt);
  std::vector<float> out;
  while (runner.has_pending())
    for (auto& o : runner.step(true)) out.insert(out.end(), o.logits.begin(), o.logits.end());
  for (int32_t tok : decode) {
    runner.append_tokens(id, {tok});
    for (auto& o : runner.step(false)) out.insert(out.end(), o.logits.begin(), o.logits.end());
  }
  return out;
}

// sqrt(sum (got - ref)^2 / sum ref^2); the sizes must agree.
inline double rel_rms(const std::vector<float>& got, const std::vector<float>& ref) {
  EXPECT_EQ(got.size(), ref.size());
  double e = 0, r = 0;
  for (size_t i = 0; i < std::min(got.size(), ref.size()); ++i)
    e += double(got[i] - ref[i]) * (got[i] - ref[i]), r += double(ref[i]) * ref[i];
  return std::sqrt(e / r);
}

// A golden prompt decoded token by token through the paged cache (block size 4: many block
// boundaries), fed the reference's greedy tokens, against transformers' per-step logits:
// the worst step's max|error| / max|ref|.
inline double golden_decode_worst_rel(Model& m, const kiln::testing::Reference& ref, size_t prompt) {
  const auto greedy = ref.ids("greedy");
  const auto step_ref = ref.f32("greedy_logits_" + std::to_string(prompt));
  const int64_t n = ref.shape("greedy")[1], vocab = m.info().vocab_size;
  LlmRunner runner(m, {.block_size = 4});
  const int32_t seq = runner.add_sequence(ref.prompts().at(prompt));
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    auto out = runner.step();
    EXPECT_EQ(out.size(), 1u);
    if (out.size() != 1) return INFINITY;
    const Diff d = diff(Tensor::view(out[0].logits.data(), DType::kF32, {vocab}),
                        Tensor::view(const_cast<float*>(step_ref.data()) + i * vocab, DType::kF32, {vocab}));
    worst = std::max(worst, d.rel());  // a NaN logit makes it infinite
    runner.append_tokens(seq, {greedy[size_t(int64_t(prompt) * n + i)]});
  }
  return worst;
}

}  // namespace kiln::cuda::testing
