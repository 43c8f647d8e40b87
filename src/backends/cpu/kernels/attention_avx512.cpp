// AVX-512 prompt attention over f32 caches at head dims 64 and 128 (called by the AVX2
// paged_attention for sequences of several query rows, where avx512_enabled()). The AVX2
// blocked path's structure (attention_avx2.cpp: units of query rows of one sequence and
// head, 64-key chunks transposed once into Kt [D][64], an online softmax per row), with
// units of up to 128 rows (each transposed chunk serves them all: BERT-base's attention
// ~10% faster than with 32) and four query rows at a time in zmm registers: the chunk's 64 scores of four rows
// are 16 accumulators fed by one load of each Kt row (4 loads + 4 broadcasts per 16 FMAs,
// where one row at a time in ymm costs 9 loads per 8 FMAs), and P V the same way over 64
// output dims at a time (4 V loads + 4 broadcasts per 16 FMAs). Sums run in another order
// than the AVX2 and scalar paths (within f32 rounding). Compiled with -mavx512f
// -mavx512bw -mavx512vl -mfma; tested through tests/backends/cpu/attention_test.cpp.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backends/cpu/kernels/attention_blocked.h"
#include "backends/cpu/kernels/isa.h"
#include "backends/cpu/kernels/vec_math.h"
#include "core/thread_pool.h"

