// AVX2/FMA Ops for the paged-attention loop in attention_impl.h: 8-wide dot products
// over D (two accumulators), V accumulation by FMA, and the vector exp for the scores;
// int8 codes are widened, FP8 E4M3 codes decoded through F16C (see load_fp8).
// Tested in tests/backends/cpu/attention_test.cpp.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backends/cpu/kernels/attention_blocked.h"
#include "backends/cpu/kernels/attention_impl.h"
#include "backends/cpu/kernels/isa.h"
#include "backends/cpu/kernels/vec_math_avx2.h"
#include "core/fp8.h"

namespace kiln::cpu::avx2 {
namespace {

struct Avx2Ops {
  static float dot(const float* a, const float* b, int64_t d) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= d; i += 16) {
      s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
      s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= d; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float s = hsum(_mm256_add_ps(s0, s1));
    for (; i < d; ++i) s += a[i] * b[i];
    return s;
  }
  // int8 codes: 8 at a time widened to i32, then to f32.
  static __m256 load_i8(const int8_t* c) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c))));
  }
  static float dot(const float* a, const int8_t* b, int64_t d) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= d; i += 16) {
      s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load_i8(b + i), s0);
      s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), load_i8(b + i + 8), s1);
    }
    for (; i + 8 <= d; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load_i8(b + i), s0);
    float s = hsum(_mm256_add_ps(s0, s1));
    for (; i < d; ++i) s += a[i] * float(b[i]);
    return s;
  }
  static void axpy(float* acc, float p, const int8_t* v, int64_t d) {
    const __m256 vp = vset(p);
    int64_t i = 0;
    for (; i + 8 <= d; i += 8)
      _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(vp, load_i8(v + i), _mm256_loadu_ps(acc + i)));
    for (; i < d; ++i) acc[i] += p * float(v[i]);
  }
  // FP8 E4M3 codes, 8 at a time, as f16 bits: sign to bit 15, exponent and mantissa to
  // bits 13..7. An E4M3 value 2^(e-7) (1 + m/8) then reads as the f16 2^(e-15) (1 + m/8),
  // and a subnormal (m/8) 2^-6 as (m/8) 2^-14: both exactly the value times 2^-8, which
  // dot/axpy fold back in (a power of two: exact). The cache holds no NaN codes.
  static __m256 load_fp8(const Fp8Code* c) {
    const __m128i w = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c)));
    const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x80)), 8),
                                   _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x7f)), 7));
    return _mm256_cvtph_ps(h);
  }
  static float dot(const float* a, const Fp8Code* b, int64_t d) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= d; i += 16) {
      s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load_fp8(b + i), s0);
      s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), load_fp8(b + i + 8), s1);
    }
    for (; i + 8 <= d; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load_fp8(b + i), s0);
    float s = hsum(_mm256_add_ps(s0, s1)) * 256.0f;
    const float* table = fp8e4m3_table();
    for (; i < d; ++i) s += a[i] * table[uint8_t(b[i])];
    return s;
  }
  static void axpy(float* acc, float p, const Fp8Code* v, int64_t d) {
    const __m256 vp = vset(p * 256.0f);
    int64_t i = 0;
    for (; i + 8 <= d; i += 8)
      _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(vp, load_fp8(v + i), _mm256_loadu_ps(acc + i)));
    const float* table = fp8e4m3_table();
    for (; i < d; ++i) acc[i] += p * table[uint8_t(v[i])];
  }
  static void axpy(float* acc, float p, const float* v, int64_t d) {
    const __m256 vp = vset(p);
    int64_t i = 0;
    for (; i + 8 <= d; i += 8)
      _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(vp, _mm256_loadu_ps(v + i), _mm256_loadu_ps(acc + i)));
    for (; i < d; ++i) acc[i] += p * v[i];
  }
  static void scale(float* acc, float s, int64_t d) {
    const __m256 vs = vset(s);
    int64_t i = 0;
    for (; i + 8 <= d; i += 8) _mm256_storeu_ps(acc + i, _mm256_mul_ps(vs, _mm256_loadu_ps(acc + i)));
    for (; i < d; ++i) acc[i] *= s;
  }
  static void exp_inplace(float* x, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, exp_ps(_mm256_loadu_ps(x + i)));
    if (i < n) {
      float buf[8] = {};
      for (int64_t j = i; j < n; ++j) buf[j - i] = x[j];
      _mm256_storeu_ps(buf, exp_ps(_mm256_loadu_ps(buf)));
      for (int64_t j = i; j < n; ++j) x[j] = buf[j - i];
    }
  }
};

