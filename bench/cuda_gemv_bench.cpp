// Weight-streaming GEMV bandwidth on the GPU (the decode GEMMs of kiln's CUDA backend):
// for the Linear shapes of Llama-3.1-8B, Llama-3.2-1B/TinyLlama and GPT-2, bf16 weights
// (batch rows 1, 2, 4) and weight-only q8/q4 (rows 1, 2, 4, 8) through the quantized
// kernels of both layouts (mma: the tensor-core kernel over the kMma layout; old: the
// kRows layout through launch_gemv_quant's default for it; the dp4a kernel, the default
// for bf16/f16, and its launch sweep are in the qgemv mode), the median kernel time of one launch
// alone and of 20 back to back (CUDA events, 50 repeats), and the weight bytes per
// second back to back (for q8/q4 the bytes streamed: codes, f16 scales, row factors)
// against a device-to-device copy measured in the same run (read + write bytes) and the
// H200's 4.8 TB/s data-sheet peak. Before timing, each q8/q4 GEMV is checked against the
// bf16 GEMV on the same weights dequantized (launch_dequant_rows of that layout); the
// worst relative difference is printed. The bf16 rows also time the norm prologue and the
// residual epilogue (pass fuse_norm_linear): "norm + bf16" is the unfused pair (the RMSNorm
// kernel of norm.cu into a buffer, then the GEMV on it), "bf16 {rms}" the GEMV normalizing
// x itself, "bf16 {+res}" the GEMV adding a residual; the fused GEMV's output is checked
// against the pair's.
// "chain" mode: the decode step's layer sequence for a model shape (GPT-2 small, TinyLlama
// 1.1B, Llama-3.2-1B, Llama-3.1-8B) captured as one CUDA graph with programmatic dependent
// launch, as the backend's decode steps are: per layer the qkv GEMV with the norm prologue,
// a latency-bound kernel standing in for the decode attention (an RMSNorm of the q row:
// one CTA that, like the attention, triggers its dependents at its start in a decode
// step), the o GEMV adding the residual, the gate|up GEMV with the norm prologue and
// SwiGLU (GPT-2: fc with LayerNorm prologue, bias and GELU-tanh), the down GEMV adding
// the residual - and the same with the default graph's AddNorm kernels in front of the
// qkv and gate|up GEMVs instead of the prologues and residual epilogues; every layer with its own weights (nothing stays in L2), times the layer
// count, no LM head. Printed without and with dependent launch (PDL): the median time of a step (graph launches back to back) and the
// weight bytes per second against the device-to-device copy. Before timing, the PDL
// variant's final residual stream is compared with the one without (same inputs).
//   cuda_gemv_bench [shape filter, e.g. 8B]     the bf16 / q8 / q4 table
//   cuda_gemv_bench qgemv [shape filter]        the quantized kernels (old / mma / dp4a) and
//                                               the dp4a launch sweep only (cuda_qgemv_table.cpp)
//   cuda_gemv_bench chain [shape filter]        the decode-chain table only
//   cuda_gemv_bench qprologue [shape filter]    the dp4a GEMV with and without x's rounding
//                                               (cuda_qgemv_table.cpp)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <iterator>
#include <vector>

#include "backends/cuda/cuda_context.h"
#include "cuda_bench_util.h"
#include "cuda_qgemv_table.h"
#include "backends/cuda/ops/convert.h"
#include "backends/cuda/ops/elementwise.h"
#include "backends/cuda/ops/gemv.h"
#include "backends/cuda/ops/gemv_quant.h"
#include "backends/cuda/ops/norm.h"
#include "core/status.h"

using namespace kiln;
using namespace kiln::cuda;
using bench::median_ms;

