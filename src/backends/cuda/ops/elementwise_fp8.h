// SwiGLU and the activations writing E4M3 codes for an FP8 Linear (the CUDA backend's
// quantize fused into the producer, cuda_fp8_linear.h); kernels in elementwise.cu, next to
// the bf16 ones whose rounding they share. Tested against launch_swiglu / launch_unary
// followed by launch_fp8_quantize in tests/backends/cuda/fp8_fuse_test.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backends/cuda/ops/elementwise.h"
#include "core/dtype.h"

namespace kiln::cuda {

// out = e4m3(float(T(f(x))) * inv): bit for bit the codes launch_fp8_quantize makes of
// launch_unary's / launch_swiglu's T output. t must be bf16 (the FP8 Linears' activation
// dtype).
void launch_unary_fp8(UnaryOp op, DType t, const void* x, int64_t n, float inv, uint8_t* out, cudaStream_t s);
void launch_swiglu_fp8(DType t, const void* x, int64_t rows, int64_t inter, float inv, uint8_t* out, cudaStream_t s);
// SwiGLU of E4M3 rows [gate | up] (2 * inter codes, value = decode(code) * gu_scale: an
// FP8 GEMM's E4M3 output) into E4M3 codes out = e4m3(silu(g) * u * inv), all in f32 as the
// CPU backend emulates it (cpu_ops.cpp's out_amax rounding, then its SwiGLU and quantize).
void launch_swiglu_e4m3(const uint8_t* x, int64_t rows, int64_t inter, float gu_scale, float inv, uint8_t* out,
                        cudaStream_t s);

}  // namespace kiln::cuda
