// Calibration statistics and thresholds (see calibration.h). The histogram methods follow
// pytorch-quantization's HistogramCalibrator (_compute_amax_entropy / _compute_amax_mse /
// _compute_amax_percentile), the reference implementation of TensorRT's calibrators.
#include "quant/calibration.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/fp8.h"
#include "core/hadamard.h"
#include "core/status.h"

namespace kiln::quant {

CalibMethod calib_method_parse(const std::string& s) {
  if (s == "max") return CalibMethod::kMax;
  if (s == "percentile") return CalibMethod::kPercentile;
  if (s == "mse") return CalibMethod::kMse;
  if (s == "kl" || s == "entropy") return CalibMethod::kKl;
  throw_error(ErrorCode::kInvalidArgument, "unknown calibration method '", s, "' (expected kl, mse, max or percentile)");
}

const char* calib_method_name(CalibMethod m) {
  switch (m) {
    case CalibMethod::kMax: return "max";
    case CalibMethod::kPercentile: return "percentile";
    case CalibMethod::kMse: return "mse";
    case CalibMethod::kKl: return "kl";
  }
  return "?";
}

double Histogram::total() const {
  double s = 0;
  for (double c : counts) s += c;
  return s;
}

namespace {

constexpr int kQuantLevels = 128;  // |x| of symmetric int8: codes 0..127
constexpr int kStartBin = 128;

double edge(const Histogram& h, int64_t i) { return double(i) * h.bin_width(); }

}  // namespace

double amax_percentile(const Histogram& h, double percentile) {
  const double total = h.total();
  if (total <= 0 || h.range <= 0) return h.range;
  double cum = 0;
  for (int i = 0; i < kHistogramBins; ++i) {
    cum += h.counts[size_t(i)];
    if (cum / total >= percentile / 100.0) return edge(h, i + 1);
  }
  return h.range;
}

double amax_mse(const Histogram& h) {
  if (h.total() <= 0 || h.range <= 0) return h.range;
  const double w = h.bin_width();
  double best = INFINITY, best_amax = h.range;
  for (int i = kStartBin; i <= kHistogramBins; ++i) {
    const double amax = edge(h, i), step = amax / 127.0;
    double err = 0;
    for (int b = 0; b < kHistogramBins; ++b) {
      const double c = h.counts[size_t(b)];
      if (c == 0) continue;
      const double x = (b + 0.5) * w;
      const double q = std::min(std::nearbyint(x / step), 127.0) * step;
      err += c * (x - q) * (x - q);
    }
    if (err <= best) best = err, best_amax = amax;  // ties: the larger clip
  }
  return best_amax;
}

double amax_kl(const Histogram& h) {
  const double total = h.total();
  if (total <= 0 || h.range <= 0) return h.range;
  const std::vector<double>& bins = h.counts;
  // Suffix sums: the outliers beyond edge i.
  std::vector<double> tail(size_t(kHistogramBins) + 1, 0.0);
  for (int i = kHistogramBins - 1; i >= 0; --i) tail[size_t(i)] = tail[size_t(i) + 1] + bins[size_t(i)];
  double best = INFINITY;
  int best_i = kHistogramBins;
  std::vector<double> merged(kQuantLevels), nonzero(kQuantLevels);
  std::vector<int> level;
  for (int i = kStartBin; i <= kHistogramBins; ++i) {
    // Bin j of [0, i) belongs to level floor(j * 128 / i) (numpy's digitize on a linspace).
    level.resize(size_t(i));
    std::fill(merged.begin(), merged.end(), 0.0);
    std::fill(nonzero.begin(), nonzero.end(), 0.0);
    for (int j = 0; j < i; ++j) {
      int l = int(int64_t(j) * kQuantLevels / i);
      level[size_t(j)] = l;
      if (bins[size_t(j)] != 0) merged[size_t(l)] += bins[size_t(j)], nonzero[size_t(l)] += 1;
    }
    // P: the reference with the outliers in its last bin; Q: levels spread back evenly
    // over their non-empty bins. Both normalised; KL(P || Q) = Σ p log(p / q).
    double q_total = 0;
    for (int j = 0; j < i; ++j)
      if (bins[size_t(j)] != 0) q_total += merged[size_t(level[size_t(j)])] / nonzero[size_t(level[size_t(j)])];
    double kl = 0;
    for (int j = 0; j < i; ++j) {
      double p = bins[size_t(j)] + (j == i - 1 ? tail[size_t(i)] : 0.0);
      if (p == 0) continue;
      p /= total;
      const double qc = bins[size_t(j)] != 0 ? merged[size_t(level[size_t(j)])] / nonzero[size_t(level[size_t(j)])] : 0;
      if (qc == 0) {
        kl = INFINITY;
        break;
      }
      kl += p * std::log(p / (qc / q_total));
    }
    if (kl <= best) best = kl, best_i = i;
  }
  return edge(h, best_i);
}

namespace {

// |x| of a bin centre quantized to E4M3 with the clip `amax` (per-tensor scaling).
double fp8_fake_quant(double x, const Fp8Scale& s) {
  return double(fp8e4m3_to_f32(f32_to_fp8e4m3(float(x) * s.inv))) * double(s.scale);
}

}  // namespace

double amax_mse_fp8(const Histogram& h) {
  if (h.total() <= 0 || h.range <= 0) return h.range;
  const double w = h.bin_width();
  double best = INFINITY, best_amax = h.range;
  for (int i = kStartBin; i <= kHistogramBins; ++i) {
    const double amax = edge(h, i);
    const Fp8Scale s = fp8_scale_for_amax(amax);
    double err = 0;
    for (int b = 0; b < kHistogramBins; ++b) {
      const double c = h.counts[size_t(b)];
      if (c == 0) continue;
      const double x = (b + 0.5) * w, q = fp8_fake_quant(x, s);
      err += c * (x - q) * (x - q);
    }
    if (err <= best) best = err, best_amax = amax;  // ties: the larger clip
  }
  return best_amax;
}

double amax_kl_fp8(const Histogram& h) {
  const double total = h.total();
  if (total <= 0 || h.range <= 0) return h.range;
  const std::vector<double>& bins = h.counts;
  std::vector<double> tail(size_t(kHistogramBins) + 1, 0.0);
  for (int i = kHistogramBins - 1; i >= 0; --i) tail[size_t(i)] = tail[size_t(i) + 1] + bins[size_t(i)];
  double best = INFINITY;
  int best_i = kHistogramBins;
  constexpr int kCodes = 0x7f;  // non-negative finite E4M3 codes
  std::vector<double> merged(kCodes), nonzero(kCodes);
  std::vector<uint8_t> level;
  for (int i = kStartBin; i <= kHistogramBins; ++i) {
    // Bin j of [0, i) belongs to the code its centre rounds to with the clip at edge i:
    // e4m3((j + 0.5) / i * 448). Bins near zero get a code each (no loss there); bins
    // near the clip share the coarse top codes.
    level.resize(size_t(i));
    std::fill(merged.begin(), merged.end(), 0.0);
    std::fill(nonzero.begin(), nonzero.end(), 0.0);
    for (int j = 0; j < i; ++j) {
      const uint8_t l = f32_to_fp8e4m3(float((j + 0.5) / i * double(kFp8E4M3Max)));
      level[size_t(j)] = l;
      if (bins[size_t(j)] != 0) merged[l] += bins[size_t(j)], nonzero[l] += 1;
    }
    double q_total = 0;
    for (int j = 0; j < i; ++j)
      if (bins[size_t(j)] != 0) q_total += merged[level[size_t(j)]] / nonzero[level[size_t(j)]];
    double kl = 0;
    for (int j = 0; j < i; ++j) {
      double p = bins[size_t(j)] + (j == i - 1 ? tail[size_t(i)] : 0.0);
      if (p == 0) continue;
      p /= total;
      const double qc = bins[size_t(j)] != 0 ? merged[level[size_t(j)]] / nonzero[level[size_t(j)]] : 0;
      if (qc == 0) {
        kl = INFINITY;
        break;
      }
      kl += p * std::log(p / (qc / q_total));
    }
    if (kl <= best) best = kl, best_i = i;
  }
  return edge(h, best_i);
}

double CalibrationTable::amax(const std::string& node, CalibMethod method, QuantFormat format) const {
  auto it = tensors.find(node);
  if (it == tensors.end())
    throw_error(ErrorCode::kNotFound, "calibration table has no entry for Linear '", node,
                "' (was it calibrated on a different model or opt level?)");
  std::string key = calib_method_name(method);
  if (format == QuantFormat::kFp8E4M3 && (method == CalibMethod::kMse || method == CalibMethod::kKl)) key += "_fp8";
  auto m = it->second.amax.find(key);
  if (m == it->second.amax.end())
    throw_error(ErrorCode::kNotFound, "calibration table entry '", node, "' has no '", key, "' amax",
                key.ends_with("_fp8") ? " (the cache predates FP8 calibration: delete it to recalibrate)" : "");
  return m->second;
}

double CalibrationTable::out_amax(const std::string& node) const {
  auto it = tensors.find(node);
  if (it == tensors.end())
    throw_error(ErrorCode::kNotFound, "calibration table has no entry for Linear '", node,
                "' (calibrated on a different model or opt level?)");
  const double v = it->second.out_amax;
  if (v < 0)
    throw_error(ErrorCode::kNotFound, "calibration table entry '", node, "' has no output amax (the cache predates "
                "output calibration: delete it to recalibrate)");
  if (!(v > 0) || !std::isfinite(v))
    throw_error(ErrorCode::kInvalidArgument, "calibration table entry '", node, "' has output amax ", v,
                " (expected a finite value > 0)");
  return v;
}

void CalibrationTable::save(const std::string& path) const {
  nlohmann::json j;
  j["format"] = "kiln-calibration-1";
  j["model"] = model;
  j["text"] = text;
  j["smooth_alpha"] = smooth_alpha;
  j["sequences"] = sequences;
  j["tokens"] = tokens;
  nlohmann::json& t = j["tensors"];
  for (auto& [name, c] : tensors) {
    t[name] = {{"amax", c.amax}, {"rows", c.rows}, {"channel_absmax", c.channel_absmax}};
    if (c.out_amax >= 0) t[name]["out_amax"] = c.out_amax;
  }
  if (!awq_format.empty()) {
    nlohmann::json& a = j["awq"];
    a["format"] = awq_format;
    a["linears"] = nlohmann::json::object();
    for (auto& [name, e] : awq)
      a["linears"][name] = {{"alpha", e.alpha}, {"error", e.error}, {"error_plain", e.error_plain}, {"scales", e.scales}};
  }
  std::ofstream f(path);
  if (!f) throw_error(ErrorCode::kInvalidArgument, "cannot write calibration cache '", path, "'");
  f << j.dump(1) << "\n";
  if (!f) throw_error(ErrorCode::kInvalidArgument, "cannot write calibration cache '", path, "'");
}

CalibrationTable CalibrationTable::load(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw_error(ErrorCode::kNotFound, "calibration cache '", path, "' cannot be opened");
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return parse(text, path);
}

CalibrationTable CalibrationTable::parse(std::string_view text, const std::string& path) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    throw_error(ErrorCode::kInvalidArgument, "calibration cache '", path, "' is not a JSON object");
  if (!j.contains("format") || !j["format"].is_string() || j["format"].get<std::string>() != "kiln-calibration-1")
    throw_error(ErrorCode::kInvalidArgument, "calibration cache '", path,
                "': expected \"format\": \"kiln-calibration-1\" (write one with --calib-cache)");
  CalibrationTable t;
  try {
    t.model = j.value("model", "");
    t.text = j.value("text", "");
    t.smooth_alpha = j.at("smooth_alpha").get<double>();
    t.sequences = j.value("sequences", int64_t(0));
    t.tokens = j.value("tokens", int64_t(0));
    if (!std::isfinite(t.smooth_alpha) || t.smooth_alpha > 1)
      throw_error(ErrorCode::kInvalidArgument, "smooth_alpha ", t.smooth_alpha, " (expected <= 1)");
    if (!j.at("tensors").is_object()) throw_error(ErrorCode::kInvalidArgument, "\"tensors\" is not an object");
    for (auto& [name, e] : j.at("tensors").items()) {
      TensorCalib c;
      if (e.contains("amax")) c.amax = e.at("amax").get<std::map<std::string, double>>();
      c.rows = e.value("rows", int64_t(0));
      c.channel_absmax = e.at("channel_absmax").get<std::vector<float>>();
      if (e.contains("out_amax")) {
        c.out_amax = e.at("out_amax").get<double>();
        if (!std::isfinite(c.out_amax) || c.out_amax < 0)
          throw_error(ErrorCode::kInvalidArgument, "tensor '", name, "' has out_amax ", c.out_amax,
                      " (expected a finite value >= 0)");
      }
      for (auto& [m, v] : c.amax)
        if (!std::isfinite(v) || v < 0)
          throw_error(ErrorCode::kInvalidArgument, "tensor '", name, "' method '", m, "' has amax ", v);
      for (float v : c.channel_absmax)
        if (!std::isfinite(v) || v < 0)
          throw_error(ErrorCode::kInvalidArgument, "tensor '", name, "' has a channel max of ", v);
      t.tensors.emplace(name, std::move(c));
    }
    if (j.contains("awq")) {
      const nlohmann::json& a = j.at("awq");
      t.awq_format = a.at("format").get<std::string>();
      if (t.awq_format != "q4" && t.awq_format != "q8")
        throw_error(ErrorCode::kInvalidArgument, "awq format '", t.awq_format, "' (expected q4 or q8)");
      if (!a.at("linears").is_object()) throw_error(ErrorCode::kInvalidArgument, "\"awq\".\"linears\" is not an object");
      for (auto& [name, e] : a.at("linears").items()) {
        AwqEntry w;
        w.alpha = e.at("alpha").get<double>();
        w.error = e.value("error", 0.0);
        w.error_plain = e.value("error_plain", 0.0);
        w.scales = e.at("scales").get<std::vector<float>>();
        if (!(w.alpha >= 0 && w.alpha <= 1))
          throw_error(ErrorCode::kInvalidArgument, "awq entry '", name, "' has alpha ", w.alpha, " (expected [0, 1])");
        if (w.scales.empty()) throw_error(ErrorCode::kInvalidArgument, "awq entry '", name, "' has no scales");
        for (float v : w.scales)
          if (!std::isfinite(v) || v <= 0)
            throw_error(ErrorCode::kInvalidArgument, "awq entry '", name, "' has a scale of ", v, " (expected > 0)");
        t.awq.emplace(name, std::move(w));
      }
      if (t.awq.empty()) throw_error(ErrorCode::kInvalidArgument, "\"awq\" has no Linears");
    }
  } catch (const nlohmann::json::exception& e) {
    throw_error(ErrorCode::kInvalidArgument, "calibration cache '", path, "': ", e.what());
  } catch (const Error& e) {
    throw_error(ErrorCode::kInvalidArgument, "calibration cache '", path, "': ", e.what());
  }
  if (t.tensors.empty()) throw_error(ErrorCode::kInvalidArgument, "calibration cache '", path, "' has no tensors");
  return t;
}

