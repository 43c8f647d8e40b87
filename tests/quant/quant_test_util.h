// Helpers shared by the quantization tests (one binary: quant_test).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/status.h"

#include "runtime/eval.h"
#include "runtime/llm_runner.h"
#include "runtime/model.h"

namespace kiln::quant_test {

// The logits of every position of `toks`, run as one sequence.
inline std::vector<float> all_logits(Model& m, const std::vector<int32_t>& toks) {
  LlmRunner runner(m, {.max_total_tokens = int64_t(toks.size()) + 16});
  runner.add_sequence(toks);
  std::vector<float> out;
  while (runner.has_pending())
    for (auto& o : runner.step(true)) out.insert(out.end(), o.logits.begin(), o.logits.end());
  return out;
}

inline std::vector<std::vector<int32_t>> random_sequences(int n, int len, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> s(static_cast<size_t>(n));
  for (auto& q : s)
    for (int i = 0; i < len; ++i) q.push_back(int32_t(rng() % uint64_t(vocab)));
  return s;
}

// f() throws a kiln Error of `code` whose message contains `needle`.
inline void expect_error(const std::function<void()>& f, ErrorCode code, const std::string& needle) {
  try {
    f();
    FAIL() << "no error; expected one containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace kiln::quant_test
