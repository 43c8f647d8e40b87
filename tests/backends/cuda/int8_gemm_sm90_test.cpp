// The fused int8 GEMM (ops/int8_gemm_sm90.h) against an exact host reference: int8 codes
// summed in int64 on the host, then int8.h's f32 epilogue in the same order (float(acc) *
// (xs * w_scale[j]) + bias[j], then GELU), rounded once to bf16/f16. Without an
// activation the f32 arithmetic is the same IEEE operations, so the outputs must be
// equal to the bit; with gelu_erf the device's erfcf may differ from the host's by an f32
// ulp or two, so one output ulp is allowed. Also: the same bits as cuBLASLt's int8 GEMM +
// the dequantize kernel (the path it replaces) for every case, every tile configuration,
// rows that are not a multiple of the tile (1..4100), per-token and static scales, with
// and without bias, sums beyond 2^24 (float(acc) rounds); the timing of the
// configurations; the codes epilogue against the T output + the GELU-to-codes pass; and
// the shape checks' messages. Skips without a GPU or a build without
// CUTLASS (the checks' test needs neither).
#include "backends/cuda/ops/int8_gemm_sm90.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_context.h"
#include "backends/cuda/ops/gemm.h"
#include "backends/cuda/ops/elementwise_int8.h"
#include "backends/cuda/ops/int8.h"
#include "backends/cuda/ops/unary_lut.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "cuda_test_util.h"

