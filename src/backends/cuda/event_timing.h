// Timing launches on a stream with CUDA events, for the kernels' tactic choices at load
// (the fused int8 CUTLASS GEMM's tile configurations) and the device's copy ceiling. Host
// code.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_context.h"

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

// GB/s of a 1 GiB device-to-device copy on s (bytes read + written), the median of 10 after
// a warm-up: the memory ceiling `kiln bench` (Backend::measure_ceilings) and the bench/
// programs rate the weight streams against. Needs 2 GiB free.
inline double device_copy_gbs(cudaStream_t s) {
  constexpr size_t kBytes = size_t(1) << 30;
  DeviceBuffer src(kBytes), dst(kBytes);
  const float ms = median_launch_ms(
      s, 10, [&] { KILN_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), kBytes, cudaMemcpyDeviceToDevice, s)); });
  return 2.0 * double(kBytes) / (double(ms) * 1e-3) / 1e9;
}

}  // namespace kiln::cuda
