// Sampler: exact checks (greedy, penalties, logprobs, seeds) and statistical ones: the
// empirical token frequencies of 20k draws must match the filtered distribution by a
// chi-square test at p = 0.001 (a wrong filter or temperature fails it by far). Drawing
// from a row's top-k candidates (the TopKLogits op's CPU kernel) gives the whole row's
// tokens, logprobs and RNG state, bit for bit, over many seeds.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>

#include "backends/cpu/kernels/kernels.h"
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

// plain_argmax: greedy with nothing beside the argmax; each extra turns it off.
TEST(Sampling, PlainArgmaxIsGreedyWithoutExtras) {
  SamplingParams p;
  p.temperature = 0;
  EXPECT_TRUE(p.plain_argmax());
  p.top_k = 5;  // ignored by greedy
  EXPECT_TRUE(p.plain_argmax());
  auto with = [&](auto set) {
    SamplingParams q = p;
    set(q);
    return q.plain_argmax();
  };
  EXPECT_FALSE(with([](SamplingParams& q) { q.temperature = 0.7f; }));
  EXPECT_FALSE(with([](SamplingParams& q) { q.logprobs = 0; }));
  EXPECT_FALSE(with([](SamplingParams& q) { q.logit_bias = {{3, 1.0f}}; }));
  EXPECT_FALSE(with([](SamplingParams& q) { q.repetition_penalty = 1.1f; }));
  EXPECT_FALSE(with([](SamplingParams& q) { q.presence_penalty = 0.5f; }));
  EXPECT_FALSE(with([](SamplingParams& q) { q.frequency_penalty = 0.5f; }));
}

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
  p = {};
  p.logit_bias = {{3, 150.0f}};
  EXPECT_NE(sampling_params_error(p).find("logit_bias"), std::string::npos);
  p.logit_bias = {{-1, 1.0f}};
  EXPECT_NE(sampling_params_error(p).find("negative"), std::string::npos);
}

// logit_bias adds to the logits before the draw: the distribution becomes softmax(l + b);
// +-100 forces or bans a token; the logprobs stay the raw distribution's; and such a
// sampler never draws from top-k candidates alone.
TEST(Sampling, LogitBiasShiftsTheDistribution) {
  SamplingParams p;
  p.logit_bias = {{3, float(std::log(10.0))}, {0, float(std::log(0.2))}};
  // probs 0.5, 0.3, 0.15, 0.05 -> weights 0.1, 0.3, 0.15, 0.5 (sum 1.05)
  expect_distribution(draw(p, logits_of(kProbs), 20000), {0.1 / 1.05, 0.3 / 1.05, 0.15 / 1.05, 0.5 / 1.05});
  SamplingParams g;
  g.temperature = 0;
  g.logprobs = 0;
  g.logit_bias = {{2, 100.0f}};
  auto l = logits_of(kProbs);
  Sampler forced(g, 1);
  const SampledToken t = forced.sample(l);
  EXPECT_EQ(t.token, 2);
  EXPECT_NEAR(t.logprob, std::log(0.15), 1e-5);  // the model's own probability
  g.logit_bias = {{0, -100.0f}};
  l = logits_of(kProbs);
  EXPECT_EQ(Sampler(g, 1).sample(l).token, 1);
  EXPECT_FALSE(Sampler(g, 1).samples_from_top(4, 4));
}

// The TopKLogits candidates of one row, as the CPU backend computes them.
struct TopRow {
  std::vector<float> values, logprobs;
  std::vector<int32_t> ids;
  int32_t vocab = 0;
  TopRow(const std::vector<float>& row, int32_t k) : values(size_t(k)), logprobs(size_t(k)), ids(size_t(k)) {
    vocab = int32_t(row.size());
    cpu::topk_logits(row.data(), 1, vocab, k, values.data(), ids.data(), logprobs.data());
  }
  TopLogits view() const { return {values, ids, logprobs, vocab}; }
};

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

void expect_same(const SampledToken& full, const SampledToken& top, const std::string& what) {
  ASSERT_EQ(full.token, top.token) << what;
  EXPECT_TRUE(same_bits(full.logprob, top.logprob)) << what << ": " << full.logprob << " vs " << top.logprob;
  ASSERT_EQ(full.top.size(), top.top.size()) << what;
  for (size_t i = 0; i < full.top.size(); ++i) {
    EXPECT_EQ(full.top[i].token, top.top[i].token) << what;
    EXPECT_TRUE(same_bits(full.top[i].logprob, top.top[i].logprob)) << what;
  }
}

