// AVX2/FMA linear microkernel: an m × 16 tile (m <= 6) held in 2m ymm accumulators;
// each k step loads one 16-wide panel row (bf16/f16 widened to f32 in registers, so
// half-size storage halves the bytes streamed), broadcasts m x values and issues 2m FMAs.
// Compiled with -mavx2 -mfma -mf16c. Tested in tests/backends/cpu/linear_test.cpp.
#include <immintrin.h>

#include <cstdint>

#include "backends/cpu/kernels/isa.h"

namespace kiln::cpu::avx2 {
namespace {

// load(panel, kk, lo, hi): row kk of a panel as columns 0-7 and 8-15 in f32.
struct F32 {
  using Elem = float;
  static void load(const Elem* panel, int64_t kk, __m256& lo, __m256& hi) {
    lo = _mm256_load_ps(panel + kk * 16);
    hi = _mm256_load_ps(panel + kk * 16 + 8);
  }
};
// bf16 is the top half of an f32, and bf16 panels store rows in pairs (PackedWeight): a
// pair's 32-bit words hold the even row in their low halves, widened by a shift, and the
// odd row in their high halves, widened by a mask (one uop with its load).
struct BF16 {
  using Elem = uint16_t;
  static void load(const Elem* panel, int64_t kk, __m256& lo, __m256& hi) {
    const auto* p = reinterpret_cast<const __m256i*>(panel + (kk & ~int64_t(1)) * 16);
    const __m256i v0 = _mm256_load_si256(p), v1 = _mm256_load_si256(p + 1);
    if (kk & 1) {
      const __m256i mask = _mm256_set1_epi32(int(0xFFFF0000u));
      lo = _mm256_castsi256_ps(_mm256_and_si256(v0, mask));
      hi = _mm256_castsi256_ps(_mm256_and_si256(v1, mask));
    } else {
      lo = _mm256_castsi256_ps(_mm256_slli_epi32(v0, 16));
      hi = _mm256_castsi256_ps(_mm256_slli_epi32(v1, 16));
    }
  }
};
struct F16 {
  using Elem = uint16_t;
  static void load(const Elem* panel, int64_t kk, __m256& lo, __m256& hi) {
    lo = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(panel + kk * 16)));
    hi = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(panel + kk * 16 + 8)));
  }
};

// With few rows the 2m accumulator chains cannot hide the FMA latency (4 cycles, 2 per
// cycle), so small m keeps U independent accumulator sets over consecutive k.
template <typename S, int M>
void tile(const float* x, int64_t ldx, const typename S::Elem* panel, int64_t kc, float* y,
          int64_t ldy, const float* init, bool accumulate) {
  constexpr int U = M == 1 ? 4 : (M == 2 ? 2 : 1);
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
    if constexpr (M <= 2) prefetch_stream<U * 16 * sizeof(typename S::Elem)>(panel + kk * 16);
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) {
      __m256 b0, b1;
      S::load(panel, kk + u, b0, b1);
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
    S::load(panel, kk, b0, b1);
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

// A 16-bit panel's rows as f32 in column order (isa.h's LinearWiden), through S::load.
template <typename S>
void widen(const void* panel_v, int64_t kc, float* dst) {
  const auto* panel = static_cast<const typename S::Elem*>(panel_v);
  for (int64_t kk = 0; kk < kc; ++kk) {
    __m256 lo, hi;
    S::load(panel, kk, lo, hi);
    _mm256_store_ps(dst + kk * 16, lo);
    _mm256_store_ps(dst + kk * 16 + 8, hi);
  }
}

// Quantized panels (kQ8 / kQ4): codes widen to f32 in registers; each group of
// kQuantGroup rows is summed unscaled, then folded into the tile with one FMA by the
// group's 16 scales (q4 also adds min * sum(x) of the group), so the per-weight cost
// is a widen + convert + FMA.
// 8 of a group's f32 scales (or q4 mins), columns c0..c0+7: f16 x 2^e, the product pack
// time would form (exact).
template <WeightStorage kS>
__m256 group_values(const uint8_t* group, bool min, int c0) {
  const __m256i e = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(group + quant_exps_at(kS) + c0)));
  const __m256 f = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23));
  const size_t at = (min ? quant_mins_at(kS) : quant_scales_at(kS)) + 2 * size_t(c0);
  return _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(group + at))), f);
}

