// AVX-512 VNNI W8A8 tiles: one vpdpbusd on zmm registers is 64 u8 x s8 products summed
// four at a time into 16 int32 lanes - four times the multiply-adds of an f32 FMA, and
// twice the AVX-VNNI kernel's ymm form. vpdpbusd multiplies unsigned by signed bytes, so
// the rows arrive biased (x + 128 as u8: int8_bias_rows) and each column's 128 * Σ_k w
// (PackedInt8Weight::bias128) comes off at the end: Σ (x + 128) w - 128 Σ w = Σ x w, exact
// in int32 like every other W8A8 kernel, so all of them give the same accumulators.
// Compiled with -mavx512f -mavx512bw -mavx512vnni -ffp-contract=off; called only where
// avx512_int8_supported().
// Tested in tests/backends/cpu/linear_int8_test.cpp.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "backends/cpu/kernels/isa.h"

namespace kiln::cpu::avx512 {
namespace {

// An M x 16P tile over P adjacent panels (panel_stride bytes apart): per group of four k,
// P weight loads and M broadcasts feed M * P vpdpbusd into M * P independent accumulators
// (12 at the default 6 x 32, enough to cover vpdpbusd's latency).
template <int M, int P>
void tile(const uint8_t* ux, int64_t ldx, const int8_t* panel, int64_t panel_stride, int64_t k4,
          const int32_t* bias128, int32_t* acc) {
  // The sums start from -128 Σw: a subtraction after the loop made GCC 12 copy every
  // accumulator twice per vpdpbusd (three uops where one does).
  __m512i a[P][M];
  for (int p = 0; p < P; ++p) {
    const __m512i b = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_loadu_si512(bias128 + p * 16));
    for (int r = 0; r < M; ++r) a[p][r] = b;
  }
  for (int64_t kk = 0; kk < k4; ++kk) {
    __m512i w[P];
#pragma GCC unroll 2
    for (int p = 0; p < P; ++p) w[p] = _mm512_load_si512(panel + p * panel_stride + kk * 64);
#pragma GCC unroll 8
    for (int r = 0; r < M; ++r) {
      int32_t x4;
      std::memcpy(&x4, ux + r * ldx + 4 * kk, 4);
      const __m512i xb = _mm512_set1_epi32(x4);
#pragma GCC unroll 2
      for (int p = 0; p < P; ++p) a[p][r] = _mm512_dpbusd_epi32(a[p][r], xb, w[p]);
    }
  }
  for (int p = 0; p < P; ++p)
    for (int r = 0; r < M; ++r) _mm512_storeu_si512(acc + (p * M + r) * 16, a[p][r]);
}

template <int P>
void tiles(int m, const uint8_t* ux, int64_t ldx, const int8_t* panel, int64_t panel_stride, int64_t k4,
           const int32_t* bias128, int32_t* acc) {
  with_tile_rows<kInt8TileRows>(m, [&](auto rows) {
    tile<decltype(rows)::value, P>(ux, ldx, panel, panel_stride, k4, bias128, acc);
  });
}

}  // namespace

void int8_dequantize(int m, const int32_t* acc, const float* xs, const float* scale, const float* bias, int64_t cols,
                     float* y, int64_t ldy) {
  const __mmask16 k = cols >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << cols) - 1);
  const __m512 s = _mm512_maskz_loadu_ps(k, scale);
  const __m512 b = bias ? _mm512_maskz_loadu_ps(k, bias) : _mm512_setzero_ps();
  for (int r = 0; r < m; ++r) {
    const __m512 v = _mm512_cvtepi32_ps(_mm512_loadu_si512(acc + r * 16));
    // A multiply, then an add (no FMA: the file is built with -ffp-contract=off).
    const __m512 prod = _mm512_mul_ps(v, _mm512_mul_ps(_mm512_set1_ps(xs[r]), s));
    _mm512_mask_storeu_ps(y + r * ldy, k, _mm512_add_ps(prod, b));
  }
}

void int8_tile(int m, int panels, const uint8_t* ux, int64_t ldx, const int8_t* panel, int64_t panel_stride,
               int64_t k4, const int32_t* bias128, int32_t* acc) {
  if (panels == 2) return tiles<2>(m, ux, ldx, panel, panel_stride, k4, bias128, acc);
  tiles<1>(m, ux, ldx, panel, panel_stride, k4, bias128, acc);
}

}  // namespace kiln::cpu::avx512
