// AVX-512 linear microkernel: an m × 16 tile (m <= 12) in m zmm accumulators, one per
// row: each k step loads one 16-wide panel row (bf16/f16 widened to f32 in registers)
// and issues m FMAs whose x operand is broadcast from memory. Twelve independent
// accumulators cover the FMA latency of two 512-bit FMA units; the broadcast loads cost
// ~1.1 loads per FMA, against the AVX2 kernel's 8-wide FMAs: about twice its FLOP/s where
// the core has two 512-bit FMA units. Uses the AVX2 kernel's panels as packed (bf16 rows
// keep their column swap, undone by the same in-lane unpacks). Compiled with
// -mavx512f -mavx512bw -mavx512vl -mfma -mf16c; called only where avx512_linear_enabled().
// Tested in tests/backends/cpu/linear_test.cpp.
#include <immintrin.h>

#include <cstdint>

#include "backends/cpu/kernels/isa.h"

namespace kiln::cpu::avx512 {
namespace {

struct F32 {
  using Elem = float;
  static __m512 load(const Elem* p) { return _mm512_load_ps(p); }
};
// bf16 is the top half of an f32: interleaving zeros below each value widens it; the
// in-lane unpacks give columns 0-7 / 8-15 because packing permuted them (panel_slot).
struct BF16 {
  using Elem = uint16_t;
  static __m512 load(const Elem* p) {
    const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(p));
    const __m256 lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(_mm256_setzero_si256(), v));
    const __m256 hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(_mm256_setzero_si256(), v));
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi), 1));
  }
};
struct F16 {
  using Elem = uint16_t;
  static __m512 load(const Elem* p) { return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(p))); }
};

template <typename S, int M>
void tile(const float* x, int64_t ldx, const typename S::Elem* panel, int64_t kc, float* y, int64_t ldy,
          const float* init, bool accumulate) {
  // Few rows: U independent accumulator sets over consecutive k cover the FMA latency.
  constexpr int U = M == 1 ? 4 : (M <= 3 ? 2 : 1);
  __m512 acc[U][M];
#pragma GCC unroll 12
  for (int r = 0; r < M; ++r) {
    acc[0][r] = accumulate ? _mm512_loadu_ps(y + r * ldy) : init ? _mm512_loadu_ps(init) : _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int u = 1; u < U; ++u) acc[u][r] = _mm512_setzero_ps();
  }
  int64_t kk = 0;
  for (; kk + U <= kc; kk += U) {
    // Few rows = a GEMV-like stream: prefetch ~2 KB ahead so DRAM latency stays hidden.
    if constexpr (M <= 2)
      _mm_prefetch(reinterpret_cast<const char*>(panel + (kk + 2048 / (16 * sizeof(typename S::Elem))) * 16),
                   _MM_HINT_T0);
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u) {
      const __m512 b = S::load(panel + (kk + u) * 16);
#pragma GCC unroll 12
      for (int r = 0; r < M; ++r) acc[u][r] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * ldx + kk + u]), b, acc[u][r]);
    }
  }
  for (; kk < kc; ++kk) {
    const __m512 b = S::load(panel + kk * 16);
#pragma GCC unroll 12
    for (int r = 0; r < M; ++r) acc[0][r] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * ldx + kk]), b, acc[0][r]);
  }
#pragma GCC unroll 12
  for (int r = 0; r < M; ++r) {
#pragma GCC unroll 4
    for (int u = 1; u < U; ++u) acc[0][r] = _mm512_add_ps(acc[0][r], acc[u][r]);
    _mm512_storeu_ps(y + r * ldy, acc[0][r]);
  }
}

template <typename S>
void microkernel(int m, const float* x, int64_t ldx, const void* panel_v, int64_t kc, float* y, int64_t ldy,
                 const float* init, bool accumulate) {
  const auto* panel = static_cast<const typename S::Elem*>(panel_v);
  with_tile_rows<12>(m, [&](auto rows) { tile<S, decltype(rows)::value>(x, ldx, panel, kc, y, ldy, init, accumulate); });
}

}  // namespace

LinearMicrokernel linear_microkernel(WeightStorage storage) {
  switch (storage) {
    case WeightStorage::kF32: return microkernel<F32>;
    case WeightStorage::kBF16: return microkernel<BF16>;
    case WeightStorage::kF16: return microkernel<F16>;
    default: return nullptr;  // quantized panels keep the AVX2 kernels
  }
}

}  // namespace kiln::cpu::avx512
