// Conformance of linear() (packed f32/bf16/f16 weights, every tactic) against a naive
// double-precision x·Wᵀ+b over a table of shapes with row/column/K tails. The bound is
// the rigorous f32 summation bound 2·K·2⁻²⁴·Σ|x·w| (+ storage rounding where compared to
// unrounded weights).
#include <gtest/gtest.h>

#include <cstring>

#include "backends/cpu/kernels/kernels.h"
#include "core/dtype.h"
#include "core/status.h"
#include "test_util.h"

namespace kiln::cpu {
namespace {

using testing::expect_within;
using testing::for_each_isa;
using testing::random_floats;

struct Ref {
  std::vector<double> y, abs_sum;
};

// w as the kernel sees it after storage rounding (or exact when round is false).
Ref reference(const std::vector<float>& x, const std::vector<float>& w, const float* bias, int64_t t,
              int64_t n, int64_t k, WeightStorage storage, bool round) {
  Ref r{std::vector<double>(t * n), std::vector<double>(t * n)};
  std::vector<double> wr(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    float v = w[i];
    if (round && storage == WeightStorage::kBF16) v = bf16_to_f32(f32_to_bf16(v));
    if (round && storage == WeightStorage::kF16) v = f16_to_f32(f32_to_f16(v));
    wr[i] = v;
  }
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = bias ? bias[j] : 0.0, a = bias ? std::fabs(bias[j]) : 0.0;
      for (int64_t kk = 0; kk < k; ++kk) {
        s += double(x[i * k + kk]) * wr[j * k + kk];
        a += std::fabs(double(x[i * k + kk]) * wr[j * k + kk]);
      }
      r.y[i * n + j] = s;
      r.abs_sum[i * n + j] = a;
    }
  return r;
}

void check(int64_t t, int64_t n, int64_t k, WeightStorage storage, bool with_bias,
           const LinearTactic& tactic, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "T=" << t << " N=" << n << " K=" << k << " storage="
                                    << weight_storage_name(storage) << " bias=" << with_bias
                                    << " mr=" << tactic.mr << " kc=" << tactic.kc
                                    << " split=" << int(tactic.split) << " threads=" << tactic.threads
                                    << " panels=" << tactic.panels);
  auto x = random_floats(t * k, seed);
  auto w = random_floats(n * k, seed + 1);
  auto b = random_floats(n, seed + 2);
  const float* bias = with_bias ? b.data() : nullptr;
  PackedWeight pw = pack_weight(w.data(), n, k, storage);
  Ref ref = reference(x, w, bias, t, n, k, storage, /*round=*/true);
  std::vector<double> tol(t * n);
  for (size_t i = 0; i < tol.size(); ++i) tol[i] = 2.0 * double(k + 1) * 0x1p-24 * ref.abs_sum[i] + 1e-30;
  std::vector<float> y(t * n, NAN);
  linear(x.data(), t, k, pw, bias, y.data(), tactic);
  expect_within(y, ref.y, tol, "linear");
}

TEST(Linear, ShapeTableF32) {
  const int64_t ts[] = {1, 2, 3, 5, 7, 17, 64, 129};
  const int64_t nks[][2] = {{1, 1}, {15, 7}, {16, 16}, {17, 33}, {48, 64}, {100, 75}, {257, 300}, {40, 700}};
  for_each_isa([&] {
    uint64_t seed = 1;
    for (int64_t t : ts)
      for (auto& nk : nks) {
        seed += 7;
        check(t, nk[0], nk[1], WeightStorage::kF32, (seed & 2) != 0, {}, seed);
      }
  });
}

TEST(Linear, ShapeTableHalfStorage) {
  const int64_t ts[] = {1, 3, 7, 64};
  const int64_t nks[][2] = {{15, 7}, {33, 64}, {100, 75}, {40, 700}};
  for_each_isa([&] {
    uint64_t seed = 100;
    for (WeightStorage s : {WeightStorage::kBF16, WeightStorage::kF16})
      for (int64_t t : ts)
        for (auto& nk : nks) check(t, nk[0], nk[1], s, true, {}, seed += 7);
  });
}

