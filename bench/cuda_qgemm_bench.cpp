// q8/q4 prompt GEMMs at prefill row counts: the GEMM that decodes the weight in shared
// memory (launch_qgemm, KILN_CUDA_QGEMM=fused) against the path it would replace (weight
// tiles dequantized into a workspace, each multiplied by cuBLASLt: the tile rows the Linear
// op takes, dequant_tile_rows) and against cuBLASLt on a bf16 copy of the weight (what the
// same model runs in bf16), on the Llama-3.1-8B and TinyLlama-1.1B layer shapes; the fused
// GEMM with CTAs of 4 and of 8 warps; up to 128 rows also the dp4a GEMV over even chunks
// of at most 8 rows (KILN_CUDA_QGEMV_CHUNK_ROWS: each chunk streams the codes), and the
// dequantize kernel alone over the whole weight in tiles (its output's GB/s), and up to 64
// rows the skinny GEMM (launch_qgemm_skinny: weights dequantized in registers) at 1, 2, 4
// and 8 k splits (and its rule's count's GB/s of codes). Each time
// is the median of 10 replays of a CUDA graph of 5 calls; cuBLASLt's algorithms are timed
// first (Gemm::tune) for every shape it meets. TFLOP/s = 2·m·n·k / time.
//   cuda_qgemm_bench [shape filter, e.g. 8B] [rows, e.g. 128]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/ops/convert.h"
#include "backends/cuda/ops/gemm.h"
#include "backends/cuda/ops/gemv_quant.h"
#include "core/env_switch.h"
#include "core/weight_quant.h"
#include "cuda_bench_util.h"

using namespace kiln;
using namespace kiln::cuda;

namespace {

struct QShape {
  const char* what;
  int64_t n, k;
};

}  // namespace

