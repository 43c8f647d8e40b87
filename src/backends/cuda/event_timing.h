// Timing launches on a stream with CUDA events, for the kernels' tactic choices at load
// (the fused int8 and FP8 CUTLASS GEMMs' tile configurations). Host code.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "backends/cuda/cuda_check.h"

namespace kiln::cuda {

// The median of `reps` timings of run() on s (events recorded around each call, waited
// for), after one untimed warm-up call.
template <typename Run>
float median_launch_ms(cudaStream_t s, int reps, Run&& run) {
  cudaEvent_t ev[2];
  KILN_CUDA_CHECK(cudaEventCreate(&ev[0]));
  if (const cudaError_t err = cudaEventCreate(&ev[1]); err != cudaSuccess) {
    cudaEventDestroy(ev[0]);
    KILN_CUDA_CHECK(err);
  }
  struct Destroy {
    cudaEvent_t* ev;
    ~Destroy() {
      cudaEventDestroy(ev[0]);
      cudaEventDestroy(ev[1]);
    }
  } destroy{ev};
  run();  // warm-up
  std::vector<float> ms(size_t(std::max(reps, 1)));
  for (float& t : ms) {
    KILN_CUDA_CHECK(cudaEventRecord(ev[0], s));
    run();
    KILN_CUDA_CHECK(cudaEventRecord(ev[1], s));
    KILN_CUDA_CHECK(cudaEventSynchronize(ev[1]));
    KILN_CUDA_CHECK(cudaEventElapsedTime(&t, ev[0], ev[1]));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace kiln::cuda