namespace {

constexpr double kPeakGbs = 4800.0;  // H200 HBM3e, data sheet

// One decode layer's shape (see the file comment).
struct ChainShape {
  const char* what;
  int layers;
  int64_t d, qkv, ff;  // hidden size, q|k|v width, MLP width (per half for SwiGLU)
  bool gpt2;           // LayerNorm + bias + GELU-tanh fc; else RMSNorm + SwiGLU, no bias
};

struct ChainLayer {
  DeviceBuffer qkv_w, qkv_b, o_w, o_b, up_w, up_b, down_w, down_b, g1, b1, g2, b2;
};

void chain_table(const char* filter, double copy_gbs) {
  std::printf("\ndecode chain (bf16, 1 token row; CUDA graph of the layers; weight GB/s = weight bytes per step / "
              "step time; norms: AddNorm kernels as in the default graph, or inside the GEMVs as with KILN_CUDA_PRENORM=1)"
              "\n\n| shape | layers | norms | PDL | us per step (min..max) | us per layer | weight MB | "
              "weight GB/s | %% of copy | max|y - no PDL| / max|no PDL| |\n|---|---|---|---|---|---|---|---|---|---|\n");
  const ChainShape shapes[] = {
      {"GPT-2 small", 12, 768, 3 * 768, 3072, true},
      {"TinyLlama 1.1B", 22, 2048, 2048 + 2 * 256, 5632, false},
      {"Llama-3.2-1B", 16, 2048, 2048 + 2 * 512, 8192, false},
      {"Llama-3.1-8B", 32, 4096, 4096 + 2 * 1024, 14336, false},
  };
  const DType bf = DType::kBF16;
  for (const ChainShape& c : shapes) {
    if (!std::strstr(c.what, filter)) continue;
    const int64_t up_rows = c.gpt2 ? c.ff : 2 * c.ff;
    const GemvEpilogue up_epi = c.gpt2 ? GemvEpilogue::kGeluTanh : GemvEpilogue::kSwiGlu;
    std::vector<ChainLayer> L(size_t(c.layers));
    uint64_t seed = 100;
    // Random values in [-1, 1) times `scale` (a one-element factor broadcast by launch_binary).
    auto fill = [&](DeviceBuffer& b, DType t, int64_t n, float scale) {
      b = DeviceBuffer(size_t(n) * dtype_size(t));
      launch_fill_random(b.get(), t, n, uint32_t(seed++), nullptr);
      if (scale == 1.0f) return;
      DeviceBuffer f(4);
      const uint16_t fb = f32_to_bf16(scale);
      if (t == DType::kF32) KILN_CUDA_CHECK(cudaMemcpy(f.get(), &scale, 4, cudaMemcpyHostToDevice));
      else KILN_CUDA_CHECK(cudaMemcpy(f.get(), &fb, 2, cudaMemcpyHostToDevice));
      launch_binary(BinaryOp::kMul, t, b.get(), f.get(), n, 1, b.get(), nullptr);
      KILN_CUDA_CHECK(cudaDeviceSynchronize());  // f is freed on return
    };
    size_t wbytes = 0;
    for (ChainLayer& l : L) {
      // Weights scaled so that the residual stream stays of order 1 over the layers.
      fill(l.qkv_w, bf, c.qkv * c.d, 1.0f / std::sqrt(float(c.d)));
      fill(l.o_w, bf, c.d * c.d, 0.5f / std::sqrt(float(c.d)));
      fill(l.up_w, bf, up_rows * c.d, 1.0f / std::sqrt(float(c.d)));
      fill(l.down_w, bf, c.d * c.ff, 0.5f / std::sqrt(float(c.ff)));
      fill(l.g1, DType::kF32, c.d, 1.0f);
      fill(l.g2, DType::kF32, c.d, 1.0f);
      if (c.gpt2) {
        fill(l.qkv_b, bf, c.qkv, 0.1f);
        fill(l.o_b, bf, c.d, 0.1f);
        fill(l.up_b, bf, up_rows, 0.1f);
        fill(l.down_b, bf, c.d, 0.1f);
        fill(l.b1, DType::kF32, c.d, 0.1f);
        fill(l.b2, DType::kF32, c.d, 0.1f);
      }
      wbytes += size_t(c.qkv * c.d + c.d * c.d + up_rows * c.d + c.d * c.ff) * 2;
    }
    DeviceBuffer h0, h(size_t(c.d) * 2), qkv(size_t(c.qkv) * 2), attn(size_t(c.d) * 2), act(size_t(c.ff) * 2),
        gq;
    fill(h0, bf, c.d, 1.0f);
    fill(gq, DType::kF32, c.d, 1.0f);
    KILN_CUDA_CHECK(cudaDeviceSynchronize());  // the weights exist before any step, as in the backend
    cudaStream_t s;
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    // prenorm: the norms inside the GEMVs (pass fuse_norm_linear, KILN_CUDA_PRENORM=1);
    // else the default graph's AddNorm kernels (the residual sums ping-pong between hs[0]
    // and hs[1]: a sum never aliases its inputs).
    DeviceBuffer hs[2] = {DeviceBuffer(size_t(c.d) * 2), DeviceBuffer(size_t(c.d) * 2)}, xn(size_t(c.d) * 2),
                 lin(size_t(c.d) * 2);
    auto enqueue = [&](bool prenorm) {
      const GemvNorm nk = c.gpt2 ? GemvNorm::kLayer : GemvNorm::kRms;
      const GemvFusion none{}, fold{GemvNorm::kNone, nullptr, nullptr, 0.0f, h.get()};
      auto add_norm = [&](const void* x, const void* res, void* sum, const float* g, const float* b) {
        if (c.gpt2) launch_add_layer_norm(bf, x, res, g, b, 1e-5f, 1, c.d, sum, xn.get(), s);
        else launch_add_rms_norm(bf, x, res, g, 1e-5f, 1, c.d, sum, xn.get(), s);
      };
      if (prenorm) {
        KILN_CUDA_CHECK(cudaMemcpyAsync(h.get(), h0.get(), size_t(c.d) * 2, cudaMemcpyDeviceToDevice, s));
      } else {  // layer 0 adds h0 to zeros
        KILN_CUDA_CHECK(cudaMemcpyAsync(lin.get(), h0.get(), size_t(c.d) * 2, cudaMemcpyDeviceToDevice, s));
        KILN_CUDA_CHECK(cudaMemsetAsync(hs[0].get(), 0, size_t(c.d) * 2, s));
      }
      for (const ChainLayer& l : L) {
        auto* g1 = static_cast<const float*>(l.g1.get());
        auto* g2 = static_cast<const float*>(l.g2.get());
        auto* b1 = static_cast<const float*>(l.b1.get());
        auto* b2 = static_cast<const float*>(l.b2.get());
        if (prenorm) {
          launch_gemv(bf, h.get(), l.qkv_w.get(), l.qkv_b.get(), qkv.get(), 1, c.qkv, c.d, s, GemvEpilogue::kNone,
                      GemvFusion{nk, g1, b1, 1e-5f, nullptr});
          launch_rms_norm(bf, qkv.get(), static_cast<const float*>(gq.get()), 1e-5f, 1, c.d, attn.get(), s);
          launch_gemv(bf, attn.get(), l.o_w.get(), l.o_b.get(), h.get(), 1, c.d, c.d, s, GemvEpilogue::kNone, fold);
          launch_gemv(bf, h.get(), l.up_w.get(), l.up_b.get(), act.get(), 1, c.ff, c.d, s, up_epi,
                      GemvFusion{nk, g2, b2, 1e-5f, nullptr});
          launch_gemv(bf, act.get(), l.down_w.get(), l.down_b.get(), h.get(), 1, c.d, c.ff, s, GemvEpilogue::kNone,
                      fold);
        } else {
          add_norm(lin.get(), hs[0].get(), hs[1].get(), g1, b1);
          launch_gemv(bf, xn.get(), l.qkv_w.get(), l.qkv_b.get(), qkv.get(), 1, c.qkv, c.d, s, GemvEpilogue::kNone,
                      none);
          launch_rms_norm(bf, qkv.get(), static_cast<const float*>(gq.get()), 1e-5f, 1, c.d, attn.get(), s);
          launch_gemv(bf, attn.get(), l.o_w.get(), l.o_b.get(), lin.get(), 1, c.d, c.d, s, GemvEpilogue::kNone, none);
          add_norm(lin.get(), hs[1].get(), hs[0].get(), g2, b2);
          launch_gemv(bf, xn.get(), l.up_w.get(), l.up_b.get(), act.get(), 1, c.ff, c.d, s, up_epi, none);
          launch_gemv(bf, act.get(), l.down_w.get(), l.down_b.get(), lin.get(), 1, c.d, c.ff, s, GemvEpilogue::kNone,
                      none);
        }
      }
      if (!prenorm)  // the stream the check compares: h = last down + residual
        launch_binary(BinaryOp::kAdd, bf, lin.get(), hs[0].get(), c.d, c.d, h.get(), s);
    };
    struct Variant {
      bool prenorm;
      bool pdl;
    };
    std::vector<Variant> variants;
    for (bool prenorm : {false, true}) {
      variants.push_back({prenorm, false});
      variants.push_back({prenorm, true});
    }
    std::vector<uint16_t> ref(size_t(c.d)), got(size_t(c.d));
    for (const Variant& v : variants) {
      set_pdl_allowed(v.pdl);
      enqueue(v.prenorm);  // eager first: kernel attributes are set outside the capture
      KILN_CUDA_CHECK(cudaStreamSynchronize(s));
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      KILN_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      enqueue(v.prenorm);
      KILN_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
      set_pdl_allowed(false);
      KILN_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      KILN_CUDA_CHECK(cudaGraphLaunch(exec, s));
      KILN_CUDA_CHECK(cudaMemcpyAsync(got.data(), h.get(), got.size() * 2, cudaMemcpyDeviceToHost, s));
      KILN_CUDA_CHECK(cudaStreamSynchronize(s));
      if (!v.pdl) ref = got;  // the first of each layer form
      double err = 0, mx = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        const float a = bf16_to_f32(got[i]), b = bf16_to_f32(ref[i]);
        err = std::isnan(a) || std::isnan(b) ? INFINITY : std::max(err, double(std::fabs(a - b)));
        mx = std::max(mx, double(std::fabs(b)));
      }
      // Step time: graph launches back to back on the stream, between events.
      cudaEvent_t e0, e1;
      KILN_CUDA_CHECK(cudaEventCreate(&e0));
      KILN_CUDA_CHECK(cudaEventCreate(&e1));
      std::vector<float> t;
      constexpr int kBatch = 10;
      for (int rep = 0; rep < 30; ++rep) {
        KILN_CUDA_CHECK(cudaEventRecord(e0, s));
        for (int i = 0; i < kBatch; ++i) KILN_CUDA_CHECK(cudaGraphLaunch(exec, s));
        KILN_CUDA_CHECK(cudaEventRecord(e1, s));
        KILN_CUDA_CHECK(cudaEventSynchronize(e1));
        float ms = 0;
        KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        t.push_back(ms / kBatch);
      }
      std::sort(t.begin(), t.end());
      const double ms = t[t.size() / 2], gbs = double(wbytes) / (ms * 1e-3) / 1e9;
      std::printf("| %s | %d | %s | %s | %.1f (%.1f..%.1f) | %.2f | %.1f | %.0f | %.0f%% | %.2g%s |\n",
                  c.what, c.layers, v.prenorm ? "in GEMV" : "AddNorm", v.pdl ? "on" : "off", ms * 1e3, t.front() * 1e3, t.back() * 1e3,
                  ms * 1e3 / c.layers, double(wbytes) / 1e6, gbs, 100.0 * gbs / copy_gbs, mx > 0 ? err / mx : err,
                  mx > 0 && err / mx < 2e-2 ? "" : " CHECK");
      cudaEventDestroy(e0);
      cudaEventDestroy(e1);
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
    }
    cudaStreamDestroy(s);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool qgemv_only = argc > 1 && std::string(argv[1]) == "qgemv";
  const bool chain_only = argc > 1 && std::string(argv[1]) == "chain";
  const bool prologue_only = argc > 1 && std::string(argv[1]) == "qprologue";
  const bool mode = qgemv_only || chain_only || prologue_only;
  const char* filter = argc > (mode ? 2 : 1) ? argv[mode ? 2 : 1] : "";
  const double copy_gbs = bench::device_copy_gbs();
  std::printf("device-to-device copy: %.0f GB/s (read + write)\n\n", copy_gbs);
  if (chain_only) {
    chain_table(filter, copy_gbs);
    return 0;
  }
  if (prologue_only) {
    bench::qgemv_prologue_table(filter, copy_gbs);
    return 0;
  }
  if (qgemv_only) {
    bench::qgemv_kernels_table(filter, copy_gbs);
    return 0;
  }
  std::printf("| shape (n x k) | weights | epilogue | rows | us, alone | us, 20 back to back | weight GB/s (back to back) | %% of copy | %% of 4.8 TB/s |\n"
              "|---|---|---|---|---|---|---|---|---|\n");
  std::vector<bench::GemvShape> shapes(std::begin(bench::kLlamaGemvShapes), std::end(bench::kLlamaGemvShapes));
  shapes.push_back({"GPT-2 fc", 3072, 768, GemvEpilogue::kGeluTanh});
  shapes.push_back({"GPT-2 proj", 768, 3072, GemvEpilogue::kNone});
  std::vector<std::string> checks;
  for (const bench::GemvShape& s : shapes) {
    if (!std::strstr(s.what, filter)) continue;
    const int64_t wrows = s.epi == GemvEpilogue::kSwiGlu ? 2 * s.n : s.n;
    const size_t wbytes = size_t(wrows * s.k) * 2;
    DeviceBuffer w(wbytes), x(size_t(8 * s.k) * 2), y(size_t(8 * s.n) * 2), yref(size_t(8 * s.n) * 2);
    launch_fill_random(w.get(), DType::kBF16, wrows * s.k, 1, nullptr);
    launch_fill_random(x.get(), DType::kBF16, 8 * s.k, 2, nullptr);
    const char* epi = s.epi == GemvEpilogue::kSwiGlu ? "swiglu" : s.epi == GemvEpilogue::kNone ? "-" : "gelu";
    auto row = [&](const std::string& wname, int64_t m, size_t bytes, auto&& run) {
      const float alone = median_ms(run), ms = median_ms(run, 20, 20);
      const double gbs = double(bytes) / (ms * 1e-3) / 1e9;
      std::printf("| %s %lldx%lld | %s | %s | %lld | %.1f | %.1f | %.0f | %.0f%% | %.0f%% |\n", s.what,
                  (long long)wrows, (long long)s.k, wname.c_str(), epi, (long long)m, alone * 1e3, ms * 1e3, gbs,
                  100.0 * gbs / copy_gbs, 100.0 * gbs / kPeakGbs);
    };
    for (int64_t m : {1, 2, 4})
      row("bf16", m, wbytes,
          [&] { launch_gemv(DType::kBF16, x.get(), w.get(), nullptr, y.get(), m, s.n, s.k, nullptr, s.epi); });
    for (int64_t m : {1, 2, 4})  // the split-K rule's alternatives
      for (int splits : {1, 2, 4}) {
        GemvFusion forced;
        forced.splits = splits;
        row(str_cat("bf16 S=", splits), m, wbytes, [&] {
          launch_gemv(DType::kBF16, x.get(), w.get(), nullptr, y.get(), m, s.n, s.k, nullptr, s.epi, forced);
        });
      }
    {
      DeviceBuffer gamma(size_t(s.k) * 4), xn(size_t(4 * s.k) * 2), res(size_t(4 * s.n) * 2);
      launch_fill_random(gamma.get(), DType::kF32, s.k, 6, nullptr);
      launch_fill_random(res.get(), DType::kBF16, 4 * s.n, 7, nullptr);
      const auto* g = static_cast<const float*>(gamma.get());
      const GemvFusion rms{GemvNorm::kRms, g, nullptr, 1e-5f, nullptr}, plus{GemvNorm::kNone, nullptr, nullptr, 0, res.get()};
      double worst = 0;
      for (int64_t m : {1, 2, 4}) {
        auto pair = [&] {
          launch_rms_norm(DType::kBF16, x.get(), g, 1e-5f, m, s.k, xn.get(), nullptr);
          launch_gemv(DType::kBF16, xn.get(), w.get(), nullptr, yref.get(), m, s.n, s.k, nullptr, s.epi);
        };
        row("norm + bf16", m, wbytes, pair);
        if (gemv_norm_supports(DType::kBF16, m, s.k)) {
          auto fused = [&] { launch_gemv(DType::kBF16, x.get(), w.get(), nullptr, y.get(), m, s.n, s.k, nullptr, s.epi, rms); };
          row("bf16 {rms}", m, wbytes, fused);
          std::vector<uint16_t> a(size_t(m * s.n)), b(size_t(m * s.n));
          KILN_CUDA_CHECK(cudaMemcpy(a.data(), y.get(), a.size() * 2, cudaMemcpyDeviceToHost));
          KILN_CUDA_CHECK(cudaMemcpy(b.data(), yref.get(), b.size() * 2, cudaMemcpyDeviceToHost));
          double err = 0, ref = 0;
          for (size_t i = 0; i < a.size(); ++i) {
            err = std::max(err, double(std::fabs(bf16_to_f32(a[i]) - bf16_to_f32(b[i]))));
            ref = std::max(ref, double(std::fabs(bf16_to_f32(b[i]))));
          }
          worst = std::max(worst, ref > 0 ? err / ref : err);
        }
        row("bf16 {+res}", m, wbytes,
            [&] { launch_gemv(DType::kBF16, x.get(), w.get(), nullptr, y.get(), m, s.n, s.k, nullptr, s.epi, plus); });
      }
      checks.push_back(str_cat(s.what, " bf16 {rms}: max|fused - norm kernel + gemv| / max|ref| = ", worst,
                               worst < 1e-2 ? " ok" : " TOO LARGE"));
    }
    // Random codes, f16 scales and row factors in [-1, 1) (all finite; timing needs no real
    // weights), sized for the larger of the two layouts; each view reads them its own way.
    for (QuantFormat f : {QuantFormat::kQ8, QuantFormat::kQ4}) {
      const QuantWeightView layouts[2] = {quant_view_shape(f, wrows, s.k, QuantLayout::kMma),
                                         quant_view_shape(f, wrows, s.k, QuantLayout::kRows)};
      const size_t code_bytes = size_t(wrows * layouts[0].code_stride);
      const size_t scale_elems = size_t(wrows * layouts[0].scale_stride) * (f == QuantFormat::kQ4 ? 2 : 1);
      DeviceBuffer codes(code_bytes), scales(scale_elems * 2), factors(size_t(wrows) * 4);
      launch_fill_random(codes.get(), DType::kF32, int64_t(code_bytes / 4), 3, nullptr);
      launch_fill_random(scales.get(), DType::kF16, int64_t(scale_elems), 4, nullptr);
      launch_fill_random(factors.get(), DType::kF32, wrows, 5, nullptr);
      for (QuantWeightView qw : layouts) {
        const std::string name = str_cat(quant_format_name(f), qw.layout == QuantLayout::kMma ? " mma" : " old");
        qw.codes = static_cast<const uint8_t*>(codes.get());
        qw.scales = scales.get();
        qw.row_factor = static_cast<const float*>(factors.get());
        // The check: the same weights dequantized to bf16 through the bf16 GEMV.
        launch_dequant_rows(DType::kBF16, qw, 0, wrows, w.get(), nullptr);
        double worst = 0;
        for (int64_t m : {1, 2, 4, 8}) {
          launch_gemv_quant(DType::kBF16, x.get(), qw, nullptr, y.get(), m, s.n, nullptr, s.epi);
          for (int64_t r0 = 0; r0 < m; r0 += 4)
            launch_gemv(DType::kBF16, static_cast<const uint16_t*>(x.get()) + r0 * s.k, w.get(), nullptr,
                        static_cast<uint16_t*>(yref.get()) + r0 * s.n, std::min<int64_t>(4, m - r0), s.n, s.k,
                        nullptr, s.epi);
          std::vector<uint16_t> a(size_t(m * s.n)), b(size_t(m * s.n));
          KILN_CUDA_CHECK(cudaMemcpy(a.data(), y.get(), a.size() * 2, cudaMemcpyDeviceToHost));
          KILN_CUDA_CHECK(cudaMemcpy(b.data(), yref.get(), b.size() * 2, cudaMemcpyDeviceToHost));
          double err = 0, ref = 0;
          for (size_t i = 0; i < a.size(); ++i) {
            err = std::max(err, double(std::fabs(bf16_to_f32(a[i]) - bf16_to_f32(b[i]))));
            ref = std::max(ref, double(std::fabs(bf16_to_f32(b[i]))));
          }
          worst = std::max(worst, ref > 0 ? err / ref : err);
        }
        checks.push_back(str_cat(s.what, " ", name, ": max|q - bf16 gemv| / max|bf16 gemv| = ", worst,
                                 worst < 2e-2 ? " ok" : " TOO LARGE"));
        for (int64_t m : {1, 2, 4, 8})
          row(name, m, qw.bytes(),
              [&] { launch_gemv_quant(DType::kBF16, x.get(), qw, nullptr, y.get(), m, s.n, nullptr, s.epi); });
      }
    }
  }
  std::printf("\nchecks (q8/q4 GEMV vs the bf16 GEMV on the dequantized weights, rows 1, 2, 4, 8; the bf16 GEMV's "
              "norm prologue vs the norm kernel + GEMV, rows 1, 2, 4):\n");
  for (auto& c : checks) std::printf("  %s\n", c.c_str());
  return 0;
}
