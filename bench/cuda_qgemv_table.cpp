// The quantized GEMV kernels side by side (`cuda_gemv_bench qgemv [shape filter]`): for the
// decode Linears of Llama-3.1-8B (and TinyLlama-1.1B), q4 and q8 weights, 1, 2, 4 and 8
// token rows, bf16 activations, each kernel (old: kRows f32 on CUDA cores; mma: kMma on
// tensor cores; dp4a: kRows, x rounded to int8, integer dot products) is timed alone and 20
// back to back, without and with programmatic dependent launch (as in a decode step's CUDA
// graph), cycling over enough copies of the weight to exceed twice the L2 (so nothing is
// served from it); the table gives GB/s of the weight bytes streamed (codes, f16 scales,
// row factors) and the percent of the device-to-device copy rate of the same run. Before
// timing, each kernel's output is compared with the bf16 GEMV on the same weights
// dequantized (launch_dequant_rows of its layout): max|q - bf16| / max|bf16| over the row
// counts. Then the dp4a kernel's launch sweep for q4 and q8 at 1, 2, 4 and 8 rows (CTAs
// per SM x load depth x split-K), us back to back with PDL, each variant checked first,
// next to what the built-in rule picks and the sweep's best: what the defaults
// (kDefaultCtasPerSm, kDefaultDepth, qgemv_dp4a_default_splits) are set from.
#include "cuda_qgemv_table.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cuda/cuda_context.h"
#include "backends/cuda/ops/convert.h"
#include "backends/cuda/ops/gemv.h"
#include "backends/cuda/ops/gemv_quant.h"
#include "core/status.h"
#include "cuda_bench_util.h"

