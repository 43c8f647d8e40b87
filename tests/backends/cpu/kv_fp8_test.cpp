// FP8 (E4M3) KV cache kernels: kv_quantize_row_fp8's scale and error bound, every code's
// decoding inside paged_attention_fp8 (the AVX2 F16C trick and the scalar table), the
// cache write's layout, and paged_attention_fp8 against (a) paged_attention on the
// exactly dequantized cache (only f32 rounding apart) and (b) the original f32 K/V (the
// quantization error, within a stated bound).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "backends/cpu/kernels/kernels.h"
#include "core/dtype.h"
#include "core/fp8.h"
#include "kv_quant_attention_case.h"
#include "test_util.h"

namespace kiln::cpu {
namespace {

using testing::for_each_isa;
using testing::quantized_attention_case;
using testing::random_floats;
using testing::SeqSpec;

float decode(Fp8Code c) { return fp8e4m3_to_f32(uint8_t(c)); }

TEST(KvFp8, QuantizeRowScaleAndErrorBound) {
  uint64_t seed = 5;
  for (int64_t d : {1, 7, 16, 64, 130})
    for (float range : {1e-3f, 1.0f, 300.0f}) {
      auto x = random_floats(size_t(d), seed++, -range, range);
      x[size_t(d / 2)] *= 1e-4f;  // a value deep in E4M3's subnormal range
      std::vector<Fp8Code> c(static_cast<size_t>(d));
      const float s = kv_quantize_row_fp8(x.data(), d, c.data());
      float amax = 0;
      for (float v : x) amax = std::max(amax, std::fabs(v));
      EXPECT_EQ(s, amax / 448.0f);
      float max_decoded = 0;
      for (int64_t i = 0; i < d; ++i) {
        const float xi = x[size_t(i)], got = decode(c[size_t(i)]) * s;
        max_decoded = std::max(max_decoded, std::fabs(decode(c[size_t(i)])));
        // 3 mantissa bits: half a step is 2^-4 of the value in the normal range and
        // 2^-10 (in units of s) in the subnormal one; 1e-5 for the f32 products.
        const double bound = std::max(std::ldexp(std::fabs(double(xi)), -4), std::ldexp(double(s), -10));
        EXPECT_LE(std::fabs(double(xi) - double(got)), bound * (1 + 1e-5) + 1e-6 * double(amax))
            << "d=" << d << " range=" << range << " i=" << i;
      }
      EXPECT_EQ(max_decoded, 448.0f);  // the largest |x| maps to E4M3's largest value
    }
  std::vector<float> zeros(8, 0.0f);
  std::vector<Fp8Code> c(8, Fp8Code(0x33));
  EXPECT_EQ(kv_quantize_row_fp8(zeros.data(), 8, c.data()), 0.0f);
  EXPECT_TRUE(std::all_of(c.begin(), c.end(), [](Fp8Code v) { return uint8_t(v) == 0; }));
  zeros[3] = INFINITY;
  EXPECT_TRUE(std::isnan(kv_quantize_row_fp8(zeros.data(), 8, c.data())));
  EXPECT_TRUE(std::all_of(c.begin(), c.end(), [](Fp8Code v) { return uint8_t(v) == 0; }));
}

// One key: the output is its V row (softmax weight 1, up to the vector exp's rounding of
// e^0), so a V row holding every finite code decodes each of them through the
// attention's V accumulation under every ISA; a wrongly decoded code is off by at least
// one E4M3 step (2^-4 relative), far beyond the 1e-6 allowed.
TEST(KvFp8, AttentionDecodesEveryCodeExactly) {
  const int64_t d = 256;
  std::vector<Fp8Code> kc(static_cast<size_t>(d), Fp8Code(0x38)), vc(static_cast<size_t>(d));  // K: all 1.0
  for (int64_t i = 0; i < d; ++i) vc[size_t(i)] = Fp8Code((i & 0x7f) == 0x7f ? 0x00 : i);  // no NaN codes
  const float ks = 1.0f, vs = 0.25f;
  const int32_t table[1] = {0};
  const AttentionSeq seq{0, 1, 1, table};
  auto q = random_floats(size_t(d), 1);
  for_each_isa([&] {
    std::vector<float> out(size_t(d), NAN);
    paged_attention_fp8(q.data(), kc.data(), &ks, vc.data(), &vs, 1, 1, 1, d, 0.1f, true, &seq, 1, out.data());
    for (int64_t i = 0; i < d; ++i) {
      const float want = decode(vc[size_t(i)]) * vs;
      ASSERT_LE(std::fabs(out[size_t(i)] - want), 1e-6f * std::fabs(want)) << "code " << i;
    }
  });
}

TEST(KvFp8, CacheWriteStoresRowsPerSlotAndHead) {
  const int64_t hkv = 2, d = 5, slots = 6;
  auto k = random_floats(size_t(2 * hkv * d), 3), v = random_floats(size_t(2 * hkv * d), 4);
  std::vector<Fp8Code> kc(size_t(slots * hkv * d), Fp8Code(9)), vc = kc;
  std::vector<float> ks(size_t(slots * hkv), -1.0f), vs = ks;
  const int64_t slot_mapping[2] = {-1, 2};  // the first token is padding
  kv_cache_write_fp8(k.data(), v.data(), slot_mapping, 2, hkv, d, kc.data(), ks.data(), vc.data(), vs.data());
  for (int64_t h = 0; h < hkv; ++h) {
    std::vector<Fp8Code> want(static_cast<size_t>(d));
    EXPECT_EQ(ks[size_t(2 * hkv + h)], kv_quantize_row_fp8(k.data() + (hkv + h) * d, d, want.data()));
    EXPECT_TRUE(std::equal(want.begin(), want.end(), kc.begin() + (2 * hkv + h) * d));
    EXPECT_EQ(vs[size_t(2 * hkv + h)], kv_quantize_row_fp8(v.data() + (hkv + h) * d, d, want.data()));
    EXPECT_TRUE(std::equal(want.begin(), want.end(), vc.begin() + (2 * hkv + h) * d));
  }
  for (int64_t slot : {0, 1, 3, 4, 5}) EXPECT_EQ(ks[size_t(slot * hkv)], -1.0f) << "slot " << slot << " untouched";

  // With a key shift the keys are stored as k - shift (per kv head), the values as they are.
  auto shift = random_floats(size_t(hkv * d), 5, -3.0f, 3.0f);
  kv_cache_write_fp8(k.data(), v.data(), slot_mapping, 2, hkv, d, kc.data(), ks.data(), vc.data(), vs.data(),
                     shift.data());
  for (int64_t h = 0; h < hkv; ++h) {
    std::vector<float> centered(static_cast<size_t>(d));
    for (int64_t c = 0; c < d; ++c) centered[size_t(c)] = k[size_t((hkv + h) * d + c)] - shift[size_t(h * d + c)];
    std::vector<Fp8Code> want(static_cast<size_t>(d));
    EXPECT_EQ(ks[size_t(2 * hkv + h)], kv_quantize_row_fp8(centered.data(), d, want.data()));
    EXPECT_TRUE(std::equal(want.begin(), want.end(), kc.begin() + (2 * hkv + h) * d));
    EXPECT_EQ(vs[size_t(2 * hkv + h)], kv_quantize_row_fp8(v.data() + (hkv + h) * d, d, want.data()));
    EXPECT_TRUE(std::equal(want.begin(), want.end(), vc.begin() + (2 * hkv + h) * d));
  }
}

// Returns the largest |fp8 attention - f32 attention| over every output. Quantization
// error bound: each V element is within 2^-4 of itself (|v| <= 1), and an output is a
// convex combination of V rows, so the V error alone is <= 0.0625; the K error (also
// <= 2^-4 relative, |q| <= 2) moves the softmax weights a little: 0.08.
double run_case(int64_t d, int64_t block_size, int64_t hq, int64_t hkv, bool causal,
                const std::vector<SeqSpec>& specs, uint64_t seed, int64_t window = 0,
                float softcap = 0.0f, double bound = 0.08, const std::vector<float>* k_bias = nullptr,
                const std::vector<float>* k_shift = nullptr, bool rotate = false,
                const std::vector<float>* channels = nullptr) {
  return quantized_attention_case<Fp8Code>("fp8", kv_cache_write_fp8, paged_attention_fp8, decode, bound, d,
                                           block_size, hq, hkv, causal, specs, seed, window, softcap, k_bias, k_shift,
                                           rotate, channels);
}

// Keys with a large common part (a bias per channel, as RoPE's slow channels carry): E4M3
// rounds each key element to 2^-4 of itself, so the bias costs the scores its own rounding
// error; shifting the stored keys by that common part (KvLayout::k_shift) leaves the
// softmax unchanged and quantizes only the small remainder. The shifted cache must be
// several times closer to the f32 attention than the plain one.
TEST(KvFp8, KeyShiftLeavesSoftmaxAndShrinksError) {
  const int64_t d = 64, hq = 8, hkv = 2;
  auto bias = random_floats(size_t(hkv * d), 31, -12.0f, 12.0f);
  const std::vector<SeqSpec> specs = {{1, 40}, {17, 50}, {1, 300}};
  const double plain = run_case(d, 16, hq, hkv, true, specs, 77, 0, 0.0f, 10.0, &bias);
  const double shifted = run_case(d, 16, hq, hkv, true, specs, 77, 0, 0.0f, 0.08, &bias, &bias);
  // A shift that is not the bias still leaves the softmax exact (the (a) check inside).
  auto other = random_floats(size_t(hkv * d), 32, -1.0f, 1.0f);
  run_case(d, 16, hq, hkv, true, specs, 78, 0, 0.0f, 10.0, &bias, &other);
  std::printf("fp8 KV with biased keys: max |err| %.3g plain, %.3g with the key shift\n", plain, shifted);
  EXPECT_LT(shifted * 4, plain);
}

// Keys and queries sharing a few large channels (RoPE's slow pairs): E4M3 rounds each
// element to 2^-4 of itself, so a score's error is dominated by those channels' rounding
// times the query's large values there. Stored rotated (KvLayout::k_rotate) the rounding
// spreads over every channel, where the query's other values are small: the score's error
// shrinks by about sqrt(sum q^2 k^2 / (|q|^2 |k|^2 / d)). The rotated cache must be
// several times closer to the f32 attention; with the shift as well, still as close.
TEST(KvFp8, KeyRotationShrinksTheErrorOfLargeSharedChannels) {
  const int64_t d = 64, hq = 8, hkv = 2;
  std::vector<float> channels(size_t(d), 1.0f);
  channels[3] = channels[3 + d / 2] = 8.0f;
  const std::vector<SeqSpec> specs = {{1, 40}, {17, 50}, {1, 300}};
  const double plain = run_case(d, 16, hq, hkv, true, specs, 79, 0, 0.0f, 10.0, nullptr, nullptr, false, &channels);
  const double rotated = run_case(d, 16, hq, hkv, true, specs, 79, 0, 0.0f, 10.0, nullptr, nullptr, true, &channels);
  auto bias = random_floats(size_t(hkv * d), 33, -2.0f, 2.0f);
  const double both = run_case(d, 16, hq, hkv, true, specs, 79, 0, 0.0f, 10.0, &bias, &bias, true, &channels);
  std::printf("fp8 KV with two large shared channels: max |err| %.3g plain, %.3g rotated, %.3g shifted + rotated\n",
              plain, rotated, both);
  EXPECT_LT(rotated * 2, plain);
  EXPECT_LT(both * 2, plain);
}

TEST(KvFp8, PagedAttentionMatchesDequantizedAndF32) {
  uint64_t seed = 21;
  double worst = 0;
  for (int64_t d : {16, 64, 72})
    for (auto [hq, hkv] : {std::pair{4, 4}, std::pair{8, 2}})
      for (bool causal : {true, false})
        worst = std::max(worst, run_case(d, 16, hq, hkv, causal, {{1, 1}, {1, 40}, {17, 50}, {3, 33}}, seed++));
  worst = std::max(worst, run_case(128, 16, 9, 3, true, {{1, 700}}, 99));
  // Keys stored rotated (KvLayout::k_rotate): blocks of 16, 64 and 8 (72 = 9 x 8), 128.
  for (int64_t d : {16, 64, 72})
    worst = std::max(worst, run_case(d, 16, 8, 2, true, {{1, 1}, {1, 40}, {17, 50}, {3, 33}}, seed++, 0, 0.0f, 0.08,
                                     nullptr, nullptr, true));
  worst = std::max(worst, run_case(128, 16, 9, 3, true, {{1, 300}}, seed++, 7, 1.5f, 0.08, nullptr, nullptr, true));
  // A sliding window of 7 keys: decode, chunked prefill, prompts.
  for (int64_t d : {16, 64})
    worst = std::max(worst, run_case(d, 16, 8, 2, true, {{1, 1}, {1, 40}, {17, 50}, {3, 33}}, seed++, 7));
  // Soft-capped scores (Gemma 2), with and without the window.
  for (int64_t window : {0, 7})
    worst = std::max(worst, run_case(64, 16, 8, 2, true, {{1, 40}, {17, 50}}, seed++, window, 1.5f));
  std::printf("fp8 KV attention: max |err| vs the f32 cache %.3g\n", worst);
  EXPECT_GT(worst, 0.0) << "the fp8 path must differ from f32 somewhere (it quantizes)";
}

}  // namespace
}  // namespace kiln::cpu
