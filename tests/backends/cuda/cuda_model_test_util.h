// Helpers of the CUDA model tests (fp8_models_test.cpp, w8a8_models_test.cpp): a
// decoder's logits over a prefill and single-token decode steps, and the relative RMS
// difference of two logit vectors.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

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

}  // namespace kiln::cuda::testing