namespace kiln::cuda {
namespace {

#define KILN_SKIP_WITHOUT_INT8_SM90()                                          \
  do {                                                                         \
    KILN_SKIP_WITHOUT_CUDA();                                                  \
    std::string why_;                                                          \
    if (!int8_gemm_sm90_available(&why_)) GTEST_SKIP() << "skipped: " << why_; \
  } while (0)

template <typename T>
DeviceBuffer upload(const std::vector<T>& v) {
  DeviceBuffer b(v.size() * sizeof(T));
  KILN_CUDA_CHECK(cudaMemcpy(b.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return b;
}

std::vector<uint16_t> download16(const DeviceBuffer& b, size_t n) {
  std::vector<uint16_t> v(n);
  KILN_CUDA_CHECK(cudaMemcpy(v.data(), b.get(), n * 2, cudaMemcpyDeviceToHost));
  return v;
}

float host_gelu_erf(float x) { return 0.5f * x * std::erfc(-x * 0.70710678118654752f); }

struct Case {
  int64_t m, n, k;
};

// One problem: random codes (a few rows and channels at +-127 everywhere, so that their
// sums pass 2^24 and float(acc) rounds), scales and bias, the int64 reference sums of
// the rows that are checked (all of them up to 1100 rows; beyond, every 5th row and the
// last 130 rows, which hold the partial tiles).
struct Problem {
  Case c;
  std::vector<int8_t> x, w;
  std::vector<float> xs, ws, bias;
  std::vector<int64_t> rows;  // the rows checked
  std::vector<int32_t> sums;  // [rows.size(), n]
  DeviceBuffer dx, dw, dxs, dws, dbias;

  explicit Problem(Case cs, uint64_t seed) : c(cs) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int> code(-127, 127);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    x.resize(size_t(c.m * c.k));
    w.resize(size_t(c.n * c.k));
    for (auto& v : x) v = int8_t(code(rng));
    for (auto& v : w) v = int8_t(code(rng));
    for (int64_t r = 0; r < c.m; r += 97)
      std::fill_n(x.begin() + r * c.k, c.k, int8_t(r % 2 ? -127 : 127));
    for (int64_t j = 0; j < c.n; j += 13) std::fill_n(w.begin() + j * c.k, c.k, int8_t(127));
    for (int64_t r = 0; r < c.m; ++r) xs.push_back(1e-3f + 4e-2f * u(rng));
    for (int64_t j = 0; j < c.n; ++j) ws.push_back(1e-3f + 1e-2f * u(rng));
    for (int64_t j = 0; j < c.n; ++j) bias.push_back(4.0f * u(rng) - 2.0f);
    for (int64_t r = 0; r < c.m; ++r)
      if (c.m <= 1100 || r % 5 == 0 || r >= c.m - 130) rows.push_back(r);
    sums.resize(rows.size() * size_t(c.n));
    ThreadPool::global().parallel_for(int64_t(rows.size()), [&](int64_t i0, int64_t i1, int) {
      for (int64_t i = i0; i < i1; ++i) {
        const int8_t* xr = x.data() + rows[size_t(i)] * c.k;
        for (int64_t j = 0; j < c.n; ++j) {
          const int8_t* wr = w.data() + j * c.k;
          int64_t s = 0;
          for (int64_t kk = 0; kk < c.k; ++kk) s += int64_t(xr[kk]) * int64_t(wr[kk]);
          EXPECT_LE(std::llabs(s), int64_t(INT32_MAX));
          sums[size_t(i * c.n + j)] = int32_t(s);
        }
      }
    });
    dx = upload(x);
    dw = upload(w);
    dxs = upload(xs);
    dws = upload(ws);
    dbias = upload(bias);
  }
};

struct Variant {
  DType out;
  GemvEpilogue act;
  bool per_token, with_bias;
};

std::string variant_name(const Case& c, const Variant& v, const char* cfg) {
  return str_cat("m=", c.m, " n=", c.n, " k=", c.k, " ", dtype_name(v.out),
                 v.act == GemvEpilogue::kGeluErf ? " gelu_erf" : "",
                 v.per_token ? " per-token" : " static", v.with_bias ? " +bias" : "", " [", cfg,
                 "]");
}

Int8Epilogue epilogue_of(const Problem& p, const Variant& v, float x_scale) {
  Int8Epilogue e;
  e.x_scale = x_scale;
  e.row_scale = v.per_token ? static_cast<const float*>(p.dxs.get()) : nullptr;
  e.w_scale = static_cast<const float*>(p.dws.get());
  e.bias = v.with_bias ? static_cast<const float*>(p.dbias.get()) : nullptr;
  e.act = v.act;
  return e;
}

// The device result vs the host reference: exact without an activation, one output ulp with GELU.
void expect_matches_reference(const Problem& p, const Variant& v, float x_scale,
                              const std::vector<uint16_t>& got, const std::string& what) {
  const int64_t n = p.c.n;
  size_t bad = 0;
  for (size_t i = 0; i < p.rows.size(); ++i) {
    const int64_t r = p.rows[i];
    const float xs = v.per_token ? p.xs[size_t(r)] : x_scale;
    for (int64_t j = 0; j < n; ++j) {
      const float b = v.with_bias ? p.bias[size_t(j)] : 0.0f;
      float y = float(p.sums[i * size_t(n) + size_t(j)]) * (xs * p.ws[size_t(j)]) + b;
      if (v.act == GemvEpilogue::kGeluErf) y = host_gelu_erf(y);
      const uint16_t want = v.out == DType::kBF16 ? f32_to_bf16(y) : f32_to_f16(y);
      const uint16_t g = got[size_t(r * n + j)];
      const int ulps = std::abs(int(g) - int(want));  // same sign: neighbouring codes differ by 1
      const bool ok = v.act == GemvEpilogue::kNone
                          ? g == want
                          : (g == want || ((g ^ want) < 0x8000 && ulps <= 1));
      if (!ok && bad++ < 5)
        ADD_FAILURE() << what << ": y[" << r << ", " << j << "] = 0x" << std::hex << g
                      << ", reference 0x" << want << std::dec << " (f32 " << y << ")";
    }
  }
  EXPECT_EQ(bad, 0u) << what;
}

TEST(CudaInt8GemmSm90, MatchesExactReferenceAndCublasLtPath) {
  KILN_SKIP_WITHOUT_INT8_SM90();
  int sms = 0;
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  Gemm gemm;
  const Case cases[] = {{1, 16, 64},       {5, 24, 80},      {64, 128, 128},    {130, 136, 144},
                        {300, 2304, 768},  {777, 520, 3072}, {1000, 3072, 256}, {4100, 768, 768},
                        {4100, 3072, 768}, {4096, 768, 3072}};
  uint64_t seed = 1;
  for (const Case& c : cases) {
    const Problem p(c, seed++);
    DeviceBuffer dy(size_t(c.m * c.n) * 2), dref(size_t(c.m * c.n) * 2), acc(size_t(c.m * c.n) * 4);
    const float x_scale = 0.0137f;
    int combo = 0;
    for (DType out : {DType::kBF16, DType::kF16})
      for (GemvEpilogue act : {GemvEpilogue::kNone, GemvEpilogue::kGeluErf})
        for (bool per_token : {false, true})
          for (bool with_bias : {false, true}) {
            const Variant v{out, act, per_token, with_bias};
            const Int8Epilogue e = epilogue_of(p, v, x_scale);
            const auto* dx = static_cast<const int8_t*>(p.dx.get());
            const auto* dw = static_cast<const int8_t*>(p.dw.get());
            ASSERT_EQ(int8_gemm_sm90_check(out, dx, dw, dy.get(), c.m, c.n, c.k, e), "");
            // The path it replaces, on the same codes: cuBLASLt's exact sums, then the dequantize
            // kernel.
            gemm.run_int8(dx, dw, static_cast<int32_t*>(acc.get()), c.m, c.n, c.k, nullptr);
            launch_int8_dequant(out, static_cast<const int32_t*>(acc.get()), c.m, c.n, c.n, e,
                                dref.get(), nullptr);
            const std::vector<uint16_t> ref = download16(dref, size_t(c.m * c.n));
            // Every configuration for the small shapes; the big ones rotate through them.
            for (int ci = 0; ci < kInt8GemmConfigs; ++ci) {
              if (c.m * c.n > (int64_t(1) << 21) && ci != combo % kInt8GemmConfigs) continue;
              const auto cfg = Int8GemmConfig(ci);
              const std::string what = variant_name(c, v, int8_gemm_config_name(cfg));
              const size_t ws_bytes = int8_gemm_sm90_workspace(cfg, out, c.m, c.n, c.k, act);
              DeviceBuffer ws(ws_bytes);
              KILN_CUDA_CHECK(cudaMemset(dy.get(), 0xff,
                                         size_t(c.m * c.n) * 2));  // NaN: unwritten outputs show
              launch_int8_gemm_sm90(cfg, out, dx, dw, c.m, c.n, c.k, e, dy.get(), ws.get(),
                                    ws_bytes, sms, nullptr);
              KILN_CUDA_CHECK(cudaDeviceSynchronize());
              const std::vector<uint16_t> got = download16(dy, size_t(c.m * c.n));
              expect_matches_reference(p, v, x_scale, got, what);
              size_t differ = 0;
              for (size_t i = 0; i < got.size(); ++i) differ += got[i] != ref[i];
              EXPECT_EQ(differ, 0u) << what << ": outputs that differ from cuBLASLt + dequantize";
            }
            ++combo;
          }
  }
}

// The codes epilogue: int8 codes of gelu_erf(T(v)) with a static scale, looked up in the
// GELU pass's codes table, equal to the byte to the T output followed by that pass
// (arithmetic), for every configuration (the big shapes rotate), static and per-token x
// scales.
TEST(CudaInt8GemmSm90, CodesEpilogueMatchesTheGeluPass) {
  KILN_SKIP_WITHOUT_INT8_SM90();
  int sms = 0;
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const Case cases[] = {{5, 32, 80}, {130, 144, 144}, {300, 2304, 768}, {4100, 3072, 768}};
  const float x_scale = 0.0137f;
  uint64_t seed = 11;
  int combo = 0;
  for (const Case& c : cases) {
    const Problem p(c, seed++);
    // The outputs' spread grows as sqrt(k) (random codes): most codes stay unsaturated.
    const float inv = 127.0f / (1.5f * std::sqrt(float(c.k)));
    const auto* dx = static_cast<const int8_t*>(p.dx.get());
    const auto* dw = static_cast<const int8_t*>(p.dw.get());
    DeviceBuffer dt(size_t(c.m * c.n) * 2), dref(size_t(c.m * c.n)), dq(size_t(c.m * c.n)),
        table{size_t(kUnaryLutEntries)};
    for (DType out : {DType::kBF16, DType::kF16}) {
      const auto* codes = static_cast<const int8_t*>(table.get());
      launch_unary_lut_fill_codes(UnaryOp::kGeluErf, out, inv, static_cast<int8_t*>(table.get()), nullptr);
      for (bool per_token : {false, true}) {
        const Variant plain{out, GemvEpilogue::kNone, per_token, true};
        Int8Epilogue e = epilogue_of(p, plain, x_scale), ec = e;
        ec.act = GemvEpilogue::kGeluErf;
        ASSERT_EQ(int8_gemm_sm90_check(out, dx, dw, dq.get(), c.m, c.n, c.k, ec, true), "");
        for (int ci = 0; ci < kInt8GemmConfigs; ++ci) {
          if (c.m * c.n > (int64_t(1) << 21) && ci != combo++ % kInt8GemmConfigs) continue;
          const auto cfg = Int8GemmConfig(ci);
          const std::string what = variant_name(c, plain, int8_gemm_config_name(cfg));
          DeviceBuffer ws(std::max(int8_gemm_sm90_workspace(cfg, out, c.m, c.n, c.k, e.act),
                                   int8_gemm_sm90_workspace(cfg, out, c.m, c.n, c.k, ec.act, true)));
          launch_int8_gemm_sm90(cfg, out, dx, dw, c.m, c.n, c.k, e, dt.get(), ws.get(), ws.size(), sms, nullptr);
          launch_unary_int8(UnaryOp::kGeluErf, out, dt.get(), c.m, c.n, inv, static_cast<int8_t*>(dref.get()),
                            nullptr, nullptr);
          KILN_CUDA_CHECK(cudaMemset(dq.get(), 0x80, size_t(c.m * c.n)));  // -128: no code, unwritten shows
          launch_int8_gemm_sm90(cfg, out, dx, dw, c.m, c.n, c.k, ec, dq.get(), ws.get(), ws.size(), sms, nullptr,
                                codes);
          KILN_CUDA_CHECK(cudaDeviceSynchronize());
          std::vector<int8_t> want(size_t(c.m * c.n)), got(want.size());
          KILN_CUDA_CHECK(cudaMemcpy(want.data(), dref.get(), want.size(), cudaMemcpyDeviceToHost));
          KILN_CUDA_CHECK(cudaMemcpy(got.data(), dq.get(), got.size(), cudaMemcpyDeviceToHost));
          size_t differ = 0, saturated = 0;
          for (size_t i = 0; i < got.size(); ++i) {
            if (got[i] != want[i] && differ++ < 5)
              ADD_FAILURE() << what << ": code " << i << " = " << int(got[i]) << ", the pass wrote " << int(want[i]);
            saturated += want[i] == 127 || want[i] == -127;
          }
          EXPECT_EQ(differ, 0u) << what << " codes epilogue";
          EXPECT_LT(saturated, got.size() / 4) << what << ": the scale should leave most codes unsaturated";
        }
      }
    }
  }
}

TEST(CudaInt8GemmSm90, TuningTimesTheConfigurations) {
  KILN_SKIP_WITHOUT_INT8_SM90();
  int sms = 0;
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const Problem p({8, 768, 768}, 7);
  const Variant v{DType::kBF16, GemvEpilogue::kGeluErf, true, true};
  std::vector<Int8GemmTiming> times;
  const Int8GemmPlan plan =
      int8_gemm_sm90_tune(DType::kBF16, static_cast<const int8_t*>(p.dw.get()), 768, 768,
                          epilogue_of(p, v, 1.0f), true, sms, nullptr, &times);
  EXPECT_TRUE(plan.tuned);
  // Every configuration at every row count, except the 128 x 192 tiles below 1024 rows.
  size_t expected = 0;
  for (int64_t m : kInt8GemmTuneRows) expected += m < 1024 ? kInt8GemmConfigs - 1 : kInt8GemmConfigs;
  ASSERT_EQ(times.size(), expected);
  for (const Int8GemmTiming& t : times)
    EXPECT_FALSE(t.config == Int8GemmConfig::kCooperative128x192 && t.m < 1024) << t.m;
  for (size_t b = 0; b < kInt8GemmTuneRows.size(); ++b) {
    float best = 1e30f;
    Int8GemmConfig best_cfg{};
    for (const Int8GemmTiming& t : times) {
      EXPECT_GT(t.ms, 0.0f);
      if (t.m == kInt8GemmTuneRows[b] && t.ms < best) best = t.ms, best_cfg = t.config;
      if (t.m == kInt8GemmTuneRows[b])
        std::printf("  m=%lld n=768 k=768 %-28s %.1f us\n", (long long)t.m,
                    int8_gemm_config_name(t.config), t.ms * 1e3);
    }
    EXPECT_EQ(plan.by_bucket[b], best_cfg) << "bucket " << b;
    EXPECT_EQ(plan.pick(kInt8GemmTuneRows[b]), best_cfg);
  }
}

TEST(CudaInt8GemmSm90, ChecksNameWhatIsWrong) {
  // Plain host checks: no GPU needed.
  alignas(16) static int8_t buf[64];
  Int8Epilogue e;
  e.w_scale = reinterpret_cast<const float*>(buf);
  auto check = [&](DType out, int64_t n, int64_t k, const void* y, GemvEpilogue act) {
    Int8Epilogue ea = e;
    ea.act = act;
    return int8_gemm_sm90_check(out, buf, buf, y, 256, n, k, ea);
  };
  EXPECT_NE(check(DType::kBF16, 64, 40, buf, GemvEpilogue::kNone).find("k % 16"),
            std::string::npos);
  EXPECT_NE(check(DType::kBF16, 20, 64, buf, GemvEpilogue::kNone).find("n % 8"), std::string::npos);
  EXPECT_NE(check(DType::kF32, 64, 64, buf, GemvEpilogue::kNone).find("output dtype f32"),
            std::string::npos);
  EXPECT_NE(check(DType::kBF16, 64, 64, buf, GemvEpilogue::kSwiGlu).find("activation"),
            std::string::npos);
  EXPECT_NE(check(DType::kBF16, 64, 64, buf + 8, GemvEpilogue::kNone).find("16-byte aligned"),
            std::string::npos);
  EXPECT_NE(check(DType::kBF16, 64, int64_t(1) << 31, buf, GemvEpilogue::kNone).find("2^31"),
            std::string::npos);
  // The codes epilogue: gelu_erf only, 16-byte rows of codes.
  e.act = GemvEpilogue::kNone;
  EXPECT_NE(int8_gemm_sm90_check(DType::kBF16, buf, buf, buf, 256, 64, 64, e, 40.0f).find("gelu_erf only"),
            std::string::npos);
  e.act = GemvEpilogue::kGeluErf;
  EXPECT_NE(int8_gemm_sm90_check(DType::kBF16, buf, buf, buf, 256, 24, 64, e, 40.0f).find("n % 16"),
            std::string::npos);
  std::string why;
  if (!int8_gemm_sm90_available(&why)) {
    EXPECT_FALSE(why.empty());
  } else {
    EXPECT_EQ(check(DType::kBF16, 64, 64, buf, GemvEpilogue::kGeluErf), "");
    EXPECT_EQ(check(DType::kF16, 64, 64, buf, GemvEpilogue::kNone), "");
  }
}

// KILN_CUDA_INT8_CONFIG's parser (no GPU needed): entries, and each malformed form named.
TEST(CudaInt8GemmSm90Config, OverridesParseAndMalformedOnesAreNamed) {
  EXPECT_TRUE(parse_int8_config_overrides(nullptr).empty());
  EXPECT_TRUE(parse_int8_config_overrides("").empty());
  const auto o = parse_int8_config_overrides("2304x768=coop192,768x3072=pp64");
  ASSERT_EQ(o.size(), 2u);
  EXPECT_EQ(o[0].n, 2304);
  EXPECT_EQ(o[0].k, 768);
  EXPECT_EQ(o[0].config, Int8GemmConfig::kCooperative128x192);
  EXPECT_EQ(o[1].n, 768);
  EXPECT_EQ(o[1].k, 3072);
  EXPECT_EQ(o[1].config, Int8GemmConfig::kPingpong64x128);
  EXPECT_EQ(parse_int8_config_overrides("1x1=pp2x1")[0].config, Int8GemmConfig::kPingpong128x128);
  EXPECT_EQ(parse_int8_config_overrides("1x1=coop128")[0].config, Int8GemmConfig::kCooperative128x128);
  for (const char* bad : {"2304x768", "2304=pp64", "x768=pp64", "2304x=pp64", "0x768=pp64", "-1x768=pp64",
                          "2304x768=fast", "2304x768=pp64,", "99999999999x1=pp64", "2304x768=pp64,,1x1=pp64"}) {
    try {
      parse_int8_config_overrides(bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << bad;
      EXPECT_NE(std::string(e.what()).find("KILN_CUDA_INT8_CONFIG"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace kiln::cuda
