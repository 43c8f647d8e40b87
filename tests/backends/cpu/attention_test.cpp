// Paged attention vs naive dense attention (double) over the unpaged K/V: random shuffled
// block tables, GQA ratios 1/2/4, causal and not, decode, chunked prefill (q_len > 1 with
// existing context), several sequences per call, D 16..128, block sizes 16/32, long context,
// sliding windows (each query sees its last `window` keys) on every path.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "backends/cpu/kernels/kernels.h"
#include "core/status.h"
#include "test_util.h"

namespace kiln::cpu {
namespace {

using testing::expect_within;
using testing::for_each_isa;
using testing::random_floats;

struct SeqSpec { int32_t q_len, ctx_len; };

void run_case(int64_t d, int64_t block_size, int64_t hq, int64_t hkv, bool causal,
              const std::vector<SeqSpec>& specs, uint64_t seed, int64_t window = 0, float softcap = 0.0f) {
  SCOPED_TRACE(::testing::Message() << "D=" << d << " bs=" << block_size << " Hq=" << hq << " Hkv=" << hkv
                                    << " causal=" << causal << " window=" << window << " softcap=" << softcap
                                    << " seqs=" << specs.size());
  std::mt19937_64 rng(seed);
  // Dense per-sequence K/V [ctx, Hkv, D], scattered into shuffled physical blocks.
  int64_t total_blocks = 0;
  for (auto& s : specs) total_blocks += (s.ctx_len + block_size - 1) / block_size;
  total_blocks += 3;  // unused blocks stay NaN: reading one would poison the output
  std::vector<int32_t> pool(total_blocks);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  const int64_t row = hkv * d;
  std::vector<float> k_cache(total_blocks * block_size * row, NAN), v_cache = k_cache;
  std::vector<std::vector<float>> dense_k, dense_v;
  std::vector<std::vector<int32_t>> tables;
  size_t next = 0;
  int64_t t_total = 0;
  for (auto& s : specs) {
    dense_k.push_back(random_floats(s.ctx_len * row, rng()));
    dense_v.push_back(random_floats(s.ctx_len * row, rng()));
    std::vector<int32_t> table;
    for (int64_t b = 0; b * block_size < s.ctx_len; ++b) table.push_back(pool[next++]);
    for (int64_t p = 0; p < s.ctx_len; ++p) {
      const int64_t off = (int64_t(table[p / block_size]) * block_size + p % block_size) * row;
      std::copy_n(dense_k.back().begin() + p * row, row, k_cache.begin() + off);
      std::copy_n(dense_v.back().begin() + p * row, row, v_cache.begin() + off);
    }
    tables.push_back(table);
    t_total += s.q_len;
  }
  // Sequences occupy q rows in reverse order, to exercise q_start.
  std::vector<AttentionSeq> seqs;
  int64_t start = t_total;
  for (size_t i = 0; i < specs.size(); ++i) {
    start -= specs[i].q_len;
    seqs.push_back({int32_t(start), specs[i].q_len, specs[i].ctx_len, tables[i].data()});
  }
  auto q = random_floats(t_total * hq * d, rng(), -2.0f, 2.0f);
  const float scale = 1.0f / std::sqrt(float(d));

  std::vector<double> ref(q.size()), tol(q.size(), 2e-5);
  for (size_t si = 0; si < specs.size(); ++si)
    for (int64_t j = 0; j < specs[si].q_len; ++j)
      for (int64_t h = 0; h < hq; ++h) {
        const int64_t t = seqs[si].q_start + j, kvh = h / (hq / hkv);
        const int64_t pos = specs[si].ctx_len - specs[si].q_len + j;
        const int64_t n = causal ? pos + 1 : specs[si].ctx_len;
        const int64_t first = window > 0 ? std::max<int64_t>(0, n - window) : 0;
        std::vector<double> s(n, -INFINITY);
        double mx = -INFINITY, sum = 0;
        for (int64_t p = first; p < n; ++p) {
          double dot = 0;
          for (int64_t i = 0; i < d; ++i)
            dot += double(q[(t * hq + h) * d + i]) * dense_k[si][p * row + kvh * d + i];
          s[p] = dot * scale;
          if (softcap > 0.0f) s[p] = softcap * std::tanh(s[p] / softcap);
          mx = std::max(mx, s[p]);
        }
        for (auto& v : s) sum += (v = std::exp(v - mx));
        for (int64_t i = 0; i < d; ++i) {
          double o = 0;
          for (int64_t p = first; p < n; ++p) o += s[p] * dense_v[si][p * row + kvh * d + i];
          ref[(t * hq + h) * d + i] = o / sum;
        }
      }
  for_each_isa([&] {
    std::vector<float> out(q.size(), NAN);
    paged_attention(q.data(), k_cache.data(), v_cache.data(), block_size, hq, hkv, d, scale, causal,
                    seqs.data(), int64_t(seqs.size()), out.data(), window,
                    softcap);
    expect_within(out, ref, tol, "paged_attention");
  });
}

TEST(PagedAttention, DecodeAndPrefillTable) {
  uint64_t seed = 1;
  for (int64_t d : {16, 32, 64, 128})
    for (int64_t bs : {16, 32})
      for (auto [hq, hkv] : {std::pair{4, 4}, std::pair{4, 2}, std::pair{8, 2}})
        for (bool causal : {true, false}) {
          // decode (several lengths), chunked prefill, a fresh prefill; one call.
          run_case(d, bs, hq, hkv, causal, {{1, 1}, {1, 17}, {1, 64}, {17, 50}, {40, 40}, {3, 33}}, seed++);
        }
}

TEST(PagedAttention, LongContext) {
  run_case(64, 16, 8, 2, true, {{1, 3001}, {5, 2048}}, 99);
  run_case(128, 32, 4, 1, true, {{1, 4100}}, 100);
}

// Windows of 1 key (itself), shorter than a 64-key chunk, one chunk, and longer than some
// contexts, on the per-row path (decode, D 16/32) and the blocked prompt paths (D 64/128,
// q_len >= 4; 150 rows span two 128-row units): where a row's window starts inside a
// chunk, past the unit's first row, and where it reaches back before the new tokens.
TEST(PagedAttention, SlidingWindow) {
  uint64_t seed = 500;
  for (int64_t window : {1, 5, 64, 100})
    for (int64_t d : {16, 64, 128})
      for (auto [hq, hkv] : {std::pair{4, 4}, std::pair{8, 2}})
        run_case(d, 16, hq, hkv, true, {{1, 1}, {1, 90}, {1, 300}, {17, 50}, {150, 150}, {6, 240}, {40, 60}},
                 seed++, window);
}

// Gemma 2's soft-capped scores (s -> c tanh(s / c)), with and without a sliding window,
// every head dim (64 and 128 prompts leave the blocked paths for the per-row loop).
TEST(PagedAttention, SoftCappedScores) {
  uint64_t seed = 700;
  for (float cap : {0.5f, 3.0f})
    for (int64_t d : {16, 64, 128})
      for (int64_t window : {0, 9})
        run_case(d, 16, 8, 2, true, {{1, 1}, {1, 90}, {17, 50}, {40, 40}}, seed++, window, cap);
  run_case(64, 16, 4, 4, false, {{30, 30}}, seed, 0, 1.0f);
}

TEST(PagedAttention, RejectsBadArguments) {
  std::vector<float> buf(64);
  int32_t table[1] = {0};
  AttentionSeq s{0, 2, 1, table};  // q_len > ctx_len
  EXPECT_THROW(paged_attention(buf.data(), buf.data(), buf.data(), 16, 2, 2, 4, 1.0f, true, &s, 1,
                               buf.data()), kiln::Error);
  s = {0, 1, 1, table};
  EXPECT_THROW(paged_attention(buf.data(), buf.data(), buf.data(), 16, 3, 2, 4, 1.0f, true, &s, 1,
                               buf.data()), kiln::Error);
  // A sliding window needs causal attention and a positive size.
  EXPECT_THROW(paged_attention(buf.data(), buf.data(), buf.data(), 16, 2, 2, 4, 1.0f, false, &s, 1, buf.data(), 4),
               kiln::Error);
  EXPECT_THROW(paged_attention(buf.data(), buf.data(), buf.data(), 16, 2, 2, 4, 1.0f, true, &s, 1, buf.data(), -1),
               kiln::Error);
  for (float cap : {-1.0f, NAN, INFINITY})
    EXPECT_THROW(paged_attention(buf.data(), buf.data(), buf.data(), 16, 2, 2, 4, 1.0f, true, &s, 1, buf.data(), 0, cap),
                 kiln::Error);
}

}  // namespace
}  // namespace kiln::cpu
