// The SmoothQuant Mul (x times a row of 1/s, quant/w8a8.h) writing the int8 codes of the
// W8A8 Linears it feeds (the CUDA backend's quantize fused into the producer,
// cuda_int8_fuse.h); kernel in elementwise_int8.cu. Tested against launch_binary followed
// by launch_int8_quantize in tests/backends/cuda/int8_fuse_test.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace kiln::cuda {

// For rows of x [t, k] and a row m [k] (both in t: bf16 or f16; k % 4 == 0, 8-byte
// aligned rows): bit for bit what launch_int8_quantize makes of launch_binary's kMul
// output T(x * m): static (row_scale null) q = int8(float(T(x * m)) * inv); per token each
// row's scale max|T(x * m)| / 127 (1 for a row of zeros) to row_scale[r], the row
// quantized with its inverse.
void launch_mul_int8(DType t, const void* x, const void* m, int64_t rows, int64_t k, float inv, int8_t* q,
                     float* row_scale, cudaStream_t s);

}  // namespace kiln::cuda
