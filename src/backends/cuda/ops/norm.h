// LayerNorm and RMSNorm over the last dim on the device; statistics in f32, gamma/beta
// kept in f32. Tested against the CPU backend in tests/backends/cuda/ops_test.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace kiln::cuda {

// beta may be null. y may alias x.
void launch_layer_norm(DType t, const void* x, const float* gamma, const float* beta, float eps,
                       int64_t rows, int64_t dim, void* y, cudaStream_t s);
void launch_rms_norm(DType t, const void* x, const float* w, float eps, int64_t rows, int64_t dim,
                     void* y, cudaStream_t s);
// Fused residual add (AddLayerNorm / AddRMSNorm): sum = x + res (in T), y = norm(sum).
// sum and y must not alias x or res.
void launch_add_layer_norm(DType t, const void* x, const void* res, const float* gamma, const float* beta,
                           float eps, int64_t rows, int64_t dim, void* sum, void* y, cudaStream_t s);
void launch_add_rms_norm(DType t, const void* x, const void* res, const float* w, float eps, int64_t rows,
                         int64_t dim, void* sum, void* y, cudaStream_t s);

}  // namespace kiln::cuda
