// TopKLogits on the device: per row of logits [rows, v], the k largest values (f32,
// descending; equal values: lower index first; NaN after every number), their ids (i32;
// -1 pads rows with v < k) and log-softmax values (f32), exactly the CPU kernel's
// outputs (backends/cpu/kernels/kernels.h). Decode steps run it inside their CUDA
// graph so that only [rows, k] crosses to the host. Tested against the CPU backend in
// tests/backends/cuda/topk_test.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace kiln::cuda {

// k in [1, 1024] (ir::kTopKLogitsMaxK); outputs are [rows, k].
void launch_topk_logits(DType t, const void* x, int64_t rows, int64_t v, int64_t k, float* values, int32_t* ids,
                        float* logprobs, cudaStream_t s);

}  // namespace kiln::cuda
