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
#include "test_util.h"

namespace kiln::cpu {
namespace {

using testing::expect_within;
using testing::for_each_isa;
using testing::random_floats;

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
}

struct SeqSpec {
  int32_t q_len, ctx_len;
};

// Returns the largest |fp8 attention - f32 attention| over every output.
double run_case(int64_t d, int64_t block_size, int64_t hq, int64_t hkv, bool causal,
                const std::vector<SeqSpec>& specs, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "D=" << d << " bs=" << block_size << " Hq=" << hq << " Hkv=" << hkv
                                    << " causal=" << causal);
  std::mt19937_64 rng(seed);
  int64_t total_blocks = 1;  // block 0 stays unused
  for (auto& s : specs) total_blocks += (s.ctx_len + block_size - 1) / block_size;
  const int64_t row = hkv * d, slots = total_blocks * block_size;
  std::vector<float> k_f32(size_t(slots * row), NAN), v_f32 = k_f32;
  std::vector<Fp8Code> kc(size_t(slots * row), Fp8Code(0)), vc = kc;
  std::vector<float> ks(size_t(slots * hkv), NAN), vs = ks;
  std::vector<std::vector<int32_t>> tables;
  std::vector<int32_t> pool(size_t(total_blocks - 1));
  std::iota(pool.begin(), pool.end(), 1);
  std::shuffle(pool.begin(), pool.end(), rng);
  size_t next = 0;
  int64_t t_total = 0;
  for (auto& s : specs) {
    std::vector<int32_t> table;
    for (int64_t b = 0; b * block_size < s.ctx_len; ++b) table.push_back(pool[next++]);
    std::vector<int64_t> slot_mapping(size_t(s.ctx_len));
    for (int64_t p = 0; p < s.ctx_len; ++p)
      slot_mapping[size_t(p)] = int64_t(table[size_t(p / block_size)]) * block_size + p % block_size;
    auto k = random_floats(size_t(s.ctx_len * row), rng()), v = random_floats(size_t(s.ctx_len * row), rng());
    kv_cache_write(k.data(), v.data(), slot_mapping.data(), s.ctx_len, hkv, d, k_f32.data(), v_f32.data());
    kv_cache_write_fp8(k.data(), v.data(), slot_mapping.data(), s.ctx_len, hkv, d, kc.data(), ks.data(), vc.data(),
                       vs.data());
    tables.push_back(std::move(table));
    t_total += s.q_len;
  }
  std::vector<float> k_deq(k_f32.size(), NAN), v_deq = k_deq;
  for (int64_t r = 0; r < slots * hkv; ++r)
    if (!std::isnan(ks[size_t(r)]))
      for (int64_t i = 0; i < d; ++i) {
        k_deq[size_t(r * d + i)] = decode(kc[size_t(r * d + i)]) * ks[size_t(r)];
        v_deq[size_t(r * d + i)] = decode(vc[size_t(r * d + i)]) * vs[size_t(r)];
      }
  std::vector<AttentionSeq> seqs;
  int64_t start = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    seqs.push_back({int32_t(start), specs[i].q_len, specs[i].ctx_len, tables[i].data()});
    start += specs[i].q_len;
  }
  auto q = random_floats(size_t(t_total * hq * d), rng(), -2.0f, 2.0f);
  const float scale = 1.0f / std::sqrt(float(d));
  const int64_t n = int64_t(seqs.size());
  std::vector<float> ref_f32(q.size()), ref_deq(q.size());
  paged_attention(q.data(), k_f32.data(), v_f32.data(), block_size, hq, hkv, d, scale, causal, seqs.data(), n,
                  ref_f32.data());
  paged_attention(q.data(), k_deq.data(), v_deq.data(), block_size, hq, hkv, d, scale, causal, seqs.data(), n,
                  ref_deq.data());
  double max_quant_err = 0;
  for_each_isa([&] {
    std::vector<float> out(q.size(), NAN);
    paged_attention_fp8(q.data(), kc.data(), ks.data(), vc.data(), vs.data(), block_size, hq, hkv, d, scale, causal,
                        seqs.data(), n, out.data());
    expect_within(out, std::vector<double>(ref_deq.begin(), ref_deq.end()), std::vector<double>(q.size(), 2e-5),
                  "fp8 attention vs attention on the dequantized cache");
    // Quantization error: each V element is within 2^-4 of itself (|v| <= 1), and an
    // output is a convex combination of V rows, so the V error alone is <= 0.0625; the K
    // error (also <= 2^-4 relative, |q| <= 2) moves the softmax weights a little.
    expect_within(out, std::vector<double>(ref_f32.begin(), ref_f32.end()), std::vector<double>(q.size(), 0.08),
                  "fp8 attention vs the f32 cache");
    for (size_t i = 0; i < out.size(); ++i)
      max_quant_err = std::max(max_quant_err, std::fabs(double(out[i]) - ref_f32[i]));
  });
  return max_quant_err;
}

TEST(KvFp8, PagedAttentionMatchesDequantizedAndF32) {
  uint64_t seed = 21;
  double worst = 0;
  for (int64_t d : {16, 64, 72})
    for (auto [hq, hkv] : {std::pair{4, 4}, std::pair{8, 2}})
      for (bool causal : {true, false})
        worst = std::max(worst, run_case(d, 16, hq, hkv, causal, {{1, 1}, {1, 40}, {17, 50}, {3, 33}}, seed++));
  worst = std::max(worst, run_case(128, 16, 9, 3, true, {{1, 700}}, 99));
  std::printf("fp8 KV attention: max |err| vs the f32 cache %.3g\n", worst);
  EXPECT_GT(worst, 0.0) << "the fp8 path must differ from f32 somewhere (it quantizes)";
}

}  // namespace
}  // namespace kiln::cpu
