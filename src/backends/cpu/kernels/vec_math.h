// Internal: f32 exp/tanh/erfc/GELU/SiLU written once over a vector width - Y (ymm, 8 floats,
// AVX2/FMA) and, where the file is compiled for AVX-512F, Z (zmm, 16 floats) - so the AVX2
// and AVX-512 kernels run the same operations lane for lane (the same bits). Accuracy vs
// double-precision std:: is ~1e-7 relative (tests/backends/cpu/elementwise_test checks 2e-6
// over wide ranges); large |x| saturates cleanly (0, ±1, inf), never NaN. Include only from
// files compiled with -mavx2 -mfma (or AVX-512F).
#pragma once

#include <immintrin.h>

namespace kiln::cpu::vec {
namespace {

// The operations the math below needs, per width. sign_blend(a, b, s): b where s's sign bit
// is set, else a; ge_blend(a, b, x, t): b where x >= t (ordered), else a.
struct Y {
  using V = __m256;
  using I = __m256i;
  static V set(float v) { return _mm256_set1_ps(v); }
  static V zero() { return _mm256_setzero_ps(); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V div(V a, V b) { return _mm256_div_ps(a, b); }
  static V min(V a, V b) { return _mm256_min_ps(a, b); }
  static V max(V a, V b) { return _mm256_max_ps(a, b); }
  static V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V fnmadd(V a, V b, V c) { return _mm256_fnmadd_ps(a, b, c); }
  static V fmsub(V a, V b, V c) { return _mm256_fmsub_ps(a, b, c); }
  static V round(V a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static V andnot(V a, V b) { return _mm256_andnot_ps(a, b); }
  static V and_(V a, V b) { return _mm256_and_ps(a, b); }
  static V or_(V a, V b) { return _mm256_or_ps(a, b); }
  static V sign_blend(V a, V b, V s) { return _mm256_blendv_ps(a, b, s); }
  static V ge_blend(V a, V b, V x, V t) { return _mm256_blendv_ps(a, b, _mm256_cmp_ps(x, t, _CMP_GE_OQ)); }
  // 2^(n/2 rounded down) and 2^(the rest) for the integer-valued n.
  static void pow2_halves(V n, V& s1, V& s2) {
    const I ni = _mm256_cvtps_epi32(n), n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, _mm256_set1_epi32(127)), 23));
    s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, _mm256_set1_epi32(127)), 23));
  }
};

#ifdef __AVX512F__
struct Z {
  using V = __m512;
  using I = __m512i;
  static V set(float v) { return _mm512_set1_ps(v); }
  static V zero() { return _mm512_setzero_ps(); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V div(V a, V b) { return _mm512_div_ps(a, b); }
  static V min(V a, V b) { return _mm512_min_ps(a, b); }
  static V max(V a, V b) { return _mm512_max_ps(a, b); }
  static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V fnmadd(V a, V b, V c) { return _mm512_fnmadd_ps(a, b, c); }
  static V fmsub(V a, V b, V c) { return _mm512_fmsub_ps(a, b, c); }
  static V round(V a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static V bits(I i) { return _mm512_castsi512_ps(i); }
  static I ints(V v) { return _mm512_castps_si512(v); }
  static V andnot(V a, V b) { return bits(_mm512_andnot_si512(ints(a), ints(b))); }
  static V and_(V a, V b) { return bits(_mm512_and_si512(ints(a), ints(b))); }
  static V or_(V a, V b) { return bits(_mm512_or_si512(ints(a), ints(b))); }
  static V sign_blend(V a, V b, V s) {
    return _mm512_mask_blend_ps(_mm512_cmplt_epi32_mask(ints(s), _mm512_setzero_si512()), a, b);
  }
  static V ge_blend(V a, V b, V x, V t) { return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, t, _CMP_GE_OQ), a, b); }
  static void pow2_halves(V n, V& s1, V& s2) {
    const I ni = _mm512_cvtps_epi32(n), n1 = _mm512_srai_epi32(ni, 1), n2 = _mm512_sub_epi32(ni, n1);
    s1 = bits(_mm512_slli_epi32(_mm512_add_epi32(n1, _mm512_set1_epi32(127)), 23));
    s2 = bits(_mm512_slli_epi32(_mm512_add_epi32(n2, _mm512_set1_epi32(127)), 23));
  }
};
#endif

// exp(hi + lo) for |lo| << |hi| allowed: Cody-Waite reduction by n·ln2 (ln2 split in a
// 9-bit head, so n·C1 and hi - n·C1 are exact), a degree-6 Cephes polynomial, and 2^n
// applied as two factors so results reach the subnormal range and overflow to inf.
template <class S>
typename S::V exp_hilo(typename S::V hi, typename S::V lo) {
  using V = typename S::V;
  hi = S::min(S::max(hi, S::set(-104.0f)), S::set(89.0f));
  const V n = S::round(S::mul(S::add(hi, lo), S::set(1.44269504088896341f)));
  V r = S::fnmadd(n, S::set(0.693359375f), hi);
  r = S::fnmadd(n, S::set(-2.12194440e-4f), r);
  r = S::add(r, lo);
  V p = S::set(1.9875691500e-4f);
  p = S::fmadd(p, r, S::set(1.3981999507e-3f));
  p = S::fmadd(p, r, S::set(8.3334519073e-3f));
  p = S::fmadd(p, r, S::set(4.1665795894e-2f));
  p = S::fmadd(p, r, S::set(1.6666665459e-1f));
  p = S::fmadd(p, r, S::set(5.0000001201e-1f));
  p = S::fmadd(p, S::mul(r, r), S::add(r, S::set(1.0f)));
  V s1, s2;
  S::pow2_halves(n, s1, s2);
  return S::mul(S::mul(p, s1), s2);
}
template <class S>
typename S::V exp(typename S::V x) {
  return exp_hilo<S>(x, S::zero());
}
template <class S>
typename S::V abs(typename S::V x) {
  return S::andnot(S::set(-0.0f), x);
}

