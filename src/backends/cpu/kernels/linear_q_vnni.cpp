// Weight-only q8/q4 GEMV/GEMM rows on AVX-512 VNNI + VBMI, against activations rounded to
// int8 per group of 32 (quantize_rows_groups: d = max|x| / 127, xq = rint(x / d)), the
// CUDA backend's dp4a GEMV and llama.cpp's Q4 x Q8 dot products do the same - by default
// (KILN_CPU_QGEMV=int16) with a second int8 digit for the residual, x ~ d (xq + xlo / 254):
// one int8 digit leaves each value off by up to d / 2, which a group holding one of
// SmolLM2's outlier activations turns into a coarse grid for the other 31 (q4 perplexity
// +6.2% vs f32 with one digit, +4.0% with two; bench/RESULTS.md). The second digit is a
// second vpdpbusd per code block (the weights' operand is shared) and one FMA per group
// and row: D = Σ q xq + Σ q xlo / 254, exact integer sums each. Why: the f32
// kernels widen and convert every code (about 11 instructions per 16 q4 weights), which
// bounds them at ~25 G weights/s on two cores of the dev VM, half its read bandwidth
// (cpu_kernels_bench --gemv). Here one vpdpbusd multiplies 64 codes by 4 x codes each.
// linear() runs every row count of a q8/q4 Linear through here, in blocks of up to
// kQGemvInt8RowBlock rows a call: each row's arithmetic is the same in any block (the
// integer sums are exact, the f32 steps per row fixed), so a row's output never depends on
// the rows batched with it.
// The panels keep their layout (kernels.h): a 4-row block of a group - 4 k values x 16
// columns, 32 bytes of nibbles (q4) or 64 bytes (q8) - is one load; its codes are split
// into nibbles (q4) and one vpermb gathers each column's 4 codes into its dword. q4 codes
// (0..15) are the unsigned operand against the signed x codes; q8's signed codes take x +
// 128 as the unsigned operand (linear() stores q8's x codes biased) and the group's Σ codes
// (a vpdpbusd against ones) removes the 128 again. The group's exact integer sums, converted to f32 (|sum| < 2^24),
// are folded into the tile as the f32 kernels fold theirs: acc += float(sum) * (scale[c] *
// dx) (+ min[c] * Σx for q4, the f32 sum of the group's x), scale and min the f32 values
// f16 x 2^e of the panel's group (kernels.h). Compiled with
// -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mavx512vbmi; called only after a CPUID
// check (isa.cpp: avx512_qgemv_int8_supported). Tested in tests/backends/cpu/quant_linear_test.cpp
// against a scalar evaluation of the same rounding, and row by row across row counts.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "backends/cpu/kernels/isa.h"

