// Internal to the CUDA backend: the prefetching GEMV (GemvKind::kPrefetch, see gemv.h),
// launched by launch_gemv. Tested in tests/backends/cuda/gemv_prefetch_test.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backends/cuda/ops/gemv.h"

namespace kiln::cuda {

// launch_gemv's contract (16-bit dtype, m <= kGemvMaxRows, k % 8 == 0, a norm only where
// gemv_norm_supports); the caller has checked it and gemv_prefetch_available().
void launch_gemv_prefetch(DType dtype, const void* x, const void* w, const void* bias, void* y, int64_t m, int64_t n,
                          int64_t k, cudaStream_t s, GemvEpilogue epi, const GemvFusion& fusion);

}  // namespace kiln::cuda
