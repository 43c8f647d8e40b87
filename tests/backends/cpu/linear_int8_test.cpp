// W8A8 int8 GEMM conformance: quantization exactness (codes, round trip within half a
// step), the int32 accumulators against an exact integer reference (bit for bit, both
// ISAs, shapes with row/column/K tails), and the full linear_int8 against the same
// float epilogue (bit for bit) and against the f32 product (within the quantization bound).
#include <gtest/gtest.h>

#include <cmath>

#include "backends/cpu/kernels/isa.h"
#include "backends/cpu/kernels/kernels.h"
#include "test_util.h"

namespace kiln::cpu {
namespace {

using testing::for_each_isa;
using testing::random_floats;

// Codes of w the way pack_weight_int8 documents them (row-major [n][k]) and their scales.
void reference_weight_codes(const std::vector<float>& w, int64_t n, int64_t k, std::vector<int>& q,
                            std::vector<float>& scale) {
  q.assign(size_t(n * k), 0);
  scale.assign(size_t(n), 0.0f);
  for (int64_t r = 0; r < n; ++r) {
    float amax = 0;
    for (int64_t i = 0; i < k; ++i) amax = std::max(amax, std::fabs(w[size_t(r * k + i)]));
    scale[size_t(r)] = amax / 127.0f;
    if (amax == 0) continue;
    for (int64_t i = 0; i < k; ++i) {
      float v = std::clamp(w[size_t(r * k + i)] * (1.0f / scale[size_t(r)]), -127.0f, 127.0f);
      q[size_t(r * k + i)] = int(std::nearbyint(v));
    }
  }
}

TEST(LinearInt8, QuantizeRowsMatchesDefinitionAndRoundTrips) {
  for_each_isa([] {
    const int64_t t = 3, k = 77, ldq = 80;
    auto x = random_floats(size_t(t * k), 1, -3.0f, 3.0f);
    x[5] = 100.0f;   // clips to 127
    x[6] = -100.0f;  // clips to -127
    const float scale = 2.0f / 127.0f;
    std::vector<int8_t> q(size_t(t * ldq), 55);
    quantize_rows_int8(x.data(), t, k, 1.0f / scale, q.data(), ldq);
    for (int64_t r = 0; r < t; ++r) {
      for (int64_t i = 0; i < k; ++i) {
        const float v = x[size_t(r * k + i)];
        const float e = std::clamp(v * (1.0f / scale), -127.0f, 127.0f);
        ASSERT_EQ(int(q[size_t(r * ldq + i)]), int(std::nearbyint(e))) << "row " << r << " col " << i;
        if (std::fabs(v) <= 127 * scale) {  // inside the range the round trip is within half a step
          EXPECT_LE(std::fabs(float(q[size_t(r * ldq + i)]) * scale - v), 0.5f * scale * (1 + 1e-5f));
        }
      }
      for (int64_t i = k; i < ldq; ++i) EXPECT_EQ(q[size_t(r * ldq + i)], 0);
    }
    EXPECT_EQ(q[5], 127);
    EXPECT_EQ(q[6], -127);
  });
}

TEST(LinearInt8, AccumulatorsExactAgainstIntegerReference) {
  struct Shape { int64_t t, n, k; };
  for (Shape s : {Shape{1, 16, 4}, Shape{1, 17, 5}, Shape{3, 33, 64}, Shape{5, 40, 130}, Shape{9, 64, 576},
                  Shape{70, 50, 257}}) {
    SCOPED_TRACE("t=" + std::to_string(s.t) + " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k));
    auto w = random_floats(size_t(s.n * s.k), 2);
    w[0] = 5.0f;  // an outlier: that row's other codes shrink, still exact
    for (int64_t i = 0; i < s.k; ++i) w[size_t((s.n - 1) * s.k + i)] = 0.0f;  // a zero row
    std::vector<int> qw;
    std::vector<float> scale;
    reference_weight_codes(w, s.n, s.k, qw, scale);
    PackedInt8Weight pw = pack_weight_int8(w.data(), s.n, s.k);
    for (int64_t r = 0; r < s.n; ++r) ASSERT_EQ(pw.scale[size_t(r)], scale[size_t(r)]);
    const int64_t ldx = 4 * pw.k4;
    std::vector<int8_t> qx(size_t(s.t * ldx), 0);
    auto xs = random_floats(size_t(s.t * s.k), 3, -127.4f, 127.4f);
    for (int64_t r = 0; r < s.t; ++r)
      for (int64_t i = 0; i < s.k; ++i) qx[size_t(r * ldx + i)] = int8_t(std::nearbyint(xs[size_t(r * s.k + i)]));
    qx[0] = 127;  // extremes: |x|·|w| = 127·127 must not saturate
    for_each_isa([&] {
      std::vector<int32_t> acc(size_t(s.t * s.n), -1);
      gemm_int8_acc(qx.data(), s.t, pw, acc.data());
      for (int64_t r = 0; r < s.t; ++r)
        for (int64_t c = 0; c < s.n; ++c) {
          int64_t ref = 0;
          for (int64_t i = 0; i < s.k; ++i) ref += int64_t(qx[size_t(r * ldx + i)]) * qw[size_t(c * s.k + i)];
          ASSERT_EQ(int64_t(acc[size_t(r * s.n + c)]), ref) << "row " << r << " col " << c;
        }
    });
  }
}

TEST(LinearInt8, SaturationCornerAllExtremes) {
  // Every code ±127 with signs arranged so that every maddubs pair is 127·127 + 127·127.
  const int64_t n = 16, k = 64;
  std::vector<float> w(size_t(n * k));
  for (size_t i = 0; i < w.size(); ++i) w[i] = (i % 3 == 0) ? -1.0f : 1.0f;
  PackedInt8Weight pw = pack_weight_int8(w.data(), n, k);
  std::vector<int8_t> qx(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) qx[size_t(i)] = (i % 3 == 0) ? -127 : 127;
  for_each_isa([&] {
    std::vector<int32_t> acc(static_cast<size_t>(n));
    gemm_int8_acc(qx.data(), 1, pw, acc.data());
    for (int64_t c = 0; c < n; ++c) {
      int64_t ref = 0;
      for (int64_t i = 0; i < k; ++i) ref += int64_t(qx[size_t(i)]) * ((size_t(c * k + i) % 3 == 0) ? -127 : 127);
      EXPECT_EQ(acc[size_t(c)], ref);
    }
  });
}

TEST(LinearInt8, LinearMatchesEpilogueExactlyAndFloatWithinBound) {
  const int64_t t = 7, n = 37, k = 96;
  auto x = random_floats(size_t(t * k), 4);
  auto w = random_floats(size_t(n * k), 5);
  auto bias = random_floats(size_t(n), 6);
  PackedInt8Weight pw = pack_weight_int8(w.data(), n, k);
  const float x_scale = 1.0f / 127.0f;  // |x| <= 1
  std::vector<int> qw;
  std::vector<float> scale;
  reference_weight_codes(w, n, k, qw, scale);
  for_each_isa([&] {
    std::vector<float> y(size_t(t * n));
    linear_int8(x.data(), t, k, pw, x_scale, bias.data(), y.data());
    for (int64_t r = 0; r < t; ++r)
      for (int64_t c = 0; c < n; ++c) {
        int64_t acc = 0;
        double exact = bias[size_t(c)], bound = 0;
        for (int64_t i = 0; i < k; ++i) {
          const float xv = x[size_t(r * k + i)];
          const int qx = int(std::nearbyint(std::clamp(xv * (1.0f / x_scale), -127.0f, 127.0f)));
          acc += int64_t(qx) * qw[size_t(c * k + i)];
          exact += double(xv) * w[size_t(c * k + i)];
          // |x·w - qx·sx·qw·sw| <= |x|·sw/2 + |w|·sx/2 + sx·sw/4
          bound += std::fabs(xv) * scale[size_t(c)] / 2 + std::fabs(w[size_t(c * k + i)]) * x_scale / 2 +
                   x_scale * scale[size_t(c)] / 4;
        }
        const float want = float(acc) * (x_scale * scale[size_t(c)]) + bias[size_t(c)];
        ASSERT_EQ(y[size_t(r * n + c)], want) << "row " << r << " col " << c;
        EXPECT_NEAR(y[size_t(r * n + c)], exact, bound * 1.001 + 1e-6);
      }
  });
}

// A row-parallel shard (parallel/tensor_parallel.h) packs part of each row on the whole
// row's max |w|: its scales and codes are the unsharded row's, so the shards' integer
// sums add up to the unsharded ones exactly.
TEST(LinearInt8, GivenRowMaximaGiveTheWholeRowsCodes) {
  const int64_t t = 5, n = 21, k = 96, half = 48;
  auto x = random_floats(size_t(t * k), 7);
  auto w = random_floats(size_t(n * k), 8);
  PackedInt8Weight full = pack_weight_int8(w.data(), n, k);
  std::vector<float> row_amax(static_cast<size_t>(n), 0.0f);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < k; ++i)
      row_amax[size_t(r)] = std::max(row_amax[size_t(r)], std::fabs(w[size_t(r * k + i)]));
  std::vector<std::vector<float>> parts(2), xs(2);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < k; ++i) parts[size_t(i / half)].push_back(w[size_t(r * k + i)]);
  for (int64_t r = 0; r < t; ++r)
    for (int64_t i = 0; i < k; ++i) xs[size_t(i / half)].push_back(x[size_t(r * k + i)]);
  // Quantized rows of x: the static per-tensor scale of the whole x rounds each slice alike.
  const float x_inv_scale = 127.0f;
  std::vector<int8_t> qx(size_t(t * 4 * full.k4));
  quantize_rows_int8(x.data(), t, k, x_inv_scale, qx.data(), 4 * full.k4);
  std::vector<int32_t> want(size_t(t * n));
  gemm_int8_acc(qx.data(), t, full, want.data());
  std::vector<int32_t> sum(want.size(), 0);
  for (int p = 0; p < 2; ++p) {
    PackedInt8Weight pw = pack_weight_int8(parts[size_t(p)].data(), n, half, row_amax.data());
    for (int64_t r = 0; r < n; ++r)
      EXPECT_EQ(pw.scale[size_t(r)], full.scale[size_t(r)]) << "row " << r;
    std::vector<int8_t> qp(size_t(t * 4 * pw.k4));
    quantize_rows_int8(xs[size_t(p)].data(), t, half, x_inv_scale, qp.data(), 4 * pw.k4);
    std::vector<int32_t> acc(want.size());
    gemm_int8_acc(qp.data(), t, pw, acc.data());
    for (size_t i = 0; i < acc.size(); ++i) sum[i] += acc[i];
  }
  EXPECT_EQ(sum, want);
}

TEST(LinearInt8, PerTokenScalesMatchDefinition) {
  const int64_t t = 5, n = 20, k = 48;
  auto x = random_floats(size_t(t * k), 10, -2.0f, 2.0f);
  for (int64_t i = 0; i < k; ++i) x[size_t(3 * k + i)] = 0.0f;  // an all-zero row
  for (int64_t i = 0; i < k; ++i) x[size_t(k + i)] *= 100.0f;   // a row with a much larger range
  auto w = random_floats(size_t(n * k), 11);
  PackedInt8Weight pw = pack_weight_int8(w.data(), n, k);
  std::vector<int> qw;
  std::vector<float> scale;
  reference_weight_codes(w, n, k, qw, scale);
  for_each_isa([&] {
    std::vector<float> y(size_t(t * n));
    linear_int8(x.data(), t, k, pw, 0.0f, nullptr, y.data());
    for (int64_t r = 0; r < t; ++r) {
      float amax = 0;
      for (int64_t i = 0; i < k; ++i) amax = std::max(amax, std::fabs(x[size_t(r * k + i)]));
      const float xs = amax > 0 ? amax / 127.0f : 1.0f;
      for (int64_t c = 0; c < n; ++c) {
        int64_t acc = 0;
        for (int64_t i = 0; i < k; ++i)
          acc += int64_t(std::nearbyint(std::clamp(x[size_t(r * k + i)] * (1.0f / xs), -127.0f, 127.0f))) *
                 qw[size_t(c * k + i)];
        ASSERT_EQ(y[size_t(r * n + c)], float(acc) * (xs * scale[size_t(c)])) << "row " << r << " col " << c;
      }
    }
  });
}

// Every microkernel variant this CPU can run (scalar, AVX2 maddubs, AVX-VNNI) on one
// panel, against the integer reference; the public API only reaches the best one.
TEST(LinearInt8, EveryMicrokernelVariantIsExact) {
  const int64_t n = 16, k = 203;
  auto w = random_floats(size_t(n * k), 8);
  PackedInt8Weight pw = pack_weight_int8(w.data(), n, k);
  std::vector<int> qw;
  std::vector<float> scale;
  reference_weight_codes(w, n, k, qw, scale);
  const int64_t ldx = 4 * pw.k4;
  std::vector<int8_t> qx(size_t(4 * ldx), 0);
  auto xs = random_floats(size_t(4 * k), 9, -127.4f, 127.4f);
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t i = 0; i < k; ++i) qx[size_t(r * ldx + i)] = int8_t(std::nearbyint(xs[size_t(r * k + i)]));
  std::vector<std::pair<const char*, Int8Microkernel>> variants;
  if (cpu_isa_supported(CpuIsa::kAvx2)) variants.emplace_back("avx2", avx2::int8_microkernel());
  for (auto& [name, mk] : variants)
    for (int m = 1; m <= 4; ++m) {
      SCOPED_TRACE(std::string(name) + " m=" + std::to_string(m));
      std::vector<int32_t> acc(size_t(m * 16), -1);
      mk(m, qx.data(), ldx, pw.panel(0), pw.k4, acc.data());
      for (int r = 0; r < m; ++r)
        for (int64_t c = 0; c < n; ++c) {
          int64_t ref = 0;
          for (int64_t i = 0; i < k; ++i) ref += int64_t(qx[size_t(r * ldx + i)]) * qw[size_t(c * k + i)];
          ASSERT_EQ(int64_t(acc[size_t(r * 16 + c)]), ref) << "row " << r << " col " << c;
        }
    }
}

