// AVX-512 linear microkernels: an m × 16 tile (m <= 12) in m zmm accumulators, one per
// row: each k step loads one 16-wide panel row (bf16/f16 widened to f32 in registers)
// and issues m FMAs whose x operand is broadcast from memory; and an m × 32 tile over two
// adjacent panels (tile2, below) for tiles of several rows. Twelve independent
// accumulators cover the FMA latency of two 512-bit FMA units; the broadcast loads cost
// ~1.1 loads per FMA, against the AVX2 kernel's 8-wide FMAs: about twice its FLOP/s where
// the core has two 512-bit FMA units. Uses the AVX2 kernel's panels as packed (bf16 rows
// keep their column swap, undone once per tile: to_tile_order). Compiled with
// -mavx512f -mavx512bw -mavx512vl -mfma -mf16c; called only where avx512_enabled().
// Tested in tests/backends/cpu/linear_test.cpp (and the q8/q4 tiles in quant_linear_test.cpp).
#include <immintrin.h>

#include <cstdint>

#include "backends/cpu/kernels/isa.h"

namespace kiln::cpu::avx512 {
namespace {

// load(p): a panel row as 16 f32 lanes. kSlotOrder: the lanes hold the row in its
// stored (panel_slot) order, and the tile puts its accumulators into that order at the
// start and back into column order at the end (to_tile_order: the swap of columns 4-7
// and 8-11 is its own inverse), once per tile instead of once per k step.
struct F32 {
  using Elem = float;
  static constexpr bool kSlotOrder = false;
  static __m512 load(const Elem* p) { return _mm512_load_ps(p); }
};
// bf16 is the top half of an f32: zero-extend each value to 32 bits and shift it up (one
// shuffle uop and one shift, where unpacking in column order took three shuffles, on the
// port that the second 512-bit FMA unit shares).
struct BF16 {
  using Elem = uint16_t;
  static constexpr bool kSlotOrder = true;
  static __m512 load(const Elem* p) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
};
struct F16 {
  using Elem = uint16_t;
  static constexpr bool kSlotOrder = false;
  static __m512 load(const Elem* p) { return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(p))); }
};

// Column order <-> the bf16 panels' slot order (isa.h's panel_slot).
template <typename S>
__m512 to_tile_order(__m512 v) {
  if constexpr (!S::kSlotOrder) return v;
  const __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15);
  return _mm512_permutexvar_ps(idx, v);
}

template <typename S, int M>
void tile(const float* x, int64_t ldx, const typename S::Elem* panel, int64_t kc, float* y, int64_t ldy,
          const float* init, bool accumulate) {
  // Few rows: U independent accumulator sets over consecutive k cover the FMA latency.
  constexpr int U = M == 1 ? 4 : (M <= 3 ? 2 : 1);
  __m512 acc[U][M];
#pragma GCC unroll 12
  for (int r = 0; r < M; ++r) {
    acc[0][r] = to_tile_order<S>(accumulate ? _mm512_loadu_ps(y + r * ldy)
                                 : init     ? _mm512_loadu_ps(init)
                                            : _mm512_setzero_ps());
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
    _mm512_storeu_ps(y + r * ldy, to_tile_order<S>(acc[0][r]));
  }
}

