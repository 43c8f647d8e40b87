// One paged-attention case over a quantized KV cache (int8 or fp8 codes with one f32
// scale per token and K/V head), shared by kv_int8_test.cpp and kv_fp8_test.cpp: random
// K/V written through the codec's cache write into shuffled blocks of a pool, then the
// codec's paged attention (every ISA) compared with (a) paged_attention on the exactly
// dequantized cache, within f32 rounding (2e-5), and (b) paged_attention on the f32 K/V,
// within the codec's quantization bound. Returns the largest |quantized - f32| output.
// Key centering: `k_bias` [hkv * d], when given, is added to every key row (a common
// part, as RoPE's slow channels carry), and `k_shift` is passed to the write; the cache
// then holds k - k_shift, and (a) compares with attention on those dequantized keys
// (softmax does not see the shift). Key rotation: with `k_rotate` the write stores keys
// through hadamard_transform and the attention reads queries through kv_rotate_queries; (a)
// then compares with attention of those queries on the dequantized (rotated) keys.
// `channel_scale` [d], when given, multiplies every key and query row channel by channel
// (a few large channels that queries and keys share, as RoPE's slow pairs are).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/kernels/kernels.h"
#include "test_util.h"

namespace kiln::cpu::testing {

struct SeqSpec {
  int32_t q_len, ctx_len;
};

// Code: the stored code type; write / attend: the codec's kv_cache_write_* and
// paged_attention_*; decode: a code as f32 before its scale.
template <typename Code, typename Write, typename Attend, typename Decode>
double quantized_attention_case(const std::string& name, Write write, Attend attend, Decode decode, double quant_bound,
                                int64_t d, int64_t block_size, int64_t hq, int64_t hkv, bool causal,
                                const std::vector<SeqSpec>& specs, uint64_t seed, int64_t window = 0,
                                float softcap = 0.0f, const std::vector<float>* k_bias = nullptr,
                                const std::vector<float>* k_shift = nullptr, bool k_rotate = false,
                                const std::vector<float>* channel_scale = nullptr) {
  SCOPED_TRACE(::testing::Message() << name << " D=" << d << " bs=" << block_size << " Hq=" << hq << " Hkv=" << hkv
                                    << " causal=" << causal << " window=" << window << " softcap=" << softcap
                                    << " rotate=" << k_rotate);
  std::mt19937_64 rng(seed);
  int64_t total_blocks = 1;  // block 0 stays unused
  for (auto& s : specs) total_blocks += (s.ctx_len + block_size - 1) / block_size;
  const int64_t row = hkv * d, slots = total_blocks * block_size;
  std::vector<float> k_f32(size_t(slots * row), NAN), v_f32 = k_f32;
  std::vector<Code> kc(size_t(slots * row), Code(0)), vc = kc;
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
    if (channel_scale)
      for (size_t i = 0; i < k.size(); ++i) k[i] *= (*channel_scale)[i % size_t(d)];
    if (k_bias)
      for (size_t i = 0; i < k.size(); ++i) k[i] += (*k_bias)[i % size_t(row)];
    kv_cache_write(k.data(), v.data(), slot_mapping.data(), s.ctx_len, hkv, d, k_f32.data(), v_f32.data());
    write(k.data(), v.data(), slot_mapping.data(), s.ctx_len, hkv, d, kc.data(), ks.data(), vc.data(), vs.data(),
          k_shift ? k_shift->data() : nullptr, k_rotate);
    tables.push_back(std::move(table));
    t_total += s.q_len;
  }
  // The exactly dequantized cache (unused slots stay NaN).
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
  if (channel_scale)
    for (size_t i = 0; i < q.size(); ++i) q[i] *= (*channel_scale)[i % size_t(d)];
  std::vector<float> q_read = q;  // what the quantized cache's attention reads
  if (k_rotate) kv_rotate_queries(q.data(), t_total * hq, d, q_read.data());
  const float scale = 1.0f / std::sqrt(float(d));
  const int64_t n = int64_t(seqs.size());
  std::vector<float> ref_f32(q.size()), ref_deq(q.size());
  paged_attention(q.data(), k_f32.data(), v_f32.data(), block_size, hq, hkv, d, scale, causal, seqs.data(), n,
                  ref_f32.data(), window, softcap);
  paged_attention(q_read.data(), k_deq.data(), v_deq.data(), block_size, hq, hkv, d, scale, causal, seqs.data(), n,
                  ref_deq.data(), window, softcap);
  double max_quant_err = 0;
  for_each_isa([&] {
    std::vector<float> out(q.size(), NAN);
    attend(q_read.data(), kc.data(), ks.data(), vc.data(), vs.data(), block_size, hq, hkv, d, scale, causal, seqs.data(), n,
           out.data(), window, softcap);
    expect_within(out, std::vector<double>(ref_deq.begin(), ref_deq.end()), std::vector<double>(q.size(), 2e-5),
                  name + " attention vs attention on the dequantized cache");
    expect_within(out, std::vector<double>(ref_f32.begin(), ref_f32.end()), std::vector<double>(q.size(), quant_bound),
                  name + " attention vs the f32 cache");
    for (size_t i = 0; i < out.size(); ++i)
      max_quant_err = std::max(max_quant_err, std::fabs(double(out[i]) - ref_f32[i]));
  });
  return max_quant_err;
}

}  // namespace kiln::cpu::testing
