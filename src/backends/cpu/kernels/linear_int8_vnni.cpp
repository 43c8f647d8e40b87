// AVX-VNNI W8A8 microkernel (Alder Lake+, Zen 5): the AVX2 kernel's |x| / sign trick with
// one vpdpbusd (u8 × s8, four products summed into int32, no saturation) replacing
// maddubs + madd + add. Exact, like the others. Compiled with -mavx2 -mavxvnni and used
// only when the CPU has AVX-VNNI. Tested in tests/backends/cpu/linear_int8_test.cpp.
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
  for (int64_t kk = 0; kk < k4; ++kk) {
    const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(panel + kk * 64));
    const __m256i w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(panel + kk * 64 + 32));
#pragma GCC unroll 4
    for (int r = 0; r < M; ++r) {
      int32_t x4;
      std::memcpy(&x4, qx + r * ldx + 4 * kk, 4);
      const __m256i xb = _mm256_set1_epi32(x4);
      const __m256i ax = _mm256_abs_epi8(xb);
      acc[r][0] = _mm256_dpbusd_avx_epi32(acc[r][0], ax, _mm256_sign_epi8(w0, xb));
      acc[r][1] = _mm256_dpbusd_avx_epi32(acc[r][1], ax, _mm256_sign_epi8(w1, xb));
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

Int8Microkernel int8_microkernel_vnni() { return microkernel; }

}  // namespace kiln::cpu::avx2
