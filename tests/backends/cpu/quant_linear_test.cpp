// Weight-only quantized linear (kQ8 / kQ4 storage): both ISAs against a reference that
// quantizes independently (per 32-value group and output, round
// to nearest; q8 symmetric, q4 with a per-group min) and multiplies in double; and the
// quantization error against the exact
// f32 weights stays within the rounding bound of the format. On a CPU with AVX-512 VNNI +
// VBMI, linear() rounds x to int8 per group of 32 at every row count (the int8-activation
// GEMV): against the same reference on the rounded x, against the exact weights within the
// quantization and rounding errors, and row by row bit for bit across row counts, row
// blocks and thread splits; every case also runs with it switched off.
#include <gtest/gtest.h>

#include <cmath>

#include "backends/cpu/kernels/isa.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/weight_quant.h"
#include "test_util.h"

namespace kiln::cpu {
namespace {

using testing::expect_within;
using testing::for_each_isa;
using testing::random_floats;

// q8: symmetric, scale = max|w| / 127. q4: asymmetric, scale = (max - min) / 15. Scales
// and mins are stored as f16 relative to a power-of-two row factor F that puts the row's
// largest scale or |min| in [2^14, 2^15]; q4's are then rounded to integers times powers of
// two 2^E, per 8 groups the smallest E <= 8 with the largest scale <= 255 * 2^E (|min|: 127, E <=
// 9); codes round against the stored values.
std::vector<double> dequantized(const std::vector<float>& w, int64_t n, int64_t k, bool q8,
                                std::vector<double>* mins = nullptr) {
  std::vector<double> d(w.size());
  if (mins) mins->assign(size_t(n * (k / 32)), 0.0);
  for (int64_t r = 0; r < n; ++r) {
    std::vector<float> scale, offset;
    float big = 0;
    for (int64_t g = 0; g < k; g += 32) {
      const float* v = w.data() + r * k + g;
      float lo = v[0], hi = v[0], amax = 0;
      for (int64_t i = 0; i < 32; ++i) lo = std::min(lo, v[i]), hi = std::max(hi, v[i]), amax = std::max(amax, std::fabs(v[i]));
      scale.push_back(q8 ? amax / 127.0f : (hi - lo) / 15.0f);
      offset.push_back(q8 ? 0.0f : lo);
      big = std::max({big, scale.back(), std::fabs(offset.back())});
    }
    float f = 1;
    while (big > 0 && big / f > 32768.0f) f *= 2;
    while (big > 0 && big / f <= 16384.0f) f /= 2;
    // q4's exponents of each 8 groups: 2^E >= largest / top, E in [-24, 8].
    auto grid = [&](const std::vector<float>& v, int64_t g, int top, int emax) {
      const int64_t g0 = g / 8 * 8, g1 = std::min<int64_t>(g0 + 8, int64_t(v.size()));
      double big_v = 0;
      for (int64_t j = g0; j < g1; ++j)
        big_v = std::max(big_v, std::fabs(double(v[size_t(j)]) / f));
      int e = -24;
      while (e < emax && big_v > double(top) * std::ldexp(1.0, e)) ++e;
      const double c = std::clamp(std::nearbyint(double(v[size_t(g)]) / f / std::ldexp(1.0, e)),
                                  -double(top), double(top));
      return float(c * std::ldexp(1.0, e)) * f;
    };
    for (int64_t g = 0; g < k; g += 32) {
      const float* v = w.data() + r * k + g;
      const float s =
          q8 ? f16_to_f32(f32_to_f16(scale[size_t(g / 32)] / f)) * f : grid(scale, g / 32, 255, 8);
      const float m = q8 ? 0.0f : grid(offset, g / 32, 127, 9);
      if (mins) (*mins)[size_t(r * (k / 32) + g / 32)] = m;
      for (int64_t i = 0; i < 32; ++i) {
        float q = s > 0 ? std::nearbyint((v[i] - m) / s) : 0.0f;
        q = q8 ? std::clamp(q, -127.0f, 127.0f) : std::clamp(q, 0.0f, 15.0f);
        d[r * k + g + i] = double(q) * double(s) + double(m);
      }
    }
  }
  return d;
}

// The most x's rounding moves a value, in units of its group's d: half a step of d with one
// int8 digit, half a step of d / 254 with two (a 1e-3 margin for the f32 products, the
// residual's ulp and the digit weight's rounding).
double rounding_step(QGemvActs acts) { return acts == QGemvActs::kInt16 ? 1.001 / 508.0 : 0.5 * 1.001; }

void check(int64_t t, int64_t n, int64_t k, WeightStorage s, uint64_t seed) {
  SCOPED_TRACE(std::string(weight_storage_name(s)) + " T=" + std::to_string(t) + " N=" +
               std::to_string(n) + " K=" + std::to_string(k));
  auto x = random_floats(size_t(t * k), seed);
  auto w = random_floats(size_t(n * k), seed + 1);
  auto bias = random_floats(size_t(n), seed + 2);
  std::vector<double> mins;
  auto dq = dequantized(w, n, k, s == WeightStorage::kQ8, &mins);
  std::vector<double> ref(size_t(t * n)), exact(size_t(t * n)), tol(size_t(t * n)), qtol(size_t(t * n));
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = bias[j], ex = bias[j], mag = std::fabs(bias[j]), qerr = 0;
      for (int64_t kk = 0; kk < k; ++kk) {
        acc += double(x[i * k + kk]) * dq[j * k + kk];
        ex += double(x[i * k + kk]) * w[j * k + kk];
        mag += std::fabs(double(x[i * k + kk]) * dq[j * k + kk]);
        qerr += std::fabs(double(x[i * k + kk]) * (dq[j * k + kk] - w[j * k + kk]));
      }
      ref[i * n + j] = acc;
      exact[i * n + j] = ex;
      // f32 summation and scaling; q4's offset term sums x (magnitude up to sum|x|*|min|).
      tol[i * n + j] = 4.0 * double(k) * 0x1p-24 * 2.0 * mag + 1e-6;
      qtol[i * n + j] = qerr + tol[i * n + j];
    }
  PackedWeight pw = pack_weight(w.data(), n, k, s);
  const QGemvActs saved = cpu_qgemv_acts();
  for (QGemvActs acts : {QGemvActs::kF32, QGemvActs::kInt8, QGemvActs::kInt16}) {
    SCOPED_TRACE("KILN_CPU_QGEMV mode " + std::to_string(int(acts)));
    cpu_qgemv_acts_set(acts);
    // The int8-activation GEMV (every row count on AVX-512 VNNI): x as quantize_rows_groups
    // rounds it, xr = d (q + q_lo / 254) (q_lo = 0 with one digit), each group's min times the
    // exact Σx. Against the dequantized reference on xr (f32 summation), on x within x's
    // rounding bound (|Δy| <= Σ_g e_g Σ_k |scale_g q_k|, e_g = rounding_step * d_g: the
    // bound kernels.h states for linear()), and against the exact weights.
    const int64_t groups = k / 32;
    std::vector<int8_t> qx(size_t(t * k)), qlo(size_t(t * k), 0);
    std::vector<float> dx(size_t(t * groups)), sx(size_t(t * groups));
    quantize_rows_groups(x.data(), t, k, qx.data(), dx.data(), sx.data(),
                         acts == QGemvActs::kInt16 ? qlo.data() : nullptr);
    std::vector<double> ref8(size_t(t * n)), tol8(size_t(t * n)), qtol8(size_t(t * n)), xtol8(size_t(t * n));
    for (int64_t i = 0; i < t; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = bias[j], mag = std::fabs(bias[j]), qerr = 0, xerr = 0;
        for (int64_t g = 0; g < groups; ++g) {
          const double m = mins[size_t(j * groups + g)], d = dx[size_t(i * groups + g)];
          double xs = 0;
          for (int64_t kk = g * 32; kk < g * 32 + 32; ++kk) {
            const double xr = d * (qx[size_t(i * k + kk)] + double(kQGemvLoDigit) * qlo[size_t(i * k + kk)]);
            acc += xr * (dq[j * k + kk] - m);
            xs += x[i * k + kk];
            mag += std::fabs(xr * (dq[j * k + kk] - m)) + std::fabs(x[i * k + kk] * m);
            qerr += std::fabs(x[i * k + kk] - xr) * std::fabs(dq[j * k + kk] - m) +
                    std::fabs(double(x[i * k + kk]) * (dq[j * k + kk] - w[j * k + kk]));
            xerr += rounding_step(acts) * d * std::fabs(dq[j * k + kk] - m);
          }
          acc += m * xs;
        }
        ref8[i * n + j] = acc;
        tol8[i * n + j] = 4.0 * double(k) * 0x1p-24 * 2.0 * mag + 1e-6;
        qtol8[i * n + j] = qerr + tol8[i * n + j];
        xtol8[i * n + j] = xerr + tol[i * n + j] + tol8[i * n + j];
      }
    for_each_isa([&] {
      std::vector<float> y(size_t(t * n));
      linear(x.data(), t, k, pw, bias.data(), y.data());
      if (avx512_qgemv_int8_supported()) {
        SCOPED_TRACE("int8-activation GEMV");
        expect_within(y, ref8, tol8, "vs dequantized reference on the rounded x");
        expect_within(y, ref, xtol8, "vs dequantized reference on x within x's rounding bound");
        expect_within(y, exact, qtol8, "vs exact weights within the quantization and rounding errors");
        return;
      }
      expect_within(y, ref, tol, "vs dequantized reference");
      expect_within(y, exact, qtol, "vs exact weights within the quantization error");
    });
  }
  cpu_qgemv_acts_set(saved);
}

// The AVX-512 q8/q4 tiles do each AVX2 lane's arithmetic in one zmm lane: the same bits
// at every row count (the int8-activation GEMV off), N tails and K blocks included.
TEST(QuantLinear, Avx512TilesGiveTheAvx2Bits) {
  if (!cpu_isa_supported(CpuIsa::kAvx2)) GTEST_SKIP() << "no AVX2";
  const CpuIsa saved_isa = cpu_isa();
  const bool saved512 = avx512_enabled();
  const QGemvActs saved_acts = cpu_qgemv_acts();
  cpu_isa_set(CpuIsa::kAvx2);
  cpu_avx512_set(true);
  if (!avx512_enabled()) {
    cpu_isa_set(saved_isa);
    GTEST_SKIP() << "no AVX-512 here";
  }
  cpu_qgemv_acts_set(QGemvActs::kF32);
  uint64_t seed = 300;
  for (WeightStorage s : {WeightStorage::kQ8, WeightStorage::kQ4})
    for (int64_t t : {1, 2, 5, 7, 13})
      for (auto [n, k] : {std::pair<int64_t, int64_t>{50, 96}, {33, 5120}}) {
        auto x = random_floats(size_t(t * k), seed += 3);
        auto w = random_floats(size_t(n * k), seed + 1);
        auto bias = random_floats(size_t(n), seed + 2);
        PackedWeight pw = pack_weight(w.data(), n, k, s);
        std::vector<float> y[2];
        for (int wide = 0; wide < 2; ++wide) {
          cpu_avx512_set(wide == 1);
          y[wide].assign(size_t(t * n), NAN);
          linear(x.data(), t, k, pw, bias.data(), y[wide].data());
        }
        size_t differ = 0;
        for (size_t i = 0; i < y[0].size(); ++i) differ += f32_bits(y[0][i]) != f32_bits(y[1][i]);
        EXPECT_EQ(differ, 0u) << weight_storage_name(s) << " T=" << t << " N=" << n << " K=" << k;
      }
  cpu_qgemv_acts_set(saved_acts);
  cpu_isa_set(saved_isa);
  cpu_avx512_set(saved512);
}

// quantize_rows_groups: per row and group of 32, d = max|x| / 127, qx = rint(x * 127 /
// max|x|), sx the f32 sum in order; a group of zeros gives d = 0 and codes 0. The second
// digit: qlo = rint(fma(-d, qx, x) * (127 / max|x| * 254)), |qlo| <= 127, and d (qx + qlo /
// 254) is within d / 508 of x (one digit: d / 2), up to the f32 products' rounding.
TEST(QuantLinear, Int8GroupRounding) {
  auto x = random_floats(3 * 96, 5);
  for (int i = 32; i < 64; ++i) x[size_t(i)] = 0.0f;  // row 0's second group
  x[70] = 3.5f;                                       // a group whose max is one outlier
  for (int i = 0; i < 32; ++i) x[size_t(96 + i)] = float(i - 16) / 32.0f;  // row 1: exact steps and ties
  x[96 + 31] = 127.0f / 64.0f;  // d = 1/64: values k/128 are ties of the first digit, k/32512 of the second
  x[96 + 5] = 1.0f / 128.0f;    // residual exactly d / 2
  x[96 + 6] = -3.0f / 128.0f;   // -1.5 d: a tie (rint -> -2, residual +d / 2)
  x[96 + 7] = 1.0f / 32512.0f;  // a tie of the second digit (0.5 steps of d / 254)
  std::vector<int8_t> q(x.size()), ql(x.size()), q1(x.size());
  std::vector<float> d(9), sx(9), d1(9), sx1(9);
  quantize_rows_groups(x.data(), 3, 96, q.data(), d.data(), sx.data(), ql.data());
  quantize_rows_groups(x.data(), 3, 96, q1.data(), d1.data(), sx1.data());
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t g = 0; g < 3; ++g) {
      float amax = 0, sum = 0;
      for (int64_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[size_t(r * 96 + g * 32 + i)]));
      for (int64_t i = 0; i < 32; ++i) sum += x[size_t(r * 96 + g * 32 + i)];
      const float dg = amax / 127.0f;
      EXPECT_EQ(d[size_t(r * 3 + g)], dg);
      EXPECT_EQ(sx[size_t(r * 3 + g)], sum);
      EXPECT_EQ(f32_bits(d1[size_t(r * 3 + g)]), f32_bits(dg));  // the same d, sum and first digit
      EXPECT_EQ(f32_bits(sx1[size_t(r * 3 + g)]), f32_bits(sum));
      for (int64_t i = 0; i < 32; ++i) {
        const int64_t at = r * 96 + g * 32 + i;
        const float xv = x[size_t(at)];
        const int want = amax > 0 ? int(std::nearbyint(xv * (127.0f / amax))) : 0;
        EXPECT_EQ(int(q[size_t(at)]), want) << "row " << r << " group " << g << " element " << i;
        EXPECT_EQ(int(q1[size_t(at)]), want) << "row " << r << " group " << g << " element " << i;
        const float res = std::fma(-dg, float(want), xv);
        const int want_lo = amax > 0 ? int(std::nearbyint(res * (127.0f / amax * 254.0f))) : 0;
        EXPECT_EQ(int(ql[size_t(at)]), want_lo) << "row " << r << " group " << g << " element " << i;
        EXPECT_LE(std::abs(int(ql[size_t(at)])), 127);
        const double xr1 = double(dg) * want, xr2 = double(dg) * (want + double(kQGemvLoDigit) * want_lo);
        EXPECT_LE(std::fabs(xv - xr1), rounding_step(QGemvActs::kInt8) * dg) << "at " << at;
        EXPECT_LE(std::fabs(xv - xr2), rounding_step(QGemvActs::kInt16) * dg) << "at " << at;
      }
    }
  EXPECT_EQ(q[70], 127);
  EXPECT_EQ(ql[70], 0);
  // Row 1 (d = 1/64): 1/128 = d/2 rounds to 0 (ties to even), residual d/2 -> 127 steps of
  // d/254; -1.5 d -> -2, residual +d/2 -> 127; d/508 = half a step -> 0 (even), residual kept.
  EXPECT_EQ(d[3], 1.0f / 64.0f);
  EXPECT_EQ(int(q[96 + 5]), 0);
  EXPECT_EQ(int(ql[96 + 5]), 127);
  EXPECT_EQ(int(q[96 + 6]), -2);
  EXPECT_EQ(int(ql[96 + 6]), 127);
  EXPECT_EQ(int(q[96 + 7]), 0);
  EXPECT_EQ(int(ql[96 + 7]), 0);
  EXPECT_EQ(int(q[96 + 0]), -32);  // -16/32 = -32 d exactly: no residual
  EXPECT_EQ(int(ql[96 + 0]), 0);
  EXPECT_THROW(quantize_rows_groups(x.data(), 1, 48, q.data(), d.data(), sx.data()), Error);
  // A NaN reaches the outputs, as through the f32 kernels; so does an infinity (d = inf
  // against codes 0; its residual inf - inf * 0 is NaN, code 0). linear() rounds x to int8
  // only with AVX-512 VNNI + VBMI (avx512_qgemv_int8_supported); elsewhere the quantized
  // panels multiply x by the codes widened in registers, which gives +-inf where a column's
  // terms agree in sign (NaN elsewhere): there an infinity must give a non-finite output.
  const QGemvActs saved = cpu_qgemv_acts();
  auto w = random_floats(16 * 96, 9);
  for (float bad : {NAN, INFINITY}) {
    x[5] = bad;
    quantize_rows_groups(x.data(), 1, 96, q.data(), d.data(), sx.data(), ql.data());
    EXPECT_EQ(std::isnan(d[0]), std::isnan(bad));
    EXPECT_FALSE(std::isnan(d[1]));
    EXPECT_EQ(int(q[5]), 0);
    EXPECT_EQ(int(ql[5]), 0);
    if (std::isinf(bad))  // 127 / inf = 0: every code of the group 0
      for (int i = 0; i < 32; ++i) EXPECT_EQ(int(q[size_t(i)]) | int(ql[size_t(i)]), 0) << i;
    for (QGemvActs acts : {QGemvActs::kInt8, QGemvActs::kInt16}) {
      cpu_qgemv_acts_set(acts);
      const bool int8_x = avx512_qgemv_int8_supported();
      for (WeightStorage st : {WeightStorage::kQ8, WeightStorage::kQ4}) {
        PackedWeight pw = pack_weight(w.data(), 16, 96, st);
        std::vector<float> y(16);
        linear(x.data(), 1, 96, pw, nullptr, y.data());
        for (float v : y)
          EXPECT_TRUE((std::isnan(bad) || int8_x) ? std::isnan(v) : !std::isfinite(v))
              << weight_storage_name(st) << " x holding " << bad << ": " << v;
      }
    }
  }
  cpu_qgemv_acts_set(saved);
}

