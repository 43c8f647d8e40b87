// Weight-only q8/q4 Linears on CUDA against the CPU backend's q8/q4 kernels, which
// quantize the same f32 weights with the same quantizer (core/weight_quant.h), so both
// run the same codes and scales. With f32 activations only the summation order differs
// (bound 5e-5 of max|ref|: f32 sums whose q4 terms scale·Σqx and min·Σx partly cancel);
// with bf16/f16 activations the 16-bit bound of the other op tests applies to the kernels
// that multiply x as given (mma, old), and the dp4a GEMV (the default: x rounded to int8 per
// group of 32) adds its rounding's bound (kDp4aExtraTol). Covers the
// GEMV (1..8 rows: odd K and N, split-K, every epilogue, SwiGLU), the skinny GEMM (by
// default from 6 rows, where it takes over from the GEMV) and the dequantized tiles +
// cuBLASLt (weights of several tiles), both device layouts (the
// tensor-core GEMV's kMma through KILN_CUDA_QGEMV=mma with K not a multiple of its
// 128-wide blocks and N not of its 16-row tiles; kRows through the default dp4a and
// KILN_CUDA_QGEMV=old), the resident size
// (quantized, no 16-bit copy), the K % 32 fallback and the errors. Skips without a GPU,
// except the host-side check of the kMma image against the layout's definition.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/ops/gemv_quant.h"
#include "core/weight_quant.h"

#include "cuda_test_util.h"

namespace kiln::cuda {
namespace {

using namespace testing;

constexpr double kQuantF32Tol = 5e-5;

// The dp4a GEMV's extra bound, relative to max|y|: x's int8 rounding moves an output by at
// most F Σ_g scale_g Σ|q| max_g|x| / 254 (about 6% of max|y| in the worst case on these
// random rows, ~0.5% typical); as CudaQGemvDp4a.GraphEpiloguesAndSwiGlu, whose kernel test
// checks the bound per output against f64.
constexpr double kDp4aExtraTol = 3e-2;

// The bf16/f16 GEMV kernels a case runs under (KILN_CUDA_QGEMV, read when the graph is
// compiled): mma with the 16-bit bound, and the default (dp4a) with its extra bound.
struct QGemvCase {
  const char* env;  // "" = unset: the default
  double extra_tol;
};
constexpr QGemvCase kQGemvCases[] = {{"mma", 0.0}, {"", kDp4aExtraTol}};

struct ScopedQGemv {
  explicit ScopedQGemv(const char* v) {
    if (*v) ::setenv("KILN_CUDA_QGEMV", v, 1);
    else ::unsetenv("KILN_CUDA_QGEMV");
  }
  ~ScopedQGemv() { ::unsetenv("KILN_CUDA_QGEMV"); }
};

struct QuantCase {
  ir::Graph g;
  std::vector<StepCase> steps;
};

// A random [n, k] weight (values uniform in [-scale, scale]) quantized to f in the kRows
// layout, on the device.
struct DeviceQuantWeight {
  QuantImage img;
  Dev dev;
  QuantWeightView w;
  DeviceQuantWeight(int64_t n, int64_t k, QuantFormat f, std::mt19937_64& rng, float scale = 1.0f)
      : img(random_image(n, k, f, rng, scale)),
        dev(img.bytes.data(), img.bytes.size()),
        w(img.view_at(dev.get())) {}

