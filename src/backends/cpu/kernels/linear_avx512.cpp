// AVX-512 linear microkernels: an m × 16 tile (m <= 12) in m zmm accumulators, one per
// row: each k step loads one 16-wide panel row (bf16/f16 widened to f32 in registers)
// and issues m FMAs whose x operand is broadcast from memory; and an m × 32 tile over two
// adjacent panels (tile2, below) for tiles of several rows. Twelve independent
// accumulators cover the FMA latency of two 512-bit FMA units; the broadcast loads cost
// ~1.1 loads per FMA, against the AVX2 kernel's 8-wide FMAs: about twice its FLOP/s where
// the core has two 512-bit FMA units. Uses the AVX2 kernel's panels as packed. Compiled with
// -mavx512f -mavx512bw -mavx512vl -mfma -mf16c; called only where avx512_enabled().
// Tested in tests/backends/cpu/linear_test.cpp (and the q8/q4 tiles in quant_linear_test.cpp).
#include <immintrin.h>

#include <cstdint>

#include "backends/cpu/kernels/isa.h"

namespace kiln::cpu::avx512 {
namespace {

// row(panel, kk): row kk of a panel as 16 f32 lanes in column order; pair(panel, kk, a, b):
// rows kk and kk + 1 (kk even), which bf16 panels store in one 64-byte line (PackedWeight).
struct F32 {
  using Elem = float;
  static __m512 row(const Elem* panel, int64_t kk) { return _mm512_load_ps(panel + kk * 16); }
  static void pair(const Elem* panel, int64_t kk, __m512& a, __m512& b) {
    a = row(panel, kk);
    b = row(panel, kk + 1);
  }
};
// bf16 is the top half of an f32: a row pair's 32-bit words hold row kk in their low and
// row kk + 1 in their high halves, so a shift widens the first and a mask the second - one
// load and two single-uop operations for 32 values, in column order (where widening 16
// values took a zero-extend on the shuffle port, which the second 512-bit FMA unit shares,
// and a shift).
struct BF16 {
  using Elem = uint16_t;
  static __m512 low(__m512i v) { return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)); }
  static __m512 high(__m512i v) {
    return _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(int(0xFFFF0000u))));
  }
  static __m512i line(const Elem* panel, int64_t kk) { return _mm512_loadu_si512(panel + (kk & ~int64_t(1)) * 16); }
  static __m512 row(const Elem* panel, int64_t kk) { return kk & 1 ? high(line(panel, kk)) : low(line(panel, kk)); }
  static void pair(const Elem* panel, int64_t kk, __m512& a, __m512& b) {
    const __m512i v = line(panel, kk);
    a = low(v);
    b = high(v);
  }
};
struct F16 {
  using Elem = uint16_t;
  static __m512 row(const Elem* panel, int64_t kk) {
    return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(panel + kk * 16)));
  }
  static void pair(const Elem* panel, int64_t kk, __m512& a, __m512& b) {
    a = row(panel, kk);
    b = row(panel, kk + 1);
  }
};

template <typename S, int M>
void tile(const float* x, int64_t ldx, const typename S::Elem* panel, int64_t kc, float* y, int64_t ldy,
          const float* init, bool accumulate) {
  // Few rows: U independent accumulator sets over consecutive k cover the FMA latency.
  // A step covers whole row pairs; row k goes to set k mod U in every case, so the sums
  // (and bits) are those of one row at a time.
  constexpr int U = M == 1 ? 8 : (M <= 3 ? 2 : 1);
  constexpr int kStep = U < 2 ? 2 : U;
  __m512 acc[U][M];
#pragma GCC unroll 12
  for (int r = 0; r < M; ++r) {
    acc[0][r] = accumulate ? _mm512_loadu_ps(y + r * ldy) : init ? _mm512_loadu_ps(init) : _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int u = 1; u < U; ++u) acc[u][r] = _mm512_setzero_ps();
  }
  int64_t kk = 0;
  for (; kk + kStep <= kc; kk += kStep) {
    if constexpr (M <= 2) prefetch_stream<kStep * 16 * sizeof(typename S::Elem)>(panel + kk * 16);
#pragma GCC unroll 4
    for (int u = 0; u < kStep; u += 2) {
      __m512 b0, b1;
      S::pair(panel, kk + u, b0, b1);
#pragma GCC unroll 12
      for (int r = 0; r < M; ++r)
        acc[u % U][r] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * ldx + kk + u]), b0, acc[u % U][r]);
