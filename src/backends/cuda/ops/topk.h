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

// kSplit: rows cut into chunks over many CTAs, then a merge per row (the default where
// it fits); kSingleCta: one CTA per row walking the whole row (KILN_CUDA_TOPK=old);
// kAuto: kSplit unless the environment says old.
enum class TopKImpl { kAuto, kSplit, kSingleCta };

// How a launch cuts its rows: chunks == 0 means the single-CTA kernel. scratch_bytes of
// device scratch hold the chunks' candidates and partial log-sum-exps (none for the
// single-CTA kernel); the caller provides them, so that a launch allocates nothing and
// can be captured in a CUDA graph.
struct TopKPlan {
  int chunk_log2 = 0;  // chunk = 2^chunk_log2 logits (512 to 8192)
  int64_t chunks = 0;  // per row
  int64_t kc = 0;      // candidates per chunk: min(k, chunk)
  // The chunk kernel's grid: at most the CTAs that fit on the device at once, each
  // looping over chunks and loading its next while selecting in the current one (true),
  // or one CTA a chunk (false: KILN_CUDA_TOPK_GRID=full).
  bool fit_grid = true;
  size_t scratch_bytes = 0;
  bool split() const { return chunks > 0; }
};

// The plan for these shapes on the current device. `chunk` (a power of two in [512,
// 8192]; 0: chosen from the shapes, or KILN_CUDA_TOPK_CHUNK) forces the chunk size of the
// split kernels (benches and tests sweep it). Shapes the split kernels do not fit (rows
// no wider than a chunk or than k, too many candidates to merge in shared memory) get
// the single-CTA plan.
TopKPlan topk_logits_plan(int64_t rows, int64_t v, int64_t k, TopKImpl impl = TopKImpl::kAuto, int chunk = 0);

// k in [1, 1024] (ir::kTopKLogitsMaxK); outputs are [rows, k]. `scratch`: at least
// plan.scratch_bytes of device memory (unused by a single-CTA plan).
void launch_topk_logits(DType t, const void* x, int64_t rows, int64_t v, int64_t k, float* values, int32_t* ids,
                        float* logprobs, const TopKPlan& plan, void* scratch, cudaStream_t s);

}  // namespace kiln::cuda
