// Where a W8A8 Linear's time goes on the GPU, against the bf16 Linear it replaces: for
// BERT-base's four Linears at 128 and 4096 token rows (batch 32 x 128), the median time
// of the bf16 path (cuBLASLt GEMM with bias, then GELU in place for the FFN up
// projection) and of each W8A8 step (int8 quantize of the input, cuBLASLt int8 GEMM to
// int32, dequantize epilogue with scales, bias and GELU), with the GEMM in one call and
// in the W8A8 Linear's row tiles (int8_tile_rows: int32 sums small enough to stay in L2,
// KILN_CUDA_W8A8_TILE_MB); then the fused CUTLASS GEMM (int8_gemm_sm90.h: the dequantize
// in its epilogue, bf16 out) in each tile configuration, launched eagerly and replayed
// from a CUDA graph (as encoder forwards run: no per-call host work), and the W8A8 Linear
// with it (quantize + fused GEMM); then 12-layer sums. Then the FFN up projection at 4096
// rows four ways (cuda_w8a8_linear.h): GELU in the CUTLASS epilogue (alone, and followed
// by the down projection's quantize, static and per token, as an unfused engine runs
// them), and the GEMM without it followed by one GELU pass writing bf16, or writing the
// down projection's int8 codes (static; per token with the row scales), each pass also
// through the lookup tables of ops/unary_lut.h (KILN_CUDA_GELU_LUT), staged in shared
// memory or read through L1. Then the GELU passes alone (x in [-4, 4)), arithmetic
// against the tables, at BERT-base's [4096, 3072] and Llama-8B's [2048, 14336]: us and
// GB/s (bytes read + written) against the copy.
// Ceilings measured in the same run: a device-to-device copy and 8192^3 bf16 and int8
// GEMMs. Timing only (random codes): correctness is tests/backends/cuda/w8a8_test.cpp and
// int8_gemm_sm90_test.cpp.
//   cuda_int8_gemm_bench [--codes-only]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "backends/cuda/cuda_context.h"
#include "cuda_bench_util.h"
#include "backends/cuda/ops/convert.h"
#include "backends/cuda/ops/elementwise.h"
#include "backends/cuda/ops/elementwise_int8.h"
#include "backends/cuda/ops/gemm.h"
#include "backends/cuda/ops/int8.h"
#include "backends/cuda/ops/int8_gemm_sm90.h"
#include "backends/cuda/ops/unary_lut.h"
#include "core/status.h"

using namespace kiln;
using namespace kiln::cuda;
using bench::graph_ms;