// The AVX-512 rounding linear() uses gives quantize_rows_groups' bits: both digits' codes, d
// and Σx, over random groups of several magnitudes, ties, zeros, outliers, infinities and NaNs.
TEST(QuantLinear, Int8GroupRoundingAvx512Bits) {
  const QGemvActs saved = cpu_qgemv_acts();
  cpu_qgemv_acts_set(QGemvActs::kInt16);
  const bool have = avx512_qgemv_int8_supported();
  cpu_qgemv_acts_set(saved);
  if (!have) GTEST_SKIP() << "no AVX-512 VNNI + VBMI here";
  const int64_t t = 9, k = 256, groups = k / 32;
  auto x = random_floats(size_t(t * k), 11);
  for (int64_t r = 0; r < t; ++r)  // rows spanning 1e-30 .. 1e30
    for (int64_t i = 0; i < k; ++i) x[size_t(r * k + i)] *= std::pow(10.0f, float(r * 7 - 30));
  for (int i = 0; i < 32; ++i) x[size_t(32 + i)] = 0.0f;                  // a group of zeros
  for (int i = 0; i < 32; ++i) x[size_t(64 + i)] = float(i - 16) * 0.5f;  // ties at 127 / 16 steps
  x[100] = 1e6f;                                                           // an outlier
  x[k + 3] = INFINITY;
  x[k + 40] = -INFINITY;
  x[k + 41] = INFINITY;  // inf + -inf in one group: a NaN sum
  x[2 * k + 5] = NAN;
  x[2 * k + 70] = -0.0f;
  for (int i = 0; i < 32; ++i) x[size_t(3 * k + 96 + i)] = float(i - 16) / 32.0f;  // d = 1/64: ties of both digits
  x[3 * k + 96 + 31] = 127.0f / 64.0f;
  x[3 * k + 96 + 5] = 1.0f / 128.0f;
  x[3 * k + 96 + 7] = 1.0f / 32512.0f;
  std::vector<int8_t> q[2], ql[2];
  std::vector<float> d[2], sx[2];
  for (int v = 0; v < 2; ++v) {
    q[v].assign(size_t(t * k), 99);
    ql[v].assign(size_t(t * k), 99);
    d[v].assign(size_t(t * groups), -1.0f);
    sx[v].assign(size_t(t * groups), -1.0f);
    (v ? avx512::quantize_rows_groups : quantize_rows_groups)(x.data(), t, k, q[v].data(), d[v].data(), sx[v].data(),
                                                             ql[v].data());
  }
  for (size_t i = 0; i < q[0].size(); ++i) {
    EXPECT_EQ(int(q[0][i]), int(q[1][i])) << "code " << i;
    EXPECT_EQ(int(ql[0][i]), int(ql[1][i])) << "second digit " << i;
  }
  // Without the second digit: the same first digits, d and sums.
  std::vector<int8_t> q1(size_t(t * k));
  std::vector<float> d1(size_t(t * groups)), sx1(size_t(t * groups));
  avx512::quantize_rows_groups(x.data(), t, k, q1.data(), d1.data(), sx1.data());
  for (size_t i = 0; i < q1.size(); ++i) EXPECT_EQ(int(q1[i]), int(q[0][i])) << "code " << i;
  for (size_t i = 0; i < d1.size(); ++i) {
    EXPECT_EQ(f32_bits(d1[i]), f32_bits(d[0][i])) << "d of group " << i;
    EXPECT_EQ(f32_bits(sx1[i]), f32_bits(sx[0][i])) << "sum of group " << i;
  }
  for (size_t i = 0; i < d[0].size(); ++i) {
    EXPECT_EQ(f32_bits(d[0][i]), f32_bits(d[1][i])) << "d of group " << i;
    EXPECT_EQ(f32_bits(sx[0][i]), f32_bits(sx[1][i])) << "sum of group " << i;
  }
}

