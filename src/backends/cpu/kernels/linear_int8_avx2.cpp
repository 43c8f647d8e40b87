// AVX2 W8A8 microkernel: an m × 16 int32 tile (m <= 4). Each step broadcasts 4 int8
// activations and multiplies them with 4 k of 8 outputs in one maddubs: maddubs needs an
// unsigned operand, so it takes |x| and moves x's sign onto the weights (sign_epi8);
// |x|·|w| <= 127·127 keeps each int16 pair sum below saturation, then madd(·, 1) widens
// to int32. Exact, so it matches the scalar kernel bit for bit. Compiled with -mavx2.
// Tested in tests/backends/cpu/linear_int8_test.cpp.
#include <cpuid.h>

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "backends/cpu/kernels/isa.h"

namespace kiln::cpu::avx2 {
namespace {

template <int M>
void tile(const int8_t* qx, int64_t ldx, const int8_t* panel, int64_t k4, int32_t* out) {
  __m256i acc[M][2];
  for (int r = 0; r < M; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t kk = 0; kk < k4; ++kk) {
    const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(panel + kk * 64));
    const __m256i w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(panel + kk * 64 + 32));
#pragma GCC unroll 4
    for (int r = 0; r < M; ++r) {
      int32_t x4;
      std::memcpy(&x4, qx + r * ldx + 4 * kk, 4);
      const __m256i xb = _mm256_set1_epi32(x4);
      const __m256i ax = _mm256_abs_epi8(xb);
      const __m256i p0 = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(w0, xb));
      const __m256i p1 = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(w1, xb));
      acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(p0, ones));
      acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(p1, ones));
    }
  }
  for (int r = 0; r < M; ++r) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * 16), acc[r][0]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * 16 + 8), acc[r][1]);
  }
}

void microkernel(int m, const int8_t* qx, int64_t ldx, const int8_t* panel, int64_t k4, int32_t* acc) {
  switch (m) {
    case 1: return tile<1>(qx, ldx, panel, k4, acc);
    case 2: return tile<2>(qx, ldx, panel, k4, acc);
    case 3: return tile<3>(qx, ldx, panel, k4, acc);
    default: return tile<4>(qx, ldx, panel, k4, acc);
  }
}

}  // namespace

Int8Microkernel int8_microkernel() { return microkernel; }

bool avx_vnni_supported() {
  // AVX-VNNI from CPUID leaf 7 subleaf 1 (EAX bit 4): clang 14's __builtin_cpu_supports
  // does not know "avxvnni". Callers reach here only on the AVX2 path (OS AVX state saved).
  static const bool yes = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 4)) != 0;
  }();
  return yes;
}

// Same arithmetic as the scalar path: x * inv, max(·, -127) (NaN -> -127), min(·, 127),
// round to nearest even (the default MXCSR mode).
void quantize_row_int8(const float* x, int64_t k, float inv_scale, int8_t* q) {
  const __m256 s = _mm256_set1_ps(inv_scale), lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  int64_t i = 0;
  for (; i + 32 <= k; i += 32) {
    __m256i v[4];
    for (int j = 0; j < 4; ++j) {
      __m256 f = _mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * j), s);
      f = _mm256_min_ps(_mm256_max_ps(f, lo), hi);
      v[j] = _mm256_cvtps_epi32(f);
    }
    // packs work within 128-bit lanes; the permute restores element order.
    const __m256i a = _mm256_packs_epi32(v[0], v[1]), b = _mm256_packs_epi32(v[2], v[3]);
    __m256i c = _mm256_packs_epi16(a, b);
    c = _mm256_permutevar8x32_epi32(c, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), c);
  }
  for (; i < k; ++i) {
    float v = x[i] * inv_scale;
    v = v > -127.0f ? v : -127.0f;
    v = v < 127.0f ? v : 127.0f;
    q[i] = int8_t(_mm_cvtss_si32(_mm_set_ss(v)));
  }
}

}  // namespace kiln::cpu::avx2