void TensorCollector::check_k(int64_t k) {
  if (channel_absmax_.empty()) channel_absmax_.assign(size_t(k), 0.0f);
  KILN_CHECK(int64_t(channel_absmax_.size()) == k, "calibration: '", name_, "' input width changed from ",
             channel_absmax_.size(), " to ", k);
}

namespace {
[[noreturn]] void not_finite(const std::string& name, int64_t row, int64_t col, float v) {
  throw_error(ErrorCode::kInvalidArgument, "calibration: the input of Linear '", name, "' is ", v, " at row ", row,
              ", channel ", col, ": the float model's activations are not finite on the calibration text "
              "(a broken checkpoint, or a text the model overflows on); check it with kiln eval perplexity");
}
}  // namespace

void TensorCollector::observe_channels(const float* x, int64_t rows, int64_t k) {
  check_k(k);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < k; ++j) {
      const float v = x[r * k + j];
      if (!std::isfinite(v)) not_finite(name_, r, j, v);
      channel_absmax_[size_t(j)] = std::max(channel_absmax_[size_t(j)], std::fabs(v));
    }
  if (hadamard_)
    for (int64_t r = 0; r < rows; ++r) {
      row_.assign(x + r * k, x + (r + 1) * k);
      hadamard_transform(row_.data(), k);
      for (float v : row_) rotated_max_ = std::max(rotated_max_, double(std::fabs(v)));
    }
  rows_ += rows;
}

