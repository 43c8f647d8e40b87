// Rotary position embedding (HF rotate-half convention) on the device, out of place
// (y may alias x): θ = float(pos)·inv_freq[i] and cos/sin in f32, as HF and the CPU
// reference compute them. Tested against the CPU backend in tests/backends/cuda/ops_test.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace kiln::cuda {

// x, y: [tokens, heads, head_dim]; dims >= rotary_dim pass through.
void launch_rope(DType t, const void* x, void* y, const int32_t* positions, const float* inv_freq,
                 int64_t tokens, int64_t heads, int64_t head_dim, int64_t rotary_dim, cudaStream_t s);

}  // namespace kiln::cuda
