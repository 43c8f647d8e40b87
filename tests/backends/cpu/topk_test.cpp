// topk_logits (TopKLogits on the CPU) against a plain reference: a full sort of the row
// by (value desc, index asc, NaN last) and the log-sum-exp written out as sampling.cpp's
// logprobs_of writes it; bit-exact, over ties, -0/+0, NaN and -inf, k above the row
// width and widths that are multiples of nothing in particular.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "backends/cpu/kernels/kernels.h"

namespace kiln::cpu {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

struct Top {
  std::vector<float> values, logprobs;
  std::vector<int32_t> ids;
};

Top reference(const std::vector<float>& x, int64_t rows, int64_t v, int64_t k) {
  Top t;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x.data() + r * v;
    float mx = -kInf;
    for (int64_t i = 0; i < v; ++i) mx = std::max(mx, row[i]);
    double sum = 0;
    for (int64_t i = 0; i < v; ++i) sum += std::exp(double(row[i]) - mx);
    const double lse = double(mx) + std::log(sum);
    std::vector<int32_t> idx(static_cast<size_t>(v));
    std::iota(idx.begin(), idx.end(), 0);
    std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
      const bool an = std::isnan(row[a]), bn = std::isnan(row[b]);
      if (an || bn) return an == bn ? a < b : bn;
      return row[a] > row[b] || (row[a] == row[b] && a < b);
    });
    for (int64_t j = 0; j < k; ++j) {
      if (j < v) {
        const int32_t i = idx[size_t(j)];
        t.ids.push_back(i);
        t.values.push_back(row[i]);
        t.logprobs.push_back(float(double(row[i]) - lse));
      } else {
        t.ids.push_back(-1);
        t.values.push_back(-kInf);
        t.logprobs.push_back(-kInf);
      }
    }
  }
  return t;
}

// Bitwise float equality (NaN == NaN of the same bits).
bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

void check(const std::vector<float>& x, int64_t rows, int64_t v, int64_t k, const char* what) {
  SCOPED_TRACE(testing::Message() << what << " rows=" << rows << " v=" << v << " k=" << k);
  Top want = reference(x, rows, v, k);
  Top got;
  got.values.resize(size_t(rows * k));
  got.logprobs.resize(size_t(rows * k));
  got.ids.resize(size_t(rows * k));
  topk_logits(x.data(), rows, v, k, got.values.data(), got.ids.data(), got.logprobs.data());
  for (size_t i = 0; i < want.ids.size(); ++i) {
    ASSERT_EQ(got.ids[i], want.ids[i]) << "entry " << i;
    ASSERT_TRUE(same_bits(got.values[i], want.values[i])) << "entry " << i;
    ASSERT_TRUE(same_bits(got.logprobs[i], want.logprobs[i]) ||
                (std::isnan(got.logprobs[i]) && std::isnan(want.logprobs[i])))
        << "entry " << i << ": " << got.logprobs[i] << " vs " << want.logprobs[i];
  }
}

TEST(TopKLogits, RandomRowsOverWidthsAndK) {
  std::mt19937_64 rng(11);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  for (int64_t v : {1, 2, 7, 63, 64, 65, 1000, 4099, 50257})
    for (int64_t k : {1, 5, 64, 200}) {
      const int64_t rows = v > 10000 ? 2 : 5;
      std::vector<float> x(size_t(rows * v));
      for (auto& f : x) f = dist(rng);
      check(x, rows, v, k, "normal");
    }
}

TEST(TopKLogits, TiesGoToTheLowerIndexAndNegativeZeroTiesWithZero) {
  std::mt19937_64 rng(12);
  for (int64_t v : {9, 130, 3001}) {
    std::vector<float> x(size_t(3 * v));
    for (auto& f : x) f = float(int(rng() % 7) - 3);  // many exact ties
    for (size_t i = 0; i < x.size(); i += 5) x[i] = (i / 5) % 2 ? -0.0f : 0.0f;
    check(x, 3, v, 64, "ties");
    check(x, 3, v, v, "ties, k = v");
  }
}

TEST(TopKLogits, NanSortsLastAndInfinitiesInOrder) {
  std::mt19937_64 rng(13);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t v : {10, 100, 777}) {
    std::vector<float> x(size_t(4 * v));
    for (auto& f : x) f = dist(rng);
    for (size_t i = 0; i < x.size(); i += 7) x[i] = -kInf;
    for (size_t i = 3; i < x.size(); i += 11) x[i] = nan;
    x[5] = kInf;
    check(x, 4, v, 64, "nan/inf");
    check(x, 4, v, 2 * v, "nan/inf, k > v");
  }
  // Rows of only -inf and NaN: the log-sum-exp and every log-prob are NaN.
  std::vector<float> degenerate = {nan, -kInf, -kInf, nan, -kInf};
  check(degenerate, 1, 5, 3, "degenerate");
  std::vector<float> all_neg_inf(100, -kInf);
  check(all_neg_inf, 2, 50, 64, "all -inf");
}

}  // namespace
}  // namespace kiln::cpu
