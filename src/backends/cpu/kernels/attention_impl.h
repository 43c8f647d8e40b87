// Internal: the paged-attention loop, written once and instantiated per ISA with an Ops
// type giving dot/axpy/scale/exp over contiguous floats, and dot/axpy over int8 and FP8
// codes for the quantized caches (attention.cpp: scalar, attention_avx2.cpp: AVX2). Ops types live in anonymous namespaces so each ISA's
// instantiation has internal linkage. Tested in tests/backends/cpu/attention_test.cpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <type_traits>

#include "backends/cpu/kernels/kernels.h"
#include "core/thread_pool.h"

namespace kiln::cpu {

// One work item is one (query row, head): it walks the context kAttnChunk keys at a time
// with an online softmax (running max m, running sum l, unnormalized acc[D]), so a chunk's
// scores are computed, exponentiated and folded into acc while its K/V rows are in cache.
// Chunks ignore the cache's block boundaries (each key's slot comes from the block table):
// with one-token blocks (encoder rows read in place) the per-block rescale, scalar exp and
// one-element vector exp cost ~4x the arithmetic (BERT-base, seq 128: attention 84 of 300
// ms per forward on 2 threads, before chunks).
// Elem is float (f32 cache; the scale pointers are unused) or int8_t / Fp8Code (codes,
// with one scale per (slot, kv head) at k_scales/v_scales[slot * hkv + kvh], applied to
// the dot product and to the probability that weights the V row). window > 0 (causal only):
// a query at position p sees keys (p - window, p], window keys with itself. softcap > 0:
// each score s becomes softcap * tanh(s / softcap).
constexpr int64_t kAttnChunk = 64;

template <typename Ops, typename Elem>
void paged_attention_impl(const float* q, const Elem* k_cache, const float* k_scales, const Elem* v_cache,
                          const float* v_scales, int64_t block_size, int64_t hq, int64_t hkv, int64_t d, float scale,
                          bool causal, const AttentionSeq* seqs, int64_t num_seqs, float* out, int64_t window,
                          float softcap) {
  // rows_before[s] = query rows of sequences before s, to map a flat item to (seq, j, h).
  std::unique_ptr<int64_t[]> rows_before(new int64_t[num_seqs + 1]);
  rows_before[0] = 0;
  for (int64_t s = 0; s < num_seqs; ++s) rows_before[s + 1] = rows_before[s] + seqs[s].q_len;
  const int64_t items = rows_before[num_seqs] * hq;
  const int64_t group = hq / hkv;
  const int64_t kv_row = hkv * d;  // elements between consecutive tokens of a block
  constexpr bool kQuantized = !std::is_same_v<Elem, float>;

  ThreadPool::global().parallel_for(items, [&](int64_t begin, int64_t end, int) {
    std::unique_ptr<float[]> buf(new float[2 * d + kAttnChunk]);
    float* qs = buf.get();
    float* acc = qs + d;
    float* score = acc + d;
    int64_t slot[kAttnChunk];  // the chunk's keys' cache slots
    int64_t seq = std::upper_bound(rows_before.get(), rows_before.get() + num_seqs + 1, begin / hq) -
                  rows_before.get() - 1;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t row = item / hq, h = item % hq;
      while (row >= rows_before[seq + 1]) ++seq;
      const AttentionSeq& sq = seqs[seq];
      const int64_t j = row - rows_before[seq];
      const int64_t t = sq.q_start + j;
      const int64_t limit = causal ? sq.ctx_len - sq.q_len + j + 1 : sq.ctx_len;
      const int64_t first = window > 0 ? std::max<int64_t>(0, limit - window) : 0;  // sliding window
      const int64_t kvh = h / group;
      for (int64_t i = 0; i < d; ++i) qs[i] = q[(t * hq + h) * d + i] * scale;
      std::fill(acc, acc + d, 0.0f);
      float m = -std::numeric_limits<float>::infinity(), l = 0.0f;
      for (int64_t c0 = first; c0 < limit; c0 += kAttnChunk) {
        const int64_t n = std::min(kAttnChunk, limit - c0);
        float cmax = -std::numeric_limits<float>::infinity();
        for (int64_t i = 0; i < n; ++i) {
          const int64_t p = c0 + i, b = p / block_size;
          slot[i] = int64_t(sq.block_table[b]) * block_size + (p - b * block_size);
          score[i] = Ops::dot(qs, k_cache + slot[i] * kv_row + kvh * d, d);
          if constexpr (kQuantized) score[i] *= k_scales[slot[i] * hkv + kvh];
          if (softcap > 0.0f) score[i] = softcap * std::tanh(score[i] / softcap);
          cmax = std::max(cmax, score[i]);
        }
        const float m_new = std::max(m, cmax);
        if (m_new > m && l > 0.0f) {
          const float corr = std::exp(m - m_new);
          l *= corr;
          Ops::scale(acc, corr, d);
        }
        m = m_new;
        for (int64_t i = 0; i < n; ++i) score[i] -= m;
        Ops::exp_inplace(score, n);
        for (int64_t i = 0; i < n; ++i) {
          l += score[i];
          const Elem* v = v_cache + slot[i] * kv_row + kvh * d;
          if constexpr (kQuantized)
            Ops::axpy(acc, score[i] * v_scales[slot[i] * hkv + kvh], v, d);
          else
            Ops::axpy(acc, score[i], v, d);
        }
      }
      float* o = out + (t * hq + h) * d;
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      for (int64_t i = 0; i < d; ++i) o[i] = acc[i] * inv;
    }
  });
}

}  // namespace kiln::cpu