#pragma GCC unroll 12
      for (int r = 0; r < M; ++r)
        acc[(u + 1) % U][r] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * ldx + kk + u + 1]), b1, acc[(u + 1) % U][r]);
    }
  }
  for (; kk < kc; ++kk) {
    const __m512 b = S::row(panel, kk);
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

// The two-panel form: an m × 32 tile over panels p and p + 1 in 2m accumulators. A k step
// loads one row of each panel and broadcasts each x value once for its two FMAs: (m + 2)
// loads per 2m FMAs (0.67 per FMA at m = 6, the default tile; 1.08 for the 12 x 16 tile
// above), which takes the load ports off the critical path of two 512-bit FMA units. At
// m = 12 the 24 accumulators + 2 panel rows + the broadcast still fit the 32 zmm
// registers, but measured slower than m = 6 (bench/RESULTS.md, session 14). Rows go by
// pairs (bf16's lines), each accumulator still taking k in order.
template <typename S, int M>
void tile2(const float* x, int64_t ldx, const typename S::Elem* p0, const typename S::Elem* p1, int64_t kc, float* y,
           int64_t ldy, const float* init, bool accumulate) {
  __m512 a0[M], a1[M];
#pragma GCC unroll 12
  for (int r = 0; r < M; ++r) {
    a0[r] = accumulate ? _mm512_loadu_ps(y + r * ldy) : init ? _mm512_loadu_ps(init) : _mm512_setzero_ps();
    a1[r] = accumulate ? _mm512_loadu_ps(y + r * ldy + 16) : init ? _mm512_loadu_ps(init + 16) : _mm512_setzero_ps();
  }
  auto step = [&](int64_t kk, __m512 b0, __m512 b1) {
#pragma GCC unroll 12
    for (int r = 0; r < M; ++r) {
      const __m512 xv = _mm512_set1_ps(x[r * ldx + kk]);
      a0[r] = _mm512_fmadd_ps(xv, b0, a0[r]);
      a1[r] = _mm512_fmadd_ps(xv, b1, a1[r]);
    }
  };
  int64_t kk = 0;
  for (; kk + 2 <= kc; kk += 2) {
    __m512 b00, b01, b10, b11;
    S::pair(p0, kk, b00, b01);
    S::pair(p1, kk, b10, b11);
    step(kk, b00, b10);
    step(kk + 1, b01, b11);
  }
  if (kk < kc) step(kk, S::row(p0, kk), S::row(p1, kk));
#pragma GCC unroll 12
  for (int r = 0; r < M; ++r) {
    _mm512_storeu_ps(y + r * ldy, a0[r]);
    _mm512_storeu_ps(y + r * ldy + 16, a1[r]);
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

// A 16-bit panel's rows as f32 in column order (isa.h's LinearWiden): the values the
// 16-bit tiles multiply.
template <typename S>
void widen(const void* panel_v, int64_t kc, float* dst) {
  const auto* panel = static_cast<const typename S::Elem*>(panel_v);
  int64_t kk = 0;
  for (; kk + 2 <= kc; kk += 2) {
    __m512 a, b;
    S::pair(panel, kk, a, b);
    _mm512_store_ps(dst + kk * 16, a);
    _mm512_store_ps(dst + kk * 16 + 16, b);
  }
  if (kk < kc) _mm512_store_ps(dst + kk * 16, S::row(panel, kk));
}

// Quantized panels (kQ8 / kQ4): the AVX2 kernel's arithmetic (linear_avx2.cpp's
// quant_tile) with one zmm a row instead of two ymm - each lane does exactly what its AVX2
// lane did (the same U chains over k, the same group fold, the same Σx order for q4's
// min), so both give the same bits; a k row's codes widen with one conversion per 16
// instead of two per 8. For the x rows the int8-activation GEMV does not take (the logits
// GEMM; KILN_CPU_QGEMV=f32; CPUs without AVX-512 VNNI + VBMI).
struct Q8 {
  static constexpr WeightStorage kStorage = WeightStorage::kQ8;
  static constexpr size_t kGroupBytes = quant_group_bytes(kStorage);
  static constexpr bool kHasMin = false;
  static __m512 load(const uint8_t* group, int64_t r) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(group + r * 16))));
  }
};
struct Q4 {
  static constexpr WeightStorage kStorage = WeightStorage::kQ4;
  static constexpr size_t kGroupBytes = quant_group_bytes(kStorage);
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
    // Every line of the group 16 ahead into L2 (one line 2 ahead into L1 left the q8 stream
    // at ~19 GB/s of ~27 on two cores of the dev VM: cpu_kernels_bench --gemv, KILN_CPU_QGEMV=f32).
#pragma GCC unroll 16
    for (size_t o = 0; o < Q::kGroupBytes; o += 64)
      _mm_prefetch(reinterpret_cast<const char*>(group + 16 * Q::kGroupBytes + o), _MM_HINT_T1);
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
    const __m512 s = quant_group_values<Q::kStorage>(group, false);
    [[maybe_unused]] const __m512 mins = Q::kHasMin ? quant_group_values<Q::kStorage>(group, true) : s;
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
        acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(_mm_cvtss_f32(h)), mins, acc[r]);
      }
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < M; ++r) _mm512_storeu_ps(y + r * ldy, acc[r]);
}

// A q8/q4 panel's kc rows (whole groups) as f32 rows in column order: scale x code (+ min),
// a multiply then an add as dequantize_row computes them (scale x code is exact: an f16
// scale times a power of two times a code of at most 8 bits), so the same values.
template <typename Q>
void widen_quant(const void* panel_v, int64_t kc, float* dst) {
  const auto* group = static_cast<const uint8_t*>(panel_v);
  for (int64_t g0 = 0; g0 < kc; g0 += kQuantGroup, group += Q::kGroupBytes) {
    const __m512 s = quant_group_values<Q::kStorage>(group, false);
    [[maybe_unused]] const __m512 m = Q::kHasMin ? quant_group_values<Q::kStorage>(group, true) : s;
#pragma GCC unroll 4
    for (int64_t r = 0; r < kQuantGroup; ++r) {
      __m512 v = _mm512_mul_ps(s, Q::load(group, r));
      if constexpr (Q::kHasMin) v = _mm512_add_ps(v, m);
      _mm512_store_ps(dst + (g0 + r) * 16, v);
    }
  }
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
  switch (storage) {
    case WeightStorage::kBF16: return widen<BF16>;
    case WeightStorage::kF16: return widen<F16>;
    case WeightStorage::kQ8: return widen_quant<Q8>;
    case WeightStorage::kQ4: return widen_quant<Q4>;
    default: return nullptr;
  }
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
