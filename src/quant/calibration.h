// INT8 post-training calibration (TensorRT's / pytorch-quantization's methods): from the
// activations that reach each Linear, per input channel max |x| (for SmoothQuant) and
// per tensor the clipping threshold `amax` of four methods: max, a percentile, the
// MSE-optimal clip and the entropy/KL clip, the last three from a 2048-bin histogram of
// |x|. A calibration table round-trips through a JSON cache file so calibration runs
// once. Tested in tests/quant/calibration_test.cpp.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::quant {

enum class CalibMethod : uint8_t { kMax, kPercentile, kMse, kKl };
// The number format the activations are quantized to: the MSE and KL clips depend on
// its grid (int8's 127 even steps; E4M3's 3-bit mantissa, finer towards zero).
enum class QuantFormat : uint8_t { kInt8, kFp8E4M3 };
// "max" | "percentile" | "mse" | "kl"; throws kInvalidArgument naming the choices.
CalibMethod calib_method_parse(const std::string& s);
const char* calib_method_name(CalibMethod m);

constexpr int kHistogramBins = 2048;
constexpr double kDefaultPercentile = 99.99;

// Counts of |x| over [0, range] in kHistogramBins equal bins (values past range land in
// the last bin; they should not occur when range is the true max).
struct Histogram {
  double range = 0;
  std::vector<double> counts = std::vector<double>(kHistogramBins, 0.0);
  void add(float abs_x) {
    int b = range > 0 ? int(double(abs_x) / range * kHistogramBins) : 0;
    counts[size_t(b < kHistogramBins ? b : kHistogramBins - 1)] += 1;
  }
  double bin_width() const { return range / kHistogramBins; }
  double total() const;
};

// Clipping thresholds from a histogram (each >= one bin width, <= range):
// the smallest upper bin edge whose cumulative share reaches `percentile` %;
double amax_percentile(const Histogram& h, double percentile = kDefaultPercentile);
// the edge minimising the expected squared error of symmetric int8 fake quantization of
// the bin centres (clipped values cost their distance to the edge);
double amax_mse(const Histogram& h);
// TensorRT's entropy calibration: for every edge i >= 128 bins, P = counts[0, i) with the
// outliers folded into its last bin, Q = those counts merged into 128 levels and spread
// back over the non-empty bins; the edge minimising KL(P || Q) (ties: the larger edge).
double amax_kl(const Histogram& h);
// The same two searches on E4M3's grid: bin centres quantized as e4m3(x * 448 / edge)
// (core/fp8.h's per-tensor scaling, saturating); KL's levels are the E4M3 codes.
double amax_mse_fp8(const Histogram& h);
double amax_kl_fp8(const Histogram& h);

// What calibration measured for one Linear's input activation.
struct TensorCalib {
  std::vector<float> channel_absmax;       // [K]: max |x_j| of the raw input
  // method name -> threshold of the (smoothed) input; "mse"/"kl" for int8,
  // "mse_fp8"/"kl_fp8" for E4M3 ("max"/"percentile" serve both).
  std::map<std::string, double> amax;
  int64_t rows = 0;                        // activation rows observed
  // max |y| of the Linear's float output (before any activation epilogue); < 0: not
  // measured (a cache written before output maxima were recorded).
  double out_amax = -1;
};

// AWQ's result for one Linear (quant/awq.h): the per-input-channel scales, the alpha
// chosen and the output error on the calibration rows with and without them.
struct AwqEntry {
  std::vector<float> scales;
  double alpha = 0, error = 0, error_plain = 0;
};

// GPTQ's statistics of one Linear input (quant/gptq.h): sum of x^T x over the calibration
// rows, [k, k] row-major, and the row count. Held in memory only (never in the cache file:
// at K = 4096 one matrix is 128 MiB of doubles); an engine built with --quant gptq keeps
// the result instead.
struct GptqHessian {
  int64_t k = 0, rows = 0;
  std::vector<double> sum;
};

