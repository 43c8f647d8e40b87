// AVX2/FMA Ops for the paged-attention loop in attention_impl.h: 8-wide dot products
// over D (two accumulators), V accumulation by FMA, and the vector exp for the scores;
// int8 codes are widened, FP8 E4M3 codes decoded through F16C (see load_fp8).
// Tested in tests/backends/cpu/attention_test.cpp.
#include <immintrin.h>

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

}  // namespace

void paged_attention(const float* q, const float* k_cache, const float* v_cache,
                     int64_t block_size, int64_t hq, int64_t hkv, int64_t d, float scale,
                     bool causal, const AttentionSeq* seqs, int64_t num_seqs, float* out) {
  paged_attention_impl<Avx2Ops, float>(q, k_cache, nullptr, v_cache, nullptr, block_size, hq, hkv, d, scale,
                                       causal, seqs, num_seqs, out);
}

void paged_attention_int8(const float* q, const int8_t* k_codes, const float* k_scales,
                          const int8_t* v_codes, const float* v_scales, int64_t block_size, int64_t hq,
                          int64_t hkv, int64_t d, float scale, bool causal, const AttentionSeq* seqs,
                          int64_t num_seqs, float* out) {
  paged_attention_impl<Avx2Ops, int8_t>(q, k_codes, k_scales, v_codes, v_scales, block_size, hq, hkv, d, scale,
                                        causal, seqs, num_seqs, out);
}

void paged_attention_fp8(const float* q, const Fp8Code* k_codes, const float* k_scales,
                         const Fp8Code* v_codes, const float* v_scales, int64_t block_size, int64_t hq,
                         int64_t hkv, int64_t d, float scale, bool causal, const AttentionSeq* seqs,
                         int64_t num_seqs, float* out) {
  paged_attention_impl<Avx2Ops, Fp8Code>(q, k_codes, k_scales, v_codes, v_scales, block_size, hq, hkv, d, scale,
                                         causal, seqs, num_seqs, out);
}

}  // namespace kiln::cpu::avx2