// The biased-x tiles - AVX-512 VNNI (one or two panels) and AVX-VNNI (one panel): u8 x s8
// products over x biased by 128, 128 * Σw taken off - at every row count, with x and w at
// their extremes (±127), against the integer reference: the same int32 sums as the other
// kernels.
TEST(LinearInt8, BiasedTilesAreExact) {
  struct Tiles {
    const char* name;
    void (*tile)(int, int, const uint8_t*, int64_t, const int8_t*, int64_t, int64_t, const int32_t*, int32_t*);
    int rows, panels;
  };
  std::vector<Tiles> variants;
  if (avx512_int8_supported()) variants.push_back({"avx512_vnni", avx512::int8_tile, avx512::kInt8TileRows, 2});
  if (cpu_isa_supported(CpuIsa::kAvx2) && avx2::avx_vnni_supported())
    variants.push_back({"avx_vnni", avx2::int8_tile_vnni, avx2::kInt8VnniTileRows, 1});
  if (variants.empty()) GTEST_SKIP() << "neither AVX-512 VNNI nor AVX-VNNI here";
  const int64_t n = 32, k = 203;
  auto w = random_floats(size_t(n * k), 10);
  for (int64_t i = 0; i < k; ++i) w[size_t(3 * k + i)] = i % 2 ? 1.0f : -1.0f;  // column 3: every code ±127
  PackedInt8Weight pw = pack_weight_int8(w.data(), n, k);
  std::vector<int> qw;
  std::vector<float> scale;
  reference_weight_codes(w, n, k, qw, scale);
  const int rows = 6;
  const int64_t ldx = 4 * pw.k4;
  std::vector<int8_t> qx(size_t(rows * ldx), 0);
  auto xs = random_floats(size_t(rows * k), 11, -127.4f, 127.4f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < k; ++i) qx[size_t(r * ldx + i)] = int8_t(std::nearbyint(xs[size_t(r * k + i)]));
  for (int64_t i = 0; i < k; ++i) qx[size_t(i)] = i % 3 ? 127 : -127;  // row 0: every code ±127
  std::vector<uint8_t> ux(qx.size());
  for (size_t i = 0; i < qx.size(); ++i) ux[i] = uint8_t(qx[i] + 128);
  for (const Tiles& v : variants)
    for (int panels = 1; panels <= v.panels; ++panels)
      for (int m = 1; m <= std::min(rows, v.rows); ++m) {
        SCOPED_TRACE(std::string(v.name) + " panels=" + std::to_string(panels) + " m=" + std::to_string(m));
        std::vector<int32_t> acc(size_t(panels * m * 16), -1);
        v.tile(m, panels, ux.data(), ldx, pw.panel(0), pw.k4 * 64, pw.k4, pw.bias128.get(), acc.data());
        for (int p = 0; p < panels; ++p)
          for (int r = 0; r < m; ++r)
            for (int64_t c = 0; c < 16; ++c) {
              int64_t ref = 0;
              for (int64_t i = 0; i < k; ++i) ref += int64_t(qx[size_t(r * ldx + i)]) * qw[size_t((16 * p + c) * k + i)];
              ASSERT_EQ(int64_t(acc[size_t((p * m + r) * 16 + c)]), ref) << "panel " << p << " row " << r << " col " << c;
            }
      }
}

