// The skinny split-k GEMM (ops/gemm_skinny.h) against cuBLASLt at the row counts of
// batched decode steps and short encoder batches: the Llama-3.2-1B and Llama-3.1-8B layer
// shapes at 16-128 rows and BERT-base's at 128 rows (one sequence of 128 tokens), bf16.
// cuBLASLt: every algorithm its heuristic offers (Gemm::tune with the skinny tactics off)
// and the fastest kept; the skinny GEMM in each configuration (rows a CTA x splits). Each
// time is the median of 30 launches of a CUDA graph of 20 calls (as in a decode step's
// graph: no host launch cost), every call on its own copy of the weights from a
// rotation larger than L2, so weights come from HBM. Weight
// GB/s against a device-to-device copy of the same run.
//   cuda_gemm_skinny_bench [shape filter, e.g. 1B]
//   cuda_gemm_skinny_bench <shape filter> <rows>   one call of each configuration (profiling)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cuda/cuda_context.h"
#include "backends/cuda/ops/convert.h"
#include "backends/cuda/ops/gemm.h"
#include "backends/cuda/ops/gemm_skinny.h"
#include "cuda_bench_util.h"

using namespace kiln;
using namespace kiln::cuda;

namespace {

struct Shape {
  const char* what;
  int64_t n, k;
  std::vector<int64_t> rows;
};

}  // namespace

int main(int argc, char** argv) {
  const char* filter = argc > 1 ? argv[1] : "";
  // cuda_gemm_skinny_bench <filter> <m>: one eager call of each configuration at m rows
  // (for a profiler such as ncu), no table.
  const int64_t profile_m = argc > 2 ? std::atoll(argv[2]) : 0;
  setenv("KILN_CUDA_SKINNY_GEMM", "0", 1);  // the Gemm below is cuBLASLt alone
  const double copy_gbs = bench::device_copy_gbs();
  std::printf("device-to-device copy: %.0f GB/s (read + write)\n\n", copy_gbs);
  const std::vector<int64_t> decode_rows{16, 32, 64, 128};
  const Shape shapes[] = {
      {"1B qkv", 3072, 2048, decode_rows},       {"1B o", 2048, 2048, decode_rows},
      {"1B gate|up", 16384, 2048, decode_rows},  {"1B down", 2048, 8192, decode_rows},
      {"8B qkv", 6144, 4096, decode_rows},       {"8B o", 4096, 4096, decode_rows},
      {"8B gate|up", 28672, 4096, decode_rows},  {"8B down", 4096, 14336, decode_rows},
      {"BERT qkv", 2304, 768, {128}},            {"BERT o", 768, 768, {128}},
      {"BERT up", 3072, 768, {128}},             {"BERT down", 768, 3072, {128}},
  };
  std::printf("| shape (n x k) | rows | cuBLASLt best us | skinny us: 64 rows x splits 1 / 2 / 4 / 8, then 128 rows x 1 / 2 / 4 / 8 | skinny best | its us with PDL | speedup (no PDL) |"
              " weight GB/s (best of both, no PDL) | %% of copy |\n|---|---|---|---|---|---|---|---|---|\n");
  const DType t = DType::kBF16;
  cudaStream_t s = nullptr;
  KILN_CUDA_CHECK(cudaStreamCreate(&s));
  for (const Shape& sh : shapes) {
    if (!std::strstr(sh.what, filter)) continue;
    const size_t wbytes = size_t(sh.n * sh.k) * 2;
    // Enough weight copies that a rotation overflows L2 (>= 256 MB), at most 32.
    const int copies = int(std::clamp<size_t>((size_t(256) << 20) / wbytes + 1, 1, 32));
    std::vector<DeviceBuffer> ws;
    for (int i = 0; i < copies; ++i) {
      ws.emplace_back(wbytes);
      launch_fill_random(ws.back().get(), t, sh.n * sh.k, uint32_t(7 + i), nullptr);
    }
    for (const int64_t m : sh.rows) {
      if (profile_m && m != profile_m) continue;
      DeviceBuffer x(size_t(m * sh.k) * 2), y(size_t(m * sh.n) * 2);
      launch_fill_random(x.get(), t, m * sh.k, 3, nullptr);
      if (profile_m) {  // one eager call of each configuration, for a profiler
        for (int c = 0; c < kSkinnyConfigs; ++c)
          launch_gemm_skinny(c, t, x.get(), ws[0].get(), nullptr, nullptr, y.get(), m, sh.n, sh.k, 0, s);
        KILN_CUDA_CHECK(cudaStreamSynchronize(s));
        continue;
      }
      Gemm g;
      g.tune(t, x.get(), ws[0].get(), nullptr, y.get(), m, sh.n, sh.k, s);
      int next = 0;
      auto rotate = [&] {
        const void* w = ws[size_t(next)].get();
        next = (next + 1) % copies;
        return w;
      };
      const float lt = bench::graph_ms([&] { g.run(t, x.get(), rotate(), nullptr, y.get(), m, sh.n, sh.k, s); }, s, 20);
      float sk[kSkinnyConfigs];
      float best = 1e30f;
      int best_c = 0;
      std::string cells;
      for (int c = 0; c < kSkinnyConfigs; ++c) {
        sk[c] = bench::graph_ms(
            [&] { launch_gemm_skinny(c, t, x.get(), rotate(), nullptr, nullptr, y.get(), m, sh.n, sh.k, 0, s); }, s,
            20);
        if (sk[c] < best) best = sk[c], best_c = c;
        char cell[32];
        std::snprintf(cell, sizeof cell, "%s%.1f", c ? " / " : "", double(sk[c]) * 1e3);
        cells += cell;
      }
      // The best configuration again with programmatic dependent launch, as in decode steps
      // (each call's weight loads start while the previous call finishes).
      set_pdl_allowed(true);
      const float pdl = bench::graph_ms(
          [&] { launch_gemm_skinny(best_c, t, x.get(), rotate(), nullptr, nullptr, y.get(), m, sh.n, sh.k, 0, s); }, s,
          20) * 1e3f;
      set_pdl_allowed(false);
      const float fastest = std::min(best, lt);
      const double gbs = double(wbytes) / (fastest * 1e-3) / 1e9;
      std::printf("| %s (%lld x %lld) | %lld | %.1f | %s | %.1f | %.1f | %.2fx | %.0f | %.0f%% |\n", sh.what,
                  (long long)sh.n, (long long)sh.k, (long long)m, lt * 1e3, cells.c_str(), best * 1e3, pdl, lt / best,
                  gbs, 100.0 * gbs / copy_gbs);
      std::fflush(stdout);
    }
  }
  return 0;
}