namespace {

// 30 repeats of 10 calls back to back (these GEMMs are long enough for steady timing).
template <typename F>
float median_ms(F&& f, int reps = 30, int batch = 10) {
  return bench::median_ms(f, reps, batch);
}

// The bf16 GELU tables the passes read (ops/unary_lut.h, KILN_CUDA_GELU_LUT): values, and
// codes for `inv`; complete on return, before a non-blocking stream reads them.
struct GeluTables {
  DeviceBuffer values{size_t(kUnaryLutEntries) * 2}, codes{size_t(kUnaryLutEntries)};
  UnaryLut lut;
  explicit GeluTables(float inv) {
    launch_unary_lut_fill(UnaryOp::kGeluErf, DType::kBF16, static_cast<uint16_t*>(values.get()), nullptr);
    launch_unary_lut_fill_codes(UnaryOp::kGeluErf, DType::kBF16, inv, static_cast<int8_t*>(codes.get()), nullptr);
    lut.values = static_cast<const uint16_t*>(values.get());
    lut.codes = static_cast<const int8_t*>(codes.get());
    lut.inv = inv;
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
  }
};

// --codes-only: the FFN up GEMM writing the down projection's codes (4096 x 3072 x 768),
// each configuration launched 3 times eagerly and nothing else: one kernel per launch for a
// profiler (ncu --kernel-name regex:device_kernel).
int codes_only() {
  const int64_t m = 4096, n = 3072, k = 768;
  DeviceBuffer xq(size_t(m * k)), wq(size_t(n * k)), ws(size_t(n) * 4), bias(size_t(n) * 4), q(size_t(m * n));
  launch_fill_random(xq.get(), DType::kF32, m * k / 4, 11, nullptr);
  launch_fill_random(wq.get(), DType::kF32, n * k / 4, 12, nullptr);
  launch_fill_random(ws.get(), DType::kF32, n, 13, nullptr);
  launch_fill_random(bias.get(), DType::kF32, n, 14, nullptr);
  Int8Epilogue e;
  e.act = GemvEpilogue::kGeluErf;
  e.x_scale = 0.02f;
  e.w_scale = static_cast<const float*>(ws.get());
  e.bias = static_cast<const float*>(bias.get());
  int sms = 0;
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const GeluTables tables(1.0f / 0.03f);
  for (int ci = 0; ci < kInt8GemmConfigs; ++ci) {
    const auto c = Int8GemmConfig(ci);
    const size_t wsb = int8_gemm_sm90_workspace(c, DType::kBF16, m, n, k, e.act, true);
    DeviceBuffer wsp(wsb);
    for (int r = 0; r < 3; ++r)
      launch_int8_gemm_sm90(c, DType::kBF16, static_cast<const int8_t*>(xq.get()), static_cast<const int8_t*>(wq.get()),
                            m, n, k, e, q.get(), wsp.get(), wsb, sms, nullptr, tables.lut.codes);
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    std::printf("codes epilogue, %s: 3 launches\n", int8_gemm_config_name(c));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--codes-only") return codes_only();
  Gemm gemm;
  {
    std::printf("device-to-device copy: %.0f GB/s (read + write)\n", bench::device_copy_gbs());
    const int64_t s = 8192;
    DeviceBuffer a(size_t(s * s) * 2), b(size_t(s * s) * 2), c(size_t(s * s) * 4);
    launch_fill_random(a.get(), DType::kBF16, s * s, 1, nullptr);
    launch_fill_random(b.get(), DType::kBF16, s * s, 2, nullptr);
    const double flop = 2.0 * double(s) * s * s;
    const float bf = median_ms([&] { gemm.run(DType::kBF16, a.get(), b.get(), nullptr, c.get(), s, s, s, nullptr); }, 10, 3);
    const float i8 = median_ms([&] { gemm.run_int8(a.get(), b.get(), static_cast<int32_t*>(c.get()), s, s, s, nullptr); }, 10, 3);
    std::printf("cuBLASLt 8192^3: bf16 %.0f TFLOP/s, int8 %.0f TOPS (heuristic's first algorithm)\n\n", flop / (bf * 1e-3) / 1e12,
                flop / (i8 * 1e-3) / 1e12);
  }
  std::string why;
  const bool fused_ok = int8_gemm_sm90_available(&why);
  if (!fused_ok) std::printf("fused CUTLASS int8 GEMM not measured: %s\n\n", why.c_str());
  int sms = 0;
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaStream_t gs;
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&gs, cudaStreamNonBlocking));
  // Eager columns: 10 calls back to back per timing; "graph": replayed from a CUDA graph.
  std::printf("| Linear (n x k) | rows | bf16 GEMM+bias(+GELU) us, eager / graph | int8 quantize us |"
              " int8 GEMM us (TOPS) | dequant us | w8a8 total us | w8a8 in row tiles us (rows) / graph |"
              " fused GEMM us, eager / graph (TOPS), config | quantize + fused GEMM, graph us |"
              " bf16 / cuBLASLt w8a8 (graph) | bf16 / fused w8a8 (graph) |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  struct S {
    const char* what;
    int64_t n, k;
    bool gelu;
  };
  const S shapes[] = {{"qkv", 2304, 768, false}, {"attn out", 768, 768, false}, {"ffn up", 3072, 768, true},
                      {"ffn down", 768, 3072, false}};
  std::string config_rows;
  for (int64_t m : {int64_t(128), int64_t(4096)}) {
    double sum_bf16 = 0, sum_int8 = 0, sum_fused = 0;
    for (const S& s : shapes) {
      DeviceBuffer x(size_t(m * s.k) * 2), w(size_t(s.n * s.k) * 2), bias(size_t(s.n) * 4), bias16(size_t(s.n) * 2);
      DeviceBuffer y(size_t(m * s.n) * 2);
      DeviceBuffer xq(size_t(m * s.k)), wq(size_t(s.n * s.k)), acc(size_t(m * s.n) * 4), ws(size_t(s.n) * 4);
      launch_fill_random(x.get(), DType::kBF16, m * s.k, 3, nullptr);
      launch_fill_random(w.get(), DType::kBF16, s.n * s.k, 4, nullptr);
      launch_fill_random(bias.get(), DType::kF32, s.n, 5, nullptr);
      launch_fill_random(bias16.get(), DType::kBF16, s.n, 5, nullptr);
      launch_fill_random(ws.get(), DType::kF32, s.n, 6, nullptr);
      launch_fill_random(wq.get(), DType::kF32, s.n * s.k / 4, 7, nullptr);  // any bytes are int8 codes
      auto* acc32 = static_cast<int32_t*>(acc.get());
      Int8Epilogue e;
      e.x_scale = 0.01f;
      e.w_scale = static_cast<const float*>(ws.get());
      e.bias = static_cast<const float*>(bias.get());
      e.act = s.gelu ? GemvEpilogue::kGeluErf : GemvEpilogue::kNone;
      auto bf16_linear = [&](cudaStream_t st) {
        gemm.run(DType::kBF16, x.get(), w.get(), bias16.get(), y.get(), m, s.n, s.k, st);
        if (s.gelu) launch_unary(UnaryOp::kGeluErf, DType::kBF16, y.get(), m * s.n, y.get(), st);
      };
      auto quantize = [&](cudaStream_t st) {
        launch_int8_quantize(DType::kBF16, x.get(), m, s.k, 100.0f, static_cast<int8_t*>(xq.get()), nullptr, st);
      };
      const int64_t tile = int8_tile_rows(m, s.n);
      auto w8a8_cublaslt = [&](cudaStream_t st, int64_t rows_per_call) {
        quantize(st);
        for (int64_t r0 = 0; r0 < m; r0 += rows_per_call) {
          const int64_t rows = std::min(rows_per_call, m - r0);
          gemm.run_int8(static_cast<int8_t*>(xq.get()) + r0 * s.k, wq.get(), acc32, rows, s.n, s.k, st);
          launch_int8_dequant(DType::kBF16, acc32, rows, s.n, s.n, e, static_cast<uint16_t*>(y.get()) + r0 * s.n, st);
        }
      };
      const float t_bf16 = median_ms([&] { bf16_linear(nullptr); });
      const float t_q = median_ms([&] { quantize(nullptr); });
      const float t_g = median_ms([&] { gemm.run_int8(xq.get(), wq.get(), acc32, m, s.n, s.k, nullptr); });
      const float t_d = median_ms([&] { launch_int8_dequant(DType::kBF16, acc32, m, s.n, s.n, e, y.get(), nullptr); });
      const float t_all = median_ms([&] { w8a8_cublaslt(nullptr, m); });
      const float t_tiled = m <= tile ? t_all : median_ms([&] { w8a8_cublaslt(nullptr, tile); });
      // From CUDA graphs (as the engine runs encoder forwards): the ratios compare these.
      const float g_bf16 = graph_ms([&] { bf16_linear(gs); }, gs);
      const float g_int8 = graph_ms([&] { w8a8_cublaslt(gs, std::min(tile, m)); }, gs);
      // The fused GEMM: every configuration, eager and from a graph; the best graph time counts.
      float f_eager = 0, f_graph = 0, f_total = 0;
      const char* f_cfg = "-";
      if (fused_ok) {
        const auto* xq8 = static_cast<const int8_t*>(xq.get());
        const auto* wq8 = static_cast<const int8_t*>(wq.get());
        for (int ci = 0; ci < kInt8GemmConfigs; ++ci) {
          const auto c = Int8GemmConfig(ci);
          const size_t wsb = int8_gemm_sm90_workspace(c, DType::kBF16, m, s.n, s.k, e.act);
          DeviceBuffer wsp(wsb);
          auto fused = [&](cudaStream_t st) {
            launch_int8_gemm_sm90(c, DType::kBF16, xq8, wq8, m, s.n, s.k, e, y.get(), wsp.get(), wsb, sms, st);
          };
          const float te = median_ms([&] { fused(nullptr); });
          const float tg = graph_ms([&] { fused(gs); }, gs);
          const float tt = graph_ms([&] { quantize(gs); fused(gs); }, gs);
          char row[256];
          std::snprintf(row, sizeof row, "| %s %lldx%lld | %lld | %s | %.1f | %.1f (%.0f) | %.1f |\n", s.what,
                        (long long)s.n, (long long)s.k, (long long)m, int8_gemm_config_name(c), te * 1e3, tg * 1e3,
                        2.0 * double(m) * s.n * s.k / (tg * 1e-3) / 1e12, tt * 1e3);
          config_rows += row;
          if (ci == 0 || tt < f_total) f_eager = te, f_graph = tg, f_total = tt, f_cfg = int8_gemm_config_name(c);
        }
      }
      sum_bf16 += g_bf16;
      sum_int8 += g_int8;
      sum_fused += f_total;
      std::printf("| %s %lldx%lld%s | %lld | %.1f / %.1f | %.1f | %.1f (%.0f) | %.1f | %.1f | %.1f (%lld) / %.1f |"
                  " %.1f / %.1f (%.0f), %s | %.1f | %.2fx | %.2fx |\n",
                  s.what, (long long)s.n, (long long)s.k, s.gelu ? " +gelu" : "", (long long)m, t_bf16 * 1e3,
                  g_bf16 * 1e3, t_q * 1e3, t_g * 1e3, 2.0 * double(m) * s.n * s.k / (t_g * 1e-3) / 1e12, t_d * 1e3,
                  t_all * 1e3, t_tiled * 1e3, (long long)std::min(tile, m), g_int8 * 1e3, f_eager * 1e3,
                  f_graph * 1e3, f_graph > 0 ? 2.0 * double(m) * s.n * s.k / (f_graph * 1e-3) / 1e12 : 0.0, f_cfg,
                  f_total * 1e3, g_bf16 / g_int8, f_total > 0 ? g_bf16 / f_total : 0.0);
    }
    std::printf("| 12 layers' Linears (graph) | %lld | %.0f | | | | | %.0f | | %.0f | %.2fx | %.2fx |\n",
                (long long)m, 12 * sum_bf16 * 1e3, 12 * sum_int8 * 1e3, 12 * sum_fused * 1e3, sum_bf16 / sum_int8,
                sum_fused > 0 ? sum_bf16 / sum_fused : 0.0);
  }
  if (fused_ok) {
    // FFN up, 4096 rows (BERT-base batch 32) and 128 (batch 1): the GELU's place. Each row the best tile configuration's graph time.
    const int64_t m_max = 4096, n = 3072, k = 768;
    DeviceBuffer xq(size_t(m_max * k)), wq(size_t(n * k)), ws(size_t(n) * 4), bias(size_t(n) * 4),
        y(size_t(m_max * n) * 2), q(size_t(m_max * n)), rs(size_t(m_max) * 4);
    launch_fill_random(xq.get(), DType::kF32, m_max * k / 4, 11, nullptr);  // any bytes are int8 codes
    launch_fill_random(wq.get(), DType::kF32, n * k / 4, 12, nullptr);
    launch_fill_random(ws.get(), DType::kF32, n, 13, nullptr);
    launch_fill_random(bias.get(), DType::kF32, n, 14, nullptr);
    const auto* xq8 = static_cast<const int8_t*>(xq.get());
    const auto* wq8 = static_cast<const int8_t*>(wq.get());
    auto* q8 = static_cast<int8_t*>(q.get());
    auto* rsf = static_cast<float*>(rs.get());
    Int8Epilogue e;
    e.x_scale = 0.02f;
    e.w_scale = static_cast<const float*>(ws.get());
    e.bias = static_cast<const float*>(bias.get());
    const float inv = 1.0f / 0.03f;
    const GeluTables tables(inv);
    const UnaryLut& lut = tables.lut;
    struct Way {
      const char* what;
      GemvEpilogue act;
      int after;  // 0 nothing, 1 quantize static, 2 quantize per token, 3 GELU bf16, 4 GELU codes static, 5 per token,
                  // 6 none: the codes epilogue (the GEMM writes the static codes, GELU from the table)
      int table;  // the GELU pass: 0 arithmetic, 1 table in shared memory, 2 table through L1
      // The codes epilogue's inputs (after 6): 0 as the other rows (x_scale 0.02, bias: |v| in the
      // thousands, ~10 binades of the table a warp), 1 every v 0 (x_scale 0, no bias: one table
      // entry, one line a warp's gather), 2 v ~ N(0, 2) (x_scale 2.3e-5, no bias: GELU's
      // working range, ~16 binades).
      int inputs = 0;
    };
    const Way ways[] = {{"GELU in the epilogue", GemvEpilogue::kGeluErf, 0, 0},
                        {"GELU in the epilogue + down's quantize, static", GemvEpilogue::kGeluErf, 1, 0},
                        {"GELU in the epilogue + down's quantize, per token", GemvEpilogue::kGeluErf, 2, 0},
                        {"GEMM alone (no activation)", GemvEpilogue::kNone, 0, 0},
                        {"GEMM + GELU pass, bf16 out", GemvEpilogue::kNone, 3, 0},
                        {"GEMM + GELU pass, bf16 out, table (smem)", GemvEpilogue::kNone, 3, 1},
                        {"GEMM + GELU pass, bf16 out, table (L1)", GemvEpilogue::kNone, 3, 2},
                        {"GEMM + GELU pass to codes, static", GemvEpilogue::kNone, 4, 0},
                        {"GEMM + GELU pass to codes, static, table (smem)", GemvEpilogue::kNone, 4, 1},
                        {"GEMM + GELU pass to codes, static, table (L1)", GemvEpilogue::kNone, 4, 2},
                        {"GEMM + GELU pass to codes, per token", GemvEpilogue::kNone, 5, 0},
                        {"GEMM + GELU pass to codes, per token, table (smem)", GemvEpilogue::kNone, 5, 1},
                        {"GEMM + GELU pass to codes, per token, table (L1)", GemvEpilogue::kNone, 5, 2},
                        {"GEMM writing the codes (codes table in the epilogue), static", GemvEpilogue::kGeluErf, 6, 2},
                        {"same, every v 0 (one table entry)", GemvEpilogue::kGeluErf, 6, 2, 1},
                        {"same, v ~ N(0, 2)", GemvEpilogue::kGeluErf, 6, 2, 2}};
    for (const int64_t m : {m_max, int64_t(128)}) {
      std::printf("\nFFN up %lldx%lld at %lld rows (CUDA graphs; best configuration each):\n\n| way | us | GEMM config |"
                  "\n|---|---|---|\n", (long long)n, (long long)k, (long long)m);
      for (const Way& w : ways) {
        e.act = w.act;
        e.x_scale = w.inputs == 1 ? 0.0f : w.inputs == 2 ? 2.3e-5f : 0.02f;
        e.bias = w.inputs ? nullptr : static_cast<const float*>(bias.get());
        float best = 0;
        const char* best_cfg = "-";
        for (int ci = 0; ci < kInt8GemmConfigs; ++ci) {
          const auto c = Int8GemmConfig(ci);
          const int8_t* code_table = w.after == 6 ? lut.codes : nullptr;
          const size_t wsb = int8_gemm_sm90_workspace(c, DType::kBF16, m, n, k, e.act, code_table != nullptr);
          DeviceBuffer wsp(wsb);
          auto run = [&] {
            launch_int8_gemm_sm90(c, DType::kBF16, xq8, wq8, m, n, k, e, code_table ? q.get() : y.get(), wsp.get(),
                                  wsb, sms, gs, code_table);
            const UnaryLutRead read = w.table == 1 ? UnaryLutRead::kShared : UnaryLutRead::kGlobal;
            switch (w.after) {
              case 1: launch_int8_quantize(DType::kBF16, y.get(), m, n, inv, q8, nullptr, gs); break;
              case 2: launch_int8_quantize(DType::kBF16, y.get(), m, n, inv, q8, rsf, gs); break;
              case 3:
                if (w.table) launch_unary_lut(lut, y.get(), m * n, y.get(), gs, read);
                else launch_unary(UnaryOp::kGeluErf, DType::kBF16, y.get(), m * n, y.get(), gs);
                break;
              case 4:
              case 5: {
                float* r = w.after == 5 ? rsf : nullptr;
                if (w.table) launch_unary_int8_lut(lut, y.get(), m, n, inv, q8, r, gs, read);
                else launch_unary_int8(UnaryOp::kGeluErf, DType::kBF16, y.get(), m, n, inv, q8, r, gs);
                break;
              }
              default: break;
            }
          };
          run();  // eagerly first: a kernel's first launch may configure it (unary_lut.cu), not inside the capture
          KILN_CUDA_CHECK(cudaStreamSynchronize(gs));
          const float t = graph_ms(run, gs);
          if (ci == 0 || t < best) best = t, best_cfg = int8_gemm_config_name(c);
        }
        std::printf("| %s | %.1f | %s |\n", w.what, best * 1e3, best_cfg);
      }
    }
  }
  {
    // The GELU passes alone, bf16 in (random in [-4, 4)), out of place: arithmetic against
    // the tables. GB/s counts the bytes read and written (T out: 4 a value; codes: 3).
    const float inv = 1.0f / 0.03f;
    const GeluTables tables(inv);
    const UnaryLut& lut = tables.lut;
    std::printf("\nGELU (erf) passes alone, bf16 in (CUDA graphs): us (GB/s, %% of the copy)\n\n| rows x k | copy T |"
                " T out | T out, table smem | T out, table L1 | codes static | static, smem | static, L1 |"
                " codes per token | per token, smem | per token, L1 |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (const auto& [m, n] : {std::pair<int64_t, int64_t>{4096, 3072}, {2048, 14336}, {128, 3072}}) {
      const int64_t count = m * n;
      DeviceBuffer x{size_t(count) * 2}, y{size_t(count) * 2}, q{size_t(count)}, rs{size_t(m) * 4}, four{2};
      launch_fill_random(x.get(), DType::kBF16, count, 21, nullptr);
      const uint16_t four_bits = 0x4080;  // bf16 4.0
      KILN_CUDA_CHECK(cudaMemcpy(four.get(), &four_bits, 2, cudaMemcpyHostToDevice));
      launch_binary(BinaryOp::kMul, DType::kBF16, x.get(), four.get(), count, 1, x.get(), nullptr);
      KILN_CUDA_CHECK(cudaDeviceSynchronize());  // tables and x ready before gs (non-blocking) reads them
      auto* q8 = static_cast<int8_t*>(q.get());
      auto* rsf = static_cast<float*>(rs.get());
      const double tb = 4.0 * double(count), cb = 3.0 * double(count);
      const float copy = graph_ms(
          [&] { KILN_CUDA_CHECK(cudaMemcpyAsync(y.get(), x.get(), size_t(count) * 2, cudaMemcpyDeviceToDevice, gs)); },
          gs);
      // Each pass once eagerly before its capture (a kernel's first launch may configure it).
      auto timed = [&](auto f) {
        f();
        KILN_CUDA_CHECK(cudaStreamSynchronize(gs));
        return graph_ms(f, gs);
      };
      std::string line = str_cat("| ", m, " x ", n, " | ");
      auto cell = [&](float ms, double bytes) {
        char c[64];
        std::snprintf(c, sizeof c, "%.1f (%.0f, %.0f%%) | ", ms * 1e3, bytes / (ms * 1e-3) / 1e9, 100.0 * copy / ms * bytes / tb);
        line += c;
      };
      cell(copy, tb);
      cell(timed([&] { launch_unary(UnaryOp::kGeluErf, DType::kBF16, x.get(), count, y.get(), gs); }), tb);
      for (UnaryLutRead r : {UnaryLutRead::kShared, UnaryLutRead::kGlobal})
        cell(timed([&] { launch_unary_lut(lut, x.get(), count, y.get(), gs, r); }), tb);
      for (float* row_scale : {static_cast<float*>(nullptr), rsf}) {
        cell(timed([&] { launch_unary_int8(UnaryOp::kGeluErf, DType::kBF16, x.get(), m, n, inv, q8, row_scale, gs); }),
             cb);
        for (UnaryLutRead r : {UnaryLutRead::kShared, UnaryLutRead::kGlobal})
          cell(timed([&] { launch_unary_int8_lut(lut, x.get(), m, n, inv, q8, row_scale, gs, r); }), cb);
      }
      std::printf("%s\n", line.c_str());
    }
  }
  if (fused_ok)
    std::printf("\nFused CUTLASS GEMM per configuration (bf16 out):\n\n| Linear | rows | config | eager us |"
                " graph us (TOPS) | quantize + fused, graph us |\n|---|---|---|---|---|---|\n%s",
                config_rows.c_str());
  KILN_CUDA_CHECK(cudaStreamDestroy(gs));
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  return 0;
}