// Batch invariance: with the int8-activation path a row's outputs have the same bits
// whatever the call's row count, wherever the row falls in a row block, and however the
// threads split the call: every row of a T=37 call (4 blocks of 8 and one of 5) against
// T=1 calls of that row alone. q8/q4, with and without bias, N tails (50, 33, 200: partial
// last panels), on one thread and on the pool split by panels and by rows. The logits
// GEMM's int8_x = false keeps the f32 kernels' bits.
TEST(QuantLinear, Int8RowsAreBatchInvariant) {
  const QGemvActs saved = cpu_qgemv_acts();
  cpu_qgemv_acts_set(QGemvActs::kInt16);
  if (!avx512_qgemv_int8_supported()) {
    cpu_qgemv_acts_set(saved);
    GTEST_SKIP() << "no AVX-512 VNNI + VBMI here: q8/q4 Linears run the f32 kernels";
  }
  const int64_t t = 37;
  for (QGemvActs acts : {QGemvActs::kInt16, QGemvActs::kInt8}) {
  cpu_qgemv_acts_set(acts);
  uint64_t seed = 700;
  for (WeightStorage s : {WeightStorage::kQ8, WeightStorage::kQ4})
    for (auto [n, k] : {std::pair<int64_t, int64_t>{50, 96}, {33, 5120}, {200, 320}})
      for (bool with_bias : {false, true}) {
        SCOPED_TRACE(std::string(weight_storage_name(s)) + " N=" + std::to_string(n) + " K=" + std::to_string(k) +
                     (with_bias ? " bias" : "") + (acts == QGemvActs::kInt16 ? " int16" : " int8"));
        auto x = random_floats(size_t(t * k), seed += 3);
        for (int64_t r = 0; r < t; ++r)  // rows of different magnitudes
          for (int64_t i = 0; i < k; ++i) x[size_t(r * k + i)] *= float(1 + r % 5) * (r % 3 ? 1.0f : 1e-3f);
        auto w = random_floats(size_t(n * k), seed + 1);
        auto b = random_floats(size_t(n), seed + 2);
        const float* bias = with_bias ? b.data() : nullptr;
        PackedWeight pw = pack_weight(w.data(), n, k, s);
        std::vector<float> alone(size_t(t * n), NAN);
        for (int64_t r = 0; r < t; ++r)
          linear(x.data() + r * k, 1, k, pw, bias, alone.data() + r * n, LinearTactic{.threads = 1});
        const LinearTactic tactics[] = {{.threads = 1}, {}, {.split = LinearSplit::kPanels},
                                        {.split = LinearSplit::kRows}};
        for (const LinearTactic& tac : tactics)
          for (int64_t rows : {t, int64_t(13), int64_t(8), int64_t(2)}) {
            std::vector<float> y(size_t(rows * n), NAN);
            linear(x.data() + (t - rows) * k, rows, k, pw, bias, y.data(), tac);
            size_t differ = 0, first = 0;
            for (size_t i = 0; i < y.size(); ++i)
              if (f32_bits(y[i]) != f32_bits(alone[size_t((t - rows) * n) + i]) && !differ++) first = i;
            EXPECT_EQ(differ, 0u) << rows << " rows (the last of the 37), threads " << tac.threads << " split "
                                  << int(tac.split) << ": first at row " << first / size_t(n) << " column "
                                  << first % size_t(n);
          }
        // int8_x = false: the f32 kernels, as with the path switched off.
        std::vector<float> f32_off(size_t(t * n)), f32_tactic(size_t(t * n));
        LinearTactic logits;
        logits.int8_x = false;
        linear(x.data(), t, k, pw, bias, f32_tactic.data(), logits);
        cpu_qgemv_acts_set(QGemvActs::kF32);
        linear(x.data(), t, k, pw, bias, f32_off.data());
        cpu_qgemv_acts_set(acts);
        size_t differ = 0;
        for (size_t i = 0; i < f32_off.size(); ++i) differ += f32_bits(f32_off[i]) != f32_bits(f32_tactic[i]);
        EXPECT_EQ(differ, 0u) << "int8_x = false against KILN_CPU_QGEMV=f32";
      }
  }
  cpu_qgemv_acts_set(saved);
}

