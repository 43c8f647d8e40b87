// Sampler: exact checks (greedy, penalties, logprobs, seeds) and statistical ones: the
// empirical token frequencies of 20k draws must match the filtered distribution by a
// chi-square test at p = 0.001 (a wrong filter or temperature fails it by far).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <random>

#include "runtime/sampling.h"

namespace kiln {
namespace {

std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(float(std::log(p)));
  return l;
}

std::vector<int64_t> draw(const SamplingParams& p, const std::vector<float>& logits, int n,
                          uint64_t seed = 7) {
  std::vector<int64_t> counts(logits.size(), 0);
  for (int i = 0; i < n; ++i) {
    Sampler s(p, seed + uint64_t(i) * 1000003u);
    auto l = logits;
    ++counts[size_t(s.sample(l).token)];
  }
  return counts;
}

// Pearson chi-square of counts against expected probabilities (zeros must be exact).
void expect_distribution(const std::vector<int64_t>& counts, const std::vector<double>& expected) {
  int64_t n = 0;
  for (auto c : counts) n += c;
  double chi2 = 0;
  int df = -1;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (expected[i] == 0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " should be filtered out";
      continue;
    }
    double e = expected[i] * double(n);
    chi2 += (double(counts[i]) - e) * (double(counts[i]) - e) / e;
    ++df;
  }
  // chi-square 0.999 quantiles for df = 1..4.
  const double crit[] = {0, 10.83, 13.82, 16.27, 18.47};
  ASSERT_LE(df, 4);
  if (df < 1) return;  // one possible token: the zero checks above are the test
  EXPECT_LT(chi2, crit[df]) << "frequencies do not match the expected distribution";
}

const std::vector<double> kProbs = {0.5, 0.3, 0.15, 0.05};

TEST(Sampling, TemperatureOneFollowsTheModel) {
  SamplingParams p;
  expect_distribution(draw(p, logits_of(kProbs), 20000), kProbs);
}

TEST(Sampling, TemperatureSharpens) {
  SamplingParams p;
  p.temperature = 0.5f;  // p^(1/T) = p^2, renormalized
  std::vector<double> e;
  double z = 0;
  for (double q : kProbs) z += q * q;
  for (double q : kProbs) e.push_back(q * q / z);
  expect_distribution(draw(p, logits_of(kProbs), 20000), e);
}

TEST(Sampling, TopKKeepsTheKMostLikely) {
  SamplingParams p;
  p.top_k = 2;
  expect_distribution(draw(p, logits_of(kProbs), 20000), {0.625, 0.375, 0, 0});
}

TEST(Sampling, TopPKeepsTheSmallestPrefixReachingP) {
  SamplingParams p;
  p.top_p = 0.85f;  // 0.5 + 0.3 < 0.85 <= 0.5 + 0.3 + 0.15
  expect_distribution(draw(p, logits_of(kProbs), 20000), {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0});
  p.top_p = 0.4f;
  expect_distribution(draw(p, logits_of(kProbs), 2000), {1, 0, 0, 0});
}

TEST(Sampling, MinPDropsTokensBelowAFractionOfTheBest) {
  SamplingParams p;
  p.min_p = 0.35f;  // threshold 0.175: drops 0.15 and 0.05
  expect_distribution(draw(p, logits_of(kProbs), 20000), {0.625, 0.375, 0, 0});
}

TEST(Sampling, GreedyPicksTheArgmaxRegardlessOfSeed) {
  SamplingParams p;
  p.temperature = 0;
  auto counts = draw(p, logits_of(kProbs), 200);
  EXPECT_EQ(counts[0], 200);
}

