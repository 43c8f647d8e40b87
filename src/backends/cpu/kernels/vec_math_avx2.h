// Internal: 8-wide f32 exp/tanh/erfc for the AVX2 kernels (include only from *_avx2.cpp).
// Accuracy vs double-precision std:: is ~1e-7 relative (tests/backends/cpu/elementwise_test
// checks 2e-6 over wide ranges); large |x| saturates cleanly (0, ±1, inf), never NaN.
#pragma once

#include <immintrin.h>

namespace kiln::cpu::avx2 {
namespace {

inline __m256 vset(float v) { return _mm256_set1_ps(v); }

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline float hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// exp(hi + lo) for |lo| << |hi| allowed: Cody-Waite reduction by n·ln2 (ln2 split in a
// 9-bit head, so n·C1 and hi - n·C1 are exact), a degree-6 Cephes polynomial, and 2^n
// applied as two factors so results reach the subnormal range and overflow to inf.
inline __m256 exp_hilo(__m256 hi, __m256 lo) {
  hi = _mm256_min_ps(_mm256_max_ps(hi, vset(-104.0f)), vset(89.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(_mm256_add_ps(hi, lo), vset(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, vset(0.693359375f), hi);
  r = _mm256_fnmadd_ps(n, vset(-2.12194440e-4f), r);
  r = _mm256_add_ps(r, lo);
  __m256 p = vset(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, vset(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, vset(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, vset(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, vset(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, vset(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, vset(1.0f)));
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i n1 = _mm256_srai_epi32(ni, 1);
  const __m256i n2 = _mm256_sub_epi32(ni, n1);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, _mm256_set1_epi32(127)), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, _mm256_set1_epi32(127)), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}
inline __m256 exp_ps(__m256 x) { return exp_hilo(x, _mm256_setzero_ps()); }

inline __m256 abs_ps(__m256 x) { return _mm256_andnot_ps(vset(-0.0f), x); }

// tanh: odd Cephes polynomial for |x| < 0.625 (where 1 - 2/(e^2x+1) would cancel),
// the exp form above it.
inline __m256 tanh_ps(__m256 x) {
  const __m256 a = abs_ps(x);
  const __m256 z = _mm256_mul_ps(x, x);
  __m256 p = vset(-5.70498872745e-3f);
  p = _mm256_fmadd_ps(p, z, vset(2.06390887954e-2f));
  p = _mm256_fmadd_ps(p, z, vset(-5.37397155531e-2f));
  p = _mm256_fmadd_ps(p, z, vset(1.33314422036e-1f));
  p = _mm256_fmadd_ps(p, z, vset(-3.33332819422e-1f));
  const __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(p, z), x, x);
  const __m256 e = exp_ps(_mm256_add_ps(a, a));
  __m256 big = _mm256_sub_ps(vset(1.0f), _mm256_div_ps(vset(2.0f), _mm256_add_ps(e, vset(1.0f))));
  big = _mm256_or_ps(big, _mm256_and_ps(x, vset(-0.0f)));  // copysign
  return _mm256_blendv_ps(small, big, _mm256_cmp_ps(a, vset(0.625f), _CMP_GE_OQ));
}

// erfc(z) for z >= 0: Numerical Recipes' Chebyshev fit t·exp(-z² + P(t)), t = 1/(1+z/2),
// relative error < 1.2e-7 for all z. erfc's condition number is ~2z², so the caller passes
// z² as an exact hi + lo pair (from FMA) computed from its own input, not from a rounded z.
inline __m256 erfc_pos_ps(__m256 z, __m256 z2_hi, __m256 z2_lo) {
  const __m256 t = _mm256_div_ps(vset(1.0f), _mm256_fmadd_ps(z, vset(0.5f), vset(1.0f)));
  __m256 p = vset(0.17087277f);
  p = _mm256_fmadd_ps(p, t, vset(-0.82215223f));
  p = _mm256_fmadd_ps(p, t, vset(1.48851587f));
  p = _mm256_fmadd_ps(p, t, vset(-1.13520398f));
  p = _mm256_fmadd_ps(p, t, vset(0.27886807f));
  p = _mm256_fmadd_ps(p, t, vset(-0.18628806f));
  p = _mm256_fmadd_ps(p, t, vset(0.09678418f));
  p = _mm256_fmadd_ps(p, t, vset(0.37409196f));
  p = _mm256_fmadd_ps(p, t, vset(1.00002368f));
  p = _mm256_fmadd_ps(p, t, vset(-1.26551223f));
  const __m256 e = exp_hilo(_mm256_sub_ps(_mm256_setzero_ps(), z2_hi), _mm256_sub_ps(p, z2_lo));
  return _mm256_mul_ps(t, e);
}

}  // namespace
}  // namespace kiln::cpu::avx2