int main(int argc, char** argv) {
  const char* filter = argc > 1 ? argv[1] : "";
  const int64_t only_m = argc > 2 ? std::atoll(argv[2]) : 0;
  const QShape shapes[] = {{"8B qkv", 6144, 4096},      {"8B o", 4096, 4096},
                           {"8B gate|up", 28672, 4096}, {"8B down", 4096, 14336},
                           {"1.1B qkv", 2560, 2048},    {"1.1B gate|up", 11264, 2048},
                           {"1.1B down", 2048, 5632}};
  const std::vector<int64_t> rows{16, 32, 64, 128, 512, 2048};
  int dev = 0, sms = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const DType t = DType::kBF16;
  // KILN_CUDA_DEQUANT_WORDS=0: the tiles through the earlier dequantize kernel.
  const bool words = env_switch("KILN_CUDA_DEQUANT_WORDS", "one thread per code word",
                                "one thread per 16-byte chunk (the earlier kernel)");
  cudaStream_t s = nullptr;
  KILN_CUDA_CHECK(cudaStreamCreate(&s));
  std::printf(
      "| shape (n x k) | format | rows | bf16 cuBLASLt us | tiles + cuBLASLt us | dequantize us "
      "(GB/s out) | "
      "GEMV chunks us | skinny us at 1 / 2 / 4 / 8 splits (the rule's: GB/s of codes) | fused us, "
      "4 / 8 warps | fused TFLOP/s (faster) "
      "|"
      " tiles / fused | bf16 / fused |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::mt19937_64 rng(11);
  for (const QShape& sh : shapes) {
    if (!std::strstr(sh.what, filter)) continue;
    std::vector<float> wf(size_t(sh.n * sh.k));
    std::uniform_real_distribution<float> u(-0.05f, 0.05f);
    for (float& v : wf) v = u(rng);
    DeviceBuffer w16(size_t(sh.n * sh.k) * 2);
    launch_fill_random(w16.get(), t, sh.n * sh.k, 5, s);
    for (QuantFormat f : {QuantFormat::kQ4, QuantFormat::kQ8}) {
      const QuantImage img =
          quant_image(quantize_rows(wf.data(), sh.n, sh.k, f), QuantLayout::kRows);
      DeviceBuffer wq(img.bytes.size());
      KILN_CUDA_CHECK(
          cudaMemcpy(wq.get(), img.bytes.data(), img.bytes.size(), cudaMemcpyHostToDevice));
      const QuantWeightView w = img.view_at(wq.get());
      for (const int64_t m : only_m ? std::vector<int64_t>{only_m} : rows) {
        DeviceBuffer x(size_t(m * sh.k) * 2), y(size_t(m * sh.n) * 2);
        launch_fill_random(x.get(), t, m * sh.k, 3, s);
        Gemm g;
        g.tune(t, x.get(), w16.get(), nullptr, y.get(), m, sh.n, sh.k, s);
        const float bf16 = bench::graph_ms(
            [&] { g.run(t, x.get(), w16.get(), nullptr, y.get(), m, sh.n, sh.k, s); }, s, 5, 10);
        // The Linear op's tile path: tiles of tile_rows weight rows (the wide rule on).
        const int64_t tile = dequant_tile_rows(sh.n, sh.k, 2, m, sms, true);
        DeviceBuffer ws(size_t(tile * sh.k) * 2);
        for (int64_t r0 = 0; r0 < sh.n; r0 += tile)
          g.tune(t, x.get(), ws.get(), nullptr, y.get(), m, std::min(tile, sh.n - r0), sh.k, s);
        const float tiles = bench::graph_ms(
            [&] {
              for (int64_t r0 = 0; r0 < sh.n; r0 += tile) {
                const int64_t rr = std::min(tile, sh.n - r0);
                launch_dequant_rows(t, w, r0, rr, ws.get(), s, words);
                g.run(t, x.get(), ws.get(), nullptr, static_cast<char*>(y.get()) + size_t(r0) * 2,
                      m, rr, sh.k, s, sh.n);
              }
            },
            s, 5, 10);
        const float deq = bench::graph_ms(
            [&] {
              for (int64_t r0 = 0; r0 < sh.n; r0 += tile)
                launch_dequant_rows(t, w, r0, std::min(tile, sh.n - r0), ws.get(), s, words);
            },
            s, 5, 10);
        // The default (dp4a) GEMV over even chunks of at most kQGemvMaxRows rows.
        float chunked = 0.0f;
        if (m <= 128) {
          const int64_t chunks = (m + kQGemvMaxRows - 1) / kQGemvMaxRows,
                        per = (m + chunks - 1) / chunks;
          chunked = bench::graph_ms(
              [&] {
                for (int64_t r0 = 0; r0 < m; r0 += per)
                  launch_gemv_quant(t, static_cast<const char*>(x.get()) + size_t(r0 * sh.k) * 2, w,
                                    nullptr, static_cast<char*>(y.get()) + size_t(r0 * sh.n) * 2,
                                    std::min(per, m - r0), sh.n, s, GemvEpilogue::kNone,
                                    QGemvKernel::kDp4a, false);
              },
              s, 5, 10);
        }
        char chunked_us[32] = "-";
        if (chunked > 0.0f) std::snprintf(chunked_us, sizeof chunked_us, "%.1f", chunked * 1e3);
        char skinny_us[64] = "-";
        if (m <= kQGemmSkinnyMaxRows) {
          // 1, 2, 4 and 8 k splits; the rule's count and its GB/s of codes.
          const int rule = qgemm_skinny_splits(sh.n, sh.k, f, sms);
          DeviceBuffer part(size_t(kQGemmSkinnyMaxSplits * m * sh.n) * sizeof(float));
          float sk[4], at_rule = 0.0f;
          for (int i = 0; i < 4; ++i) {
            sk[i] = bench::graph_ms(
                [&] {
                  launch_qgemm_skinny(t, x.get(), w, nullptr, y.get(), m, sh.n, s, 1 << i,
                                      part.get(), part.size());
                },
                s, 5, 10);
            if (1 << i == rule) at_rule = sk[i];
          }
          std::snprintf(skinny_us, sizeof skinny_us, "%.1f / %.1f / %.1f / %.1f (%d: %.0f)",
                        sk[0] * 1e3, sk[1] * 1e3, sk[2] * 1e3, sk[3] * 1e3, rule,
                        double(w.bytes()) / (at_rule * 1e-3) / 1e9);
        }
        // The fused GEMM with CTAs of 4 and of 8 warps; the faster one in the ratios.
        const float f4 = bench::graph_ms(
            [&] { launch_qgemm(t, x.get(), w, nullptr, y.get(), m, sh.n, s, 4); }, s, 5, 10);
        const float f8 = bench::graph_ms(
            [&] { launch_qgemm(t, x.get(), w, nullptr, y.get(), m, sh.n, s, 8); }, s, 5, 10);
        const float fused = std::min(f4, f8);
        std::printf(
            "| %s (%lld x %lld) | %s | %lld | %.1f | %.1f | %.1f (%.0f) | %s | %s | %.1f / %.1f | "
            "%.0f | %.2fx | %.2fx |\n",
            sh.what, (long long)sh.n, (long long)sh.k, quant_format_name(f), (long long)m,
            bf16 * 1e3, tiles * 1e3, deq * 1e3, double(sh.n * sh.k) * 2 / (deq * 1e-3) / 1e9,
            chunked_us, skinny_us, f4 * 1e3, f8 * 1e3,
            2.0 * double(m) * double(sh.n) * double(sh.k) / (fused * 1e-3) / 1e12, tiles / fused,
            bf16 / fused);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