TEST(Linear, EveryTactic) {
  for_each_isa([&] {
    uint64_t seed = 500;
    std::vector<int> mrs = {1, 4, 6};
    if (avx512_enabled()) mrs.insert(mrs.end(), {9, 12});  // the AVX-512 kernel's taller tiles
    // panels 2: the AVX-512 kernel's 32-wide tile over pairs of whole panels (N = 50: a
    // pair, then a whole and a partial panel alone; 80: two pairs and one alone; 64: two
    // pairs); the 1-panel kernels elsewhere.
    for (int mr : mrs)
      for (int64_t kc : {int64_t(16), int64_t(100), int64_t(0)})
        for (LinearSplit split : {LinearSplit::kPanels, LinearSplit::kRows})
          for (int threads : {0, 1})
            for (int panels : {1, 2}) {
              LinearTactic tac{mr, kc, split, threads, panels};
              check(37, 50, 230, WeightStorage::kF32, true, tac, seed += 3);
              check(2, 19, 230, WeightStorage::kBF16, false, tac, seed += 3);
              if (panels == 2) {
                check(29, 80, 230, WeightStorage::kF32, false, tac, seed += 3);
                check(13, 64, 70, WeightStorage::kBF16, true, tac, seed += 3);
                check(13, 64, 70, WeightStorage::kF16, true, tac, seed += 3);
              }
            }
  });
}

// bf16 panels hold rows in pairs, so K blocks start on even rows: an odd kc is rounded
// down (to 2 at least), and an odd K ends on a half-empty pair.
TEST(Linear, Bf16PanelsTakeOddKBlocks) {
  for_each_isa([&] {
    uint64_t seed = 700;
    for (int64_t kc : {int64_t(1), int64_t(45)})
      for (int64_t t : {int64_t(1), int64_t(2), int64_t(37)})
        for (int64_t k : {int64_t(231), int64_t(230)}) {
          LinearTactic tac{};
          tac.kc = kc;
          check(t, 50, k, WeightStorage::kBF16, true, tac, seed += 3);
        }
  });
}

// 16-bit panels give the bits of f32 panels holding the same rounded values: the 16-bit
// tiles widen each panel row in registers and do the f32 tiles' FMAs lane for lane, and
// row blocks of 24+ rows (linear.cpp's kWidenMinRows) widen each panel slice once into a
// scratch and run the f32 tiles themselves. Every tile shape, K blocking and panel
// pairing, with a bias and a partial last panel, below and above that row count; an odd K
// leaves bf16's last row pair half empty.
TEST(Linear, HalfPanelsGiveTheBitsOfTheirF32Values) {
  for_each_isa([&] {
    uint64_t seed = 900;
    for (WeightStorage s : {WeightStorage::kBF16, WeightStorage::kF16})
      for (int64_t k : {int64_t(300), int64_t(77)})
        for (int64_t t : {int64_t(2), int64_t(13), int64_t(61), int64_t(140)})
          for (int64_t n : {int64_t(64), int64_t(50)})
            for (int64_t kc : {int64_t(0), int64_t(128), int64_t(46)})
              for (int panels : {0, 1, 2}) {
                SCOPED_TRACE(::testing::Message() << weight_storage_name(s) << " K=" << k << " T=" << t << " N=" << n
                                                  << " kc=" << kc << " panels=" << panels);
                auto x = random_floats(t * k, seed += 3);
                auto w = random_floats(n * k, seed += 3);
                auto b = random_floats(n, seed += 3);
                for (float& v : w)
                  v = s == WeightStorage::kBF16 ? bf16_to_f32(f32_to_bf16(v)) : f16_to_f32(f32_to_f16(v));
                PackedWeight half = pack_weight(w.data(), n, k, s);
                PackedWeight full = pack_weight(w.data(), n, k, WeightStorage::kF32);
                LinearTactic tac{};
                tac.kc = kc;
                tac.panels = panels;
                std::vector<float> y(t * n, NAN), y32(t * n, NAN);
                linear(x.data(), t, k, half, b.data(), y.data(), tac);
                linear(x.data(), t, k, full, b.data(), y32.data(), tac);
                for (int64_t i = 0; i < t * n; ++i) ASSERT_EQ(f32_bits(y[i]), f32_bits(y32[i])) << "element " << i;
              }
  });
}