// f32 caches, head dims 64 and 128, prompts (many query rows): a work unit is up to
// kRowBlock query rows of one sequence and head. For each chunk of 64 keys it transposes
// the keys into Kt [D][64] once, then per row computes the chunk's 64 scores as a [D] x
// [D, 64] product (eight 8-wide accumulators, no horizontal sums), updates the row's
// online softmax and adds P V over the chunk with the row's D outputs in registers (64
// dims at a time). The per-(row, head) loop of attention_impl.h pays a horizontal sum per
// score and reloads the row's accumulator per key: this path does ~4x less work per
// score. The same online softmax; sums in another order (within f32 rounding).
constexpr int64_t kRowBlock = 32, kKeys = kBlockedKeys;

template <int D>
void attention_rows(const float* q, const float* k_cache, const float* v_cache, int64_t block_size, int64_t hq,
                    int64_t hkv, float scale, bool causal, const AttentionSeq* seqs, int64_t num_seqs, float* out,
                    int64_t window) {
  const std::vector<BlockedUnit> units = blocked_units(seqs, num_seqs, hq, kRowBlock);
  const int64_t group = hq / hkv, kv_row = hkv * D;
  ThreadPool::global().parallel_for(int64_t(units.size()), [&](int64_t u0, int64_t u1, int) {
    alignas(32) float kt[D * kKeys];
    alignas(32) float qs[kRowBlock * D], acc[kRowBlock * D], p[kKeys];
    float m[kRowBlock], l[kRowBlock];
    const float* vrow[kKeys];
    for (int64_t ui = u0; ui < u1; ++ui) {
      const BlockedUnit& un = units[size_t(ui)];
      const AttentionSeq& sq = seqs[un.seq];
      const int64_t rows = un.j1 - un.j0, kvh = un.h / group, ctx0 = sq.ctx_len - sq.q_len;
      auto limit = [&](int64_t r) { return causal ? ctx0 + un.j0 + r + 1 : int64_t(sq.ctx_len); };
      // The first key row r sees (a sliding window's start; 0 without one).
      auto first = [&](int64_t r) { return window > 0 ? std::max<int64_t>(0, limit(r) - window) : int64_t(0); };
      for (int64_t r = 0; r < rows; ++r) {
        const float* qr = q + ((sq.q_start + un.j0 + r) * hq + un.h) * D;
        for (int64_t i = 0; i < D; ++i) qs[r * D + i] = qr[i] * scale;
        std::fill(acc + r * D, acc + (r + 1) * D, 0.0f);
        m[r] = -std::numeric_limits<float>::infinity();
        l[r] = 0.0f;
      }
      const int64_t last = limit(rows - 1);  // the most keys any row of the unit sees
      for (int64_t c0 = first(0); c0 < last; c0 += kKeys) {
        const int64_t n = std::min(kKeys, last - c0);
        gather_key_chunk<D>(sq, k_cache, v_cache, block_size, kv_row, kvh, c0, n, kt, vrow);
        for (int64_t r = 0; r < rows; ++r) {
          // Keys [lo, nn) of the chunk this row sees.
          const int64_t nn = std::min(n, limit(r) - c0), lo = std::max<int64_t>(0, first(r) - c0);
          if (nn <= lo) continue;
          __m256 sc[kKeys / 8];
          for (auto& x : sc) x = _mm256_setzero_ps();
          const float* qr = qs + r * D;
          for (int64_t i = 0; i < D; ++i) {
            const __m256 qi = _mm256_broadcast_ss(qr + i);
            const float* kti = kt + i * kKeys;
#pragma GCC unroll 8
            for (int t = 0; t < kKeys / 8; ++t) sc[t] = _mm256_fmadd_ps(qi, _mm256_load_ps(kti + 8 * t), sc[t]);
          }
          // Keys outside [lo, nn): -inf before the max, weight 0 after the exp.
          __m256 live[kKeys / 8];
          __m256 vmax = vset(-std::numeric_limits<float>::infinity());
          for (int t = 0; t < kKeys / 8; ++t) {
            const __m256i idx = _mm256_add_epi32(_mm256_set1_epi32(8 * t), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
            live[t] = _mm256_castsi256_ps(_mm256_andnot_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(int(lo)), idx),
                                                              _mm256_cmpgt_epi32(_mm256_set1_epi32(int(nn)), idx)));
            sc[t] = _mm256_blendv_ps(vset(-std::numeric_limits<float>::infinity()), sc[t], live[t]);
            vmax = _mm256_max_ps(vmax, sc[t]);
          }
          const float m_new = std::max(m[r], hmax(vmax));
          float* ar = acc + r * D;
          if (m_new > m[r] && l[r] > 0.0f) {
            const float corr = std::exp(m[r] - m_new);
            l[r] *= corr;
            Avx2Ops::scale(ar, corr, D);
          }
          m[r] = m_new;
          __m256 psum = _mm256_setzero_ps();
          for (int t = 0; t < kKeys / 8; ++t) {
            const __m256 e = _mm256_and_ps(exp_ps(_mm256_sub_ps(sc[t], vset(m_new))), live[t]);
            _mm256_store_ps(p + 8 * t, e);
            psum = _mm256_add_ps(psum, e);
          }
          l[r] += hsum(psum);
          // O += P V, 64 output dims at a time in registers.
          for (int64_t d0 = 0; d0 < D; d0 += 64) {
            __m256 o[8];
#pragma GCC unroll 8
            for (int i = 0; i < 8; ++i) o[i] = _mm256_loadu_ps(ar + d0 + 8 * i);
            for (int64_t c = lo; c < nn; ++c) {
              const __m256 pc = _mm256_broadcast_ss(p + c);
              const float* vr = vrow[c] + d0;
#pragma GCC unroll 8
              for (int i = 0; i < 8; ++i) o[i] = _mm256_fmadd_ps(pc, _mm256_loadu_ps(vr + 8 * i), o[i]);
            }
#pragma GCC unroll 8
            for (int i = 0; i < 8; ++i) _mm256_storeu_ps(ar + d0 + 8 * i, o[i]);
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

void paged_attention(const float* q, const float* k_cache, const float* v_cache,
                     int64_t block_size, int64_t hq, int64_t hkv, int64_t d, float scale,
                     bool causal, const AttentionSeq* seqs, int64_t num_seqs, float* out, int64_t window,
                     float softcap) {
  // Sequences with enough query rows that a transposed key chunk serves several (prompts,
  // prefill chunks) take the blocked path at head dims 64 / 128; decode rows and other head
  // dims the per-row loop (a decode row would pay the transposition of its whole context).
  // The two sets write disjoint rows of out. Soft-capped scores take the per-row loop.
  constexpr int32_t kBlockedRows = 4;
  std::vector<AttentionSeq> blocked, per_row;
  for (int64_t s = 0; s < num_seqs; ++s)
    ((d == 64 || d == 128) && softcap == 0.0f && seqs[s].q_len >= kBlockedRows ? blocked : per_row).push_back(seqs[s]);
  if (!blocked.empty()) {
    const int64_t nb = int64_t(blocked.size());
    if (avx512_enabled())
      avx512::attention_rows_f32(q, k_cache, v_cache, block_size, hq, hkv, d, scale, causal, blocked.data(), nb, out, window);
    else if (d == 64)
      attention_rows<64>(q, k_cache, v_cache, block_size, hq, hkv, scale, causal, blocked.data(), nb, out, window);
    else
      attention_rows<128>(q, k_cache, v_cache, block_size, hq, hkv, scale, causal, blocked.data(), nb, out, window);
  }
  if (!per_row.empty())
    paged_attention_impl<Avx2Ops, float>(q, k_cache, nullptr, v_cache, nullptr, block_size, hq, hkv, d, scale,
                                         causal, per_row.data(), int64_t(per_row.size()), out, window, softcap);
}

void paged_attention_int8(const float* q, const int8_t* k_codes, const float* k_scales,
                          const int8_t* v_codes, const float* v_scales, int64_t block_size, int64_t hq,
                          int64_t hkv, int64_t d, float scale, bool causal, const AttentionSeq* seqs,
                          int64_t num_seqs, float* out, int64_t window, float softcap) {
  paged_attention_impl<Avx2Ops, int8_t>(q, k_codes, k_scales, v_codes, v_scales, block_size, hq, hkv, d, scale,
                                        causal, seqs, num_seqs, out, window, softcap);
}

void paged_attention_fp8(const float* q, const Fp8Code* k_codes, const float* k_scales,
                         const Fp8Code* v_codes, const float* v_scales, int64_t block_size, int64_t hq,
                         int64_t hkv, int64_t d, float scale, bool causal, const AttentionSeq* seqs,
                         int64_t num_seqs, float* out, int64_t window, float softcap) {
  paged_attention_impl<Avx2Ops, Fp8Code>(q, k_codes, k_scales, v_codes, v_scales, block_size, hq, hkv, d, scale,
                                         causal, seqs, num_seqs, out, window, softcap);
}

}  // namespace kiln::cpu::avx2