// tanh: odd Cephes polynomial for |x| < 0.625 (where 1 - 2/(e^2x+1) would cancel),
// the exp form above it.
template <class S>
typename S::V tanh(typename S::V x) {
  using V = typename S::V;
  const V a = abs<S>(x);
  const V z = S::mul(x, x);
  V p = S::set(-5.70498872745e-3f);
  p = S::fmadd(p, z, S::set(2.06390887954e-2f));
  p = S::fmadd(p, z, S::set(-5.37397155531e-2f));
  p = S::fmadd(p, z, S::set(1.33314422036e-1f));
  p = S::fmadd(p, z, S::set(-3.33332819422e-1f));
  const V small = S::fmadd(S::mul(p, z), x, x);
  const V e = exp<S>(S::add(a, a));
  V big = S::sub(S::set(1.0f), S::div(S::set(2.0f), S::add(e, S::set(1.0f))));
  big = S::or_(big, S::and_(x, S::set(-0.0f)));  // copysign
  return S::ge_blend(small, big, a, S::set(0.625f));
}

// erfc(z) for z >= 0: Numerical Recipes' Chebyshev fit t·exp(-z² + P(t)), t = 1/(1+z/2),
// relative error < 1.2e-7 for all z. erfc's condition number is ~2z², so the caller passes
// z² as an exact hi + lo pair (from FMA) computed from its own input, not from a rounded z.
template <class S>
typename S::V erfc_pos(typename S::V z, typename S::V z2_hi, typename S::V z2_lo) {
  using V = typename S::V;
  const V t = S::div(S::set(1.0f), S::fmadd(z, S::set(0.5f), S::set(1.0f)));
  V p = S::set(0.17087277f);
  p = S::fmadd(p, t, S::set(-0.82215223f));
  p = S::fmadd(p, t, S::set(1.48851587f));
  p = S::fmadd(p, t, S::set(-1.13520398f));
  p = S::fmadd(p, t, S::set(0.27886807f));
  p = S::fmadd(p, t, S::set(-0.18628806f));
  p = S::fmadd(p, t, S::set(0.09678418f));
  p = S::fmadd(p, t, S::set(0.37409196f));
  p = S::fmadd(p, t, S::set(1.00002368f));
  p = S::fmadd(p, t, S::set(-1.26551223f));
  const V e = exp_hilo<S>(S::sub(S::zero(), z2_hi), S::sub(p, z2_lo));
  return S::mul(t, e);
}

// gelu_erf(x) = 0.5x·erfc(-x/√2): written per sign so neither side cancels
// (x >= 0: x·(1 - erfc(z)/2); x < 0: x·erfc(z)/2, z = |x|/√2), with z² = x²/2 exact as
// hi + lo. |x| is capped at 18 (erfc(12.7) underflows f32) so x² cannot overflow.
template <class S>
typename S::V gelu_erf(typename S::V x) {
  using V = typename S::V;
  const V a = S::min(abs<S>(x), S::set(18.0f));
  const V a2 = S::mul(a, a);
  const V a2_lo = S::fmsub(a, a, a2);
  const V half = S::set(0.5f);
  const V h = S::mul(half, erfc_pos<S>(S::mul(a, S::set(0.70710678118654752f)), S::mul(a2, half), S::mul(a2_lo, half)));
  const V pos = S::sub(S::set(1.0f), h);
  return S::mul(x, S::sign_blend(pos, h, x));  // h where x's sign bit is set
}
// sigmoid(y) from e = exp(-|y|) (never overflows): 1/(1+e) for y >= 0, e/(1+e) below, so
// results stay accurate down to the f32 normal range instead of flushing via inf.
template <class S>
typename S::V sigmoid(typename S::V y) {
  using V = typename S::V;
  const V e = exp<S>(S::sub(S::zero(), abs<S>(y)));
  const V num = S::sign_blend(S::set(1.0f), e, y);  // e where y < 0
  return S::div(num, S::add(S::set(1.0f), e));
}
// 0.5x(1 + tanh(u)) = x·sigmoid(2u): the same value without cancellation for x << 0.
template <class S>
typename S::V gelu_tanh(typename S::V x) {
  using V = typename S::V;
  const V x2 = S::mul(x, x);
  const V u = S::mul(S::mul(S::set(0.7978845608028654f), x), S::fmadd(S::set(0.044715f), x2, S::set(1.0f)));
  return S::mul(x, sigmoid<S>(S::add(u, u)));
}
template <class S>
typename S::V silu(typename S::V x) {
  return S::mul(x, sigmoid<S>(x));
}

}  // namespace
}  // namespace kiln::cpu::vec