// The two-panel form: an m × 32 tile over panels p and p + 1 in 2m accumulators. A k step
// loads one row of each panel and broadcasts each x value once for its two FMAs: (m + 2)
// loads per 2m FMAs (0.67 per FMA at m = 6, the default tile; 1.08 for the 12 x 16 tile
// above), which takes the load ports off the critical path of two 512-bit FMA units. At
// m = 12 the 24 accumulators + 2 panel rows + the broadcast still fit the 32 zmm
// registers, but measured slower than m = 6 (bench/RESULTS.md, session 14).
template <typename S, int M>
void tile2(const float* x, int64_t ldx, const typename S::Elem* p0, const typename S::Elem* p1, int64_t kc, float* y,
           int64_t ldy, const float* init, bool accumulate) {
  __m512 a0[M], a1[M];
#pragma GCC unroll 12
  for (int r = 0; r < M; ++r) {
    a0[r] = to_tile_order<S>(accumulate ? _mm512_loadu_ps(y + r * ldy)
                             : init     ? _mm512_loadu_ps(init)
                                        : _mm512_setzero_ps());
    a1[r] = to_tile_order<S>(accumulate ? _mm512_loadu_ps(y + r * ldy + 16)
                             : init     ? _mm512_loadu_ps(init + 16)
                                        : _mm512_setzero_ps());
  }
  for (int64_t kk = 0; kk < kc; ++kk) {
    const __m512 b0 = S::load(p0 + kk * 16), b1 = S::load(p1 + kk * 16);
#pragma GCC unroll 12
    for (int r = 0; r < M; ++r) {
      const __m512 xv = _mm512_set1_ps(x[r * ldx + kk]);
      a0[r] = _mm512_fmadd_ps(xv, b0, a0[r]);
      a1[r] = _mm512_fmadd_ps(xv, b1, a1[r]);
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < M; ++r) {
    _mm512_storeu_ps(y + r * ldy, to_tile_order<S>(a0[r]));
    _mm512_storeu_ps(y + r * ldy + 16, to_tile_order<S>(a1[r]));
  }
}

template <typename S>
void microkernel(int m, const float* x, int64_t ldx, const void* panel_v, int64_t kc, float* y, int64_t ldy,
                 const float* init, bool accumulate) {
  const auto* panel = static_cast<const typename S::Elem*>(panel_v);
  with_tile_rows<12>(m, [&](auto rows) { tile<S, decltype(rows)::value>(x, ldx, panel, kc, y, ldy, init, accumulate); });
}

template <typename S>
void microkernel2(int m, const float* x, int64_t ldx, const void* panel_v, int64_t panel_stride, int64_t kc,
                  float* y, int64_t ldy, const float* init, bool accumulate) {
  const auto* p0 = static_cast<const typename S::Elem*>(panel_v);
  const auto* p1 = reinterpret_cast<const typename S::Elem*>(static_cast<const uint8_t*>(panel_v) + panel_stride);
  with_tile_rows<12>(m, [&](auto rows) { tile2<S, decltype(rows)::value>(x, ldx, p0, p1, kc, y, ldy, init, accumulate); });
}

// A 16-bit panel's rows as f32 in column order (isa.h's LinearWiden): each row through
// S::load, so the values are those the 16-bit tiles multiply.
template <typename S>
void widen(const void* panel_v, int64_t kc, float* dst) {
  const auto* panel = static_cast<const typename S::Elem*>(panel_v);
  for (int64_t kk = 0; kk < kc; ++kk) _mm512_store_ps(dst + kk * 16, to_tile_order<S>(S::load(panel + kk * 16)));
}

// Quantized panels (kQ8 / kQ4): the AVX2 kernel's arithmetic (linear_avx2.cpp's
// quant_tile) with one zmm a row instead of two ymm - each lane does exactly what its AVX2
// lane did (the same U chains over k, the same group fold, the same Σx order for q4's
// min), so both give the same bits; a k row's codes widen with one conversion per 16
// instead of two per 8. For the x rows the int8-activation GEMV does not take (the logits
// GEMM; KILN_CPU_QGEMV=f32; CPUs without AVX-512 VNNI + VBMI).
struct Q8 {
  static constexpr size_t kCodeBytes = kQuantGroup * 16;
  static constexpr size_t kGroupBytes = kCodeBytes + 64;
  static constexpr bool kHasMin = false;
  static __m512 load(const uint8_t* group, int64_t r) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(group + r * 16))));
  }
};
struct Q4 {
  static constexpr size_t kCodeBytes = kQuantGroup * 8;
  static constexpr size_t kGroupBytes = kCodeBytes + 128;
  static constexpr bool kHasMin = true;
  // Byte j of a row: column j in the low nibble, j + 8 in the high one.
  static __m512 load(const uint8_t* group, int64_t r) {
    const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(group + r * 8));
    const __m128i mask = _mm_set1_epi8(15);
    const __m128i c = _mm_unpacklo_epi64(_mm_and_si128(v, mask), _mm_and_si128(_mm_srli_epi16(v, 4), mask));
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(c));
  }
};