void TensorCollector::begin_histogram(std::vector<float> inv_smooth) {
  KILN_CHECK(!channel_absmax_.empty(), "calibration: '", name_, "' has no pass-1 statistics");
  KILN_CHECK(inv_smooth.empty() || inv_smooth.size() == channel_absmax_.size(), "calibration: smoothing width");
  KILN_CHECK(!hadamard_ || inv_smooth.empty(), "calibration: '", name_, "' is read rotated and cannot be smoothed");
  inv_smooth_ = std::move(inv_smooth);
  max_ = 0;
  for (size_t j = 0; j < channel_absmax_.size(); ++j)
    max_ = std::max(max_, double(channel_absmax_[j] * (inv_smooth_.empty() ? 1.0f : inv_smooth_[j])));
  if (hadamard_) max_ = rotated_max_;
  hist_ = Histogram();
  hist_.range = max_;
}

void TensorCollector::observe_histogram(const float* x, int64_t rows, int64_t k) {
  check_k(k);
  if (hadamard_) {
    for (int64_t r = 0; r < rows; ++r) {
      row_.assign(x + r * k, x + (r + 1) * k);
      hadamard_transform(row_.data(), k);
      for (float v : row_) hist_.add(std::fabs(v));  // finite: pass 1 checked the same rows
    }
    return;
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < k; ++j) {
      const float v = x[r * k + j];
      if (!std::isfinite(v)) not_finite(name_, r, j, v);
      hist_.add(std::fabs(inv_smooth_.empty() ? v : v * inv_smooth_[size_t(j)]));
    }
}

void TensorCollector::observe_output(const float* y, int64_t rows, int64_t n) {
  float m = out_max_ < 0 ? 0.0f : float(out_max_);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) {
      const float v = y[r * n + j];
      if (!std::isfinite(v))
        throw_error(ErrorCode::kInvalidArgument, "calibration: the output of Linear '", name_, "' is ", v, " at row ", r,
                    ", column ", j, ": the float model's activations are not finite on the calibration text");
      m = std::max(m, std::fabs(v));
    }
  out_max_ = m;
}

TensorCalib TensorCollector::finish() const {
  TensorCalib c;
  c.out_amax = out_max_;
  c.channel_absmax = channel_absmax_;
  c.rows = rows_;
  c.amax["max"] = max_;
  c.amax["percentile"] = amax_percentile(hist_);
  c.amax["mse"] = amax_mse(hist_);
  c.amax["kl"] = amax_kl(hist_);
  c.amax["mse_fp8"] = amax_mse_fp8(hist_);
  c.amax["kl_fp8"] = amax_kl_fp8(hist_);
  return c;
}

}  // namespace kiln::quant
