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
#include "test_util.h"

namespace kiln::cpu {
namespace {

using testing::expect_within;
using testing::for_each_isa;
using testing::random_floats;

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

struct SeqSpec { int32_t q_len, ctx_len; };

void run_case(int64_t d, int64_t block_size, int64_t hq, int64_t hkv, bool causal,
              const std::vector<SeqSpec>& specs, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "D=" << d << " bs=" << block_size << " Hq=" << hq << " Hkv=" << hkv
                                    << " causal=" << causal);
  std::mt19937_64 rng(seed);
  int64_t total_blocks = 1;  // block 0 stays unused
  for (auto& s : specs) total_blocks += (s.ctx_len + block_size - 1) / block_size;
  const int64_t row = hkv * d, slots = total_blocks * block_size;
  std::vector<float> k_f32(size_t(slots * row), NAN), v_f32 = k_f32;
  std::vector<int8_t> kc(size_t(slots * row), 0), vc = kc;
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
    for (int64_t p = 0; p < s.ctx_len; ++p) slot_mapping[size_t(p)] = int64_t(table[size_t(p / block_size)]) * block_size + p % block_size;
    auto k = random_floats(size_t(s.ctx_len * row), rng()), v = random_floats(size_t(s.ctx_len * row), rng());
    kv_cache_write(k.data(), v.data(), slot_mapping.data(), s.ctx_len, hkv, d, k_f32.data(), v_f32.data());
    kv_cache_write_int8(k.data(), v.data(), slot_mapping.data(), s.ctx_len, hkv, d, kc.data(), ks.data(), vc.data(),
                        vs.data());
    tables.push_back(std::move(table));
    t_total += s.q_len;
  }
  // The exactly dequantized cache (unused slots stay NaN).
  std::vector<float> k_deq(k_f32.size(), NAN), v_deq = k_deq;
  for (int64_t r = 0; r < slots * hkv; ++r)
    if (!std::isnan(ks[size_t(r)]))
      for (int64_t i = 0; i < d; ++i) {
        k_deq[size_t(r * d + i)] = float(kc[size_t(r * d + i)]) * ks[size_t(r)];
        v_deq[size_t(r * d + i)] = float(vc[size_t(r * d + i)]) * vs[size_t(r)];
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
    paged_attention_int8(q.data(), kc.data(), ks.data(), vc.data(), vs.data(), block_size, hq, hkv, d, scale, causal,
                         seqs.data(), n, out.data());
    expect_within(out, std::vector<double>(ref_deq.begin(), ref_deq.end()), std::vector<double>(q.size(), 2e-5),
                  "int8 attention vs attention on the dequantized cache");
    // Quantization error: K/V in [-1, 1] have steps <= 1/127, so each element is off by
    // <= 1/254; outputs are convex combinations of V rows, so the V error alone is
    // <= 0.004, and the K error moves the softmax weights a little (|q| <= 2).
    expect_within(out, std::vector<double>(ref_f32.begin(), ref_f32.end()), std::vector<double>(q.size(), 0.02),
                  "int8 attention vs the f32 cache");
    for (size_t i = 0; i < out.size(); ++i) max_quant_err = std::max(max_quant_err, std::fabs(double(out[i]) - ref_f32[i]));
  });
  EXPECT_GT(max_quant_err, 0.0) << "the int8 path must differ from f32 somewhere (it quantizes)";
}

TEST(KvInt8, PagedAttentionMatchesDequantizedAndF32) {
  uint64_t seed = 11;
  for (int64_t d : {16, 64, 72})
    for (auto [hq, hkv] : {std::pair{4, 4}, std::pair{8, 2}})
      for (bool causal : {true, false})
        run_case(d, 16, hq, hkv, causal, {{1, 1}, {1, 40}, {17, 50}, {3, 33}}, seed++);
  run_case(64, 16, 9, 3, true, {{1, 700}}, 99);
}

}  // namespace
}  // namespace kiln::cpu
