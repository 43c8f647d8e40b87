// INT8 KV cache kernels: kv_quantize_row's error bound and scale, kv_cache_write_int8's
// layout, and paged_attention_int8 against (a) paged_attention on the exactly dequantized
// cache (the fused dequantization adds only f32 rounding) and (b) paged_attention on the
// original f32 K/V (the quantization error, within a stated bound).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "backends/cpu/kernels/kernels.h"
#include "kv_quant_attention_case.h"
#include "test_util.h"

namespace kiln::cpu {
namespace {

using testing::quantized_attention_case;
using testing::random_floats;
using testing::SeqSpec;

TEST(KvInt8, QuantizeRowWithinHalfAStep) {
  uint64_t seed = 7;
  for (int64_t d : {1, 7, 16, 64, 130})
    for (float range : {1e-3f, 1.0f, 300.0f}) {
      auto x = random_floats(size_t(d), seed++, -range, range);
      std::vector<int8_t> c(static_cast<size_t>(d));
      const float s = kv_quantize_row(x.data(), d, c.data());
      float amax = 0;
      for (float v : x) amax = std::max(amax, std::fabs(v));
      EXPECT_EQ(s, amax / 127.0f);
      int max_code = 0;
      for (int64_t i = 0; i < d; ++i) {
        max_code = std::max(max_code, std::abs(int(c[size_t(i)])));
        EXPECT_LE(std::fabs(x[size_t(i)] - float(c[size_t(i)]) * s), 0.5f * s * (1 + 1e-5f))
            << "d=" << d << " range=" << range << " i=" << i;
      }
      EXPECT_EQ(max_code, 127);  // the largest |x| maps to +-127
    }
  std::vector<float> zeros(8, 0.0f);
  std::vector<int8_t> c(8, 5);
  EXPECT_EQ(kv_quantize_row(zeros.data(), 8, c.data()), 0.0f);
  EXPECT_TRUE(std::all_of(c.begin(), c.end(), [](int8_t v) { return v == 0; }));
  zeros[3] = NAN;
  EXPECT_TRUE(std::isnan(kv_quantize_row(zeros.data(), 8, c.data())));
}

TEST(KvInt8, CacheWriteStoresRowsPerSlotAndHead) {
  const int64_t hkv = 2, d = 5, slots = 6;
  auto k = random_floats(size_t(2 * hkv * d), 3), v = random_floats(size_t(2 * hkv * d), 4);
  std::vector<int8_t> kc(size_t(slots * hkv * d), 9), vc = kc;
  std::vector<float> ks(size_t(slots * hkv), -1.0f), vs = ks;
  const int64_t slot_mapping[2] = {4, -1};  // the second token is padding
  kv_cache_write_int8(k.data(), v.data(), slot_mapping, 2, hkv, d, kc.data(), ks.data(), vc.data(), vs.data());
  for (int64_t h = 0; h < hkv; ++h) {
    std::vector<int8_t> want(static_cast<size_t>(d));
    EXPECT_EQ(ks[size_t(4 * hkv + h)], kv_quantize_row(k.data() + h * d, d, want.data()));
    EXPECT_TRUE(std::equal(want.begin(), want.end(), kc.begin() + (4 * hkv + h) * d));
    EXPECT_EQ(vs[size_t(4 * hkv + h)], kv_quantize_row(v.data() + h * d, d, want.data()));
    EXPECT_TRUE(std::equal(want.begin(), want.end(), vc.begin() + (4 * hkv + h) * d));
  }
  for (int64_t slot : {0, 1, 2, 3, 5}) EXPECT_EQ(ks[size_t(slot * hkv)], -1.0f) << "slot " << slot << " untouched";
}

// Quantization error bound: K/V in [-1, 1] have steps <= 1/127, so each element is off
// by <= 1/254; outputs are convex combinations of V rows, so the V error alone is <= 0.004,
// and the K error moves the softmax weights a little (|q| <= 2): 0.02.
void run_case(int64_t d, int64_t block_size, int64_t hq, int64_t hkv, bool causal,
              const std::vector<SeqSpec>& specs, uint64_t seed, int64_t window = 0,
              float softcap = 0.0f, bool rotate = false) {
  const double max_quant_err = quantized_attention_case<int8_t>(
      "int8", kv_cache_write_int8, paged_attention_int8, [](int8_t c) { return float(c); }, 0.02, d, block_size, hq,
      hkv, causal, specs, seed, window, softcap, nullptr, nullptr, rotate);
  EXPECT_GT(max_quant_err, 0.0) << "the int8 path must differ from f32 somewhere (it quantizes)";
}

// Keys with a common bias per channel: int8's step is the row's max |x| / 127, so the bias
// widens every key's step; the key shift (KvLayout::k_shift) stores k - bias and leaves the
// softmax unchanged. The shifted cache must be several times closer to f32 attention.
TEST(KvInt8, KeyShiftLeavesSoftmaxAndShrinksError) {
  const int64_t d = 64, hq = 8, hkv = 2;
  auto bias = random_floats(size_t(hkv * d), 41, -12.0f, 12.0f);
  const std::vector<SeqSpec> specs = {{1, 40}, {17, 50}, {1, 300}};
  auto write = [](const float* k, const float* v, const int64_t* slots, int64_t t, int64_t hkv_, int64_t d_,
                  int8_t* kc, float* ks, int8_t* vc, float* vs, const float* shift, bool rotate) {
    kv_cache_write_int8(k, v, slots, t, hkv_, d_, kc, ks, vc, vs, shift, rotate);
  };
  auto decode = [](int8_t c) { return float(c); };
  const double plain = quantized_attention_case<int8_t>("int8", write, paged_attention_int8, decode, 10.0, d, 16, hq,
                                                        hkv, true, specs, 87, 0, 0.0f, &bias);
  const double shifted = quantized_attention_case<int8_t>("int8", write, paged_attention_int8, decode, 0.02, d, 16,
                                                          hq, hkv, true, specs, 87, 0, 0.0f, &bias, &bias);
  std::printf("int8 KV with biased keys: max |err| %.3g plain, %.3g with the key shift\n", plain, shifted);
  EXPECT_LT(shifted * 4, plain);
}

// Keys and queries sharing a few large channels (RoPE's slow pairs in real models): int8's
// step is the row's max |x| / 127, set by those channels; stored rotated (KvLayout::
// k_rotate) a row's energy spreads over every channel, so its max and step shrink. The
// rotated cache must be several times closer to the f32 attention.
TEST(KvInt8, KeyRotationShrinksTheErrorOfLargeSharedChannels) {
  const int64_t d = 64, hq = 8, hkv = 2;
  std::vector<float> channels(size_t(d), 1.0f);
  channels[3] = channels[3 + d / 2] = 16.0f;
  const std::vector<SeqSpec> specs = {{1, 40}, {17, 50}, {1, 300}};
  auto decode = [](int8_t c) { return float(c); };
  const double plain = quantized_attention_case<int8_t>("int8", kv_cache_write_int8, paged_attention_int8, decode,
                                                        10.0, d, 16, hq, hkv, true, specs, 88, 0, 0.0f, nullptr,
                                                        nullptr, false, &channels);
  const double rotated = quantized_attention_case<int8_t>("int8", kv_cache_write_int8, paged_attention_int8, decode,
                                                          10.0, d, 16, hq, hkv, true, specs, 88, 0, 0.0f, nullptr,
                                                          nullptr, true, &channels);
  std::printf("int8 KV with two large shared channels: max |err| %.3g plain, %.3g rotated\n", plain, rotated);
  EXPECT_LT(rotated * 2, plain);
}

// hadamard_transform is the Walsh-Hadamard transform of blocks of d & -d values (Sylvester's
// order: H[i][j] = (-1)^popcount(i & j)); applied twice it gives b times the row, and
// kv_rotate_queries' rows dotted with rotated keys give the plain dot products.
TEST(KvRotation, BlockHadamardTransform) {
  for (int64_t d : {1, 8, 16, 64, 72, 96, 128, 256}) {
    SCOPED_TRACE(::testing::Message() << "d=" << d);
    const int64_t b = hadamard_block(d);
    EXPECT_EQ(d % b, 0);
    EXPECT_EQ(b & (b - 1), 0);
    EXPECT_NE((d / b) % 2, 0) << "the largest power of two dividing d";
    const auto x = random_floats(size_t(d), uint64_t(d), -4.0f, 4.0f);
    std::vector<float> y = x;
    hadamard_transform(y.data(), d);
    for (int64_t i = 0; i < d; ++i) {
      const int64_t blk = i / b * b;
      double want = 0;
      for (int64_t j = 0; j < b; ++j)
        want += (__builtin_popcountll(uint64_t((i - blk) & j)) % 2 ? -1.0 : 1.0) * double(x[size_t(blk + j)]);
      EXPECT_NEAR(y[size_t(i)], want, 1e-5 * double(b)) << "element " << i;
    }
    std::vector<float> twice = y;
    hadamard_transform(twice.data(), d);
    for (int64_t i = 0; i < d; ++i) EXPECT_NEAR(twice[size_t(i)], double(b) * x[size_t(i)], 1e-5 * double(b * b));
    const auto q = random_floats(size_t(2 * d), uint64_t(d) + 1, -2.0f, 2.0f);
    std::vector<float> qr(q.size());
    kv_rotate_queries(q.data(), 2, d, qr.data());
    for (int64_t r = 0; r < 2; ++r) {
      double plain = 0, rotated = 0;
      for (int64_t i = 0; i < d; ++i) {
        plain += double(q[size_t(r * d + i)]) * x[size_t(i)];
        rotated += double(qr[size_t(r * d + i)]) * y[size_t(i)];
      }
      EXPECT_NEAR(rotated, plain, 1e-5 * double(d));
    }
  }
}

TEST(KvInt8, PagedAttentionMatchesDequantizedAndF32) {
  uint64_t seed = 11;
  for (int64_t d : {16, 64, 72})
    for (auto [hq, hkv] : {std::pair{4, 4}, std::pair{8, 2}})
      for (bool causal : {true, false})
        run_case(d, 16, hq, hkv, causal, {{1, 1}, {1, 40}, {17, 50}, {3, 33}}, seed++);
  // Keys stored rotated (KvLayout::k_rotate): blocks of 16, 64 and 8 (72 = 9 x 8), 128.
  for (int64_t d : {16, 64, 72}) run_case(d, 16, 8, 2, true, {{1, 1}, {1, 40}, {17, 50}, {3, 33}}, seed++, 0, 0.0f, true);
  run_case(128, 16, 9, 3, true, {{1, 300}}, seed++, 7, 1.5f, true);
  run_case(64, 16, 9, 3, true, {{1, 700}}, 99);
  // A sliding window of 7 keys: decode, chunked prefill, prompts.
  for (int64_t d : {16, 64}) run_case(d, 16, 8, 2, true, {{1, 1}, {1, 40}, {17, 50}, {3, 33}}, seed++, 7);
  // Soft-capped scores (Gemma 2), with and without the window.
  for (int64_t window : {0, 7}) run_case(64, 16, 8, 2, true, {{1, 40}, {17, 50}}, seed++, window, 1.5f);
}

}  // namespace
}  // namespace kiln::cpu
