// Calibration thresholds on synthetic distributions with known answers (max, percentile
// of a uniform histogram, KL clipping a Gaussian's outliers, the MSE clip against a brute
// force search over the raw samples), NaN/Inf rejection, and the cache round trip.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "core/status.h"
#include "quant/calibration.h"

namespace kiln::quant {
namespace {

std::vector<float> gaussian_with_outliers(size_t n, size_t outliers, float at, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  for (size_t i = 0; i < outliers; ++i) v[i * (n / outliers)] = (i % 2 ? -at : at);
  return v;
}

TensorCalib calibrate_samples(const std::vector<float>& v, int64_t k = 1) {
  TensorCollector c("t");
  c.observe_channels(v.data(), int64_t(v.size()) / k, k);
  c.begin_histogram({});
  c.observe_histogram(v.data(), int64_t(v.size()) / k, k);
  return c.finish();
}

TEST(Calibration, MaxIsTheMaxAndChannelMaxima) {
  std::vector<float> x = {0.5f, -2.0f, 1.0f, 3.0f, -0.25f, -7.5f};  // rows of 3 channels
  TensorCollector c("t");
  c.observe_channels(x.data(), 2, 3);
  EXPECT_EQ(c.channel_absmax(), (std::vector<float>{3.0f, 2.0f, 7.5f}));
  c.begin_histogram({});
  c.observe_histogram(x.data(), 2, 3);
  TensorCalib t = c.finish();
  EXPECT_EQ(t.amax["max"], 7.5);
  EXPECT_EQ(t.rows, 2);
  // With smoothing divisors the histogram covers |x_j / s_j|: max = max_j absmax_j / s_j.
  TensorCollector s("s");
  s.observe_channels(x.data(), 2, 3);
  s.begin_histogram({1.0f, 1.0f, 0.25f});
  s.observe_histogram(x.data(), 2, 3);
  EXPECT_EQ(s.finish().amax["max"], 3.0);
}

TEST(Calibration, PercentileOfUniformHistogram) {
  Histogram h;
  h.range = 1.0;
  std::fill(h.counts.begin(), h.counts.end(), 1.0);
  EXPECT_DOUBLE_EQ(amax_percentile(h, 50.0), 0.5);
  EXPECT_DOUBLE_EQ(amax_percentile(h, 100.0), 1.0);
  // 99.99% of 2048 equal bins needs all of them.
  EXPECT_DOUBLE_EQ(amax_percentile(h, 99.99), 1.0);
  h.counts[2047] = 0;
  h.counts[0] = 1e6;  // mass at zero: the percentile moves down
  EXPECT_DOUBLE_EQ(amax_percentile(h, 99.5), 1.0 / kHistogramBins);
}

TEST(Calibration, KlClipsGaussianOutliers) {
  auto v = gaussian_with_outliers(200000, 20, 40.0f, 1);
  TensorCalib t = calibrate_samples(v);
  EXPECT_EQ(t.amax["max"], 40.0);
  // TensorRT's entropy clip lands a few sigma out, far below the outliers.
  EXPECT_GT(t.amax["kl"], 2.5);
  EXPECT_LT(t.amax["kl"], 10.0);
  EXPECT_LT(t.amax["percentile"], 40.0);
  // MSE weighs the outliers' clipping error by their size: with 20 at 40 it keeps them.
  EXPECT_LE(t.amax["mse"], 40.0);
  // Without outliers KL still clips the sparse tail, never beyond the max.
  auto g = gaussian_with_outliers(200000, 0 + 1, 0.0f, 2);
  TensorCalib tg = calibrate_samples(g);
  EXPECT_LE(tg.amax["kl"], tg.amax["max"]);
  EXPECT_GT(tg.amax["kl"], 2.0);
}

double fake_quant_mse(const std::vector<float>& v, double amax) {
  const double step = amax / 127.0;
  double e = 0;
  for (float x : v) {
    const double a = std::fabs(double(x));
    const double q = std::min(std::nearbyint(a / step), 127.0) * step;
    e += (a - q) * (a - q);
  }
  return e / double(v.size());
}

TEST(Calibration, MseMatchesBruteForceOnTheSamples) {
  auto v = gaussian_with_outliers(40000, 8, 25.0f, 3);
  TensorCalib t = calibrate_samples(v);
  const double range = t.amax["max"];
  double best = INFINITY, best_amax = 0;
  for (int i = 128; i <= kHistogramBins; i += 4) {
    const double a = range * i / kHistogramBins;
    const double e = fake_quant_mse(v, a);
    if (e < best) best = e, best_amax = a;
  }
  const double got = fake_quant_mse(v, t.amax["mse"]);
  EXPECT_LE(got, best * 1.03) << "histogram MSE clip " << t.amax["mse"] << " vs brute force " << best_amax;
  EXPECT_NEAR(t.amax["mse"], best_amax, 0.15 * best_amax);
}

TEST(Calibration, NonFiniteActivationsNameTheTensor) {
  std::vector<float> x = {1.0f, NAN, 2.0f, 3.0f};
  TensorCollector c("layers.3.mlp.down");
  try {
    c.observe_channels(x.data(), 2, 2);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layers.3.mlp.down"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("row 0, channel 1"), std::string::npos) << e.what();
  }
  std::vector<float> y = {1.0f, INFINITY};
  TensorCollector d("d");
  EXPECT_THROW(d.observe_channels(y.data(), 1, 2), Error);
}

// The output maximum (--fp8-gate-up-out's scale): max |y| over every output seen, NaN/Inf
// named; a collector that saw no output records none (-1), and the table asks to recalibrate.
TEST(Calibration, OutputMaxIsRecorded) {
  TensorCollector c("layers.0.mlp.gate_up");
  std::vector<float> x = {1.0f, 2.0f};
  c.observe_channels(x.data(), 1, 2);
  EXPECT_EQ(c.finish().out_amax, -1.0);
  std::vector<float> y1 = {0.5f, -3.25f, 1.0f, 2.0f, 0.0f, -0.75f};  // [2, 3]
  std::vector<float> y2 = {3.0f, -1.0f, 0.5f};
  c.observe_output(y1.data(), 2, 3);
  c.observe_output(y2.data(), 1, 3);
  c.begin_histogram({});
  c.observe_histogram(x.data(), 1, 2);
  EXPECT_EQ(c.finish().out_amax, 3.25);
  std::vector<float> bad = {1.0f, 2.0f, NAN};
  try {
    c.observe_output(bad.data(), 1, 3);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("output of Linear 'layers.0.mlp.gate_up'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("column 2"), std::string::npos) << e.what();
  }
  bad[2] = -INFINITY;
  EXPECT_THROW(c.observe_output(bad.data(), 1, 3), Error);

  CalibrationTable t;
  t.tensors["a"] = {{1.0f}, {{"max", 1.0}}, 1, 6.5};
  t.tensors["b"] = {{1.0f}, {{"max", 1.0}}, 1};  // no output max
  t.tensors["z"] = {{1.0f}, {{"max", 1.0}}, 1, 0.0};
  EXPECT_EQ(t.out_amax("a"), 6.5);
  for (const char* n : {"b", "z", "c"}) {
    try {
      t.out_amax(n);
      FAIL() << "expected an error for " << n;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + n + "'"), std::string::npos) << e.what();
      if (std::string(n) == "b") EXPECT_NE(std::string(e.what()).find("recalibrate"), std::string::npos) << e.what();
      if (std::string(n) == "z") EXPECT_NE(std::string(e.what()).find("> 0"), std::string::npos) << e.what();
    }
  }
  const std::string path = ::testing::TempDir() + "/kiln_calib_out_test.json";
  t.save(path);
  CalibrationTable u = CalibrationTable::load(path);
  EXPECT_EQ(u.tensors["a"].out_amax, 6.5);
  EXPECT_EQ(u.tensors["b"].out_amax, -1.0);
  std::filesystem::remove(path);
  for (const char* v : {"-1", "\"x\"", "1e999"})
    EXPECT_THROW(CalibrationTable::parse(std::string("{\"format\": \"kiln-calibration-1\", \"smooth_alpha\": 0.5, "
                                                     "\"tensors\": {\"a\": {\"channel_absmax\": [1], \"out_amax\": ") +
                                             v + "}}}",
                                         "inline"),
                 Error)
        << v;
}

TEST(Calibration, CacheRoundTripAndBadFiles) {
  CalibrationTable t;
  t.model = "m";
  t.text = "default";
  t.smooth_alpha = 0.5;
  t.sequences = 3;
  t.tokens = 700;
  t.tensors["a"] = {{1.0f, 2.5f}, {{"max", 2.5}, {"kl", 1.25}, {"mse", 1.5}, {"percentile", 2.0}}, 700};
  t.tensors["b"] = {{0.125f}, {{"max", 0.125}, {"kl", 0.1}, {"mse", 0.11}, {"percentile", 0.12}}, 700};
  const std::string dir = ::testing::TempDir();
  const std::string path = dir + "/kiln_calib_test.json";
  t.save(path);
  CalibrationTable u = CalibrationTable::load(path);
  EXPECT_EQ(u.model, "m");
  EXPECT_EQ(u.smooth_alpha, 0.5);
  EXPECT_EQ(u.tokens, 700);
  ASSERT_EQ(u.tensors.size(), 2u);
  EXPECT_EQ(u.tensors["a"].channel_absmax, t.tensors["a"].channel_absmax);
  EXPECT_EQ(u.amax("a", CalibMethod::kKl), 1.25);
  EXPECT_EQ(u.amax("b", CalibMethod::kMax), 0.125);
  EXPECT_THROW(u.amax("c", CalibMethod::kKl), Error);

  auto write = [&](const std::string& text) {
    std::ofstream(path) << text;
    return path;
  };
  EXPECT_THROW(CalibrationTable::load(write("not json")), Error);
  EXPECT_THROW(CalibrationTable::load(write("{\"format\": \"other\"}")), Error);
  EXPECT_THROW(CalibrationTable::load(write("{\"format\": \"kiln-calibration-1\", \"smooth_alpha\": 0.5, \"tensors\": {}}")),
               Error);
  EXPECT_THROW(CalibrationTable::load(write("{\"format\": \"kiln-calibration-1\", \"smooth_alpha\": 0.5, \"tensors\": "
                                            "{\"a\": {\"amax\": {\"kl\": -1}, \"channel_absmax\": [1]}}}")),
               Error);
  EXPECT_THROW(CalibrationTable::parse("{\"format\": \"kiln-calibration-1\", \"smooth_alpha\": 0.5, \"tensors\": "
                                       "{\"a\": {\"amax\": {\"kl\": 1}, \"channel_absmax\": [-1]}}}",
                                       "inline"),
               Error);
  EXPECT_THROW(CalibrationTable::parse("{\"format\": \"kiln-calibration-1\", \"smooth_alpha\": 0.5, \"tensors\": [1]}",
                                       "inline"),
               Error);
  EXPECT_THROW(CalibrationTable::load(dir + "/does_not_exist.json"), Error);
  EXPECT_THROW(calib_method_parse("entropyy"), Error);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace kiln::quant