// Two samplers with one seed, one fed whole rows and one fed their top-k candidates,
// over several steps each (the RNG streams must stay aligned).
void expect_paths_agree(const SamplingParams& p, int32_t vocab, int32_t k, int seeds, const std::string& what,
                        bool ties = false) {
  std::mt19937_64 rng(vocab * 31 + k);
  std::normal_distribution<float> dist(0.0f, 2.5f);
  for (int seed = 0; seed < seeds; ++seed) {
    Sampler full(p, uint64_t(seed)), top(p, uint64_t(seed));
    ASSERT_TRUE(top.samples_from_top(k, vocab)) << what;
    for (int step = 0; step < 4; ++step) {
      std::vector<float> row(static_cast<size_t>(vocab));
      for (auto& x : row) x = ties ? float(int(rng() % 9)) * 0.5f : dist(rng);
      TopRow t(row, k);
      auto scratch = row;
      expect_same(full.sample(scratch), top.sample(t.view()), what + " seed " + std::to_string(seed));
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(SamplingTop, GreedyAndLogprobsMatchTheWholeRow) {
  SamplingParams p;
  p.temperature = 0;
  expect_paths_agree(p, 1000, 64, 50, "greedy");
  expect_paths_agree(p, 1003, 64, 50, "greedy with ties", true);
  p.logprobs = 5;
  expect_paths_agree(p, 1000, 64, 50, "greedy logprobs=5");
  p.logprobs = 20;
  expect_paths_agree(p, 50, 64, 50, "greedy logprobs=20, vocab < k");
  expect_paths_agree(p, 513, 20, 50, "greedy logprobs=20 = k", true);
}

TEST(SamplingTop, TopKSamplingMatchesTheWholeRowOverManySeeds) {
  struct Case {
    float temperature;
    int32_t top_k;
    float top_p, min_p;
    int32_t logprobs;
  };
  for (Case c : {Case{1.0f, 1, 1.0f, 0.0f, -1}, Case{0.7f, 10, 1.0f, 0.0f, -1}, Case{1.3f, 64, 1.0f, 0.0f, 3},
                 Case{1.0f, 40, 0.9f, 0.0f, 0}, Case{0.8f, 50, 0.95f, 0.05f, 2}, Case{2.0f, 64, 0.5f, 0.2f, 20},
                 Case{1.0f, 7, 1.0f, 0.3f, -1}}) {
    SamplingParams p;
    p.temperature = c.temperature;
    p.top_k = c.top_k;
    p.top_p = c.top_p;
    p.min_p = c.min_p;
    p.logprobs = c.logprobs;
    const std::string what = "T=" + std::to_string(c.temperature) + " top_k=" + std::to_string(c.top_k) +
                             " top_p=" + std::to_string(c.top_p) + " min_p=" + std::to_string(c.min_p);
    expect_paths_agree(p, 2000, 64, 300, what);
    expect_paths_agree(p, 777, 64, 100, what + " ties", true);
    if (c.top_k < 60) expect_paths_agree(p, 60, 64, 100, what + " vocab < k");
  }
}

TEST(SamplingTop, DegenerateRowsMatchToo) {
  // Every value -inf: greedy picks 0 and every log-prob is NaN on both paths.
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = 3;
  for (int32_t vocab : {5, 13, 64, 100}) {
    std::vector<float> row(size_t(vocab), -std::numeric_limits<float>::infinity());
    Sampler full(p, 1), top(p, 1);
    TopRow t(row, 8);
    auto a = full.sample(row);
    auto b = top.sample(t.view());
    EXPECT_EQ(a.token, 0);
    EXPECT_EQ(b.token, 0);
    EXPECT_TRUE(std::isnan(a.logprob) && std::isnan(b.logprob));
    ASSERT_EQ(a.top.size(), b.top.size());
    for (size_t i = 0; i < a.top.size(); ++i) EXPECT_EQ(a.top[i].token, b.top[i].token);
  }
  // -inf entries among finite ones (a masked vocabulary).
  p.temperature = 0.9f;
  p.top_k = 30;
  Sampler full(p, 9), top(p, 9);
  for (int step = 0; step < 50; ++step) {
    std::vector<float> row(300);
    for (size_t i = 0; i < row.size(); ++i)
      row[i] = i % 3 ? -std::numeric_limits<float>::infinity() : float((i * 7919 + size_t(step)) % 101) * 0.05f;
    TopRow t(row, 64);
    auto scratch = row;
    expect_same(full.sample(scratch), top.sample(t.view()), "masked step " + std::to_string(step));
  }
}

TEST(SamplingTop, OnlyExactCasesUseTheCandidates) {
  auto p_of = [](float t, int32_t top_k, float top_p = 1.0f) {
    SamplingParams p;
    p.temperature = t;
    p.top_k = top_k;
    p.top_p = top_p;
    return p;
  };
  auto ok = [](const SamplingParams& p, int32_t k = 64, int32_t vocab = 1000) {
    return Sampler(p, 0).samples_from_top(k, vocab);
  };
  EXPECT_TRUE(ok(p_of(0, 0)));
  EXPECT_TRUE(ok(p_of(0, 0, 0.5f)));  // greedy ignores top-p
  EXPECT_TRUE(ok(p_of(1, 64)));
  EXPECT_TRUE(ok(p_of(1, 64, 0.9f)));  // top-p over the top_k survivors only
  EXPECT_FALSE(ok(p_of(1, 65)));
  EXPECT_FALSE(ok(p_of(1, 0)));         // the whole vocabulary's distribution
  EXPECT_FALSE(ok(p_of(1, -1)));
  EXPECT_FALSE(ok(p_of(1, 0, 0.9f)));   // top-p normalizes over the whole vocabulary
  EXPECT_FALSE(ok(p_of(1, 50), 64, 50));  // top_k >= vocab: no top-k filter at all
  EXPECT_TRUE(ok(p_of(1, 49), 64, 50));
  SamplingParams p = p_of(0, 0);
  p.logprobs = 20;
  EXPECT_TRUE(ok(p, 20));
  EXPECT_FALSE(ok(p, 19));
  for (int which = 0; which < 3; ++which) {
    SamplingParams q = p_of(0, 0);
    if (which == 0) q.repetition_penalty = 1.1f;
    if (which == 1) q.presence_penalty = 0.5f;
    if (which == 2) q.frequency_penalty = -0.5f;
    EXPECT_FALSE(ok(q)) << "penalty " << which;
  }
}

// The leading candidates a step must bring for a sampler, and that sampling from just
// those gives what the whole row gives.
TEST(SamplingTop, CandidatesNeeded) {
  SamplingParams p;
  p.temperature = 0;
  EXPECT_EQ(Sampler(p, 0).top_candidates_needed(), 1);
  p.logprobs = 0;
  EXPECT_EQ(Sampler(p, 0).top_candidates_needed(), 1);
  p.logprobs = 5;
  EXPECT_EQ(Sampler(p, 0).top_candidates_needed(), 5);
  p.temperature = 0.7f;
  p.top_k = 40;
  EXPECT_EQ(Sampler(p, 0).top_candidates_needed(), 40);
  p.logprobs = 20;
  p.top_k = 8;
  EXPECT_EQ(Sampler(p, 0).top_candidates_needed(), 20);
  // Greedy from one candidate: the row's argmax and its log-prob, as from the whole row.
  std::vector<float> row = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
  SamplingParams g;
  g.temperature = 0;
  g.logprobs = 1;
  Sampler whole(g, 0), one(g, 0);
  ASSERT_EQ(whole.top_candidates_needed(), 1);
  const float ls = std::log(std::exp(0.5f) + 2 * std::exp(2.0f) + std::exp(-1.0f) + std::exp(1.0f));
  const float lv[1] = {2.0f};
  const int32_t li[1] = {1};
  const float lp[1] = {2.0f - ls};
  TopLogits top{lv, li, lp, 5};
  ASSERT_TRUE(one.samples_from_top(1, 5));
  SampledToken a = whole.sample(std::span<float>(row)), b = one.sample(top);
  EXPECT_EQ(a.token, 1);
  EXPECT_EQ(b.token, a.token);
  EXPECT_NEAR(b.logprob, a.logprob, 1e-5);
  ASSERT_EQ(b.top.size(), 1u);
  EXPECT_EQ(b.top[0].token, a.top.at(0).token);
}

}  // namespace
}  // namespace kiln
