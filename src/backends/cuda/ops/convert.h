// Casts between the float storage types on the device (graph inputs in, outputs out).
// Tested through the op tests in tests/backends/cuda/ops_test.cpp (every graph output).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace kiln::cuda {

void launch_convert(const void* src, DType from, void* dst, DType to, int64_t n, cudaStream_t s);

}  // namespace kiln::cuda

namespace kiln::cuda {

// Fills n elements with deterministic pseudo-random values in [-1, 1) (tuning inputs:
// never time on zeros).
void launch_fill_random(void* dst, DType t, int64_t n, uint32_t seed, cudaStream_t s);

// Keeps the stream busy for about `us` microseconds (the op profiler queues a step's
// launches behind it, so that the kernels then run back to back as in a graph).
void launch_spin(int64_t us, cudaStream_t s);

// Lets this thread's kernel launches use programmatic dependent launch (common.cuh).
void set_pdl_allowed(bool on);
// KILN_CUDA_PDL=all: the backend allows dependent launch in every step (prefill and
// encoder forwards too), not only in decode steps (measurements; see common.cuh). The
// variable takes 1 (the default), 0 or all; another value is a kInvalidArgument error.
bool pdl_in_every_step();

}  // namespace kiln::cuda
