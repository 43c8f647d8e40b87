// Elementwise producers writing the int8 codes of the W8A8 Linears they feed (the CUDA
// backend's quantize fused into the producer, cuda_int8_fuse.h): the SmoothQuant Mul (x
// times a row of 1/s, quant/w8a8.h), and the activation after a W8A8 Linear's GEMM (its
// FFN up projection feeding the down projection); kernels in elementwise_int8.cu. Tested
// against launch_binary / launch_unary followed by launch_int8_quantize in
// tests/backends/cuda/int8_fuse_test.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backends/cuda/ops/elementwise.h"
#include "core/dtype.h"

namespace kiln::cuda {

// For rows of x [t, k] and a row m [k] (both in t: bf16 or f16; k % 4 == 0, 8-byte
// aligned rows): bit for bit what launch_int8_quantize makes of launch_binary's kMul
// output T(x * m): static (row_scale null) q = int8(float(T(x * m)) * inv); per token each
// row's scale max|T(x * m)| / 127 (1 for a row of zeros) to row_scale[r], the row
// quantized with its inverse.
void launch_mul_int8(DType t, const void* x, const void* m, int64_t rows, int64_t k, float inv, int8_t* q,
                     float* row_scale, cudaStream_t s);

// For rows of x [t, k] (bf16 or f16; k % 4 == 0, 8-byte aligned rows) and op kGeluErf,
// kGeluTanh or kSilu: bit for bit what launch_int8_quantize makes of launch_unary's
// output T(op(x)): static (row_scale null) q = int8(float(T(op(x))) * inv); per token each
// row's scale max|T(op(x))| / 127 (1 for a row of zeros) to row_scale[r], the row
// quantized with its inverse. One block per row, the activation held in registers between
// the row's max and its codes (rows past 4 x 1024 vectors compute it twice).
void launch_unary_int8(UnaryOp op, DType t, const void* x, int64_t rows, int64_t k, float inv, int8_t* q,
                       float* row_scale, cudaStream_t s);

}  // namespace kiln::cuda
