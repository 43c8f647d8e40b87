// The one E4M3 rounding of the CUDA backend's activation quantization, shared by the
// quantize kernel (fp8.cu) and the producers that write E4M3 codes directly (the fused
// norms in norm.cu, SwiGLU and the activations in elementwise.cu): the hardware's
// cvt.rn.satfinite of x * inv, as core/dtype.h's f32_to_fp8e4m3 rounds. A fused producer
// first rounds its f32 result to its storage type T, as the unfused kernel stores it, so
// its codes are those of the unfused kernel followed by the quantize pass, bit for bit.
// Included only by .cu files; tested in tests/backends/cuda/fp8_test.cpp and fp8_fuse_test.cpp.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "backends/cuda/common.cuh"

namespace kiln::cuda {

__device__ __forceinline__ uint8_t fp8_code(float x, float inv) {
  return __nv_cvt_float_to_fp8(x * inv, __NV_SATFINITE, __NV_E4M3);
}

// v as the unfused kernel would store it in T, then quantized.
template <typename T>
__device__ __forceinline__ uint8_t fp8_code_via(float v, float inv) {
  return fp8_code(to_f32(from_f32<T>(v)), inv);
}

}  // namespace kiln::cuda
