// Weight-streaming GEMV bandwidth on the GPU (the decode GEMMs of kiln's CUDA backend):
// for the Linear shapes of Llama-3.1-8B, Llama-3.2-1B/TinyLlama and GPT-2, batch rows 1
// and 4, the median kernel time of one launch alone and of 20 back to back (CUDA events,
// 50 repeats), and the weight bytes per second back to back, against a device-to-device
// copy measured in the same run (read + write bytes).
//   cuda_gemv_bench
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "backends/cuda/cuda_context.h"
#include "backends/cuda/ops/convert.h"
#include "backends/cuda/ops/gemv.h"

using namespace kiln;
using namespace kiln::cuda;

namespace {

// Median ms of one call of f: `batch` calls back to back between two events (batch 1:
// launch latency included; batch 20: the per-kernel time of a busy stream, as in a
// decode step's CUDA graph).
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

}  // namespace

int main() {
  const size_t copy_bytes = size_t(1) << 30;
  DeviceBuffer src(copy_bytes), dst(copy_bytes);
  const float copy_ms =
      median_ms([&] { KILN_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), copy_bytes, cudaMemcpyDeviceToDevice)); }, 10);
  const double copy_gbs = 2.0 * double(copy_bytes) / (copy_ms * 1e-3) / 1e9;
  std::printf("device-to-device copy: %.0f GB/s (read + write)\n\n", copy_gbs);
  std::printf("| shape (n x k) | epilogue | rows | us, alone | us, 20 back to back | weight GB/s (back to back) | %% of copy |\n"
              "|---|---|---|---|---|---|---|\n");
  struct S {
    const char* what;
    int64_t n, k;
    GemvEpilogue epi;
  };
  const S shapes[] = {
      {"8B qkv", 6144, 4096, GemvEpilogue::kNone},      {"8B o", 4096, 4096, GemvEpilogue::kNone},
      {"8B gate|up", 14336, 4096, GemvEpilogue::kSwiGlu}, {"8B down", 4096, 14336, GemvEpilogue::kNone},
      {"8B lm head", 128256, 4096, GemvEpilogue::kNone},  {"1.1B qkv", 2560, 2048, GemvEpilogue::kNone},
      {"1.1B o", 2048, 2048, GemvEpilogue::kNone},        {"1.1B gate|up", 5632, 2048, GemvEpilogue::kSwiGlu},
      {"1.1B down", 2048, 5632, GemvEpilogue::kNone},     {"GPT-2 fc", 3072, 768, GemvEpilogue::kGeluTanh},
      {"GPT-2 proj", 768, 3072, GemvEpilogue::kNone},
  };
  for (const S& s : shapes) {
    const int64_t wrows = s.epi == GemvEpilogue::kSwiGlu ? 2 * s.n : s.n;
    const size_t wbytes = size_t(wrows * s.k) * 2;
    DeviceBuffer w(wbytes), x(size_t(4 * s.k) * 2), y(size_t(4 * s.n) * 2);
    launch_fill_random(w.get(), DType::kBF16, wrows * s.k, 1, nullptr);
    launch_fill_random(x.get(), DType::kBF16, 4 * s.k, 2, nullptr);
    for (int64_t m : {1, 4}) {
      auto run = [&] { launch_gemv(DType::kBF16, x.get(), w.get(), nullptr, y.get(), m, s.n, s.k, nullptr, s.epi); };
      const float alone = median_ms(run), ms = median_ms(run, 20, 20);
      const double gbs = double(wbytes) / (ms * 1e-3) / 1e9;
      std::printf("| %s %lldx%lld | %s | %lld | %.1f | %.1f | %.0f | %.0f%% |\n", s.what, (long long)wrows,
                  (long long)s.k, s.epi == GemvEpilogue::kSwiGlu ? "swiglu" : s.epi == GemvEpilogue::kNone ? "-" : "gelu",
                  (long long)m, alone * 1e3, ms * 1e3, gbs, 100.0 * gbs / copy_gbs);
    }
  }
  return 0;
}