// Half-size storage vs the exact f32 weights: within the storage rounding bound
// (bf16 keeps 8 significant bits, f16 11) plus summation.
TEST(Linear, HalfStorageVsF32Weights) {
  const int64_t t = 5, n = 70, k = 129;
  auto x = random_floats(t * k, 11);
  auto w = random_floats(n * k, 12);
  Ref exact = reference(x, w, nullptr, t, n, k, WeightStorage::kF32, false);
  for_each_isa([&] {
    for (auto [s, rel] : {std::pair{WeightStorage::kBF16, 0x1p-9}, std::pair{WeightStorage::kF16, 0x1p-11}}) {
      PackedWeight pw = pack_weight(w.data(), n, k, s);
      // bf16 rows go in pairs: K = 129 stores 130 rows, the last zero.
      EXPECT_EQ(pw.bytes(), size_t(pw.panels() * 16 * (s == WeightStorage::kBF16 ? k + 1 : k) * 2));
      std::vector<float> y(t * n);
      linear(x.data(), t, k, pw, nullptr, y.data());
      std::vector<double> tol(t * n);
      for (size_t i = 0; i < tol.size(); ++i)
        tol[i] = (rel + 2.0 * double(k) * 0x1p-24) * exact.abs_sum[i] + double(k) * 0x1p-25;
      expect_within(y, exact.y, tol, weight_storage_name(s));
    }
  });
}

// Packing straight from bf16 / f16 weights (a 16-bit checkpoint's) makes the bytes that
// packing their f32 values makes, in every storage, with a partial last panel (N = 50)
// and K not a multiple of the bf16 row pair; other dtypes are refused.
TEST(Linear, PackingFromHalfWeightsMakesTheF32PanelsBytes) {
  for (DType half : {DType::kBF16, DType::kF16})
    for (WeightStorage s : {WeightStorage::kF32, WeightStorage::kBF16, WeightStorage::kF16, WeightStorage::kQ8,
                            WeightStorage::kQ4})
      for (int64_t n : {int64_t(64), int64_t(50)}) {
        const int64_t k = weight_storage_quantized(s) ? 256 : 77;
        SCOPED_TRACE(::testing::Message() << dtype_name(half) << " -> " << weight_storage_name(s) << " N=" << n);
        const auto f = random_floats(n * k, uint64_t(n + k));
        std::vector<uint16_t> h(f.size());
        std::vector<float> wide(f.size());
        for (size_t i = 0; i < f.size(); ++i) {
          h[i] = half == DType::kBF16 ? f32_to_bf16(f[i]) : f32_to_f16(f[i]);
          wide[i] = half == DType::kBF16 ? bf16_to_f32(h[i]) : f16_to_f32(h[i]);
        }
        const PackedWeight a = pack_weight(h.data(), half, n, k, s), b = pack_weight(wide.data(), n, k, s);
        ASSERT_EQ(a.bytes(), b.bytes());
        EXPECT_EQ(std::memcmp(a.data.get(), b.data.get(), a.bytes()), 0);
      }
  std::vector<int8_t> codes(16 * 32);
  EXPECT_THROW(pack_weight(codes.data(), DType::kI8, 16, 32, WeightStorage::kF32), kiln::Error);
}

TEST(Linear, RejectsKMismatch) {
  auto w = random_floats(8 * 4, 1);
  PackedWeight pw = pack_weight(w.data(), 8, 4, WeightStorage::kF32);
  std::vector<float> x(5), y(8);
  EXPECT_THROW(linear(x.data(), 1, 5, pw, nullptr, y.data()), kiln::Error);
}

TEST(Linear, RejectsABadPanelCount) {
  auto w = random_floats(32 * 4, 1);
  PackedWeight pw = pack_weight(w.data(), 32, 4, WeightStorage::kF32);
  std::vector<float> x(4), y(32);
  LinearTactic tac;
  tac.panels = 3;
  EXPECT_THROW(linear(x.data(), 1, 4, pw, nullptr, y.data(), tac), kiln::Error);
}

}  // namespace
}  // namespace kiln::cpu