struct CalibrationTable {
  std::string model;      // what was calibrated (a path), informative
  std::string text;       // the calibration set, informative
  double smooth_alpha = 0.5;  // SmoothQuant alpha the amaxes were measured under (< 0: no smoothing)
  int64_t sequences = 0, tokens = 0;
  std::map<std::string, TensorCalib> tensors;  // Linear node name -> stats
  // AWQ scales (a table calibrated for --quant awq; its tensors then hold channel maxima
  // and no amax): the weight format they were searched for ("q4" | "q8"; "" when none)
  // and, per Linear node name, the scales.
  std::string awq_format;
  std::map<std::string, AwqEntry> awq;
  // GPTQ: per Linear node name, the Hessian of its input (Linears reading one input share
  // it). Not saved by save().
  std::map<std::string, std::shared_ptr<const GptqHessian>> gptq;
  // Mixed precision (--effective-bits): Linear node name -> the precision it is promoted
  // to ("q8"), chosen by the measured sensitivity of the model's output to each Linear
  // (runtime/quantize.h, plan_effective_bits). Not saved by save().
  std::map<std::string, std::string> precision_plan;

  // The amax of `node` for `method` and `format`; throws kNotFound naming the node (or
  // the missing threshold, e.g. an FP8 clip in a cache written before FP8 existed).
  double amax(const std::string& node, CalibMethod method, QuantFormat format = QuantFormat::kInt8) const;
  // The max |output| of `node`; throws kNotFound naming the node when the table has none
  // (recalibrate), kInvalidArgument when it is not > 0.
  double out_amax(const std::string& node) const;
  void save(const std::string& path) const;
  // Throws kiln::Error (kInvalidArgument) naming the file and the problem on bad input.
  static CalibrationTable load(const std::string& path);
  // The same from the file's text; `where` names it in errors (fuzzed in fuzz/).
  static CalibrationTable parse(std::string_view text, const std::string& where);
};

// Collects one tensor's statistics over many batches in two passes: first the channel
// max |x| (pass 1), then, once the smoothing divisors are known, the histogram of
// |x_j / s_j| over [0, max_j channel_absmax_j / s_j] (pass 2). NaN/Inf anywhere throws
// kInvalidArgument naming the tensor, row and channel.
class TensorCollector {
 public:
  explicit TensorCollector(std::string name) : name_(std::move(name)) {}
  // The input is read rotated (W8A8Options::hadamard): pass 1 also takes the max |x H| of
  // its rows, pass 2 bins x H (no smoothing) over [0, that max]; "max" is that max. Call
  // before the first observation.
  void set_hadamard(bool on) { hadamard_ = on; }
  bool hadamard() const { return hadamard_; }
  void observe_channels(const float* x, int64_t rows, int64_t k);
  // inv_smooth: [K] multipliers 1/s_j (empty: no smoothing). Call after pass 1.
  void begin_histogram(std::vector<float> inv_smooth);
  void observe_histogram(const float* x, int64_t rows, int64_t k);
  // The Linear's output y [rows, n]: its max |y| (out_amax). NaN/Inf throws as above.
  void observe_output(const float* y, int64_t rows, int64_t n);
  // Every threshold of the histogram (int8 and FP8); pass 1's max for "max".
  TensorCalib finish() const;
  const std::vector<float>& channel_absmax() const { return channel_absmax_; }

 private:
  std::string name_;
  std::vector<float> channel_absmax_;
  std::vector<float> inv_smooth_;
  Histogram hist_;
  double max_ = 0;
  double out_max_ = -1;  // < 0: no output seen
  bool hadamard_ = false;
  double rotated_max_ = 0;  // pass 1: max |x H| (hadamard_)
  std::vector<float> row_;  // a rotated row
  int64_t rows_ = 0;
  void check_k(int64_t k);
};

// The built-in calibration set (`--calib default`): src/quant/calib_default.txt, a frozen
// copy of the project's README and docs (frozen so the default clips do not drift with edits).
const std::string& default_calibration_text();

}  // namespace kiln::quant