struct Q8 {
  static constexpr WeightStorage kStorage = WeightStorage::kQ8;
  static constexpr size_t kGroupBytes = quant_group_bytes(kStorage);  // codes, f16 scales, exponents
  static constexpr bool kHasMin = false;
  static void load(const uint8_t* row, __m256& lo, __m256& hi) {
    const __m128i v = _mm_load_si128(reinterpret_cast<const __m128i*>(row));
    lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
    hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(v, v)));
  }
  static const uint8_t* row(const uint8_t* group, int64_t r) { return group + r * 16; }
};
struct Q4 {
  static constexpr WeightStorage kStorage = WeightStorage::kQ4;
  static constexpr size_t kGroupBytes = quant_group_bytes(kStorage);  // codes, f16 scales and mins, exponents
  static constexpr bool kHasMin = true;
  static void load(const uint8_t* row, __m256& lo, __m256& hi) {
    const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row));
    const __m128i mask = _mm_set1_epi8(15);
    lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_and_si128(v, mask)));
    hi = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(v, 4), mask)));
  }
  static const uint8_t* row(const uint8_t* group, int64_t r) { return group + r * 8; }
};

// A q8/q4 panel's kc rows (whole groups) as f32 rows in column order, the values
// dequantize_row gives (LinearTactic::widen_quant; avx512's widen_quant in ymm halves).
template <typename Q>
void widen_quant(const void* panel_v, int64_t kc, float* dst) {
  const auto* group = static_cast<const uint8_t*>(panel_v);
  for (int64_t g0 = 0; g0 < kc; g0 += kQuantGroup, group += Q::kGroupBytes) {
    const __m256 s0 = group_values<Q::kStorage>(group, false, 0), s1 = group_values<Q::kStorage>(group, false, 8);
    [[maybe_unused]] __m256 m0 = s0, m1 = s1;
    if constexpr (Q::kHasMin) {
      m0 = group_values<Q::kStorage>(group, true, 0);
      m1 = group_values<Q::kStorage>(group, true, 8);
    }
    for (int64_t r = 0; r < kQuantGroup; ++r) {
      __m256 lo, hi;
      Q::load(Q::row(group, r), lo, hi);
      lo = _mm256_mul_ps(s0, lo);
      hi = _mm256_mul_ps(s1, hi);
      if constexpr (Q::kHasMin) {
        lo = _mm256_add_ps(lo, m0);
        hi = _mm256_add_ps(hi, m1);
      }
      _mm256_store_ps(dst + (g0 + r) * 16, lo);
      _mm256_store_ps(dst + (g0 + r) * 16 + 8, hi);
    }
  }
}

