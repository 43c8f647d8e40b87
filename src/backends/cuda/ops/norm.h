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
// The same norms (res and sum null: no residual) writing y as E4M3 codes for an FP8
// Linear (the CUDA backend's fused quantize): y = e4m3(float(bf16(norm)) * inv), bit for
// bit the codes launch_fp8_quantize makes of the launchers' bf16 y above. t must be bf16,
// the FP8 Linears' activation dtype.
void launch_add_layer_norm_fp8(DType t, const void* x, const void* res, const float* gamma, const float* beta,
                               float eps, int64_t rows, int64_t dim, void* sum, uint8_t* y, float inv,
                               cudaStream_t s);
void launch_add_rms_norm_fp8(DType t, const void* x, const void* res, const float* w, float eps, int64_t rows,
                             int64_t dim, void* sum, uint8_t* y, float inv, cudaStream_t s);

}  // namespace kiln::cuda
