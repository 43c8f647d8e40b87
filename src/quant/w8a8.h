// W8A8 INT8 as a graph rewrite: SmoothQuant's per-channel migration (s_j = max|X_j|^α /
// max|W_j|^(1-α); X/s, W·s) folded into the preceding norm's gamma/beta when the Linear
// input is a norm output read only by the Linears being smoothed, else applied by a Mul
// node; then each quantized Linear gets attrs quant="w8a8" and act_amax (the calibrated
// clip of its smoothed input; act_dynamic=1 for per-token scales). Backends implement the attrs
// (CPU: per-channel int8 weights, per-tensor int8 activations). A tensor-parallel shard of a
// row-parallel Linear also carries weight_amax, its rows' max |w| over the unsharded rows
// (parallel/tensor_parallel.h). Tested in tests/quant/w8a8_test.cpp.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "quant/calibration.h"

namespace kiln::quant {

struct W8A8Options {
  CalibMethod method = CalibMethod::kKl;
  double smooth_alpha = 0.5;  // < 0: no migration
  // Linears whose node name or weight name contains one of these stay f32.
  std::vector<std::string> keep;
  bool quantize = true;  // false: only the (float-preserving) smoothing rewrite
  // Activation scales: per tensor from calibration (static), or per token from each
  // row's max at run time (attr act_dynamic=1; calibration then only sets smoothing).
  bool per_token = false;
  // Linears (node name substrings) whose input rows go through a Walsh-Hadamard transform
  // (core/hadamard.h, blocks of b = K & -K) before int8 rounding, the weight stored as
  // W H / b so that the product is unchanged: a row's few huge channels (SwiGLU outputs
  // feeding a down projection) spread over the block instead of setting the scale alone.
  // Such Linears are not smoothed; attr act_hadamard = b. Their calibration entries are
  // the rotated inputs', named hadamard_calib_name(node, b).
  std::vector<std::string> hadamard;
};

// Whether options.hadamard names this Linear (by node name).
bool w8a8_rotates(const std::string& node, const std::vector<std::string>& hadamard);
// The calibration entry of a rotated Linear's input: "<node>#hadamard<b>".
std::string hadamard_calib_name(const std::string& node, int64_t b);

struct W8A8Report {
  int quantized = 0, kept = 0, folded_into_norm = 0, smoothing_muls = 0, rotated = 0;
  std::vector<std::string> kept_names;
};

// Whether options.keep names this Linear.
bool w8a8_keeps(const ir::Graph& g, const ir::Node& linear, const W8A8Options& options);

// The SmoothQuant divisors s [K] of every Linear to quantize, by node name: Linears that
// read the same input share one s (from the max over all their weight columns). Needs
// channel_absmax of each in `table`.
std::map<std::string, std::vector<float>> smooth_factors(const ir::Graph& g, const CalibrationTable& table,
                                                         const W8A8Options& options);

// Rewrites g (see the file comment); new weights are added, tied/shared ones never
// modified. Throws kNotFound when a Linear to quantize is missing from the table.
W8A8Report apply_w8a8(ir::Graph& g, const CalibrationTable& table, const W8A8Options& options);

}  // namespace kiln::quant
