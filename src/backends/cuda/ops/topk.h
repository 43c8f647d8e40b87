// TopKLogits on the device: per row of logits [rows, v], the k largest values (f32,
// descending; equal values: lower index first; NaN after every number), their ids (i32;
// -1 pads rows with v < k) and log-softmax values (f32), exactly the CPU kernel's
// outputs (backends/cpu/kernels/kernels.h). Decode steps run it inside their CUDA
// graph so that only [rows, k] crosses to the host. Tested against the CPU backend in
// tests/backends/cuda/topk_test.cpp; timed by bench/cuda_topk_bench.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace kiln::cuda {

// What plans depend on besides the shapes: the device and the switches, read once per
// compiled graph (topk_logits_config) so that planning a step is arithmetic only.
struct TopKConfig {
  DType dtype = DType::kBF16;  // of the logits
  int num_sms = 0;
  size_t max_merge_smem = 0;  // dynamic shared memory a merge CTA may take on this device
  // Chunk-kernel CTAs resident on the device at once, by chunk size 512, 1024, ... 8192.
  int64_t resident[5] = {};
  int chunk = 0;          // KILN_CUDA_TOPK_CHUNK=<512..8192> forces it; 0: chosen from the shapes
  bool fit_grid = true;   // KILN_CUDA_TOPK_GRID=full: a CTA per chunk
};

// The configuration for logits of dtype t on the current device; it also lets the merge
// kernel take its shared memory there (a host-side attribute, set before any capture).
// A malformed switch is a kInvalidArgument error naming it.
TopKConfig topk_logits_config(DType t);

// How a launch cuts its rows. Split plans (chunks > 0): each row cut into chunks over
// many CTAs, then a merge per row, with scratch_bytes of device scratch for the chunks'
// candidates and partial log-sum-exps; the caller provides them, so that a launch
// allocates nothing and can be captured in a CUDA graph. chunks == 0: one CTA walks each
// row (rows the split does not fit), no scratch.
struct TopKPlan {
  DType dtype = DType::kBF16;
  int chunk_log2 = 0;  // chunk = 2^chunk_log2 logits (512 to 8192)
  int64_t chunks = 0;  // per row
  int64_t kc = 0;      // candidates per chunk: min(k, chunk)
  // CTAs of the chunk kernel: rows * chunks (a CTA a chunk), or as many as fit on the
  // device at once, each looping over chunks and loading its next while selecting in the
  // current one.
  int64_t grid = 0;
  size_t scratch_bytes = 0;
  bool split() const { return chunks > 0; }
};

// The plan for these shapes. `chunk` (a power of two in [512, 8192]; 0: the config's)
// forces the chunk size of the split kernels (benches sweep it). Shapes the split
// kernels do not fit (rows no wider than a chunk or than k, too many candidates to merge
// in shared memory) get the one-CTA-per-row plan.
TopKPlan topk_logits_plan(const TopKConfig& c, int64_t rows, int64_t v, int64_t k, int chunk = 0);

// k in [1, 1024] (ir::kTopKLogitsMaxK); outputs are [rows, k]. `plan`: made for these
// shapes and dtype t. `scratch`: at least plan.scratch_bytes of device memory.
void launch_topk_logits(DType t, const void* x, int64_t rows, int64_t v, int64_t k, float* values, int32_t* ids,
                        float* logprobs, const TopKPlan& plan, void* scratch, cudaStream_t s);

}  // namespace kiln::cuda
