// Internal: 8-wide f32 helpers for the AVX2 kernels (include only from *_avx2.cpp): the
// horizontal sum/max and vec_math.h's exp/tanh/erfc at 8 lanes.
#pragma once

#include <immintrin.h>

#include "backends/cpu/kernels/vec_math.h"

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

// The 8-wide forms of vec_math.h's functions.
inline __m256 exp_hilo(__m256 hi, __m256 lo) { return vec::exp_hilo<vec::Y>(hi, lo); }
inline __m256 exp_ps(__m256 x) { return vec::exp<vec::Y>(x); }
inline __m256 abs_ps(__m256 x) { return vec::abs<vec::Y>(x); }
inline __m256 tanh_ps(__m256 x) { return vec::tanh<vec::Y>(x); }
inline __m256 erfc_pos_ps(__m256 z, __m256 z2_hi, __m256 z2_lo) { return vec::erfc_pos<vec::Y>(z, z2_hi, z2_lo); }

}  // namespace
}  // namespace kiln::cpu::avx2