 private:
  static QuantImage random_image(int64_t n, int64_t k, QuantFormat f, std::mt19937_64& rng,
                                 float scale) {
    std::uniform_real_distribution<float> u(-scale, scale);
    std::vector<float> wf(size_t(n * k));
    for (float& v : wf) v = u(rng);
    return quant_image(quantize_rows(wf.data(), n, k, f), QuantLayout::kRows);
  }
};

// One Linear node [n, k] with the given attributes, run at each token count of `ts`.
QuantCase linear_case(int64_t n, int64_t k, bool bias, std::map<std::string, ir::Attr> attrs,
                      const std::vector<int64_t>& ts, const std::string& act_dtype, uint64_t seed) {
  std::mt19937_64 rng(seed);
  QuantCase c;
  ir::ValueId x = c.g.add_input("x", DType::kF32, Shape{"T", k});
  ir::ValueId w = c.g.add_weight("w", random_tensor({n, k}, rng, "f32", -0.1f, 0.1f));
  ir::ValueId b = bias ? c.g.add_weight("b", random_tensor({n}, rng, act_dtype)) : ir::kNoValue;
  c.g.add_output("y", c.g.add("Linear", {x, w, b}, std::move(attrs), "linear"));
  for (int64_t t : ts) {
    StepCase s;
    s.inputs["x"] = random_tensor({t, k}, rng, act_dtype);
    c.steps.push_back(std::move(s));
  }
  return c;
}

const std::vector<int64_t>& all_row_counts() {
  static const std::vector<int64_t> v = {1, 2, 3, 4, 5, 6, 7, 8, 9, 33};  // GEMV up to 8, then tiles
  return v;
}

// f32 activations: the node's precision attribute quantizes it on both backends.
TEST(CudaQuant, LinearMatchesCpuQuantizedKernelsInF32) {
  KILN_SKIP_WITHOUT_CUDA();
  struct S { int64_t n, k; bool bias; };
  for (const char* q : {"q8", "q4"})
    for (S s : {S{1, 32, false}, S{37, 96, true}, S{130, 256, false}, S{70, 4128, true}, S{4097, 2048, true},
                S{6, 14336, false}}) {
      QuantCase c = linear_case(s.n, s.k, s.bias, {{"precision", std::string(q)}}, all_row_counts(), "f32",
                                uint64_t(s.n * 7 + s.k + q[1]));
      expect_backends_match_opts(c.g, c.steps, {.weight_dtype = "f32"}, {.weight_dtype = "f32"}, kQuantF32Tol,
                                 str_cat("Linear ", q, " n=", s.n, " k=", s.k, s.bias ? " +bias" : "", " t=1..9,33"));
    }
}

TEST(CudaQuant, EpiloguesAndSwiGluInEveryActivationDtype) {
  KILN_SKIP_WITHOUT_CUDA();
  for (const auto& dt : all_dtypes())
    for (const QGemvCase& kc : kQGemvCases) {
      if (dt == "f32" && *kc.env) continue;  // f32 activations always run the kRows kernel
      ScopedQGemv env(kc.env);
      for (const char* q : {"q8", "q4"})
        for (const char* act : {"gelu_erf", "gelu_tanh", "silu", "swiglu"}) {
          QuantCase c = linear_case(322, 256, true, {{"precision", std::string(q)}, {"activation", std::string(act)}},
                                    {1, 3, 8, 9, 20}, dt, uint64_t(act[0] + act[5] + q[1]));
          expect_backends_match_opts(c.g, c.steps, {.weight_dtype = "f32"}, {.weight_dtype = dt},
                                     dt == "f32" ? kQuantF32Tol : op_tolerance(dt) + kc.extra_tol,
                                     str_cat("Linear ", q, "+", act, " n=322 k=256 t=1,3,8,9,20 qgemv ",
                                             *kc.env ? kc.env : "default"));
        }
    }
}

// Weights larger than one dequantization tile (24 MiB: 1536 f32 / 3072 bf16 rows of
// k=4096), SwiGLU tiles that straddle the gate/up boundary, and the resident size: the
// codes and f16 scales only (a 16-bit copy would at least double it).
TEST(CudaQuant, GemmTilesAndResidentSize) {
  KILN_SKIP_WITHOUT_CUDA();
  const int64_t n = 4000, k = 4096;
  for (const std::string dt : {"f32", "bf16"})
    for (const char* q : {"q8", "q4"})
      for (bool swiglu : {false, true}) {
        std::map<std::string, ir::Attr> attrs{{"precision", std::string(q)}};
        if (swiglu) attrs["activation"] = std::string("swiglu");
        // 300 rows: one tile the width of the device (dequant_tile_rows); 40: L2-sized tiles.
        QuantCase c = linear_case(n, k, true, attrs, {300, 40, 1}, dt, uint64_t(swiglu) + q[1]);
        // The default kernel (dp4a for bf16) at t=1: its bound.
        expect_backends_match_opts(c.g, c.steps, {.weight_dtype = "f32"}, {.weight_dtype = dt},
                                   dt == "f32" ? kQuantF32Tol : op_tolerance(dt) + kDp4aExtraTol,
                                   str_cat("Linear ", q, swiglu ? "+swiglu" : "", " n=4000 k=4096 t=300,40,1"));
        auto gg = create_backend("cuda")->compile(c.g, {.weight_dtype = dt});
        const double bf16_bytes = double(n * k) * 2, got = double(gg->weight_bytes());
        const double want = std::string(q) == "q8" ? double(n) * (k + k / 32 * 2 + 4) : double(n) * (k / 2 + k / 32 * 4 + 4);
        std::printf("  %s resident: %.2f MiB (bf16 would be %.2f MiB)\n", q, got / (1 << 20), bf16_bytes / (1 << 20));
        EXPECT_GE(got, want) << q;
        EXPECT_LE(got, want + double(n) * 4 + 4096) << q << ": more than the quantized weight and the bias";
      }
}

// The skinny GEMM's split-K rule alone (no GPU): split until the CTAs (64 weight rows each)
// fill two a SM, keeping at least 4 k blocks (q4: 128 values, q8: 64) a split.
TEST(CudaQuant, SkinnyGemmSplitsSmallGrids) {
  EXPECT_EQ(qgemm_skinny_splits(28672, 4096, QuantFormat::kQ4, 132), 1);  // 448 CTAs
  EXPECT_EQ(qgemm_skinny_splits(4096, 4096, QuantFormat::kQ4, 132), 8);   // 64 CTAs, 32 blocks
  EXPECT_EQ(qgemm_skinny_splits(4096, 14336, QuantFormat::kQ4, 132), 8);  // 64 CTAs, 112 blocks
  EXPECT_EQ(qgemm_skinny_splits(6144, 4096, QuantFormat::kQ4, 132), 4);   // 96 CTAs: 192 < 264
  EXPECT_EQ(qgemm_skinny_splits(2048, 5632, QuantFormat::kQ8, 132), 8);   // 32 CTAs, 88 blocks
  EXPECT_EQ(qgemm_skinny_splits(2560, 2048, QuantFormat::kQ4, 132), 4);   // 40 CTAs, 16 blocks
  EXPECT_EQ(qgemm_skinny_splits(130, 256, QuantFormat::kQ4, 132), 1);     // 2 blocks
  EXPECT_EQ(qgemm_skinny_splits(4096, 4096, QuantFormat::kQ4, 0), 1);
}

// The chunked GEMV's rule alone (no GPU): the row count where the weight is large enough
// and the kernel takes 8 rows, else 0 (tiles); the defaults on the measured shapes.
TEST(CudaQuant, ChunkedGemvOnlyForLargeWeights) {
  EXPECT_EQ(qgemv_chunk_rows(28672 * 4096, 16, 80'000'000, true), 16);   // 8B gate|up: 117M values
  EXPECT_EQ(qgemv_chunk_rows(128256 * 4096, 16, 80'000'000, true), 16);  // 8B LM head
  EXPECT_EQ(qgemv_chunk_rows(int64_t(4096) * 14336, 16, 80'000'000, true), 0);  // 8B down: 59M
  EXPECT_EQ(qgemv_chunk_rows(32000 * 2048, 16, 80'000'000, true), 0);   // TinyLlama LM head: 66M
  EXPECT_EQ(qgemv_chunk_rows(28672 * 4096, 16, 80'000'000, false), 0);  // no 8-row kernel at this k
  EXPECT_EQ(qgemv_chunk_rows(100, 64, 0, true), 64);
  EXPECT_EQ(qgemv_chunk_rows(100, 0, 0, true), 0);
}

// The two tile dequantizers give the same bits (one thread per code word, and the earlier
// one per 16-byte chunk: KILN_CUDA_DEQUANT_WORDS=0), over row ranges that start inside the
// weight, a k of an odd group count, and more than 65535 rows in one call (the new
// kernel's grid takes rows in launches of 65535).
TEST(CudaQuant, DequantKernelsGiveTheSameBits) {
  KILN_SKIP_WITHOUT_CUDA();
  struct S {
    int64_t n, k, r0, rows;
  };
  for (const DType t : {DType::kBF16, DType::kF16, DType::kF32})
    for (const QuantFormat f : {QuantFormat::kQ4, QuantFormat::kQ8})
      for (const S s : {S{300, 4128, 37, 250}, S{70000, 64, 0, 70000}, S{70000, 96, 3, 65537}}) {
        std::mt19937_64 rng(uint64_t(s.n + s.k));
        const DeviceQuantWeight dw(s.n, s.k, f, rng);
        const QuantWeightView& w = dw.w;
        const size_t bytes = size_t(s.rows * s.k) * dtype_size(t);
        DeviceBuffer a(bytes), b(bytes);
        launch_dequant_rows(t, w, s.r0, s.rows, a.get(), nullptr, true);
        launch_dequant_rows(t, w, s.r0, s.rows, b.get(), nullptr, false);
        std::vector<uint8_t> ha(bytes), hb(bytes);
        KILN_CUDA_CHECK(cudaMemcpy(ha.data(), a.get(), bytes, cudaMemcpyDeviceToHost));
        KILN_CUDA_CHECK(cudaMemcpy(hb.data(), b.get(), bytes, cudaMemcpyDeviceToHost));
        EXPECT_TRUE(ha == hb) << dtype_name(t) << " " << quant_format_name(f) << " n=" << s.n
                              << " k=" << s.k << " rows [" << s.r0 << ", +" << s.rows << ")";
      }
}

// The tile rule alone (no GPU): L2-sized even tiles below 256 token rows; from 256 rows,
// enough rows for four waves of 128 x 256 output tiles, capped at 256 MB.
TEST(CudaQuant, DequantTilesFillTheDeviceAtPromptRows) {
  const int sms = 132;
  // Llama-3.1-8B's gate|up [28672, 4096], bf16 tiles: 24 MB is 3072 rows.
  EXPECT_EQ(dequant_tile_rows(28672, 4096, 2, 64, sms, true), 2944);     // 10 even tiles
  EXPECT_EQ(dequant_tile_rows(28672, 4096, 2, 512, sms, false), 2944);   // KILN_CUDA_DEQUANT_WIDE=0
  EXPECT_EQ(dequant_tile_rows(28672, 4096, 2, 512, sms, true), 28672);   // one tile: 4 x 112 CTAs
  EXPECT_EQ(dequant_tile_rows(28672, 4096, 2, 2048, sms, true), 7168);   // 33 x 256 rows -> 4 even tiles
  // The LM head [128256, 4096] at 512 rows: 256 MB caps a tile at 32768 rows.
  EXPECT_EQ(dequant_tile_rows(128256, 4096, 2, 512, sms, true), 32128);
  // Small weights are one tile; tiles are multiples of 128 rows or the whole weight.
  EXPECT_EQ(dequant_tile_rows(1000, 4096, 2, 9, sms, true), 1000);
  for (int64_t t : {9, 255, 256, 1000, 4096})
    for (int64_t n : {4000, 14336, 50000}) {
      const int64_t r = dequant_tile_rows(n, 4096, 4, t, sms, true);
      EXPECT_TRUE(r == n || r % 128 == 0) << n << " " << t;
      EXPECT_LE(size_t(r) * 4096 * 4, size_t(256) << 20) << n << " " << t;
    }
}

// `--weight-dtype q8|q4`: every Linear quantized, bf16 activations; K = 100 (not a
// multiple of 32) stays bf16 on both backends, so with bf16-exact weights it matches
// tightly in f32 too.
TEST(CudaQuant, WeightDtypeOptionAndTheKFallback) {
  KILN_SKIP_WITHOUT_CUDA();
  for (const char* q : {"q8", "q4"}) {
    QuantCase c = linear_case(96, 512, true, {}, {1, 4, 8, 12}, "bf16", q[1]);
    // t = 1, 4 run the default GEMV (dp4a; t = 8 the skinny GEMM): its bound.
    expect_backends_match_opts(c.g, c.steps, {.weight_dtype = q}, {.weight_dtype = q},
                               op_tolerance("bf16") + kDp4aExtraTol, str_cat("Linear --weight-dtype ", q, " n=96 k=512"));
    std::mt19937_64 rng(9);
    ir::Graph g;
    ir::ValueId x = g.add_input("x", DType::kF32, Shape{"T", 100});
    ir::ValueId w = g.add_weight("w", random_tensor({50, 100}, rng, "bf16", -0.1f, 0.1f));
    g.add_output("y", g.add("Linear", {x, w, ir::kNoValue}, {{"precision", std::string(q)}}, "linear"));
    StepCase s;
    s.inputs["x"] = random_tensor({3, 100}, rng, "f32");
    expect_backends_match_opts(g, {s}, {.weight_dtype = "f32"}, {.weight_dtype = "f32"}, op_tolerance("f32"),
                               str_cat("Linear ", q, " k=100 (stays 16-bit)"));
  }
}

// The kMma image read back by the layout's definition (gemv_quant.h), independently of
// the kernels: every code, scale and min where the layout says, zeros in the padding.
TEST(CudaQuant, MmaImageFollowsTheLayout) {
  std::mt19937_64 rng(5);
  for (QuantFormat f : {QuantFormat::kQ8, QuantFormat::kQ4})
    for (int64_t k : {32, 96, 128, 160, 4128}) {
      const int64_t n = 3;
      std::vector<float> w(size_t(n * k));
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      for (float& v : w) v = u(rng);
      const QuantizedRows q = quantize_rows(w.data(), n, k, f);
      const QuantImage img = quant_image(q, QuantLayout::kMma);
      const QuantWeightView v = img.view_at(img.bytes.data());
      const bool q4 = f == QuantFormat::kQ4;
      const int64_t per_block = q4 ? 4 : 2, groups = k / 32, blocks = (groups + per_block - 1) / per_block;
      ASSERT_EQ(v.code_stride, 64 * blocks);
      ASSERT_EQ(v.scale_stride, per_block * blocks);
      for (int64_t r = 0; r < n; ++r) {
        const uint8_t* row = v.codes + r * v.code_stride;
        for (int64_t g = 0; g < per_block * blocks; ++g)
          for (int64_t t = 0; t < 4; ++t)
            for (int64_t e = 0; e < 8; ++e) {
              const uint8_t* slice = row + (g / per_block) * 64 + t * 16 + (g % per_block) * (q4 ? 4 : 8);
              int got;
              if (q4) {
                uint32_t word;
                std::memcpy(&word, slice, 4);
                got = int((word >> (e % 2 ? 16 + 4 * (e / 2) : 4 * (e / 2))) & 15u);
              } else {
                got = int(int8_t(slice[e]));
              }
              const int want = g < groups ? quant_code(f, q.codes.get() + r * int64_t(quant_row_code_bytes(f, k)),
                                                       g * 32 + t * 8 + e)
                                          : 0;
              ASSERT_EQ(got, want) << quant_format_name(f) << " k=" << k << " row " << r << " group " << g
                                   << " slice " << t << " code " << e;
            }
        for (int64_t g = 0; g < per_block * blocks; ++g) {
          const auto* sc = static_cast<const uint8_t*>(v.scales) + (r * v.scale_stride + g) * (q4 ? 4 : 2);
          uint16_t s16 = 0, m16 = 0;
          std::memcpy(&s16, sc, 2);
          if (q4) std::memcpy(&m16, sc + 2, 2);
          EXPECT_EQ(s16, g < groups ? q.scales[size_t(r * groups + g)] : 0) << "scale " << r << "," << g;
          if (q4) {
            EXPECT_EQ(m16, g < groups ? q.mins[size_t(r * groups + g)] : 0) << "min " << r << "," << g;
          }
        }
        EXPECT_EQ(v.row_factor[r], q.row_factor[size_t(r)]);
      }
    }
}

// The tensor-core GEMV (kMma, bf16/f16): K with a partial last block (k % 128 != 0 for q4,
// % 64 for q8), N not a multiple of the 16-row tile, a single row, split-K, SwiGLU with an
// odd output count, every token count 1..8, and the kMma dequantization for 9 rows.
TEST(CudaQuant, MmaGemvShapesInBf16AndF16) {
  KILN_SKIP_WITHOUT_CUDA();
  ScopedQGemv env("mma");  // not the default since dp4a is
  struct S { int64_t n, k; bool bias; const char* act; };
  for (const std::string dt : {"bf16", "f16"})
    for (const char* q : {"q8", "q4"})
      for (S s : {S{1, 32, false, ""}, S{37, 96, true, ""}, S{130, 160, false, "gelu_tanh"}, S{70, 4128, true, ""},
                  S{4097, 2048, true, ""}, S{6, 14336, false, ""}, S{2 * 21, 224, true, "swiglu"},
                  S{2 * 600, 4096, false, "swiglu"}}) {
        std::map<std::string, ir::Attr> attrs{{"precision", std::string(q)}};
        if (*s.act) attrs["activation"] = std::string(s.act);
        QuantCase c = linear_case(s.n, s.k, s.bias, attrs, {1, 2, 3, 4, 5, 6, 7, 8, 9}, dt,
                                  uint64_t(s.n * 5 + s.k + q[1]));
        expect_backends_match_opts(c.g, c.steps, {.weight_dtype = "f32"}, {.weight_dtype = dt}, op_tolerance(dt),
                                   str_cat("Linear ", dt, " ", q, *s.act ? "+" : "", s.act, " n=", s.n, " k=", s.k,
                                           s.bias ? " +bias" : "", " t=1..9"));
      }
}

// The prompt GEMM that decodes the weight in shared memory (launch_qgemm) against f64 sums
// over the weights the tile dequantizer gives (launch_dequant_rows, the path it replaces):
// the same weights, only the f32 summation order differs, so each output is within its
// rounding (2^-8 of |y| in bf16, 2^-11 in f16) plus 1e-4 of max|y|. Token rows around its
// 64-row tiles, weight rows around its 128-row tiles, k from one group to 129, rows of y
// wider than n (the columns past n untouched), with and without bias; a rerun, and CTAs of 8
// warps instead of 4, give the same bits. The skinny GEMM (launch_qgemm_skinny, up to 64
// token rows: 1, 9, 16, 33 and 64 here, weight rows around its 64-row CTAs, k blocks of 128 /
// 64 with partial last ones) within the same bound.
TEST(CudaQuant, FusedPromptGemmMatchesTheDequantizedWeights) {
  KILN_SKIP_WITHOUT_CUDA();
  std::mt19937_64 rng(41);
  struct S {
    int64_t m, n, k, ldy;
    bool bias;
  };
  const S cases[] = {
      {9, 2, 32, 2, true},         {64, 128, 256, 128, false},     {65, 130, 96, 136, true},
      {130, 384, 4128, 384, true}, {300, 1000, 2048, 1000, false}, {1, 64, 64, 64, false},
      {16, 130, 96, 136, true},    {33, 200, 4128, 200, false},    {20, 1000, 2048, 1000, true}};
  auto bits_of = [](DType t, float v) {
    return t == DType::kBF16 ? f32_to_bf16(v) : f32_to_f16(v);
  };
  auto value_of = [](DType t, uint16_t b) {
    return double(t == DType::kBF16 ? bf16_to_f32(b) : f16_to_f32(b));
  };
  for (DType t : {DType::kBF16, DType::kF16})
    for (QuantFormat f : {QuantFormat::kQ8, QuantFormat::kQ4})
      for (const S& c : cases) {
        const std::string what =
            str_cat(dtype_name(t), " ", quant_format_name(f), " m=", c.m, " n=", c.n, " k=", c.k,
                    " ldy=", c.ldy, c.bias ? " +bias" : "");
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        const DeviceQuantWeight dw(c.n, c.k, f, rng, 0.1f);
        const QuantWeightView& w = dw.w;
        ASSERT_TRUE(qgemm_supports(t, w)) << what;
        std::vector<uint16_t> xb(size_t(c.m * c.k)), bb(size_t(c.n)),
            y0(size_t(c.m * c.ldy), bits_of(t, 7.0f));
        for (uint16_t& b : xb) b = bits_of(t, u(rng));
        for (uint16_t& b : bb) b = bits_of(t, u(rng));
        const Dev x(xb.data(), xb.size() * 2), bias(bb.data(), bb.size() * 2),
            y(y0.data(), y0.size() * 2), wd(size_t(c.n * c.k) * 2);
        launch_dequant_rows(t, w, 0, c.n, wd.get(), nullptr);
        launch_qgemm(t, x.get(), w, c.bias ? bias.get() : nullptr, y.get(), c.m, c.ldy, nullptr);
        KILN_CUDA_CHECK(cudaDeviceSynchronize());
        const auto wb = wd.host<uint16_t>(size_t(c.n * c.k));
        const auto got = y.host<uint16_t>(y0.size());
        std::vector<double> ref(size_t(c.m * c.n));
        double mx = 0;
        for (int64_t i = 0; i < c.m; ++i)
          for (int64_t j = 0; j < c.n; ++j) {
            double acc = c.bias ? value_of(t, bb[size_t(j)]) : 0.0;
            for (int64_t q = 0; q < c.k; ++q)
              acc += value_of(t, xb[size_t(i * c.k + q)]) * value_of(t, wb[size_t(j * c.k + q)]);
            ref[size_t(i * c.n + j)] = acc;
            mx = std::max(mx, std::fabs(acc));
          }
        const double rel = t == DType::kBF16 ? 0x1p-8 : 0x1p-11;
        // The largest error in units of the element's bound (failures counted, not thrown).
        auto worst_of = [&](const std::vector<uint16_t>& out, const std::string& which) {
          double worst = 0;
          int bad = 0;
          for (int64_t i = 0; i < c.m; ++i)
            for (int64_t j = 0; j < c.ldy; ++j) {
              const size_t at = size_t(i * c.ldy + j);
              if (j >= c.n) {
                if (out[at] != y0[at] && bad++ < 3)
                  ADD_FAILURE() << which << ": column " << j << " past n written, row " << i;
                continue;
              }
              const double r = ref[size_t(i * c.n + j)], e = std::fabs(value_of(t, out[at]) - r);
              const double bound = rel * std::fabs(r) + 1e-4 * mx;
              worst = std::max(worst, std::isnan(e) ? INFINITY : e / bound);
              if (!(e <= bound) && bad++ < 3)
                ADD_FAILURE() << which << " y[" << i << "][" << j << "] = " << value_of(t, out[at])
                              << ", f64 " << r;
            }
          return worst;
        };
        // The skinny GEMM in one k split and in its rule's splits for 132 SMs (partial sums
        // in a workspace), each rerun; two k blocks in flight: the same bits as one.
        const int rule = qgemm_skinny_splits(c.n, c.k, f, 132);
        for (const int splits : {1, rule, kQGemmSkinnyMaxSplits}) {
          if (c.m > kQGemmSkinnyMaxRows) break;
          const size_t ws_bytes = size_t(splits * c.m * c.n) * sizeof(float);
          const Dev ys(y0.data(), y0.size() * 2), ws(ws_bytes);
          const std::string which = str_cat(what, " (skinny, ", splits, " splits)");
          launch_qgemm_skinny(t, x.get(), w, c.bias ? bias.get() : nullptr, ys.get(), c.m, c.ldy,
                              nullptr, splits, ws.get(), ws_bytes);
          KILN_CUDA_CHECK(cudaDeviceSynchronize());
          const auto sk = ys.host<uint16_t>(y0.size());
          std::printf("  %-48s worst %.2f of the bound\n", which.c_str(), worst_of(sk, which));
          for (const int depth : {1, 2}) {
            launch_qgemm_skinny(t, x.get(), w, c.bias ? bias.get() : nullptr, ys.get(), c.m, c.ldy,
                                nullptr, splits, ws.get(), ws_bytes, depth);
            KILN_CUDA_CHECK(cudaDeviceSynchronize());
            EXPECT_EQ(ys.host<uint16_t>(y0.size()), sk)
                << which << ": a rerun at depth " << depth << " differs";
          }
        }
        const double worst = worst_of(got, what);
        ASSERT_FALSE(HasFailure()) << what;
        std::printf("  %-48s worst %.2f of the bound\n", what.c_str(), worst);
        launch_qgemm(t, x.get(), w, c.bias ? bias.get() : nullptr, y.get(), c.m, c.ldy, nullptr);
        KILN_CUDA_CHECK(cudaDeviceSynchronize());
        EXPECT_EQ(y.host<uint16_t>(y0.size()), got) << what << ": a rerun differs";
        // CTAs of 8 warps: the same k order into every output, so the same bits.
        launch_qgemm(t, x.get(), w, c.bias ? bias.get() : nullptr, y.get(), c.m, c.ldy, nullptr, 8);
        KILN_CUDA_CHECK(cudaDeviceSynchronize());
        EXPECT_EQ(y.host<uint16_t>(y0.size()), got) << what << ": 8 warps differ from 4";
      }
  // Outside its shapes: odd n, the kMma layout, f32.
  const QuantImage odd =
      quant_image(quantize_rows(std::vector<float>(3 * 64, 0.5f).data(), 3, 64, QuantFormat::kQ4),
                  QuantLayout::kRows);
  EXPECT_FALSE(qgemm_supports(DType::kBF16, odd.shape));
  const QuantImage mma =
      quant_image(quantize_rows(std::vector<float>(4 * 64, 0.5f).data(), 4, 64, QuantFormat::kQ4),
                  QuantLayout::kMma);
  EXPECT_FALSE(qgemm_supports(DType::kBF16, mma.shape));
  EXPECT_FALSE(qgemm_supports(DType::kF32, odd.shape));
  QuantWeightView strided = quant_view_shape(QuantFormat::kQ4, 4, 64, QuantLayout::kRows);
  EXPECT_TRUE(qgemm_supports(DType::kBF16, strided));
  strided.code_stride += 16;  // rows further apart than the kRows layout's
  EXPECT_FALSE(qgemm_supports(DType::kBF16, strided));
}

// The weight the prompt GEMM decodes is the tile dequantizer's bit for bit: with x the
// k x k identity every output is one weight times one (the other terms exact zeros), so
// y[i][j] must be the dequantized w[j][i] exactly, in both dtypes and formats, over
// several k steps and a partial tile of weight rows; the skinny GEMM too (k <= 64: m = k).
TEST(CudaQuant, FusedPromptGemmDecodesTheTileDequantizersWeights) {
  KILN_SKIP_WITHOUT_CUDA();
  std::mt19937_64 rng(43);
  for (DType t : {DType::kBF16, DType::kF16})
    for (QuantFormat f : {QuantFormat::kQ8, QuantFormat::kQ4})
      for (const int64_t k : {32, 64, 96}) {
        const int64_t n = 130;
        const DeviceQuantWeight dw(n, k, f, rng);
        const QuantWeightView& w = dw.w;
        std::vector<uint16_t> eye(size_t(k * k),
                                  t == DType::kBF16 ? f32_to_bf16(0.0f) : f32_to_f16(0.0f));
        for (int64_t i = 0; i < k; ++i)
          eye[size_t(i * k + i)] = t == DType::kBF16 ? f32_to_bf16(1.0f) : f32_to_f16(1.0f);
        const Dev x(eye.data(), eye.size() * 2), y(size_t(k * n) * 2), wd(size_t(n * k) * 2);
        launch_dequant_rows(t, w, 0, n, wd.get(), nullptr);
        const auto wb = wd.host<uint16_t>(size_t(n * k));
        // CTAs of 4 and 8 warps, then (0) the skinny GEMM where k = m fits it.
        for (int warps : {4, 8, 0}) {
          if (warps == 0 && k > kQGemmSkinnyMaxRows) continue;
          KILN_CUDA_CHECK(
              cudaMemset(y.get(), 0xFF, size_t(k * n) * 2));  // NaN: an unwritten output fails
          if (warps == 0)
            launch_qgemm_skinny(t, x.get(), w, nullptr, y.get(), k, n, nullptr);
          else
            launch_qgemm(t, x.get(), w, nullptr, y.get(), k, n, nullptr, warps);
          KILN_CUDA_CHECK(cudaDeviceSynchronize());
          const auto got = y.host<uint16_t>(size_t(k * n));
          for (int64_t i = 0; i < k; ++i)
            for (int64_t j = 0; j < n; ++j)
              ASSERT_EQ(got[size_t(i * n + j)], wb[size_t(j * k + i)])
                  << dtype_name(t) << " " << quant_format_name(f) << " k=" << k << " "
                  << (warps ? str_cat(warps, " warps") : std::string("skinny")) << ": y[" << i
                  << "][" << j << "]";
        }
      }
}

// The skinny GEMM's weights bit for bit over many k blocks: x's 64 rows are unit vectors
// e_p at positions spread over every block, every chunk of a block (lane t) and the partial
// last block (k = 4128: 33 q4 blocks of 128, 65 q8 blocks of 64), so y[i][j] must be the
// dequantized w[j][p_i] exactly; every token-tile count (m = 8, 16, 32, 64), n around the
// 64-row CTAs, outputs preset to NaN.
TEST(CudaQuant, SkinnyGemmSelectsTheTileDequantizersWeights) {
  KILN_SKIP_WITHOUT_CUDA();
  std::mt19937_64 rng(47);
  const int64_t k = 4128, n = 70;
  for (DType t : {DType::kBF16, DType::kF16})
    for (QuantFormat f : {QuantFormat::kQ8, QuantFormat::kQ4}) {
      const DeviceQuantWeight dw(n, k, f, rng);
      const QuantWeightView& w = dw.w;
      const Dev wd(size_t(n * k) * 2);
      launch_dequant_rows(t, w, 0, n, wd.get(), nullptr);
      const auto wb = wd.host<uint16_t>(size_t(n * k));
      const uint16_t zero = t == DType::kBF16 ? f32_to_bf16(0.0f) : f32_to_f16(0.0f);
      const uint16_t one = t == DType::kBF16 ? f32_to_bf16(1.0f) : f32_to_f16(1.0f);
      for (const int64_t m : {8, 16, 32, 64}) {
        std::vector<int64_t> at_k(static_cast<size_t>(m));
        for (int64_t i = 0; i < m; ++i)
          at_k[size_t(i)] = i == m - 1 ? k - 1 : (i * 997 + 13 * (i % 4)) % k;
        std::vector<uint16_t> xb(size_t(m * k), zero);
        for (int64_t i = 0; i < m; ++i) xb[size_t(i * k + at_k[size_t(i)])] = one;
        const size_t ws_bytes = size_t(kQGemmSkinnyMaxSplits * m * n) * sizeof(float);
        const Dev x(xb.data(), xb.size() * 2), y(size_t(m * n) * 2), ws(ws_bytes);
        for (const int splits : {1, 3, kQGemmSkinnyMaxSplits}) {  // k split or not: exact sums
          KILN_CUDA_CHECK(cudaMemset(y.get(), 0xFF, size_t(m * n) * 2));
          launch_qgemm_skinny(t, x.get(), w, nullptr, y.get(), m, n, nullptr, splits, ws.get(),
                              ws_bytes, splits == 3 ? 2 : 1);
          KILN_CUDA_CHECK(cudaDeviceSynchronize());
          const auto got = y.host<uint16_t>(size_t(m * n));
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j)
              ASSERT_EQ(got[size_t(i * n + j)], wb[size_t(j * k + at_k[size_t(i)])])
                  << dtype_name(t) << " " << quant_format_name(f) << " m=" << m << " splits "
                  << splits << ": y[" << i << "][" << j << "], k position " << at_k[size_t(i)];
        }
      }
    }
}

// The q8/q4 GEMMs inside the Linear op (KILN_CUDA_QGEMM=fused|fused8|skinny|dequant or unset:
// skinny, read when the op is prepared) against the CPU backend's q8/q4 kernels, with the
// 16-bit bound of the path each replaces: every epilogue and SwiGLU behind it, prompt rows
// (7 rows: the skinny GEMM by default, the GEMV otherwise; 9+), odd n on the dequantize path
// beside it; the skinny GEMM also at 1-8 rows (KILN_CUDA_QGEMM_SKINNY_MIN_ROWS=1) and at depth 2; a
// bad value of the switch is an error naming it.
TEST(CudaQuant, FusedPromptGemmInTheLinear) {
  KILN_SKIP_WITHOUT_CUDA();
  ScopedEnv tiles("KILN_CUDA_QGEMV_CHUNK_ROWS",
                  "0");  // never the chunked GEMV, whatever the environment
  // skinny (the default, also unset): 7, 9 and 64 rows, tiles past; the others: tiles from 9
  // (7 rows would take the dp4a GEMV there). Odd n (37) has no skinny GEMM: its 7 rows take
  // the dp4a GEMV, within the bound of its x rounding.
  for (const char* mode : {"fused", "fused8", "skinny", "", "dequant"}) {
    ScopedEnv env("KILN_CUDA_QGEMM", mode);
    ScopedEnv min_rows("KILN_CUDA_QGEMM_SKINNY_MIN_ROWS", "");  // its default: 7 rows skinny
    ScopedQGemv layout("");  // the default GEMV, whose kRows layout the fused GEMM reads
    struct S {
      int64_t n, k;
      bool bias;
      const char* act;
    };
    for (const std::string dt : {"bf16", "f16"})
      for (const char* q : {"q8", "q4"})
        for (S s : {S{130, 256, true, ""}, S{37, 96, true, ""}, S{2 * 161, 224, true, "swiglu"},
                    S{256, 4128, false, "gelu_tanh"}, S{200, 64, false, "silu"}}) {
          std::map<std::string, ir::Attr> attrs{{"precision", std::string(q)}};
          if (*s.act) attrs["activation"] = std::string(s.act);
          const bool skinny_7 = !*mode || std::string(mode) == "skinny";
          QuantCase c = linear_case(s.n, s.k, s.bias, attrs,
                                    skinny_7 ? std::vector<int64_t>{7, 9, 64, 65, 130}
                                             : std::vector<int64_t>{9, 64, 65, 130},
                                    dt, uint64_t(s.n * 3 + s.k + q[1]));
          const double gemv_7 = skinny_7 && s.n % 2 != 0 ? kDp4aExtraTol : 0.0;
          expect_backends_match_opts(c.g, c.steps, {.weight_dtype = "f32"}, {.weight_dtype = dt},
                                     op_tolerance(dt) + gemv_7,
                                     str_cat("Linear ", mode, " ", dt, " ", q, *s.act ? "+" : "",
                                             s.act, " n=", s.n, " k=", s.k, s.bias ? " +bias" : "",
                                             skinny_7 ? " t=7,9,64,65,130" : " t=9,64,65,130"));
        }
  }
  {  // the skinny GEMM from one token row (KILN_CUDA_QGEMM_SKINNY_MIN_ROWS), the GEMV's rows
    ScopedEnv mode("KILN_CUDA_QGEMM", "skinny");
    ScopedEnv from_one("KILN_CUDA_QGEMM_SKINNY_MIN_ROWS", "1");
    ScopedEnv depth("KILN_CUDA_QGEMM_SKINNY_DEPTH", "2");
    for (const std::string dt : {"bf16", "f16"})
      for (const char* q : {"q8", "q4"})
        for (const char* act : {"", "swiglu"}) {
          std::map<std::string, ir::Attr> attrs{{"precision", std::string(q)}};
          if (*act) attrs["activation"] = std::string(act);
          QuantCase c = linear_case(2 * 161, 224, true, attrs, {1, 3, 8}, dt, uint64_t(q[1]) + 7);
          expect_backends_match_opts(c.g, c.steps, {.weight_dtype = "f32"}, {.weight_dtype = dt},
                                     op_tolerance(dt),
                                     str_cat("Linear skinny from 1 row, depth 2 ", dt, " ", q,
                                             *act ? "+" : "", act, " n=322 k=224 t=1,3,8"));
        }
  }
  ScopedEnv bad("KILN_CUDA_QGEMM", "maybe");
  QuantCase c = linear_case(8, 64, false, {{"precision", std::string("q4")}}, {9}, "bf16", 1);
  try {
    (void)create_backend("cuda")->compile(c.g, {.weight_dtype = "bf16"});
    ADD_FAILURE() << "KILN_CUDA_QGEMM=maybe was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KILN_CUDA_QGEMM='maybe'"), std::string::npos) << e.what();
  }
}

