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

// The median of `reps` replays of a CUDA graph holding `batch` calls of run(stream), per
// call: what the calls cost inside a graph, as an engine's forwards and steps run them.
// Back-to-back eager launches of a kernel of 10-40 us measure mostly the host's launch
// work (CUTLASS's initialize and launch: the int8 GEMM's timings at 4096 rows read ~2x
// their graph times and settled near-ties on that, bench/RESULTS.md session 48; used with
// KILN_CUDA_INT8_TUNE_GRAPH=1). One eager call first (warm-up, host-side attributes), then the
// capture on a private non-blocking stream (s may be the legacy default stream, which cannot
// capture); s is synchronized before. run must launch onto the stream it is given.
template <typename Run>
float median_graph_ms(cudaStream_t s, int reps, int batch, Run&& run) {
  KILN_CUDA_CHECK(cudaStreamSynchronize(s));
  struct Res {
    cudaStream_t cs = nullptr;
    cudaGraph_t g = nullptr;
    cudaGraphExec_t ge = nullptr;
    cudaEvent_t ev[2] = {nullptr, nullptr};
    bool capturing = false;
    ~Res() {
      if (capturing) {  // run threw mid-capture: end it so the stream is usable, drop the graph
        cudaGraph_t partial = nullptr;
        cudaStreamEndCapture(cs, &partial);
        if (partial) cudaGraphDestroy(partial);
        cudaGetLastError();
      }
      if (ge) cudaGraphExecDestroy(ge);
      if (g) cudaGraphDestroy(g);
      for (cudaEvent_t e : ev)
        if (e) cudaEventDestroy(e);
      if (cs) cudaStreamDestroy(cs);
    }
  } r;
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&r.cs, cudaStreamNonBlocking));
  KILN_CUDA_CHECK(cudaEventCreate(&r.ev[0]));
  KILN_CUDA_CHECK(cudaEventCreate(&r.ev[1]));
  run(r.cs);  // warm-up, outside the capture
  KILN_CUDA_CHECK(cudaStreamSynchronize(r.cs));
  KILN_CUDA_CHECK(cudaStreamBeginCapture(r.cs, cudaStreamCaptureModeThreadLocal));
  r.capturing = true;
  for (int i = 0; i < std::max(batch, 1); ++i) run(r.cs);
  r.capturing = false;
  KILN_CUDA_CHECK(cudaStreamEndCapture(r.cs, &r.g));
  KILN_CUDA_CHECK(cudaGraphInstantiate(&r.ge, r.g, 0));
  KILN_CUDA_CHECK(cudaGraphLaunch(r.ge, r.cs));  // warm-up replay
  std::vector<float> ms(size_t(std::max(reps, 1)));
  for (float& t : ms) {
    KILN_CUDA_CHECK(cudaEventRecord(r.ev[0], r.cs));
    KILN_CUDA_CHECK(cudaGraphLaunch(r.ge, r.cs));
    KILN_CUDA_CHECK(cudaEventRecord(r.ev[1], r.cs));
    KILN_CUDA_CHECK(cudaEventSynchronize(r.ev[1]));
    KILN_CUDA_CHECK(cudaEventElapsedTime(&t, r.ev[0], r.ev[1]));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2] / float(std::max(batch, 1));
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
