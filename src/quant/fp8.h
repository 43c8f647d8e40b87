// FP8 E4M3 post-training quantization as a graph rewrite: optional SmoothQuant folding
// (quant/w8a8.h's, float-preserving), then each quantized Linear gets attrs
// quant="fp8" and act_amax (the calibrated clip of its input, from the E4M3-aware
// clip methods of quant/calibration.h). Backends implement the attrs: activations
// become E4M3 codes with one static per-tensor scale act_amax / 448, weights E4M3
// codes with one per-tensor scale max|W| / 448 (core/fp8.h), products accumulate in
// f32 and the output keeps the activation dtype.
// Per tensor, not per output channel: E4M3 has an exponent per value, so a channel
// far below the tensor's max keeps its 3 mantissa bits (the subnormal floor sits 2^15
// below the max); and a scalar scale is what cuBLASLt's FP8 GEMM takes on every FP8
// GPU (A/B scale pointers), with the bias epilogue fused.
// Only Linears whose weight is [N, K] with K and N multiples of 16 are quantized
// (cuBLASLt's FP8 layout rule and the GPU kernels' 16-byte rows); others stay float.
// store_fp8_weights() turns their weights into E4M3 tensors (attr weight_scale) for
// engine files. Tested in tests/quant/fp8_test.cpp.
// gate_up_out (--fp8-gate-up-out): a quantized Linear with the swiglu epilogue (the
// merged gate|up projection) also gets attr out_amax, the calibrated max |output|; its
// [gate | up] output is then rounded to E4M3 with the scale out_amax / 448 before SwiGLU
// (so a GPU GEMM can write E4M3 instead of bf16 there, half the bytes SwiGLU reads).
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"
#include "quant/calibration.h"

namespace kiln::quant {

struct Fp8Options {
  CalibMethod method = CalibMethod::kMax;
  double smooth_alpha = -1;  // < 0: no SmoothQuant migration
  std::vector<std::string> keep;  // node or weight name substrings kept in float
  bool gate_up_out = false;       // out_amax on swiglu Linears (see the file comment)
};

struct Fp8Report {
  int quantized = 0, kept = 0, kept_shape = 0, folded_into_norm = 0, smoothing_muls = 0;
  int gate_up_out = 0;  // swiglu Linears given out_amax
  std::vector<std::string> kept_names;  // by --keep or by shape
};

// Whether a Linear of weight [n, k] can run in FP8 (K and N multiples of 16).
bool fp8_shape_ok(int64_t n, int64_t k);

// Rewrites g (see the file comment). Throws kNotFound when a Linear to quantize is
// missing from the table or lacks the method's FP8 threshold (or, with gate_up_out, a
// swiglu Linear lacks its output amax), kInvalidArgument for an output amax <= 0.
Fp8Report apply_fp8(ir::Graph& g, const CalibrationTable& table, const Fp8Options& options);

// Engine files: replaces the weight of every quant="fp8" Linear still stored in
// another dtype by its E4M3 codes (a new weight value; a weight also read elsewhere,
// like a tied embedding, keeps its float copy) and sets attr weight_scale. Returns how
// many Linears it converted.
int store_fp8_weights(ir::Graph& g);

}  // namespace kiln::quant