// Token rows past kQGemvMaxRows up to KILN_CUDA_QGEMV_CHUNK_ROWS run the GEMV in even
// chunks (9 rows: 5 + 4; 20: 7 + 7 + 6; 64: 8 x 8), each its rows of x and y: the CPU
// backend's outputs with the epilogues, for the dp4a kernel (within its x rounding's
// bound) and the mma one ("old", the kRows f32-path kernel, keeps the tiles), and the same
// against the tiles path (the count 0). A count that is not an integer in range is an error.
TEST(CudaQuant, ChunkedGemvInTheLinear) {
  KILN_SKIP_WITHOUT_CUDA();
  struct S {
    int64_t n, k;
    bool bias;
    const char* act;
  };
  ScopedEnv any_size("KILN_CUDA_QGEMV_CHUNK_MIN_WEIGHTS", "0");  // these weights are all small
  ScopedEnv no_skinny("KILN_CUDA_QGEMM", "dequant");  // rows past 8: the chunks or the tiles
  for (const char* rows : {"64", "0"})
    for (const char* kernel : {"", "mma", "old"}) {
      ScopedEnv env("KILN_CUDA_QGEMV_CHUNK_ROWS", rows);
      ScopedQGemv layout(kernel);
      for (const std::string dt : {"bf16", "f16", "f32"}) {
        if (dt == "f32" && *kernel) continue;  // f32 activations always take the kRows kernel
        for (const char* q : {"q8", "q4"})
          for (S s : {S{130, 256, true, ""}, S{2 * 161, 224, true, "swiglu"},
                      S{256, 4128, false, "gelu_tanh"}}) {
            std::map<std::string, ir::Attr> attrs{{"precision", std::string(q)}};
            if (*s.act) attrs["activation"] = std::string(s.act);
            QuantCase c = linear_case(s.n, s.k, s.bias, attrs, {9, 20, 64, 3}, dt,
                                      uint64_t(s.n * 5 + s.k + q[1]));
            // dp4a rounds x to int8 (f32 activations take the kRows f32 kernel)
            const double extra = !*kernel && dt != "f32" ? kDp4aExtraTol : 0.0;
            expect_backends_match_opts(
                c.g, c.steps, {.weight_dtype = "f32"}, {.weight_dtype = dt},
                op_tolerance(dt) + extra,
                str_cat("Linear chunk rows '", rows, "' kernel '", kernel, "' ", dt, " ", q,
                        *s.act ? "+" : "", s.act, " n=", s.n, " k=", s.k, s.bias ? " +bias" : "",
                        " t=9,20,64,3"));
          }
      }
    }
  for (const char* var : {"KILN_CUDA_QGEMV_CHUNK_ROWS", "KILN_CUDA_QGEMV_CHUNK_MIN_WEIGHTS",
                          "KILN_CUDA_DEQUANT_WORDS", "KILN_CUDA_QGEMM_SKINNY_SPLITS",
                          "KILN_CUDA_QGEMM_SKINNY_DEPTH", "KILN_CUDA_QGEMM_SKINNY_MIN_ROWS"}) {
    ScopedEnv skinny("KILN_CUDA_QGEMM", "");  // the skinny GEMM's settings are read too
    ScopedEnv bad(var, "8x");
    QuantCase c = linear_case(8, 64, false, {{"precision", std::string("q4")}}, {9}, "bf16", 1);
    try {
      (void)create_backend("cuda")->compile(c.g, {.weight_dtype = "bf16"});
      ADD_FAILURE() << var << "=8x was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(var) + "='8x'"), std::string::npos)
          << e.what();
    }
  }
}