TEST(Sampling, BlockedArgmaxEqualsAPlainScanIncludingTies) {
  std::mt19937 rng(3);
  for (int n : {1, 7, 8, 9, 63, 1000, 4099}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<float> x(static_cast<size_t>(n));
      for (auto& v : x) v = float(rng() % 17);  // many ties
      int32_t plain = 0;
      for (int i = 1; i < n; ++i)
        if (x[size_t(i)] > x[size_t(plain)]) plain = i;
      EXPECT_EQ(greedy_argmax(x.data(), n), plain) << "n " << n;
    }
  }
  std::vector<float> neg(5, -std::numeric_limits<float>::infinity());
  EXPECT_EQ(greedy_argmax(neg.data(), 5), 0);
}

TEST(Sampling, SameSeedSameTokensDifferentSeedDifferent) {
  SamplingParams p;
  auto run = [&](uint64_t seed) {
    Sampler s(p, seed);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) {
      auto l = logits_of(kProbs);
      out.push_back(s.sample(l).token);
    }
    return out;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
}

TEST(Sampling, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 1.2f;
  Sampler s(p, 1);
  std::vector<int32_t> prompt = {0};
  s.add_context(prompt);
  std::vector<float> l = {2.0f, 1.9f, -1.0f};  // 2.0 / 1.2 = 1.67 < 1.9
  EXPECT_EQ(s.sample(l).token, 1);
  EXPECT_NEAR(l[0], 2.0f / 1.2f, 1e-6);
  std::vector<float> l2 = {-1.0f, -1.1f, -5.0f};  // token 1 now seen: -1.1 * 1.2 = -1.32
  s.add_context(std::vector<int32_t>{0});
  EXPECT_EQ(s.sample(l2).token, 0);  // both seen now: -1.0 * 1.2 = -1.2 beats -1.32
  EXPECT_NEAR(l2[1], -1.1f * 1.2f, 1e-6);
}

TEST(Sampling, FrequencyAndPresencePenaltiesCountOutputTokens) {
  SamplingParams p;
  p.temperature = 0;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  Sampler s(p, 1);
  std::vector<float> l = {3.0f, 2.0f};
  EXPECT_EQ(s.sample(l).token, 0);  // no history yet
  l = {3.0f, 2.0f};
  EXPECT_EQ(s.sample(l).token, 0);  // 3 - 0.75 = 2.25 > 2
  EXPECT_FLOAT_EQ(l[0], 2.25f);
  l = {3.0f, 2.0f};
  EXPECT_EQ(s.sample(l).token, 1);  // 3 - 1.0 - 0.25 = 1.75 < 2
  EXPECT_FLOAT_EQ(l[0], 1.75f);
}

TEST(Sampling, LogprobsComeFromTheRawDistributionWithTopN) {
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = 2;
  p.repetition_penalty = 5.0f;  // changes the choice, not the reported logprobs
  Sampler s(p, 1);
  s.add_context(std::vector<int32_t>{0});
  auto l = logits_of(kProbs);
  auto out = s.sample(l);
  EXPECT_EQ(out.token, 1);
  EXPECT_NEAR(out.logprob, std::log(0.3), 1e-5);
  ASSERT_EQ(out.top.size(), 2u);
  EXPECT_EQ(out.top[0].token, 0);
  EXPECT_NEAR(out.top[0].logprob, std::log(0.5), 1e-5);
  EXPECT_EQ(out.top[1].token, 1);
}

TEST(Sampling, ParameterValidationNamesTheBadValue) {
  SamplingParams p;
  EXPECT_EQ(sampling_params_error(p), "");
  p.temperature = -1;
  EXPECT_NE(sampling_params_error(p).find("temperature"), std::string::npos);
  p = {};
  p.top_p = 0;
  EXPECT_NE(sampling_params_error(p).find("top_p"), std::string::npos);
  p = {};
  p.temperature = NAN;
  EXPECT_NE(sampling_params_error(p), "");
  p = {};
  p.logprobs = 100;
  EXPECT_NE(sampling_params_error(p).find("logprobs"), std::string::npos);
  p = {};
  p.presence_penalty = 3;
  EXPECT_NE(sampling_params_error(p).find("presence_penalty"), std::string::npos);
}

}  // namespace
}  // namespace kiln
