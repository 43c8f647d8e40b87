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
// Whether the backend allows dependent launch in a step of `rows` token rows that is not a
// decode step (prefill, encoder forwards). KILN_CUDA_PDL: 1 (the default) where
// `gemms_take_part` - every GEMM of the graph launches with the attribute and waits as
// kiln's kernels do (the W8A8 Linears' CUTLASS GEMMs; cuBLASLt's do not, and chains of
// them lost 7-10% with dependent launch, common.cuh) - and rows <= kPdlMaxStepRows; all:
// always; decode or 0: never. Another value is a kInvalidArgument error. Measured on the
// H200 (BERT-base W8A8, 128-token sequences, 2026-12-01): batch 1 0.51 -> 0.47 ms, batch 8
// 3% slower, batch 32 unchanged.
inline constexpr int64_t kPdlMaxStepRows = 256;
bool pdl_in_step(bool gemms_take_part, int64_t rows);

}  // namespace kiln::cuda