namespace kiln::cuda::bench {
namespace {

// Copies of one quantized weight (random codes, f16 scales and mins in [-1, 1), row
// factors in [-1, 1)) in one layout, together larger than twice the L2.
struct WeightCopies {
  std::vector<DeviceBuffer> bufs;
  std::vector<QuantWeightView> views;
  size_t next = 0;
  const QuantWeightView& take() { return views[next++ % views.size()]; }
};

WeightCopies make_copies(QuantFormat f, int64_t rows, int64_t k, QuantLayout layout, size_t l2_bytes, uint32_t seed) {
  WeightCopies c;
  const QuantWeightView shape = quant_view_shape(f, rows, k, layout);
  const size_t code_bytes = size_t(rows) * size_t(shape.code_stride);
  const size_t scale_bytes = size_t(rows) * size_t(shape.scale_stride) * shape.scale_bytes();
  auto up = [](size_t b) { return (b + 255) / 256 * 256; };
  const size_t total = up(code_bytes) + up(scale_bytes) + size_t(rows) * 4;
  const size_t n = std::max<size_t>(1, (2 * l2_bytes + shape.bytes() - 1) / shape.bytes());
  for (size_t i = 0; i < n; ++i) {
    DeviceBuffer b(total);
    auto* base = static_cast<uint8_t*>(b.get());
    launch_fill_random(base, DType::kF32, int64_t(code_bytes / 4), seed + 3 * uint32_t(i), nullptr);
    launch_fill_random(base + up(code_bytes), DType::kF16, int64_t(scale_bytes / 2), seed + 3 * uint32_t(i) + 1, nullptr);
    launch_fill_random(base + up(code_bytes) + up(scale_bytes), DType::kF32, rows, seed + 3 * uint32_t(i) + 2, nullptr);
    QuantWeightView v = shape;
    v.codes = base;
    v.scales = base + up(code_bytes);
    v.row_factor = reinterpret_cast<const float*>(base + up(code_bytes) + up(scale_bytes));
    c.views.push_back(v);
    c.bufs.push_back(std::move(b));
  }
  return c;
}

double max_rel(const void* a_dev, const void* b_dev, size_t n) {
  std::vector<uint16_t> a(n), b(n);
  KILN_CUDA_CHECK(cudaMemcpy(a.data(), a_dev, n * 2, cudaMemcpyDeviceToHost));
  KILN_CUDA_CHECK(cudaMemcpy(b.data(), b_dev, n * 2, cudaMemcpyDeviceToHost));
  double err = 0, ref = 0;
  for (size_t i = 0; i < n; ++i) {
    const double x = bf16_to_f32(a[i]), y = bf16_to_f32(b[i]);
    err = std::isnan(x) ? INFINITY : std::max(err, std::fabs(x - y));
    ref = std::max(ref, std::fabs(y));
  }
  return ref > 0 ? err / ref : err;
}

struct PdlScope {  // launches of this thread carry the PDL attribute while alive
  explicit PdlScope(bool on) { set_pdl_allowed(on); }
  ~PdlScope() { set_pdl_allowed(false); }
};

}  // namespace

void qgemv_kernels_table(const char* filter, double copy_gbs) {
  int dev = 0, l2 = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  std::printf("\nquantized GEMV kernels (bf16 activations; weight copies cycled past 2 x L2 = %d MiB; GB/s = weight "
              "bytes streamed / time, 20 back to back with PDL; %% of the %.0f GB/s copy)\n\n"
              "| shape (rows x k) | weights | epilogue | rows | kernel | us, alone | us, 20 b2b | us, 20 b2b + PDL | "
              "GB/s | %% of copy |\n|---|---|---|---|---|---|---|---|---|---|\n",
              2 * l2 >> 20, copy_gbs);
  const QGemvKernel kernels[] = {QGemvKernel::kRows, QGemvKernel::kMma, QGemvKernel::kDp4a};
  const QGemvKernel def_kernel = qgemv_kernel(DType::kBF16);  // what a compiled graph runs (KILN_CUDA_QGEMV)
  std::vector<std::string> checks, sweeps;
  for (const GemvShape& s : kLlamaGemvShapes) {
    if (!std::strstr(s.what, filter)) continue;
    const bool swiglu = s.epi == GemvEpilogue::kSwiGlu;
    const int64_t wrows = swiglu ? 2 * s.n : s.n, mmax = kQGemvMaxRows;
    DeviceBuffer wdq(size_t(wrows * s.k) * 2), x(size_t(mmax * s.k) * 2), y(size_t(mmax * s.n) * 2),
        yref(size_t(mmax * s.n) * 2);
    launch_fill_random(x.get(), DType::kBF16, mmax * s.k, 2, nullptr);
    for (QuantFormat f : {QuantFormat::kQ4, QuantFormat::kQ8}) {
      WeightCopies rows = make_copies(f, wrows, s.k, QuantLayout::kRows, size_t(l2), 10);
      WeightCopies mma = make_copies(f, wrows, s.k, QuantLayout::kMma, size_t(l2), 20);
      for (QGemvKernel kern : kernels) {
        WeightCopies& wc = kern == QGemvKernel::kMma ? mma : rows;
        const QuantWeightView& w0 = wc.views[0];
        auto run = [&](const QuantWeightView& w, int64_t m) {
          launch_gemv_quant(DType::kBF16, x.get(), w, nullptr, y.get(), m, s.n, nullptr, s.epi, kern);
        };
        // The check: the bf16 GEMV on the same weights dequantized (4 token rows a launch).
        launch_dequant_rows(DType::kBF16, w0, 0, wrows, wdq.get(), nullptr);
        double worst = 0;
        for (int64_t m : {1, 2, 4, 8}) {
          run(w0, m);
          for (int64_t r0 = 0; r0 < m; r0 += 4)
            launch_gemv(DType::kBF16, static_cast<const uint16_t*>(x.get()) + r0 * s.k, wdq.get(), nullptr,
                        static_cast<uint16_t*>(yref.get()) + r0 * s.n, std::min<int64_t>(4, m - r0), s.n, s.k,
                        nullptr, s.epi);
          KILN_CUDA_CHECK(cudaDeviceSynchronize());
          worst = std::max(worst, max_rel(y.get(), yref.get(), size_t(m * s.n)));
        }
        const std::string name = str_cat(quant_format_name(f), " ", qgemv_kernel_name(kern));
        checks.push_back(str_cat(s.what, " ", name, ": max|q - bf16 gemv| / max|bf16 gemv| = ", worst,
                                 worst < 2e-2 ? " ok" : " TOO LARGE"));
        for (int64_t m : {1, 2, 4, 8}) {
          auto call = [&] { run(wc.take(), m); };
          const float alone = median_ms(call), b2b = median_ms(call, 50, 20);
          float pdl = 0;
          {
            PdlScope on(true);
            pdl = median_ms(call, 50, 20);
          }
          const double gbs = double(w0.bytes()) / (pdl * 1e-3) / 1e9;
          std::printf("| %s %lldx%lld | %s | %s | %lld | %s | %.1f | %.1f | %.1f | %.0f | %.0f%% |\n", s.what,
                      (long long)wrows, (long long)s.k, quant_format_name(f), swiglu ? "swiglu" : "-", (long long)m,
                      str_cat(qgemv_kernel_name(kern), kern == def_kernel ? " (default)" : "").c_str(), alone * 1e3,
                      b2b * 1e3, pdl * 1e3, gbs, 100.0 * gbs / copy_gbs);
        }
      }
      // The dp4a launch sweep (both formats, every row count): the one-row forms (load depth,
      // outputs a warp, chunks a step; more rows always run depth 4) x split-K, and the L2
      // prefetch, us back to back with PDL;
      // each variant's output checked first against the bf16 GEMV on the dequantized
      // weights (as above).
      const QuantWeightView& r0 = rows.views[0];
      launch_dequant_rows(DType::kBF16, r0, 0, wrows, wdq.get(), nullptr);
      for (int64_t m : {1, 2, 4, 8}) {
        for (int64_t q0 = 0; q0 < m; q0 += 4)
          launch_gemv(DType::kBF16, static_cast<const uint16_t*>(x.get()) + q0 * s.k, wdq.get(), nullptr,
                      static_cast<uint16_t*>(yref.get()) + q0 * s.n, std::min<int64_t>(4, m - q0), s.n, s.k, nullptr,
                      s.epi);
        auto time_of = [&](const QGemvDp4aTuning& tune) {
          launch_qgemv_dp4a(DType::kBF16, x.get(), r0, nullptr, y.get(), m, s.n, nullptr, s.epi, tune);
          KILN_CUDA_CHECK(cudaDeviceSynchronize());
          const double err = max_rel(y.get(), yref.get(), size_t(m * s.n));
          auto call = [&] {
            launch_qgemv_dp4a(DType::kBF16, x.get(), rows.take(), nullptr, y.get(), m, s.n, nullptr, s.epi, tune);
          };
          PdlScope on(true);
          return std::pair<float, double>(median_ms(call, 30, 20), err);
        };
        auto cell = [&](float ms) {
          const double gbs = double(r0.bytes()) / (ms * 1e-3) / 1e9;
          return str_cat(int(ms * 1e4 + 0.5) / 10.0, " (", int(gbs / 10 + 0.5) / 100.0, ", ",
                         int(100.0 * gbs / copy_gbs + 0.5), "%)");
        };
        QGemvDp4aPlan def;
        launch_qgemv_dp4a(DType::kBF16, x.get(), r0, nullptr, y.get(), m, s.n, nullptr, s.epi, {}, &def);
        const auto [def_ms, def_err] = time_of({});
        float best = def_ms;
        std::string best_name = "default", bad;
        // The one-row forms (load depth in chunks; outputs a warp; chunks a step); more rows
        // run one form at depth 4. Then the default form with the L2 prefetch.
        struct Variant {
          int depth, outs, chunks;
          bool l2;
        };
        for (const auto [depth, outs, chunks, l2] :
             {Variant{2, 1, 1, false}, Variant{4, 1, 1, false}, Variant{8, 1, 1, false}, Variant{4, 2, 1, false},
              Variant{4, 1, 2, false}, Variant{2, 2, 2, false}, Variant{4, 2, 2, false}, Variant{4, 2, 2, true},
              Variant{4, 1, 1, true}}) {
          if (m > 1 && (depth != 4 || outs != 1 || chunks != 1)) continue;
          if (m == 1 && l2 && outs == 1) continue;
          const std::string tag = str_cat(m > 1 ? std::string() : str_cat(", outs ", outs, ", chunks ", chunks),
                                          l2 ? ", L2 prefetch" : "");
          for (int cps : {1}) {
            std::string line = str_cat("| ", s.what, " | ", quant_format_name(f), " | ", m, " | ",
                                       cps, " | ", depth, tag);
            for (int splits : {1, 2, 4, 8}) {
              QGemvDp4aTuning tune{cps, depth, splits};
              tune.outs_one_row = outs;
              tune.chunks_per_step = chunks;
              tune.l2_prefetch = l2;
              QGemvDp4aPlan pl;
              launch_qgemv_dp4a(DType::kBF16, x.get(), r0, nullptr, y.get(), m, s.n, nullptr, s.epi, tune, &pl);
              const auto [ms, err] = time_of(tune);
              if (!(err < 2e-2)) bad += str_cat(" ", cps, "x", depth, "x", splits, tag, "=", err);
              const std::string name = str_cat(pl.ctas_per_sm, "x", pl.depth, "x", pl.splits, tag);
              if (ms < best) best = ms, best_name = name;
              line += str_cat(" | ", cell(ms), pl.ctas_per_sm != cps || pl.splits != splits ? " [ran " + name + "]" : "");
            }
            sweeps.push_back(line + " |");
          }
        }
        sweeps.push_back(str_cat("| ", s.what, " | ", quant_format_name(f), " | ", m, " | default: ", def.ctas_per_sm,
                                 "x", def.depth, "x", def.splits, m == 1 ? ", outs 2, chunks 2" : "", " (",
                                 def.ctas, " CTAs) | | ", cell(def_ms),
                                 " | best: ", best_name, " | ", cell(best), " | default / best ",
                                 int(100.0 * def_ms / best + 0.5), "% |"));
        checks.push_back(str_cat(s.what, " ", quant_format_name(f), " dp4a sweep m=", m, ": default max|q - bf16| / "
                                 "max|bf16| = ", def_err, def_err < 2e-2 ? " ok" : " TOO LARGE",
                                 bad.empty() ? ", every variant ok" : ", TOO LARGE:" + bad));
      }
    }
  }
  std::printf("\nchecks (each kernel vs the bf16 GEMV on its weights dequantized, rows 1, 2, 4, 8; dp4a adds x's int8 "
              "rounding):\n");
  for (auto& c : checks) std::printf("  %s\n", c.c_str());
  std::printf("\ndp4a launch sweep (bf16 x; each cell: us for 20 back to back with PDL (TB/s of weight bytes, %% of "
              "copy); a variant the kernel ran otherwise (occupancy cap, split exchange too large) says what ran; the "
              "default row gives the plan of the built-in rule as CTAs/SM x depth x splits and the best of the sweep):"
              "\n\n| shape | w | rows | CTAs/SM | depth | split 1 | split 2 | split 4 | split 8 |\n"
              "|---|---|---|---|---|---|---|---|---|\n");
  for (auto& c : sweeps) std::printf("%s\n", c.c_str());
}

void qgemv_prologue_table(const char* filter, double copy_gbs) {
  int dev = 0, l2 = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  cudaStream_t st = nullptr;
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  std::printf("\ndp4a GEMV with and without x's rounding (skip x: timing only, garbage output). us per call, 20 calls "
              "captured in one CUDA graph with PDL, weight copies cycled past 2 x L2; (%% of the %.0f GB/s copy). "
              "bf16: the bf16 GEMV on the same shape (its own 2-byte weights), same method.\n\n"
              "| shape | w | rows | CTAs/SM x depth x splits (CTAs) | us | us, skip x | prologue us |\n"
              "|---|---|---|---|---|---|---|\n",
              copy_gbs);
  std::vector<std::string> checks;
  for (const GemvShape& s : kLlamaGemvShapes) {
    if (!std::strstr(s.what, filter)) continue;
    const int64_t wrows = s.epi == GemvEpilogue::kSwiGlu ? 2 * s.n : s.n, mmax = kQGemvMaxRows;
    DeviceBuffer wdq(size_t(wrows * s.k) * 2), x(size_t(mmax * s.k) * 2), y(size_t(mmax * s.n) * 2),
        yref(size_t(mmax * s.n) * 2);
    launch_fill_random(x.get(), DType::kBF16, mmax * s.k, 2, nullptr);
    {  // the bf16 GEMV's own time (2-byte weights, copies past 2 x L2)
      const size_t wb = size_t(wrows * s.k) * 2, n = std::max<size_t>(1, (2 * size_t(l2) + wb - 1) / wb);
      std::vector<DeviceBuffer> ws;
      for (size_t i = 0; i < n; ++i) {
        ws.emplace_back(wb);
        launch_fill_random(ws.back().get(), DType::kBF16, wrows * s.k, 30 + uint32_t(i), nullptr);
      }
      for (int64_t m : {1, 2}) {
        size_t i = 0;
        PdlScope on(true);
        const float ms = graph_ms([&] {
          launch_gemv(DType::kBF16, x.get(), ws[i++ % n].get(), nullptr, y.get(), m, s.n, s.k, st, s.epi);
        }, st, 20);
        const double gbs = double(wb) / (ms * 1e-3) / 1e9;
        std::printf("| %s %lldx%lld | bf16 | %lld | rule | %.1f (%.0f%%) | | |\n", s.what, (long long)wrows,
                    (long long)s.k, (long long)m, ms * 1e3, 100.0 * gbs / copy_gbs);
      }
    }
    for (QuantFormat f : {QuantFormat::kQ4, QuantFormat::kQ8}) {
      WeightCopies rows = make_copies(f, wrows, s.k, QuantLayout::kRows, size_t(l2), 10);
      const QuantWeightView& r0 = rows.views[0];
      launch_dequant_rows(DType::kBF16, r0, 0, wrows, wdq.get(), nullptr);
      for (int64_t m : {1, 2, 4}) {
        for (int64_t q0 = 0; q0 < m; q0 += 4)
          launch_gemv(DType::kBF16, static_cast<const uint16_t*>(x.get()) + q0 * s.k, wdq.get(), nullptr,
                      static_cast<uint16_t*>(yref.get()) + q0 * s.n, std::min<int64_t>(4, m - q0), s.n, s.k, nullptr,
                      s.epi);
        auto time_of = [&](const QGemvDp4aTuning& tune) {
          if (!tune.skip_x) {
            launch_qgemv_dp4a(DType::kBF16, x.get(), r0, nullptr, y.get(), m, s.n, nullptr, s.epi, tune);
            KILN_CUDA_CHECK(cudaDeviceSynchronize());
            const double err = max_rel(y.get(), yref.get(), size_t(m * s.n));
            if (!(err < 2e-2))
              checks.push_back(str_cat(s.what, " ", quant_format_name(f), " m=", m, " depth ", tune.depth,
                                       " splits ", tune.splits, ": ", err, " TOO LARGE"));
          }
          PdlScope on(true);
          return graph_ms([&] {
            launch_qgemv_dp4a(DType::kBF16, x.get(), rows.take(), nullptr, y.get(), m, s.n, st, s.epi, tune);
          }, st, 20);
        };
        for (int depth : {4, 8}) {  // at one row: the default form, and depth 8 with one output and one chunk
          if (m > 1 && depth != 4) continue;
          for (int splits : {0, 1, 2, 4}) {
            QGemvDp4aTuning t{0, depth, splits};
            if (depth == 8) t.outs_one_row = t.chunks_per_step = 1;
            QGemvDp4aPlan pl;
            launch_qgemv_dp4a(DType::kBF16, x.get(), r0, nullptr, y.get(), m, s.n, nullptr, s.epi, t, &pl);
            const float a = time_of(t);
            t.skip_x = true;
            const float b = time_of(t);
            const double pct = 100.0 * double(r0.bytes()) / (a * 1e-3) / 1e9 / copy_gbs;
            const double pct_b = 100.0 * double(r0.bytes()) / (b * 1e-3) / 1e9 / copy_gbs;
            std::printf("| %s %lldx%lld | %s | %lld | %s%dx%dx%d (%d) | %.1f (%.0f%%) | %.1f (%.0f%%) | %.1f |\n",
                        s.what, (long long)wrows, (long long)s.k, quant_format_name(f), (long long)m,
                        splits == 0 ? "rule " : "", pl.ctas_per_sm, pl.depth, pl.splits, pl.ctas, a * 1e3, pct,
                        b * 1e3, pct_b, (a - b) * 1e3);
            std::fflush(stdout);
          }
        }
      }
    }
  }
  std::printf("\nchecks: %s\n", checks.empty() ? "every variant within 2e-2 of the bf16 GEMV on its weights dequantized"
                                                : "");
  for (auto& c : checks) std::printf("  %s\n", c.c_str());
  cudaStreamDestroy(st);
}

}  // namespace kiln::cuda::bench
