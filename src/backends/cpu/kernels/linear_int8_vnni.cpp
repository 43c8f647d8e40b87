// AVX-VNNI W8A8 tiles (Alder Lake+, client CPUs without AVX-512): the AVX-512 VNNI tiles'
// arithmetic (linear_int8_avx512.cpp) in ymm registers - x biased to unsigned bytes, each
// column's 128 * Σw the sums' starting value, one vpdpbusd per 32 products with no sign
// fix-ups - over one 16-column panel and up to 6 rows (12 accumulators, 2 weight rows and
// a broadcast: 15 of the 16 ymm registers). Exact, like every W8A8 kernel. Compiled with
// -mavx2 -mavxvnni and used only when the CPU has AVX-VNNI. Tested in
// tests/backends/cpu/linear_int8_test.cpp.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "backends/cpu/kernels/isa.h"

namespace kiln::cpu::avx2 {
namespace {

template <int M>
void tile(const uint8_t* ux, int64_t ldx, const int8_t* panel, int64_t k4, const int32_t* bias128, int32_t* acc) {
  // Starting from -128 Σw rather than subtracting it after the loop (see the AVX-512 tiles).
  const __m256i zero = _mm256_setzero_si256();
  const __m256i b0 = _mm256_sub_epi32(zero, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bias128)));
  const __m256i b1 = _mm256_sub_epi32(zero, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bias128 + 8)));
  __m256i a[M][2];
  for (int r = 0; r < M; ++r) a[r][0] = b0, a[r][1] = b1;
  for (int64_t kk = 0; kk < k4; ++kk) {
    const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(panel + kk * 64));
    const __m256i w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(panel + kk * 64 + 32));
#pragma GCC unroll 6
    for (int r = 0; r < M; ++r) {
      int32_t x4;
      std::memcpy(&x4, ux + r * ldx + 4 * kk, 4);
      const __m256i xb = _mm256_set1_epi32(x4);
      a[r][0] = _mm256_dpbusd_avx_epi32(a[r][0], xb, w0);
      a[r][1] = _mm256_dpbusd_avx_epi32(a[r][1], xb, w1);
    }
  }
  for (int r = 0; r < M; ++r) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc + r * 16), a[r][0]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc + r * 16 + 8), a[r][1]);
  }
}

}  // namespace

void int8_tile_vnni(int m, int, const uint8_t* ux, int64_t ldx, const int8_t* panel, int64_t, int64_t k4,
                    const int32_t* bias128, int32_t* acc) {
  with_tile_rows<kInt8VnniTileRows>(m, [&](auto rows) { tile<decltype(rows)::value>(ux, ldx, panel, k4, bias128, acc); });
}

}  // namespace kiln::cpu::avx2
