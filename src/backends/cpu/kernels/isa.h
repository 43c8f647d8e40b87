// Internal: the per-ISA entry points that the public kernels dispatch to. The avx2::
// functions live in *_avx2.cpp files compiled with -mavx2 -mfma -mf16c and are only
// called when cpu_isa() == kAvx2. Tested through the public API in tests/backends/cpu/.
#pragma once

#include <type_traits>
#include <utility>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "backends/cpu/kernels/kernels.h"

namespace kiln::cpu {

inline bool use_avx2() { return cpu_isa() == CpuIsa::kAvx2; }

// Calls f(std::integral_constant<int, M>{}) for M = m clamped to [1, kMax]: a microkernel's
// step from the run-time tile height to the compiled one.
template <int kMax, typename F>
inline void with_tile_rows(int m, F&& f) {
  const int mm = m < 1 ? 1 : m > kMax ? kMax : m;
  [&]<int... I>(std::integer_sequence<int, I...>) {
    (void)((mm == I + 1 ? (f(std::integral_constant<int, I + 1>{}), true) : false) || ...);
  }(std::make_integer_sequence<int, kMax>{});
}

// Whether the AVX-512 kernels run - the linear microkernels (linear_avx512.cpp, f32/bf16/f16
// panels) and the prompt attention over f32 caches (attention_avx512.cpp): where the AVX2
// kernels run (use_avx2()), the CPU has AVX-512F/BW/VL with the OS saving its state, and
// neither KILN_CPU_AVX512=0 (read once) nor cpu_avx512_set(false) turned them off.
bool avx512_enabled();
// Tests: force the AVX-512 kernels off (or back on where the CPU has them).
void cpu_avx512_set(bool on);

// Element index of row kk, column c (0..15) in a 16-bit or f32 panel: bf16 rows go in
// pairs, column c of rows 2j and 2j+1 side by side (PackedWeight).
inline int64_t panel_index(WeightStorage s, int64_t kk, int64_t c) {
  if (s != WeightStorage::kBF16) return kk * 16 + c;
  return (kk & ~int64_t(1)) * 16 + 2 * c + (kk & 1);
}

// A GEMV-like stream (tiles of one or two rows) prefetches every 64-byte line of its panel
// this far ahead, so DRAM latency stays hidden. One prefetch per line: one per k step of
// several rows left most lines to the hardware prefetcher (one row, T = 1, 2 threads on
// the dev VM: bf16 weights streamed at 22 GB/s cold, 27 with every line prefetched). Into
// L2, 8 KB ahead, rather than 4 KB ahead into L1: TinyLlama-shape decode f16 74.3-75.6 ->
// 70.8-73.4 ms/token, bf16 70.0-73.3 -> 69.2-72.5 (within noise; 2026-12-05, alternating
// runs), the direction the q8/q4 kernels' L2 prefetch took (linear_q_vnni.cpp).
constexpr int64_t kStreamPrefetchBytes = 8192;

// Prefetches the lines of `bytes` at p + kStreamPrefetchBytes into L2.
template <int64_t kBytes>
inline void prefetch_stream(const void* p) {
  const char* c = static_cast<const char*>(p) + kStreamPrefetchBytes;
#pragma GCC unroll 4
  for (int64_t l = 0; l < (kBytes + 63) / 64; ++l) __builtin_prefetch(c + 64 * l, 0, 2);
}

// Computes an m × 16 tile (m <= 6): y[r][0..16) (+)= Σ_k x[r*ldx + k] * panel[k][0..16).
// panel points at row k0 of a packed panel (k0 even for bf16's row pairs); kc rows are
// read. If accumulate, the tile starts from y; else from init (16 floats, e.g. the bias)
// or zero when init is null.
using LinearMicrokernel = void (*)(int m, const float* x, int64_t ldx, const void* panel,
                                   int64_t kc, float* y, int64_t ldy, const float* init,
                                   bool accumulate);

enum class UnaryOp : uint8_t { kGeluErf, kGeluTanh, kSilu, kTanh, kExp };

// Exact int32 m × 16 tile (m <= 4) of a W8A8 panel: acc[r*16 + c] = Σ qx[r*ldx + k] * w[c][k]
// over 4 * k4 values of k (see PackedInt8Weight).
using Int8Microkernel = void (*)(int m, const int8_t* qx, int64_t ldx, const int8_t* panel, int64_t k4,
                                 int32_t* acc);

// The same over two adjacent panels: an m × 32 tile (m <= 12), columns 0-15 from `panel`,
// 16-31 from the panel panel_stride bytes further on; init (if used) holds 32 floats.
using LinearMicrokernel2 = void (*)(int m, const float* x, int64_t ldx, const void* panel, int64_t panel_stride,
                                    int64_t kc, float* y, int64_t ldy, const float* init, bool accumulate);

// Widens kc rows of a bf16/f16 panel (from its row k0) to f32 rows in column order at
// dst (64-byte aligned, kc * 16 floats): the panel an f32 microkernel reads with the same
// per-lane values the 16-bit microkernel widens in registers, so both give the same bits.
// For a q8/q4 panel (kc whole groups from a group boundary), its values as dequantize_row
// gives them (LinearTactic::widen_quant).
using LinearWiden = void (*)(const void* panel, int64_t kc, float* dst);

// Whether q8/q4 Linears take the int8-activation GEMV (linear_q_vnni.cpp) at every row
// count: the AVX-512 kernels run (avx512_enabled), the CPU has AVX-512 VNNI and VBMI, and
// cpu_qgemv_acts() != kF32 (kernels.h).
bool avx512_qgemv_int8_supported();

// Whether W8A8 Linears take the AVX-512 VNNI tiles (avx512::int8_tile): the AVX-512 kernels
// run (avx512_enabled) and the CPU has AVX-512 VNNI.
bool avx512_int8_supported();

namespace avx512 {
// W8A8 (PackedInt8Weight) on AVX-512 VNNI: an m x 16 tile (m <= kInt8TileRows) of one panel,
// or m x 32 over it and the next (panels = 2, panel_stride bytes on): acc[(p * m + r) * 16 + c]
// = Σ_k x[r][k] w[16p + c][k] exactly, from rows biased to u8 (x + 128, ldx bytes apart) and
// the panels' bias128 (16 a panel, from the first one's).
constexpr int kInt8TileRows = 6;
// linear_int8's epilogue over such a tile's rows of one panel: y[r][c] = float(acc[r * 16 + c])
// * (xs[r] * scale[c]) + bias[c] (bias may be null) for c < cols, a multiply then an add, as
// the scalar epilogue computes it.
void int8_dequantize(int m, const int32_t* acc, const float* xs, const float* scale, const float* bias, int64_t cols,
                     float* y, int64_t ldy);
void int8_tile(int m, int panels, const uint8_t* ux, int64_t ldx, const int8_t* panel, int64_t panel_stride,
               int64_t k4, const int32_t* bias128, int32_t* acc);
// y[r][0..16) (+)= Σ_g D_g[r][c] * (scale_g[c] * dx[r][g]) (+ min_g[c] * sx[r][g] for q4) over
// `groups` groups of a q8/q4 panel starting at `group`, D = float(Σ_k qx[r][32g + k] q[k][c])
// or, with qlo (the second digits), fma(float(Σ_k qlo q), kQGemvLoDigit, float(Σ_k qx q))
// (m <= kQGemvInt8RowBlock rows; for q8 panels the x codes come biased, x + 128 as uint8;
// qx / qlo rows ldq bytes apart, dx / sx rows ldg floats
// apart, all indexed from that first group). Start: y if accumulate, else init (16 floats)
// or zero. Row r's result depends only on row r's inputs, not on m.
void qgemv_int8(int m, bool q4, const int8_t* qx, const int8_t* qlo, const float* dx, const float* sx, int64_t ldq,
                int64_t ldg, const uint8_t* group, int64_t groups, float* y, int64_t ldy, const float* init,
                bool accumulate);
// quantize_rows_groups (kernels.h) with the same bits, for CPUs with AVX-512 F/BW.
void quantize_rows_groups(const float* x, int64_t t, int64_t k, int8_t* qx, float* dx, float* sx,
                          int8_t* qlo = nullptr);
LinearMicrokernel linear_microkernel(WeightStorage storage);    // q8/q4: the AVX2 kernels' bits
LinearMicrokernel2 linear_microkernel2(WeightStorage storage);  // null for quantized storage
LinearWiden linear_widen(WeightStorage storage);                // bf16/f16 and q8/q4
// The AVX2 kernels' unary / swiglu (same bits), 16 lanes wide.
void unary(UnaryOp op, const float* x, int64_t n, float* out);
void swiglu(const float* gate, const float* up, int64_t n, float* out);
// paged_attention's blocked path for sequences of several query rows, f32 caches, d 64 or 128.
void attention_rows_f32(const float* q, const float* k_cache, const float* v_cache, int64_t block_size, int64_t hq,
                        int64_t hkv, int64_t d, float scale, bool causal, const AttentionSeq* seqs, int64_t num_seqs,
                        float* out, int64_t window);

#ifdef __AVX512F__
// (Only in files compiled for AVX-512.) A quantized group's 16 f32 scales, or q4 mins: its
// f16 values times the columns' 2^e (kernels.h), the products pack time would form (exact).
template <WeightStorage kS>
inline __m512 quant_group_values(const uint8_t* group, bool min) {
  const __m512i e = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(group + quant_exps_at(kS))));
  const __m512 f = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(e, _mm512_set1_epi32(127)), 23));
  const size_t at = min ? quant_mins_at(kS) : quant_scales_at(kS);
  return _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + at))), f);
}
#endif
}  // namespace avx512

