// FP8 (E4M3, per-tensor scales) against bf16 GEMMs on the Llama-3.1-8B layer shapes at
// prefill row counts, each tuned (cuBLASLt's algorithms timed, the fastest kept) in the
// same run: bf16, FP8 with precise accumulation (kiln's default), FP8 with Hopper's fast
// accumulation (KILN_CUDA_FP8_FAST_ACCUM=1). Prints us and TFLOP/s per shape, the 32-layer sum, and how far the
// fast accumulation's outputs move from the precise one's on the same codes (max |diff|
// over max |y|). Ceiling: an 8192^3 bf16 GEMM in the same run. Timing only; FP8 accuracy
// is tests/backends/cuda/fp8_test.cpp and the RESULTS perplexity entries.
//   cuda_fp8_gemm_bench [ROWS...]   (default 512 2048)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "backends/cuda/cuda_context.h"
#include "cuda_bench_util.h"
#include "backends/cuda/ops/convert.h"
#include "backends/cuda/ops/fp8.h"
#include "backends/cuda/ops/gemm.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"

using namespace kiln;
using namespace kiln::cuda;

namespace {

// 20 repeats of 5 calls back to back.
template <typename F>
float median_ms(F&& f, int reps = 20, int batch = 5) {
  return bench::median_ms(f, reps, batch);
}

std::vector<float> to_host_f32(const void* bf16, int64_t n) {
  Tensor h(DType::kBF16, {n});
  KILN_CUDA_CHECK(cudaMemcpy(h.data(), bf16, size_t(n) * 2, cudaMemcpyDeviceToHost));
  const Tensor f = h.to(DType::kF32);
  return std::vector<float>(f.data_as<float>(), f.data_as<float>() + n);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> rows;
  for (int i = 1; i < argc; ++i) rows.push_back(std::atoll(argv[i]));
  if (rows.empty()) rows = {512, 2048};
  Gemm precise, fast;
  precise.set_fp8_fast_accum(false);
  fast.set_fp8_fast_accum(true);
  {
    const int64_t s = 8192;
    DeviceBuffer a(size_t(s * s) * 2), b(size_t(s * s) * 2), c(size_t(s * s) * 2);
    launch_fill_random(a.get(), DType::kBF16, s * s, 1, nullptr);
    launch_fill_random(b.get(), DType::kBF16, s * s, 2, nullptr);
    const float ms = median_ms([&] { fast.run(DType::kBF16, a.get(), b.get(), nullptr, c.get(), s, s, s, nullptr); }, 10, 3);
    std::printf("cuBLASLt 8192^3 bf16: %.0f TFLOP/s\n\n", 2.0 * double(s) * s * s / (ms * 1e-3) / 1e12);
  }
  struct S {
    const char* what;
    int64_t n, k;
  };
  const S shapes[] = {{"qkv", 6144, 4096}, {"o", 4096, 4096}, {"gate|up", 28672, 4096}, {"down", 4096, 14336}};
  std::printf("| Linear (n x k) | rows | bf16 us (TFLOP/s) | fp8 precise us (TFLOP/s) | fp8 fast us (TFLOP/s) |"
              " fast vs bf16 | fast vs precise: max|diff| / max|y| |\n|---|---|---|---|---|---|---|\n");
  DeviceBuffer scales(32 * sizeof(float));
  {
    const float h[8] = {0.01f, 0, 0, 0, 0.02f, 0, 0, 0};  // w scale, x scale 16 bytes apart
    KILN_CUDA_CHECK(cudaMemcpy(scales.get(), h, sizeof(h), cudaMemcpyHostToDevice));
  }
  const auto* sc = static_cast<const float*>(scales.get());
  for (int64_t m : rows) {
    double sum[3] = {0, 0, 0};
    for (const S& s : shapes) {
      DeviceBuffer x(size_t(m * s.k) * 2), w(size_t(s.n * s.k) * 2), y(size_t(m * s.n) * 2), y2(size_t(m * s.n) * 2);
      DeviceBuffer xq(size_t(m * s.k)), wq(size_t(s.n * s.k));
      launch_fill_random(x.get(), DType::kBF16, m * s.k, 3, nullptr);
      launch_fill_random(w.get(), DType::kBF16, s.n * s.k, 4, nullptr);
      launch_fp8_quantize(DType::kBF16, x.get(), m * s.k, 64.0f, static_cast<uint8_t*>(xq.get()), nullptr);
      launch_fp8_quantize(DType::kBF16, w.get(), s.n * s.k, 64.0f, static_cast<uint8_t*>(wq.get()), nullptr);
      fast.tune(DType::kBF16, x.get(), w.get(), nullptr, y.get(), m, s.n, s.k, nullptr);
      precise.tune_fp8(xq.get(), wq.get(), sc, nullptr, y.get(), m, s.n, s.k, nullptr);
      fast.tune_fp8(xq.get(), wq.get(), sc, nullptr, y.get(), m, s.n, s.k, nullptr);
      const float t[3] = {
          median_ms([&] { fast.run(DType::kBF16, x.get(), w.get(), nullptr, y.get(), m, s.n, s.k, nullptr); }),
          median_ms([&] { precise.run_fp8(xq.get(), wq.get(), sc, nullptr, y.get(), m, s.n, s.k, nullptr); }),
          median_ms([&] { fast.run_fp8(xq.get(), wq.get(), sc, nullptr, y2.get(), m, s.n, s.k, nullptr); })};
      KILN_CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<float> a = to_host_f32(y.get(), m * s.n), b = to_host_f32(y2.get(), m * s.n);
      float dmax = 0, ymax = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        dmax = std::max(dmax, std::fabs(a[i] - b[i]));
        ymax = std::max(ymax, std::fabs(a[i]));
      }
      const double flop = 2.0 * double(m) * double(s.n) * double(s.k);
      for (int i = 0; i < 3; ++i) sum[i] += t[i];
      std::printf("| %s %lldx%lld | %lld | %.1f (%.0f) | %.1f (%.0f) | %.1f (%.0f) | %.2fx | %.2e |\n", s.what,
                  (long long)s.n, (long long)s.k, (long long)m, t[0] * 1e3, flop / (t[0] * 1e-3) / 1e12, t[1] * 1e3,
                  flop / (t[1] * 1e-3) / 1e12, t[2] * 1e3, flop / (t[2] * 1e-3) / 1e12, t[0] / t[2],
                  ymax > 0 ? dmax / ymax : 0.0f);
    }
    std::printf("| 32 layers' Linears | %lld | %.2f ms | %.2f ms | %.2f ms | %.2fx | |\n", (long long)m, 32 * sum[0],
                32 * sum[1], 32 * sum[2], sum[0] / sum[2]);
  }
  return 0;
}
