// Empties the L2 cache of other data before a timed kernel, so that GEMM tactics are timed
// on weights streamed from memory, as a decode step's Linears read them, and not on weights
// that the previous repetition left in L2 (gemm.cpp's timing at decode row counts).
// Exercised by tests/backends/cuda/gemm_tune_test.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace kiln::cuda {

// Reads `bytes` of `buf` (a zeroed device buffer of at least twice the L2 size, 16-byte
// aligned; its last 16 bytes may be written).
void launch_l2_flush(const void* buf, size_t bytes, cudaStream_t s);

}  // namespace kiln::cuda