// Enough rows that x is quantized (and biased) on every thread of the pool: each row's
// output is the bits of that row run alone (quantized on the calling thread), with static
// and with per-token scales.
TEST(LinearInt8, ManyRowsGiveEachRowsOwnBits) {
  const int64_t t = 70, n = 40, k = 600;
  auto x = random_floats(size_t(t * k), 12, -2.0f, 2.0f);
  auto w = random_floats(size_t(n * k), 13);
  auto bias = random_floats(size_t(n), 14);
  PackedInt8Weight pw = pack_weight_int8(w.data(), n, k);
  for_each_isa([&] {
    for (float x_scale : {2.0f / 127.0f, 0.0f}) {
      SCOPED_TRACE(x_scale > 0 ? "static scale" : "per-token scales");
      std::vector<float> all(static_cast<size_t>(t * n)), one(static_cast<size_t>(n));
      linear_int8(x.data(), t, k, pw, x_scale, bias.data(), all.data());
      for (int64_t r = 0; r < t; ++r) {
        linear_int8(x.data() + r * k, 1, k, pw, x_scale, bias.data(), one.data());
        for (int64_t c = 0; c < n; ++c) ASSERT_EQ(all[size_t(r * n + c)], one[size_t(c)]) << "row " << r << " col " << c;
      }
    }
  });
}

TEST(LinearInt8, BadShapesAreErrors) {
  std::vector<float> w(16, 1.0f);
  EXPECT_THROW(pack_weight_int8(w.data(), 0, 16), std::exception);
  PackedInt8Weight pw = pack_weight_int8(w.data(), 1, 16);
  std::vector<float> x(8), y(1);
  EXPECT_THROW(linear_int8(x.data(), 1, 8, pw, 1.0f, nullptr, y.data()), std::exception);
}

}  // namespace
}  // namespace kiln::cpu