// LinearTactic::widen_quant (encoders): each panel slice dequantized to f32 and the f32
// tiles run on it - the bits of linear() on f32 weights holding dequantize_row's values,
// at every row count, K blocking (K = 5120: 768-row slices) and thread split, with the
// AVX2 and the AVX-512 kernels (the scalar fallback keeps the quantized kernel).
TEST(QuantLinear, WidenedPanelsAreTheF32KernelsOnTheDequantizedWeights) {
  size_t compared = 0;
  for_each_isa([&] {
    if (cpu_isa() == CpuIsa::kScalar) return;
    uint64_t seed = 900;
    for (WeightStorage s : {WeightStorage::kQ8, WeightStorage::kQ4})
      for (auto [n, k] : {std::pair<int64_t, int64_t>{50, 96}, {33, 5120}, {200, 320}}) {
        const QuantFormat f = s == WeightStorage::kQ8 ? QuantFormat::kQ8 : QuantFormat::kQ4;
        auto w = random_floats(size_t(n * k), seed += 3);
        const QuantizedRows q = quantize_rows(w.data(), n, k, f);
        std::vector<float> dq(size_t(n * k));
        dequantize_rows(q, 0, n, dq.data());
        const PackedWeight pq = pack_quantized_weight(q), pf = pack_weight(dq.data(), n, k, WeightStorage::kF32);
        auto b = random_floats(size_t(n), seed + 1);
        for (int64_t t : {1, 5, 37})
          for (const LinearTactic& base :
               {LinearTactic{}, LinearTactic{.threads = 1}, LinearTactic{.split = LinearSplit::kRows}})
            for (bool with_bias : {false, true}) {
              SCOPED_TRACE(std::string(weight_storage_name(s)) + " T=" + std::to_string(t) + " N=" +
                           std::to_string(n) + " K=" + std::to_string(k) + " split " +
                           std::to_string(int(base.split)) + (with_bias ? " bias" : ""));
              auto x = random_floats(size_t(t * k), seed + 2);
              LinearTactic widen = base;
              widen.widen_quant = true;
              std::vector<float> got(size_t(t * n), NAN), want(size_t(t * n), NAN);
              linear(x.data(), t, k, pq, with_bias ? b.data() : nullptr, got.data(), widen);
              linear(x.data(), t, k, pf, with_bias ? b.data() : nullptr, want.data(), base);
              size_t differ = 0;
              for (size_t i = 0; i < got.size(); ++i) differ += f32_bits(got[i]) != f32_bits(want[i]);
              EXPECT_EQ(differ, 0u);
              ++compared;
            }
      }
  });
  std::printf("  %zu widened products compared bit for bit\n", compared);
  if (!compared) GTEST_SKIP() << "no AVX2 here: the scalar kernels keep q8/q4 quantized";
}