namespace avx2 {
LinearMicrokernel linear_microkernel(WeightStorage storage);
LinearWiden linear_widen(WeightStorage storage);  // bf16/f16 and q8/q4
Int8Microkernel int8_microkernel();  // maddubs + madd (any AVX2 CPU)
// avx512::int8_tile's contract in ymm registers on AVX-VNNI (only when avx_vnni_supported()):
// m <= kInt8VnniTileRows rows of one panel (the panel count and stride are ignored).
constexpr int kInt8VnniTileRows = 6;
void int8_tile_vnni(int m, int panels, const uint8_t* ux, int64_t ldx, const int8_t* panel, int64_t panel_stride,
                    int64_t k4, const int32_t* bias128, int32_t* acc);
bool avx_vnni_supported();
void quantize_row_int8(const float* x, int64_t k, float inv_scale, int8_t* q);

void layer_norm_row(const float* x, const float* res, const float* gamma, const float* beta,
                    float eps, int64_t dim, float* sum, float* y);
void rms_norm_row(const float* x, const float* res, const float* w, float eps, int64_t dim,
                  float* sum, float* y);

void unary(UnaryOp op, const float* x, int64_t n, float* out);
void add(const float* a, const float* b, int64_t n, float* out);
void mul(const float* a, const float* b, int64_t n, float* out);
void swiglu(const float* gate, const float* up, int64_t n, float* out);
void softmax_row(const float* x, int64_t dim, float* out);

void paged_attention(const float* q, const float* k_cache, const float* v_cache,
                     int64_t block_size, int64_t hq, int64_t hkv, int64_t d, float scale,
                     bool causal, const AttentionSeq* seqs, int64_t num_seqs, float* out, int64_t window,
                     float softcap);
void paged_attention_int8(const float* q, const int8_t* k_codes, const float* k_scales,
                          const int8_t* v_codes, const float* v_scales, int64_t block_size, int64_t hq,
                          int64_t hkv, int64_t d, float scale, bool causal, const AttentionSeq* seqs,
                          int64_t num_seqs, float* out, int64_t window, float softcap);
void paged_attention_fp8(const float* q, const Fp8Code* k_codes, const float* k_scales,
                         const Fp8Code* v_codes, const float* v_scales, int64_t block_size, int64_t hq,
                         int64_t hkv, int64_t d, float scale, bool causal, const AttentionSeq* seqs,
                         int64_t num_seqs, float* out, int64_t window, float softcap);
}  // namespace avx2

}  // namespace kiln::cpu