template <typename Q, int M>
void quant_tile(const float* x, int64_t ldx, const uint8_t* group, int64_t kc, float* y,
                int64_t ldy, const float* init, bool accumulate) {
  constexpr int U = M == 1 ? 2 : 1;  // independent chains to cover FMA latency at m = 1
  __m256 acc[M][2];
#pragma GCC unroll 8
  for (int r = 0; r < M; ++r) {
    if (accumulate) {
      acc[r][0] = _mm256_loadu_ps(y + r * ldy);
      acc[r][1] = _mm256_loadu_ps(y + r * ldy + 8);
    } else if (init) {
      acc[r][0] = _mm256_loadu_ps(init);
      acc[r][1] = _mm256_loadu_ps(init + 8);
    } else {
      acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    }
  }
  for (int64_t g0 = 0; g0 < kc; g0 += kQuantGroup, group += Q::kGroupBytes) {
    // Every line of the group 16 ahead into L2 (one line 2 ahead into L1 left the q8 stream
    // at ~19 GB/s of ~27 on two cores of the dev VM: cpu_kernels_bench --gemv, KILN_CPU_QGEMV=f32).
#pragma GCC unroll 16
    for (size_t o = 0; o < Q::kGroupBytes; o += 64)
      _mm_prefetch(reinterpret_cast<const char*>(group + 16 * Q::kGroupBytes + o), _MM_HINT_T1);
    __m256 part[U][M][2];
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u)
#pragma GCC unroll 8
      for (int r = 0; r < M; ++r) part[u][r][0] = part[u][r][1] = _mm256_setzero_ps();
    for (int64_t kk = 0; kk < kQuantGroup; kk += U) {
#pragma GCC unroll 8
      for (int u = 0; u < U; ++u) {
        __m256 b0, b1;
        Q::load(Q::row(group, kk + u), b0, b1);
#pragma GCC unroll 8
        for (int r = 0; r < M; ++r) {
          const __m256 a = _mm256_broadcast_ss(x + r * ldx + g0 + kk + u);
          part[u][r][0] = _mm256_fmadd_ps(a, b0, part[u][r][0]);
          part[u][r][1] = _mm256_fmadd_ps(a, b1, part[u][r][1]);
        }
      }
    }
    const __m256 s0 = group_values<Q::kStorage>(group, false, 0), s1 = group_values<Q::kStorage>(group, false, 8);
    [[maybe_unused]] __m256 m0 = s0, m1 = s1;
    if constexpr (Q::kHasMin) {
      m0 = group_values<Q::kStorage>(group, true, 0);
      m1 = group_values<Q::kStorage>(group, true, 8);
    }
#pragma GCC unroll 8
    for (int r = 0; r < M; ++r) {
#pragma GCC unroll 8
      for (int u = 1; u < U; ++u) {
        part[0][r][0] = _mm256_add_ps(part[0][r][0], part[u][r][0]);
        part[0][r][1] = _mm256_add_ps(part[0][r][1], part[u][r][1]);
      }
      acc[r][0] = _mm256_fmadd_ps(part[0][r][0], s0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(part[0][r][1], s1, acc[r][1]);
      if constexpr (Q::kHasMin) {
        const float* xr = x + r * ldx + g0;
        __m256 xs = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(xr), _mm256_loadu_ps(xr + 8)),
                                  _mm256_add_ps(_mm256_loadu_ps(xr + 16), _mm256_loadu_ps(xr + 24)));
        __m128 h = _mm_add_ps(_mm256_castps256_ps128(xs), _mm256_extractf128_ps(xs, 1));
        h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        h = _mm_add_ss(h, _mm_movehdup_ps(h));
        const __m256 xsum = _mm256_broadcastss_ps(h);
        acc[r][0] = _mm256_fmadd_ps(xsum, m0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(xsum, m1, acc[r][1]);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < M; ++r) {
    _mm256_storeu_ps(y + r * ldy, acc[r][0]);
    _mm256_storeu_ps(y + r * ldy + 8, acc[r][1]);
  }
}

template <typename Q>
void quant_microkernel(int m, const float* x, int64_t ldx, const void* panel_v, int64_t kc,
                       float* y, int64_t ldy, const float* init, bool accumulate) {
  const auto* group = static_cast<const uint8_t*>(panel_v);
  with_tile_rows<6>(m, [&](auto rows) { quant_tile<Q, decltype(rows)::value>(x, ldx, group, kc, y, ldy, init, accumulate); });
}

template <typename S>
void microkernel(int m, const float* x, int64_t ldx, const void* panel_v, int64_t kc, float* y,
                 int64_t ldy, const float* init, bool accumulate) {
  const auto* panel = static_cast<const typename S::Elem*>(panel_v);
  with_tile_rows<6>(m, [&](auto rows) { tile<S, decltype(rows)::value>(x, ldx, panel, kc, y, ldy, init, accumulate); });
}

}  // namespace

LinearWiden linear_widen(WeightStorage storage) {
  switch (storage) {
    case WeightStorage::kBF16: return widen<BF16>;
    case WeightStorage::kF16: return widen<F16>;
    case WeightStorage::kQ8: return widen_quant<Q8>;
    case WeightStorage::kQ4: return widen_quant<Q4>;
    default: return nullptr;
  }
}

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

}  // namespace kiln::cpu::avx2
