// Activation-aware weight quantization (AWQ, Lin et al. 2023) for the weight-only q4/q8
// formats. Per group of Linears that read one input x [., K]: a per-input-channel scale
// s = mean|x_j|^alpha, alpha searched on a grid in [0, 1] for the smallest output error
// ||Q(W·diag(s))·diag(s)^-1·x - W·x|| over calibration rows (alpha 0 is plain q4, so the
// search never does worse on them). W·diag(s) replaces W, and diag(s)^-1 is folded exactly
// into what produces x: the preceding norm's gamma/beta; the V rows of the projection that
// feeds Attention (with the scales tied over the query heads that share a K/V head, so the
// fold stays exact under GQA); the up half of a SwiGLU projection (or the up Linear of
// silu(gate) * up); anywhere else a Mul node scales x. The backends then quantize the
// scaled weights with the ordinary q4/q8 quantizer (core/weight_quant.h).
// Tested in tests/quant/awq_test.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/weight_quant.h"
#include "ir/graph.h"
#include "quant/calibration.h"

namespace kiln::quant {

struct AwqOptions {
  kiln::QuantFormat format = kiln::QuantFormat::kQ4;
  int grid = 20;                  // alpha in {0, 1/grid, ..., 1}
  int64_t max_out_rows = 512;     // output rows per Linear the error is measured on (an even-strided subset)
  std::vector<std::string> keep;  // Linears (node or weight name substrings) left f32
};

// "q4" | "q8" -> the format; anything else throws kInvalidArgument naming the choices.
kiln::QuantFormat awq_format_parse(const std::string& s);

// How a group's inverse scales reach its input.
enum class AwqFold : uint8_t { kNorm, kAttentionV, kSwiGluUp, kMul };
const char* awq_fold_name(AwqFold f);

// Linears to quantize that share one input, and where their 1/s goes.
struct AwqGroup {
  ir::ValueId input = ir::kNoValue;
  std::vector<int32_t> linears;  // node indices, in node order
  int64_t k = 0;
  AwqFold fold = AwqFold::kMul;
  int32_t producer = -1;  // the norm, or the Linear whose output rows take 1/s
  int64_t row_offset = 0;  // kAttentionV / kSwiGluUp: producer row of input channel 0 (before tie)
  // kAttentionV: tie[j] = the V channel input channel j comes from (query heads of one
  // K/V head read the same V channel, so their scales must agree). Empty: tie[j] = j.
  std::vector<int64_t> tie;
};

// Whether --keep names this Linear (a substring of its node or weight name).
bool linear_kept(const ir::Graph& g, const ir::Node& linear, const std::vector<std::string>& keep);
// Whether AWQ quantizes this Linear: a constant rank-2 weight with K a multiple of 32,
// not kept, and no per-node precision other than q4/q8.
bool awq_quantizes(const ir::Graph& g, const ir::Node& linear, const AwqOptions& options);
// The groups of g in node order of their first Linear.
std::vector<AwqGroup> awq_groups(const ir::Graph& g, const AwqOptions& options);

// Calibration statistics of one Linear input: per-channel sum |x| and every
// `stride`-th row observed (the rows the search measures the output error on).
// Non-finite values throw kInvalidArgument naming the Linear, row and channel.
class AwqCollector {
 public:
  AwqCollector(std::string name, int64_t stride);
  void observe(const float* x, int64_t rows, int64_t k);
  std::vector<float> channel_absmean() const;  // [K] mean |x_j|
  const std::vector<float>& samples() const { return samples_; }  // [sample_rows, K]
  int64_t sample_rows() const { return k_ > 0 ? int64_t(samples_.size()) / k_ : 0; }
  int64_t rows() const { return rows_; }

 private:
  std::string name_;
  int64_t stride_, k_ = 0, rows_ = 0;
  std::vector<double> abs_sum_;
  std::vector<float> samples_;
};

// One Linear's weight [n, k] (row-major f32) in a group.
struct AwqLayer {
  const float* w = nullptr;
  int64_t n = 0;
};

// Σ_r Σ_i ((Q(W·diag(s))·diag(s)^-1 - W) x_r)_i² over the rows x [rows, k] and output
// rows i (an even-strided subset of at most max_out_rows per layer), Q the format's
// quantize-dequantize. s empty: all ones (plain quantization).
double awq_output_error(const std::vector<AwqLayer>& layers, int64_t k, const float* x, int64_t rows,
                        const std::vector<float>& s, kiln::QuantFormat format, int64_t max_out_rows);

// The scales for alpha: a_j^alpha with a = absmean averaged over each tie class (zero
// channels take the smallest positive mean), clamped >= 1e-4 and divided by
// sqrt(max * min) so they centre on 1.
std::vector<float> awq_scales_for(const std::vector<float>& absmean, const std::vector<int64_t>& tie, double alpha);

struct AwqSearchResult {
  std::vector<float> scales;  // [k]
  double alpha = 0, error = 0, error_plain = 0;
};
// The grid search; throws kInvalidArgument when rows is 0, absmean is not [k] or holds a
// negative/non-finite value, or k is not a multiple of 32.
AwqSearchResult awq_search(const std::vector<AwqLayer>& layers, int64_t k, const float* x, int64_t rows,
                           const std::vector<float>& absmean, const std::vector<int64_t>& tie,
                           const AwqOptions& options);

struct AwqReport {
  int scaled = 0, kept = 0;  // Linears
  int folded_into_norm = 0, folded_into_v = 0, folded_into_up = 0, muls = 0;  // groups
};

// Rewrites g with the scales of `table` (see the file comment); new weights are added,
// shared ones never modified; kept Linears get attr precision=f32. Throws kNotFound when a
// Linear to quantize has no scales in the table, kInvalidArgument when the table's format
// differs from options.format or a scale vector has the wrong width.
AwqReport apply_awq(ir::Graph& g, const CalibrationTable& table, const AwqOptions& options);

}  // namespace kiln::quant
