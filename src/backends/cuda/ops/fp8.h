// FP8 E4M3 kernels of the CUDA backend's FP8 Linear (quant/fp8.h): quantizing an
// activation to E4M3 codes with its static per-tensor scale (the hardware's
// cvt.rn.satfinite, the same rounding as core/dtype.h's f32_to_fp8e4m3), and for a
// handful of token rows (decode) gemv.cu's weight-streaming GEMV over E4M3 weights (one
// byte per weight, half the bytes of bf16) that decodes both operands in registers,
// accumulates in f32 and applies the scales, bias and activation epilogue. Prefill rows go through
// cuBLASLt's FP8 GEMM (gemm.h run_fp8). Tested against the CPU FP8 kernels in
// tests/backends/cuda/fp8_test.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backends/cuda/ops/gemv.h"
#include "core/dtype.h"

namespace kiln::cuda {

// q[i] = e4m3(float(x[i]) * inv) for n elements of x in `dtype` (f32, f16 or bf16).
void launch_fp8_quantize(DType dtype, const void* x, int64_t n, float inv, uint8_t* q, cudaStream_t s);

// Whether the device has FP8 conversion and tensor-core instructions (sm_89+: Ada, Hopper).
bool fp8_device_supported(int device);
// Whether launch_fp8_gemv handles this shape (m <= kGemvMaxRows, k % 16 == 0).
bool fp8_gemv_supports(int64_t m, int64_t k);
// y[m, n] (bf16) = epi(scale * Σ_k e(x[m, k]) e(w[n, k]) + bias[n]), x and w E4M3 codes
// (16-byte aligned rows), bias bf16 (may be null), scale = x_scale * w_scale. With
// kSwiGlu, w holds 2n rows ([gate; up], bias 2n) and y = silu(gate) * up; outputs are
// rounded to bf16 where the unfused kernels would round them (gemv.h).
void launch_fp8_gemv(const uint8_t* x, const uint8_t* w, float scale, const void* bias, void* y, int64_t m,
                     int64_t n, int64_t k, cudaStream_t s, GemvEpilogue epi = GemvEpilogue::kNone);

}  // namespace kiln::cuda
