// Weight-only q8/q4 Linear layers on the device (formats of core/weight_quant.h).
// Few token rows (decode, m <= kQGemvMaxRows): a GEMV that streams the codes with
// 16-byte loads and dequantizes in registers (f32 math and accumulation, the activation
// dtype for x and y), each warp owning 4 weight rows so every x value it converts serves
// all four, split-K over 2-4 warps when the output is short, and the epilogues of the
// 16-bit GEMV (bias, GELU, SiLU, SwiGLU on a merged gate|up weight). More rows: tiles
// of the weight are dequantized into a workspace and multiplied by cuBLASLt.
// Tested against the CPU backend's q8/q4 kernels (the same quantized weights) in
// tests/backends/cuda/quant_test.cpp; timed by bench/cuda_gemv_bench.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backends/cuda/ops/gemv.h"
#include "core/dtype.h"
#include "core/weight_quant.h"

namespace kiln::cuda {

constexpr int64_t kQGemvMaxRows = 8;

// A quantized [n, k] weight on the device, row-major: row r's codes at codes + r * row
// bytes (k for q8, k / 2 for q4; k % 32 == 0, so each row is 16-byte aligned), its group
// scales at scales + r * k / 32 (q8: f16; q4: an f16 (scale, min) pair per group, as
// 32 bits), and its power-of-two factor at row_factor[r].
struct QuantWeightView {
  QuantFormat format = QuantFormat::kQ4;
  int64_t n = 0, k = 0;
  const uint8_t* codes = nullptr;
  const void* scales = nullptr;
  const float* row_factor = nullptr;
  size_t bytes() const {  // what a forward streams
    return size_t(n) * (quant_row_code_bytes(format, k) + size_t(k / kQuantGroup) * (format == QuantFormat::kQ4 ? 4 : 2) + 4);
  }
};

// Whether launch_gemv_quant handles m rows of `dtype` (f32, f16, bf16; 1 <= m <= 8).
bool gemv_quant_supports(DType dtype, int64_t m);
// y[m, n_out] = x[m, k] · wᵀ (+ bias), x/bias/y in `dtype`, 16-byte aligned; bias may be
// null. With kSwiGlu, w holds 2 n_out rows ([gate; up], bias 2 n_out) and
// y = silu(gate) * up; otherwise w.n == n_out.
void launch_gemv_quant(DType dtype, const void* x, const QuantWeightView& w, const void* bias, void* y, int64_t m,
                       int64_t n_out, cudaStream_t s, GemvEpilogue epi = GemvEpilogue::kNone);
// Rows [r0, r0 + rows) of w, dequantized (w = factor * (scale * q + min), rounded once
// to `dtype`) into out [rows, k] (256-byte aligned for cuBLASLt).
void launch_dequant_rows(DType dtype, const QuantWeightView& w, int64_t r0, int64_t rows, void* out, cudaStream_t s);

}  // namespace kiln::cuda
