// GPTQ (Frantar et al. 2022) for the weight-only q4/q8 formats: each Linear's weight is
// quantized one input column at a time, and the rounding error of column j is spread over
// the columns not yet quantized so that the output error on the calibration activations,
// tr((W - Q) H (W - Q)^T) with H = X^T X / rows, stays small, where plain rounding (RTN)
// ignores how the inputs correlate. H comes from calibration (GptqCollector, one per
// Linear input, shared by the Linears that read it); the solve uses the upper Cholesky
// factor U of (H + damp I)^-1, and column j's error (w_j - q_j) / U_jj moves the rest of
// the row by -err * U_j,(j+1..). A group's scale and min (core/weight_quant.h's q4/q8 grid)
// are chosen from the row's updated values when the sweep reaches the group, so the result
// is an ordinary q4/q8 row image: the rewrite stores it as a kept-quantized weight
// (attrs weight_quant, weight_k), which every backend runs as is.
// Rows are independent (each has its own groups), so they are solved in parallel.
// With AWQ in front (--quant awq-gptq) H is taken in the scaled input space,
// H_ij / (s_i s_j), and GPTQ quantizes the AWQ-scaled weights.
// Tested in tests/quant/gptq_test.cpp.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/weight_quant.h"
#include "ir/graph.h"
#include "quant/calibration.h"

namespace kiln::quant {

// One Linear's GPTQ row image ([n, quant_image_row_bytes] u8), its format, and the output
// errors of it and of plain rounding (gptq_output_error).
struct GptqResult {
  Tensor image;
  kiln::QuantFormat format = kiln::QuantFormat::kQ4;
  double error = 0, error_rtn = 0;
};

struct GptqOptions {
  kiln::QuantFormat format = kiln::QuantFormat::kQ4;
  // Added to H's diagonal: damp * mean(diag H) (GPTQ's percdamp), raised x10 (at most
  // 4 times) when H + damp I is still not positive definite.
  double damp = 0.01;
  std::vector<std::string> keep;  // Linears (node or weight name substrings) left f32
  bool awq_scaled = false;        // the table's AWQ scales were applied before (awq-gptq)
  bool act_order = false;         // columns by decreasing H_jj (gptq_act_order; the CLI's default)
  // Linears without a Hessian in the table stay as they are instead of being an error
  // (sequential calibration quantizes the layers calibrated so far).
  bool partial = false;
  // Results by Linear name, filled by apply_gptq and reused by later calls with the same
  // table and options (sequential calibration's stages quantize the same earlier layers
  // again); null: none kept.
  std::shared_ptr<std::map<std::string, GptqResult>> memo;
};

// Sums x^T x over the rows one Linear input takes during calibration (the upper triangle,
// in double). Non-finite values throw kInvalidArgument naming the Linear, row and channel.
class GptqCollector {
 public:
  explicit GptqCollector(std::string name) : name_(std::move(name)) {}
  void observe(const float* x, int64_t rows, int64_t k);
  // The table entry: sum of x^T x ([k, k], both triangles filled) and the row count.
  std::shared_ptr<const GptqHessian> finish() const;
  int64_t rows() const { return rows_; }

 private:
  std::string name_;
  int64_t k_ = 0, rows_ = 0;
  std::vector<double> h_;  // [k, k], upper triangle accumulated
};

// The upper Cholesky factor U of (H + damp I)^-1 (U^T U = that inverse), [k, k] row-major,
// for H = sum [k, k] / rows; channels never active (H_jj = 0) get H_jj = 1 and are listed
// in `dead`. kInvalidArgument when rows is 0, the matrix is not [k, k], or it stays
// indefinite after the damping retries.
std::vector<double> gptq_inverse_factor(const std::vector<double>& sum, int64_t rows, int64_t k, double damp,
                                        std::vector<int64_t>* dead = nullptr);

// GPTQ's act order: the columns by decreasing H_jj (stable), so the channels with the
// largest inputs are quantized first, while most columns are still free to absorb their
// error. `sum` is [k, k].
std::vector<int64_t> gptq_act_order(const std::vector<double>& sum, int64_t k);
// sum [k, k] with rows and columns taken in `order`: P H P^T.
std::vector<double> gptq_permute(const std::vector<double>& sum, int64_t k, const std::vector<int64_t>& order);

// GPTQ of the weight w [n, k] (row-major f32) with the inverse factor u of
// gptq_inverse_factor; `dead` columns (weight column indices) are zeroed first (their input
// is always 0). With an `order` (act order: a permutation of 0..k-1), column order[s] is
// quantized at step s and u must factor the permuted Hessian (gptq_permute); each group's
// scale and min then come from the unmodified row. k must be a positive multiple of
// kQuantGroup.
kiln::QuantizedRows gptq_quantize(const float* w, int64_t n, int64_t k, const std::vector<double>& u,
                                  const std::vector<int64_t>& dead, kiln::QuantFormat format,
                                  const std::vector<int64_t>& order = {});

// tr((W - Q) H (W - Q)^T) / rows: the summed squared output error of the quantized weight
// q against w over the calibration rows, per row of x (H = sum / rows).
double gptq_output_error(const float* w, const kiln::QuantizedRows& q, const std::vector<double>& sum, int64_t rows);

struct GptqReport {
  int quantized = 0, kept = 0;          // Linears
  double error = 0, error_rtn = 0;      // summed gptq_output_error of GPTQ and of plain rounding
};

// Replaces the weight of every Linear AWQ would quantize (awq_quantizes) by its GPTQ row
// image (attrs weight_quant, weight_k, precision = the format: the node's own q4/q8
// precision where --pin-precision set one, else options.format); kept Linears get attr
// precision=f32. With options.awq_scaled, H is rescaled by the table's AWQ scales of the
// Linear. Throws kNotFound when a Linear to quantize has no Hessian in the table,
// kInvalidArgument when a Hessian's width differs from the Linear's K.
GptqReport apply_gptq(ir::Graph& g, const CalibrationTable& table, const GptqOptions& options);

}  // namespace kiln::quant