// KILN_CUDA_QGEMV=old keeps the kRows layout and kernel for bf16/f16 (read when a graph
// is compiled); unset, the default dp4a kernel reads the same kRows layout.
TEST(CudaQuant, OldKernelStaysSelectable) {
  KILN_SKIP_WITHOUT_CUDA();
  EXPECT_EQ(qgemv_layout(DType::kF32), QuantLayout::kRows);
  ::setenv("KILN_CUDA_QGEMV", "old", 1);
  EXPECT_EQ(qgemv_layout(DType::kBF16), QuantLayout::kRows);
  // The kRows layout suits the skinny GEMM too: keep it off 8 rows, so the old kernel runs.
  ScopedEnv gemv_to_eight("KILN_CUDA_QGEMM_SKINNY_MIN_ROWS", "9");
  for (const std::string dt : {"bf16", "f16"})
    for (const char* q : {"q8", "q4"}) {
      QuantCase c = linear_case(130, 4128, true, {{"precision", std::string(q)}, {"activation", std::string("swiglu")}},
                                {1, 4, 8, 9}, dt, q[1]);
      expect_backends_match_opts(c.g, c.steps, {.weight_dtype = "f32"}, {.weight_dtype = dt}, op_tolerance(dt),
                                 str_cat("Linear ", dt, " ", q, "+swiglu (old kernel) n=130 k=4128"));
    }
  ::unsetenv("KILN_CUDA_QGEMV");
  EXPECT_EQ(qgemv_kernel(DType::kBF16), QGemvKernel::kDp4a);
  EXPECT_EQ(qgemv_layout(DType::kBF16), QuantLayout::kRows);
  ::setenv("KILN_CUDA_QGEMV", "mma", 1);
  EXPECT_EQ(qgemv_layout(DType::kBF16), QuantLayout::kMma);
  ::unsetenv("KILN_CUDA_QGEMV");
}

TEST(CudaQuant, BadOptionsAreErrors) {
  KILN_SKIP_WITHOUT_CUDA();
  QuantCase c = linear_case(8, 64, false, {}, {1}, "f32", 1);
  try {
    create_backend("cuda")->compile(c.g, {.weight_dtype = "q3"});
    FAIL() << "expected kInvalidArgument";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("q3"), std::string::npos) << e.what();
  }
  // An odd gate|up row count: refused when the graph is built (shape inference) or compiled.
  EXPECT_THROW(
      {
        QuantCase odd = linear_case(7, 64, false,
                                    {{"precision", std::string("q4")}, {"activation", std::string("swiglu")}}, {1},
                                    "f32", 2);
        create_backend("cuda")->compile(odd.g, {.weight_dtype = "f32"});
      },
      Error);
}

}  // namespace
}  // namespace kiln::cuda