namespace kiln::cpu::avx512 {
namespace {

// vpermb indices: output byte 4c + r (column c, row r of the block) from the loaded block.
// q4: the low nibbles of bytes 0-31 (row r at 8r + j: column j) then the high nibbles
// (column j + 8) as bytes 32-63; q8: row r at 16r + c.
struct Perm {
  alignas(64) uint8_t q4[64], q8[64];
  Perm() {
    for (int c = 0; c < 16; ++c)
      for (int r = 0; r < 4; ++r) {
        q4[4 * c + r] = uint8_t(c < 8 ? 8 * r + c : 32 + 8 * r + (c - 8));
        q8[4 * c + r] = uint8_t(16 * r + c);
      }
  }
};
const Perm kPerm;

constexpr size_t kQPrefetchGroups = 16;

template <bool kQ4, bool kTwo, int M>
void qgemv_rows(const int8_t* qx, const int8_t* qlo, const float* dx, const float* sx, int64_t ldq, int64_t ldg,
                const uint8_t* group, int64_t groups, float* y, int64_t ldy, const float* init, bool accumulate) {
  constexpr WeightStorage kS = kQ4 ? WeightStorage::kQ4 : WeightStorage::kQ8;
  constexpr size_t kGroupBytes = quant_group_bytes(kS);
  // U independent sums a row (blocks b, b + U, ...): with fewer than ~8 chains of dependent
  // vpdpbusd (5 cycles each) in flight the latency, not the port, bounds the kernel. Two
  // digits a value (kTwo) give each row two chains of their own.
  constexpr int U = M == 1 ? (kTwo ? 2 : 4) : M <= 4 && !kTwo ? 2 : 1;
  constexpr int D = kTwo ? 2 : 1;  // digits: the codes of x, then those of its residual
  const __m512i perm = _mm512_load_si512(kQ4 ? kPerm.q4 : kPerm.q8);
  const __m512i nib = _mm512_set1_epi8(15), ones = _mm512_set1_epi8(1);
  const int8_t* digit[2] = {qx, kTwo ? qlo : qx};
  __m512 acc[M];
#pragma GCC unroll 8
  for (int r = 0; r < M; ++r)
    acc[r] = accumulate ? _mm512_loadu_ps(y + r * ldy) : init ? _mm512_loadu_ps(init) : _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g, group += kGroupBytes) {
    // The group kQPrefetchGroups ahead (into the next panel at a panel's end) into L2: 5.4 KB
    // ahead for q4, 9 KB for q8. 4 groups into L1 left the stream ~20% (q4) / ~10% (q8)
    // short of it (cpu_kernels_bench --gemv, cold weights, 2026-12-05).
#pragma GCC unroll 16
    for (size_t o = 0; o < kGroupBytes; o += 64)
      _mm_prefetch(reinterpret_cast<const char*>(group + kQPrefetchGroups * kGroupBytes + o), _MM_HINT_T1);
    __m512i sum[U][D][M], wsum = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u)
#pragma GCC unroll 2
      for (int d = 0; d < D; ++d)
#pragma GCC unroll 8
        for (int r = 0; r < M; ++r) sum[u][d][r] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int b = 0; b < kQuantGroup / 4; ++b) {
      constexpr int kBlocks = kQuantGroup / 4;
      static_assert(kBlocks % U == 0);
      const int u = b % U;
      __m512i w;
      if constexpr (kQ4) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + b * 32));
        const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4), 1);
        w = _mm512_permutexvar_epi8(perm, _mm512_and_si512(both, nib));
      } else {
        w = _mm512_permutexvar_epi8(perm, _mm512_loadu_si512(group + b * 64));
        wsum = _mm512_dpbusd_epi32(wsum, ones, w);
      }
#pragma GCC unroll 2
      for (int d = 0; d < D; ++d)
#pragma GCC unroll 8
        for (int r = 0; r < M; ++r) {
          int32_t xw;
          std::memcpy(&xw, digit[d] + r * ldq + g * kQuantGroup + b * 4, 4);
          const __m512i xb = _mm512_set1_epi32(xw);
          if constexpr (kQ4)
            sum[u][d][r] = _mm512_dpbusd_epi32(sum[u][d][r], w, xb);
          else
            sum[u][d][r] = _mm512_dpbusd_epi32(sum[u][d][r], xb, w);  // x + 128 (biased by the caller) as unsigned
        }
    }
#pragma GCC unroll 8
    for (int u = 1; u < U; ++u)
#pragma GCC unroll 2
      for (int d = 0; d < D; ++d)
#pragma GCC unroll 8
        for (int r = 0; r < M; ++r) sum[0][d][r] = _mm512_add_epi32(sum[0][d][r], sum[u][d][r]);
    const __m512 s = quant_group_values<kS>(group, false);
    [[maybe_unused]] const __m512 mins = kQ4 ? quant_group_values<kS>(group, true) : s;
#pragma GCC unroll 8
    for (int r = 0; r < M; ++r) {
      __m512 dot[D];
#pragma GCC unroll 2
      for (int d = 0; d < D; ++d) {
        __m512i exact = sum[0][d][r];
        if constexpr (!kQ4) exact = _mm512_sub_epi32(exact, _mm512_slli_epi32(wsum, 7));
        dot[d] = _mm512_cvtepi32_ps(exact);
      }
      // Two digits: Σ q (x codes + residual codes / 254) in one rounding, then as one digit.
      if constexpr (kTwo) dot[0] = _mm512_fmadd_ps(dot[1], _mm512_set1_ps(kQGemvLoDigit), dot[0]);
      acc[r] = _mm512_fmadd_ps(dot[0], _mm512_mul_ps(s, _mm512_set1_ps(dx[r * ldg + g])), acc[r]);
      if constexpr (kQ4) acc[r] = _mm512_fmadd_ps(mins, _mm512_set1_ps(sx[r * ldg + g]), acc[r]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < M; ++r) _mm512_storeu_ps(y + r * ldy, acc[r]);
}

}  // namespace