namespace kiln::cpu::avx512 {
namespace {

inline __m512 vset(float v) { return _mm512_set1_ps(v); }

// exp(x): vec_math.h's, 16 lanes wide (the AVX2 kernels' operations per lane).
inline __m512 exp512(__m512 x) { return vec::exp<vec::Z>(x); }

constexpr int64_t kRowBlock = 128, kKeys = kBlockedKeys, kR = 4, kT = kKeys / 16;

// Lanes [16t, 16t + 16) of a chunk below n live.
inline __mmask16 live_mask(int64_t n, int t) {
  const int64_t k = n - 16 * t;
  return k >= 16 ? __mmask16(0xFFFF) : k <= 0 ? __mmask16(0) : __mmask16((1u << k) - 1);
}

template <int D>
void rows_impl(const float* q, const float* k_cache, const float* v_cache, int64_t block_size, int64_t hq,
               int64_t hkv, float scale, bool causal, const AttentionSeq* seqs, int64_t num_seqs, float* out,
               int64_t window) {
  const std::vector<BlockedUnit> units = blocked_units(seqs, num_seqs, hq, kRowBlock);
  const int64_t group = hq / hkv, kv_row = hkv * D;
  const float kNegInf = -std::numeric_limits<float>::infinity();
  ThreadPool::global().parallel_for(int64_t(units.size()), [&](int64_t u0, int64_t u1, int) {
    alignas(64) float kt[D * kKeys];
    alignas(64) float qs[kRowBlock * D], acc[kRowBlock * D];
    alignas(64) float p[kR][kKeys];
    float m[kRowBlock], l[kRowBlock];
    const float* vrow[kKeys];
    for (int64_t ui = u0; ui < u1; ++ui) {
      const BlockedUnit& un = units[size_t(ui)];
      const AttentionSeq& sq = seqs[un.seq];
      const int64_t rows = un.j1 - un.j0, kvh = un.h / group, ctx0 = sq.ctx_len - sq.q_len;
      // Keys row r sees (0 for the padding rows of the last group of four).
      auto limit = [&](int64_t r) -> int64_t {
        if (r >= rows) return 0;
        return causal ? ctx0 + un.j0 + r + 1 : int64_t(sq.ctx_len);
      };
      // The first key row r sees (a sliding window's start; 0 without one).
      auto first = [&](int64_t r) { return window > 0 ? std::max<int64_t>(0, limit(r) - window) : int64_t(0); };
      for (int64_t r = 0; r < kRowBlock; ++r) {
        if (r < rows) {
          const float* qr = q + ((sq.q_start + un.j0 + r) * hq + un.h) * D;
          for (int64_t i = 0; i < D; ++i) qs[r * D + i] = qr[i] * scale;
        } else {
          std::fill(qs + r * D, qs + (r + 1) * D, 0.0f);
        }
        std::fill(acc + r * D, acc + (r + 1) * D, 0.0f);
        m[r] = kNegInf;
        l[r] = 0.0f;
      }
      const int64_t last = limit(rows - 1);  // the most keys any row of the unit sees
      for (int64_t c0 = first(0); c0 < last; c0 += kKeys) {
        const int64_t n = std::min(kKeys, last - c0);
        gather_key_chunk<D>(sq, k_cache, v_cache, block_size, kv_row, kvh, c0, n, kt, vrow);
        for (int64_t r0 = 0; r0 < rows; r0 += kR) {
          // Row r0 + r sees keys [lo[r], nn[r]) of the chunk (nn[r] = 0: none).
          int64_t nn[kR], lo[kR], nmax = 0, lmin = n;
          for (int r = 0; r < kR; ++r) {
            nn[r] = std::clamp<int64_t>(limit(r0 + r) - c0, 0, n);
            lo[r] = std::clamp<int64_t>(first(r0 + r) - c0, 0, n);
            if (nn[r] <= lo[r]) nn[r] = lo[r] = 0;
            if (nn[r] > 0) lmin = std::min(lmin, lo[r]);
            nmax = std::max(nmax, nn[r]);
          }
          if (nmax == 0) continue;
          // S = Q Kt for four rows: each Kt row loaded once.
          __m512 sc[kR][kT];
#pragma GCC unroll 4
          for (int r = 0; r < kR; ++r)
#pragma GCC unroll 4
            for (int t = 0; t < kT; ++t) sc[r][t] = _mm512_setzero_ps();
          const float* qg = qs + r0 * D;
          for (int64_t i = 0; i < D; ++i) {
            __m512 kv[kT];
#pragma GCC unroll 4
            for (int t = 0; t < kT; ++t) kv[t] = _mm512_load_ps(kt + i * kKeys + 16 * t);
#pragma GCC unroll 4
            for (int r = 0; r < kR; ++r) {
              const __m512 qb = _mm512_set1_ps(qg[r * D + i]);
#pragma GCC unroll 4
              for (int t = 0; t < kT; ++t) sc[r][t] = _mm512_fmadd_ps(qb, kv[t], sc[r][t]);
            }
          }
          // The scores go to p (their exponentials replace them below): indexed at run time
          // by the softmax, sc in registers made GCC keep it in memory and store all 16
          // accumulators on every step of the loop above.
#pragma GCC unroll 4
          for (int r = 0; r < kR; ++r)
#pragma GCC unroll 4
            for (int t = 0; t < kT; ++t) _mm512_store_ps(p[r] + 16 * t, sc[r][t]);
          // Each row's online softmax step: masked max, rescale factor, P into p[r].
          float corr[kR];
          for (int r = 0; r < kR; ++r) {
            corr[r] = 1.0f;
            if (nn[r] == 0) {
              std::fill(p[r], p[r] + kKeys, 0.0f);
              continue;
            }
            __mmask16 live[kT];
            for (int t = 0; t < kT; ++t) live[t] = __mmask16(live_mask(nn[r], t) & ~live_mask(lo[r], t));
            __m512 vmax = vset(kNegInf);
            for (int t = 0; t < kT; ++t) vmax = _mm512_mask_max_ps(vmax, live[t], vmax, _mm512_load_ps(p[r] + 16 * t));
            const int64_t ri = r0 + r;
            const float m_new = std::max(m[ri], _mm512_reduce_max_ps(vmax));
            if (m_new > m[ri] && l[ri] > 0.0f) {
              corr[r] = std::exp(m[ri] - m_new);
              l[ri] *= corr[r];
            }
            m[ri] = m_new;
            __m512 psum = _mm512_setzero_ps();
            for (int t = 0; t < kT; ++t) {
              const __m512 e =
                  _mm512_maskz_mov_ps(live[t], exp512(_mm512_sub_ps(_mm512_load_ps(p[r] + 16 * t), vset(m_new))));
              _mm512_storeu_ps(p[r] + 16 * t, e);
              psum = _mm512_add_ps(psum, e);
            }
            l[ri] += _mm512_reduce_add_ps(psum);
          }
          // O = corr O + P V for four rows, 64 output dims at a time: each V row loaded once.
          for (int64_t d0 = 0; d0 < D; d0 += 64) {
            __m512 o[kR][4];
#pragma GCC unroll 4
            for (int r = 0; r < kR; ++r)
#pragma GCC unroll 4
              for (int i = 0; i < 4; ++i)
                o[r][i] = _mm512_mul_ps(_mm512_loadu_ps(acc + (r0 + r) * D + d0 + 16 * i), vset(corr[r]));
            for (int64_t c = lmin; c < nmax; ++c) {
              __m512 vv[4];
#pragma GCC unroll 4
              for (int i = 0; i < 4; ++i) vv[i] = _mm512_loadu_ps(vrow[c] + d0 + 16 * i);
#pragma GCC unroll 4
              for (int r = 0; r < kR; ++r) {
                const __m512 pb = _mm512_set1_ps(p[r][c]);
#pragma GCC unroll 4
                for (int i = 0; i < 4; ++i) o[r][i] = _mm512_fmadd_ps(pb, vv[i], o[r][i]);
              }
            }
#pragma GCC unroll 4
            for (int r = 0; r < kR; ++r)
#pragma GCC unroll 4
              for (int i = 0; i < 4; ++i) _mm512_storeu_ps(acc + (r0 + r) * D + d0 + 16 * i, o[r][i]);
          }
        }
      }
      for (int64_t r = 0; r < rows; ++r) {
        float* o = out + ((sq.q_start + un.j0 + r) * hq + un.h) * D;
        const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
        for (int64_t i = 0; i < D; ++i) o[i] = acc[r * D + i] * inv;
      }
    }
  });
}

}  // namespace

void attention_rows_f32(const float* q, const float* k_cache, const float* v_cache, int64_t block_size, int64_t hq,
                        int64_t hkv, int64_t d, float scale, bool causal, const AttentionSeq* seqs, int64_t num_seqs,
                        float* out, int64_t window) {
  if (d == 64) rows_impl<64>(q, k_cache, v_cache, block_size, hq, hkv, scale, causal, seqs, num_seqs, out, window);
  else rows_impl<128>(q, k_cache, v_cache, block_size, hq, hkv, scale, causal, seqs, num_seqs, out, window);
}

}  // namespace kiln::cpu::avx512
