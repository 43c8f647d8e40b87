// AVX2/FMA linear microkernel: an m × 16 tile (m <= 6) held in 2m ymm accumulators;
// each k step loads one 16-wide panel row (bf16/f16 widened to f32 in registers, so
// half-size storage halves the bytes streamed), broadcasts m x values and issues 2m FMAs.
// Compiled with -mavx2 -mfma -mf16c. Tested in tests/backends/cpu/linear_test.cpp.
#include <immintrin.h>

#include <cstdint>

#include "backends/cpu/kernels/isa.h"

namespace kiln::cpu::avx2 {
namespace {

struct F32 {
  using Elem = float;
  static void load(const Elem* p, __m256& lo, __m256& hi) {
    lo = _mm256_load_ps(p);
    hi = _mm256_load_ps(p + 8);
  }
};
// bf16 is the top half of an f32: interleaving zeros below each value widens it. The
// in-lane unpacks give columns 0-7 / 8-15 because packing permuted them (panel_slot).
struct BF16 {
  using Elem = uint16_t;
  static void load(const Elem* p, __m256& lo, __m256& hi) {
    const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(p));
    lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(_mm256_setzero_si256(), v));
    hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(_mm256_setzero_si256(), v));
  }
};
struct F16 {
  using Elem = uint16_t;
  static void load(const Elem* p, __m256& lo, __m256& hi) {
    lo = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(p)));
    hi = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(p + 8)));
  }
};

// With few rows the 2m accumulator chains cannot hide the FMA latency (4 cycles, 2 per
// cycle), so small m keeps U independent accumulator sets over consecutive k.
template <typename S, int M>
constexpr int64_t kPrefetchRowsFor = 2048 / (16 * sizeof(typename S::Elem));

template <typename S, int M>
void tile(const float* x, int64_t ldx, const typename S::Elem* panel, int64_t kc, float* y,
          int64_t ldy, const float* init, bool accumulate) {
  constexpr int U = M == 1 ? 4 : (M == 2 ? 2 : 1);
  constexpr int64_t kPrefetchRows = kPrefetchRowsFor<S, M>;
  __m256 acc[U][M][2];
#pragma GCC unroll 8
  for (int r = 0; r < M; ++r) {
    if (accumulate) {
      acc[0][r][0] = _mm256_loadu_ps(y + r * ldy);
      acc[0][r][1] = _mm256_loadu_ps(y + r * ldy + 8);
    } else if (init) {
      acc[0][r][0] = _mm256_loadu_ps(init);
      acc[0][r][1] = _mm256_loadu_ps(init + 8);
    } else {
      acc[0][r][0] = acc[0][r][1] = _mm256_setzero_ps();
    }
#pragma GCC unroll 8
    for (int u = 1; u < U; ++u) acc[u][r][0] = acc[u][r][1] = _mm256_setzero_ps();
  }
  int64_t kk = 0;
  for (; kk + U <= kc; kk += U) {
    // Few rows = a GEMV-like stream: prefetch ~2 KB ahead so DRAM latency stays hidden.
    if constexpr (M <= 2) _mm_prefetch(reinterpret_cast<const char*>(panel + (kk + kPrefetchRows) * 16), _MM_HINT_T0);
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) {
      __m256 b0, b1;
      S::load(panel + (kk + u) * 16, b0, b1);
#pragma GCC unroll 8
      for (int r = 0; r < M; ++r) {
        const __m256 a = _mm256_broadcast_ss(x + r * ldx + kk + u);
        acc[u][r][0] = _mm256_fmadd_ps(a, b0, acc[u][r][0]);
        acc[u][r][1] = _mm256_fmadd_ps(a, b1, acc[u][r][1]);
      }
    }
  }
  for (; kk < kc; ++kk) {
    __m256 b0, b1;
    S::load(panel + kk * 16, b0, b1);
#pragma GCC unroll 8
    for (int r = 0; r < M; ++r) {
      const __m256 a = _mm256_broadcast_ss(x + r * ldx + kk);
      acc[0][r][0] = _mm256_fmadd_ps(a, b0, acc[0][r][0]);
      acc[0][r][1] = _mm256_fmadd_ps(a, b1, acc[0][r][1]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < M; ++r) {
#pragma GCC unroll 8
    for (int u = 1; u < U; ++u) {
      acc[0][r][0] = _mm256_add_ps(acc[0][r][0], acc[u][r][0]);
      acc[0][r][1] = _mm256_add_ps(acc[0][r][1], acc[u][r][1]);
    }
    _mm256_storeu_ps(y + r * ldy, acc[0][r][0]);
    _mm256_storeu_ps(y + r * ldy + 8, acc[0][r][1]);
  }
}

template <typename S>
void microkernel(int m, const float* x, int64_t ldx, const void* panel_v, int64_t kc, float* y,
                 int64_t ldy, const float* init, bool accumulate) {
  const auto* panel = static_cast<const typename S::Elem*>(panel_v);
  switch (m) {
    case 1: return tile<S, 1>(x, ldx, panel, kc, y, ldy, init, accumulate);
    case 2: return tile<S, 2>(x, ldx, panel, kc, y, ldy, init, accumulate);
    case 3: return tile<S, 3>(x, ldx, panel, kc, y, ldy, init, accumulate);
    case 4: return tile<S, 4>(x, ldx, panel, kc, y, ldy, init, accumulate);
    case 5: return tile<S, 5>(x, ldx, panel, kc, y, ldy, init, accumulate);
    default: return tile<S, 6>(x, ldx, panel, kc, y, ldy, init, accumulate);
  }
}

}  // namespace

LinearMicrokernel linear_microkernel(WeightStorage storage) {
  switch (storage) {
    case WeightStorage::kF32: return microkernel<F32>;
    case WeightStorage::kBF16: return microkernel<BF16>;
    case WeightStorage::kF16: return microkernel<F16>;
  }
  return nullptr;
}

}  // namespace kiln::cpu::avx2