void qgemv_int8(int m, bool q4, const int8_t* qx, const int8_t* qlo, const float* dx, const float* sx, int64_t ldq,
                int64_t ldg, const uint8_t* group, int64_t groups, float* y, int64_t ldy, const float* init,
                bool accumulate) {
  with_tile_rows<kQGemvInt8RowBlock>(m, [&](auto rows) {
    constexpr int M = decltype(rows)::value;
    if (q4 && qlo)
      qgemv_rows<true, true, M>(qx, qlo, dx, sx, ldq, ldg, group, groups, y, ldy, init, accumulate);
    else if (q4)
      qgemv_rows<true, false, M>(qx, qlo, dx, sx, ldq, ldg, group, groups, y, ldy, init, accumulate);
    else if (qlo)
      qgemv_rows<false, true, M>(qx, qlo, dx, sx, ldq, ldg, group, groups, y, ldy, init, accumulate);
    else
      qgemv_rows<false, false, M>(qx, qlo, dx, sx, ldq, ldg, group, groups, y, ldy, init, accumulate);
  });
}

// quantize_rows_groups (linear.cpp) in zmm registers, bit for bit: the same products, rint
// and residual FMA, the max order-free (NaN lanes skipped as std::max skips them), and each
// group's sum in the scalar's order - 16 groups at a time, lane j summing group j's values
// one by one (gathered 32 floats apart). Why that order: SmolLM2's q4 Linears are sensitive
// to it (`eval perplexity --decode` on 300 GPL-3 tokens: 23.00 in order, 23.84 summed pairwise).
void quantize_rows_groups(const float* x, int64_t t, int64_t k, int8_t* qx, float* dx, float* sx, int8_t* qlo) {
  const int64_t groups = k / kQuantGroup;
  const __m512 hi = _mm512_set1_ps(127.0f), lo = _mm512_set1_ps(-127.0f);
  const __m512i stride = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                            _mm512_set1_epi32(kQuantGroup));
  for (int64_t r = 0; r < t; ++r) {
    const float* xr = x + r * k;
    float* sr = sx + r * groups;
    for (int64_t g0 = 0; g0 < groups; g0 += 16) {
      const __mmask16 live = groups - g0 >= 16 ? __mmask16(0xffff) : __mmask16((1u << (groups - g0)) - 1);
      __m512 sum = _mm512_setzero_ps();
      for (int i = 0; i < kQuantGroup; ++i)
        sum = _mm512_add_ps(sum, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), live, stride,
                                                          xr + g0 * kQuantGroup + i, 4));
      _mm512_mask_storeu_ps(sr + g0, live, sum);
    }
    for (int64_t g = 0; g < groups; ++g) {
      const float* xg = xr + g * kQuantGroup;
      const int64_t at = r * k + g * kQuantGroup;
      const __m512 a = _mm512_loadu_ps(xg), b = _mm512_loadu_ps(xg + 16);
      const __mmask16 a_ok = _mm512_cmp_ps_mask(a, a, _CMP_ORD_Q), b_ok = _mm512_cmp_ps_mask(b, b, _CMP_ORD_Q);
      const __m512 m = _mm512_max_ps(_mm512_maskz_mov_ps(a_ok, _mm512_abs_ps(a)), _mm512_maskz_mov_ps(b_ok, _mm512_abs_ps(b)));
      const float amax = _mm512_reduce_max_ps(m), inv = amax > 0.0f ? 127.0f / amax : 0.0f, d = amax / 127.0f;
      const __m512 vinv = _mm512_set1_ps(inv), vinv2 = _mm512_set1_ps(inv * 254.0f), vd = _mm512_set1_ps(d);
      // rint(v * s) clamped to [-127, 127], NaN (x NaN, or inf * 0) -> 0, as a float.
      auto code = [&](__m512 v, __m512 s) {
        v = _mm512_roundscale_ps(_mm512_mul_ps(v, s), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), v);
        return _mm512_min_ps(_mm512_max_ps(v, lo), hi);
      };
      auto store = [](int8_t* dst, __m512 c) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(c)));
      };
      const __m512 ca = code(a, vinv), cb = code(b, vinv);
      store(qx + at, ca);
      store(qx + at + 16, cb);
      if (qlo) {  // the residual x - d q, exact up to one rounding, in steps of d / 254
        store(qlo + at, code(_mm512_fnmadd_ps(vd, ca, a), vinv2));
        store(qlo + at + 16, code(_mm512_fnmadd_ps(vd, cb, b), vinv2));
      }
      dx[r * groups + g] = (a_ok & b_ok) != 0xffff ? sr[g] : d;
    }
  }
}

}  // namespace kiln::cpu::avx512
