// Timing helpers shared by the CUDA micro-benchmarks (cuda_*_bench.cpp): the median time
// of a call on the default stream between CUDA events, of a call replayed from a CUDA
// graph, and the device-to-device copy
// rate that the tables quote as the bandwidth ceiling of the same run.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_context.h"
#include "backends/cuda/event_timing.h"
#include "backends/cuda/ops/gemv.h"

namespace kiln::cuda::bench {

// The decode GEMVs of the Llama shapes the benches time: n x k (gate|up: n per half) and
// the epilogue the model fuses in.
struct GemvShape {
  const char* what;
  int64_t n, k;
  GemvEpilogue epi;
};
inline constexpr GemvShape kLlamaGemvShapes[] = {
    {"8B qkv", 6144, 4096, GemvEpilogue::kNone},        {"8B o", 4096, 4096, GemvEpilogue::kNone},
    {"8B gate|up", 14336, 4096, GemvEpilogue::kSwiGlu}, {"8B down", 4096, 14336, GemvEpilogue::kNone},
    {"8B lm head", 128256, 4096, GemvEpilogue::kNone},  {"1.1B qkv", 2560, 2048, GemvEpilogue::kNone},
    {"1.1B o", 2048, 2048, GemvEpilogue::kNone},        {"1.1B gate|up", 5632, 2048, GemvEpilogue::kSwiGlu},
    {"1.1B down", 2048, 5632, GemvEpilogue::kNone},
};

// Median ms of one call of f over `reps` repeats, each timing `batch` calls back to back
// between two events (batch 1: launch latency included; batch 20: the per-kernel time of
// a busy stream, as in a decode step's CUDA graph), after a few warm-up calls.
template <typename F>
float median_ms(F&& f, int reps = 50, int batch = 1) {
  cudaEvent_t a, b;
  KILN_CUDA_CHECK(cudaEventCreate(&a));
  KILN_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 5; ++i) f();
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    KILN_CUDA_CHECK(cudaEventRecord(a));
    for (int j = 0; j < batch; ++j) f();
    KILN_CUDA_CHECK(cudaEventRecord(b));
    KILN_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms / float(batch));
  }
  std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return t[t.size() / 2];
}

// Median ms of one call of f when `calls` calls (f enqueues on s) are captured in one CUDA
// graph and the graph is replayed `reps` times after 3 warm-up replays: no host launch cost
// between the calls, as in a decode step's or an encoder forward's graph.
template <typename F>
float graph_ms(F&& f, cudaStream_t s, int calls = 10, int reps = 30) {
  cudaGraph_t g = nullptr;
  cudaGraphExec_t ge = nullptr;
  KILN_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < calls; ++i) f();
  KILN_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  KILN_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t a, b;
  KILN_CUDA_CHECK(cudaEventCreate(&a));
  KILN_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int i = 0; i < reps + 3; ++i) {
    KILN_CUDA_CHECK(cudaEventRecord(a, s));
    KILN_CUDA_CHECK(cudaGraphLaunch(ge, s));
    KILN_CUDA_CHECK(cudaEventRecord(b, s));
    KILN_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    if (i >= 3) t.push_back(ms / float(calls));
  }
  std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  return t[t.size() / 2];
}

// GB/s of a 1 GiB device-to-device copy, read + write bytes (event_timing.h).
inline double device_copy_gbs() { return kiln::cuda::device_copy_gbs(nullptr); }

}  // namespace kiln::cuda::bench
