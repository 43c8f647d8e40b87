// Row selection and pooling on the device: GatherRows (out[r] = x[rows[r]], rows checked
// on the host) and SeqMeanPool (mean of each sequence's rows, f32 sums).
// Tested against the CPU backend in tests/backends/cuda/ops_test.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace kiln::cuda {

void launch_gather_rows(DType t, const void* x, const int32_t* rows, int64_t r, int64_t dim, void* out,
                        cudaStream_t s);
// seqs: [b] × {q_start, q_len, ...} with `seq_stride` int32 per entry (the step metadata).
void launch_seq_mean_pool(DType t, const void* x, const int32_t* seqs, int64_t seq_stride, int64_t b,
                          int64_t dim, void* out, cudaStream_t s);

}  // namespace kiln::cuda