template <typename Q, int M>
void quant_tile(const float* x, int64_t ldx, const uint8_t* group, int64_t kc, float* y, int64_t ldy,
                const float* init, bool accumulate) {
  constexpr int U = M == 1 ? 2 : 1;  // as the AVX2 kernel: the same chains, the same sums
  __m512 acc[M];
#pragma GCC unroll 12
  for (int r = 0; r < M; ++r)
    acc[r] = accumulate ? _mm512_loadu_ps(y + r * ldy) : init ? _mm512_loadu_ps(init) : _mm512_setzero_ps();
  for (int64_t g0 = 0; g0 < kc; g0 += kQuantGroup, group += Q::kGroupBytes) {
    _mm_prefetch(reinterpret_cast<const char*>(group + 2 * Q::kGroupBytes), _MM_HINT_T0);
    __m512 part[U][M];
#pragma GCC unroll 2
    for (int u = 0; u < U; ++u)
#pragma GCC unroll 12
      for (int r = 0; r < M; ++r) part[u][r] = _mm512_setzero_ps();
    for (int64_t kk = 0; kk < kQuantGroup; kk += U) {
#pragma GCC unroll 2
      for (int u = 0; u < U; ++u) {
        const __m512 b = Q::load(group, kk + u);
#pragma GCC unroll 12
        for (int r = 0; r < M; ++r)
          part[u][r] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * ldx + g0 + kk + u]), b, part[u][r]);
      }
    }
    const float* scale = reinterpret_cast<const float*>(group + Q::kCodeBytes);
    const __m512 s = _mm512_loadu_ps(scale);
#pragma GCC unroll 12
    for (int r = 0; r < M; ++r) {
#pragma GCC unroll 2
      for (int u = 1; u < U; ++u) part[0][r] = _mm512_add_ps(part[0][r], part[u][r]);
      acc[r] = _mm512_fmadd_ps(part[0][r], s, acc[r]);
      if constexpr (Q::kHasMin) {
        // Σx of the group in the AVX2 kernel's order.
        const float* xr = x + r * ldx + g0;
        const __m256 xs = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(xr), _mm256_loadu_ps(xr + 8)),
                                        _mm256_add_ps(_mm256_loadu_ps(xr + 16), _mm256_loadu_ps(xr + 24)));
        __m128 h = _mm_add_ps(_mm256_castps256_ps128(xs), _mm256_extractf128_ps(xs, 1));
        h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        h = _mm_add_ss(h, _mm_movehdup_ps(h));
        acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(_mm_cvtss_f32(h)), _mm512_loadu_ps(scale + 16), acc[r]);
      }
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < M; ++r) _mm512_storeu_ps(y + r * ldy, acc[r]);
}

template <typename Q>
void quant_microkernel(int m, const float* x, int64_t ldx, const void* panel_v, int64_t kc, float* y, int64_t ldy,
                       const float* init, bool accumulate) {
  const auto* group = static_cast<const uint8_t*>(panel_v);
  with_tile_rows<12>(m, [&](auto rows) { quant_tile<Q, decltype(rows)::value>(x, ldx, group, kc, y, ldy, init, accumulate); });
}

}  // namespace

LinearMicrokernel linear_microkernel(WeightStorage storage) {
  switch (storage) {
    case WeightStorage::kF32: return microkernel<F32>;
    case WeightStorage::kBF16: return microkernel<BF16>;
    case WeightStorage::kF16: return microkernel<F16>;
    case WeightStorage::kQ8: return quant_microkernel<Q8>;
    case WeightStorage::kQ4: return quant_microkernel<Q4>;
  }
  return nullptr;
}

LinearWiden linear_widen(WeightStorage storage) {
  if (storage == WeightStorage::kBF16) return widen<BF16>;
  if (storage == WeightStorage::kF16) return widen<F16>;
  return nullptr;
}

LinearMicrokernel2 linear_microkernel2(WeightStorage storage) {
  switch (storage) {
    case WeightStorage::kF32: return microkernel2<F32>;
    case WeightStorage::kBF16: return microkernel2<BF16>;
    case WeightStorage::kF16: return microkernel2<F16>;
    default: return nullptr;
  }
}

}  // namespace kiln::cpu::avx512
