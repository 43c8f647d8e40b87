// event_timing.h's graph timing: what it returns, that it captures every call onto its own
// stream (the legacy default stream, which cannot capture, may be the caller's), and that
// a call that throws mid-capture leaves no capture behind. Skips without a GPU.
#include "backends/cuda/event_timing.h"

#include <gtest/gtest.h>

#include <stdexcept>

#include "backends/cuda/ops/convert.h"
#include "cuda_test_util.h"

namespace kiln::cuda {
namespace {

TEST(CudaEventTiming, GraphTimingRunsEveryCallOnItsStream) {
  KILN_SKIP_WITHOUT_CUDA();
  constexpr int64_t kN = int64_t(1) << 22;
  DeviceBuffer b(size_t(kN) * 4);
  int calls = 0;
  cudaStream_t seen = nullptr;
  const float ms = median_graph_ms(nullptr, 3, 4, [&](cudaStream_t st) {
    ++calls;
    seen = st;
    launch_fill_random(b.get(), DType::kF32, kN, 1, st);
  });
  EXPECT_GT(ms, 0.0f);
  EXPECT_LT(ms, 1000.0f);
  EXPECT_EQ(calls, 1 + 4);   // one eager warm-up, then the captured batch
  EXPECT_NE(seen, nullptr);  // a private stream, not the caller's legacy one
  // The legacy stream still works afterwards.
  launch_fill_random(b.get(), DType::kF32, kN, 2, nullptr);
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
}

TEST(CudaEventTiming, ACallThatThrowsMidCaptureLeavesNoCapture) {
  KILN_SKIP_WITHOUT_CUDA();
  DeviceBuffer b(4096);
  int calls = 0;
  EXPECT_THROW(median_graph_ms(nullptr, 3, 4,
                               [&](cudaStream_t st) {
                                 if (++calls == 3) throw std::runtime_error("mid-capture");
                                 launch_fill_random(b.get(), DType::kF32, 1024, 1, st);
                               }),
               std::runtime_error);
  // The thread can allocate (an unsafe call while a thread-local capture is open) and time
  // again.
  DeviceBuffer more(4096);
  EXPECT_GT(median_graph_ms(
                nullptr, 2, 2,
                [&](cudaStream_t st) { launch_fill_random(more.get(), DType::kF32, 1024, 3, st); }),
            0.0f);
  launch_fill_random(b.get(), DType::kF32, 1024, 2, nullptr);
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace kiln::cuda