TEST(QuantLinear, MatchesIndependentDequantization) {
  uint64_t seed = 100;
  for (WeightStorage s : {WeightStorage::kQ8, WeightStorage::kQ4})
    for (int64_t t : {1, 2, 3, 4, 7, 64})
      for (auto [n, k] : {std::pair<int64_t, int64_t>{16, 32}, {50, 96}, {17, 320}, {130, 768}})
        check(t, n, k, s, seed += 7);
}

TEST(QuantLinear, PackingLayoutAndErrors) {
  auto w = random_floats(64 * 64, 3);
  PackedWeight q8 = pack_weight(w.data(), 64, 64, WeightStorage::kQ8);
  // 4 panels x 2 groups (codes, 16 f16 scales, q4: 16 f16 mins, 16 exponents), each panel
  // padded to whole 64-byte lines: q8 2 x 560 -> 1152, q4 2 x 336 -> 704.
  EXPECT_EQ(quant_group_bytes(WeightStorage::kQ8), size_t(32 * 16 + 32 + 16));
  EXPECT_EQ(quant_group_bytes(WeightStorage::kQ4), size_t(32 * 8 + 64 + 16));
  EXPECT_EQ(q8.bytes(), size_t(4 * 1152));
  PackedWeight q4 = pack_weight(w.data(), 64, 64, WeightStorage::kQ4);
  EXPECT_EQ(q4.bytes(), size_t(4 * 704));
  // Each group's f32 scale and min are the shared format's F * f16 value, bit for bit.
  for (WeightStorage st : {WeightStorage::kQ8, WeightStorage::kQ4}) {
    const QuantFormat f = st == WeightStorage::kQ8 ? QuantFormat::kQ8 : QuantFormat::kQ4;
    // Rows of very different magnitudes: row factors from 2^-30 to 2^10.
    std::vector<float> v(w);
    for (int64_t r = 0; r < 64; ++r)
      for (int64_t i = 0; i < 64; ++i) v[size_t(r * 64 + i)] *= std::ldexp(1.0f, int(r % 41) - 30);
    const QuantizedRows q = quantize_rows(v.data(), 64, 64, f);
    for (const PackedWeight& pw : {pack_weight(v.data(), 64, 64, st), pack_quantized_weight(q)})
      for (int64_t p = 0; p < pw.panels(); ++p)
        for (int64_t g = 0; g < 2; ++g)
          for (int64_t c = 0; c < 16; ++c) {
            const uint8_t* group = pw.panel(p) + pw.offset(g * 32);
            const int64_t row = p * 16 + c;
            const float F = q.row_factor[size_t(row)];
            EXPECT_EQ(f32_bits(quant_group_value(st, group, false, c)),
                      f32_bits(f16_to_f32(q.scales[size_t(row * 2 + g)]) * F));
            if (st == WeightStorage::kQ4)
              EXPECT_EQ(f32_bits(quant_group_value(st, group, true, c)),
                        f32_bits(f16_to_f32(q.mins[size_t(row * 2 + g)]) * F));
          }
  }
  {  // a row factor that is no power of two (a damaged image) is refused by name
    QuantizedRows q = quantize_rows(w.data(), 64, 64, QuantFormat::kQ8);
    q.row_factor[5] = 3.0f;
    try {
      pack_quantized_weight(q);
      ADD_FAILURE() << "a row factor of 3 was packed";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("row 5's row factor 3 is not a power of two"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(pack_weight(w.data(), 64, 48, WeightStorage::kQ4), Error);  // K % 32 != 0
  std::vector<float> zeros(32 * 16, 0.0f), x(32, 1.0f), y(16, 5.0f);
  PackedWeight z = pack_weight(zeros.data(), 16, 32, WeightStorage::kQ4);
  linear(x.data(), 1, 32, z, nullptr, y.data());
  for (float v : y) EXPECT_EQ(v, 0.0f);  // an all-zero group has scale 0, not NaN
}

}  // namespace
}  // namespace kiln::cpu
