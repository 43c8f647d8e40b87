// Linear (GEMM/GEMV with packed weights): packing, the blocking/threading driver shared
// by every ISA, and the portable scalar microkernel (the fallback). The AVX2 microkernel
// is in linear_avx2.cpp. Tested against a naive x·Wᵀ+b in tests/backends/cpu/linear_test.cpp.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <memory>
#include <vector>

#include "backends/cpu/kernels/isa.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "core/weight_quant.h"

namespace kiln::cpu {
namespace {

constexpr int64_t kNr = PackedWeight::kPanelWidth;
constexpr int kMaxMr = 12;     // the AVX-512 microkernel's tile rows
constexpr int kMaxMrAvx2 = 6;  // the AVX2 and scalar microkernels'

struct F32Elems {
  using Elem = float;
  static constexpr WeightStorage kStorage = WeightStorage::kF32;
  static float to_f32(float v) { return v; }
};
struct Bf16Elems {
  using Elem = uint16_t;
  static constexpr WeightStorage kStorage = WeightStorage::kBF16;
  static float to_f32(uint16_t v) { return bf16_to_f32(v); }
};
struct F16Elems {
  using Elem = uint16_t;
  static constexpr WeightStorage kStorage = WeightStorage::kF16;
  static float to_f32(uint16_t v) { return f16_to_f32(v); }
};

// Portable microkernel; written so the compiler can vectorize the 16-wide inner loop.
template <typename S>
void scalar_microkernel(int m, const float* x, int64_t ldx, const void* panel_v, int64_t kc,
                        float* y, int64_t ldy, const float* init, bool accumulate) {
  const auto* panel = static_cast<const typename S::Elem*>(panel_v);
  float acc[kMaxMr][kNr];
  for (int r = 0; r < m; ++r)
    for (int c = 0; c < kNr; ++c)
      acc[r][c] = accumulate ? y[r * ldy + c] : (init ? init[c] : 0.0f);
  for (int64_t kk = 0; kk < kc; ++kk) {
    float wrow[kNr];
    for (int c = 0; c < kNr; ++c) wrow[c] = S::to_f32(panel[panel_index(S::kStorage, kk, c)]);
    for (int r = 0; r < m; ++r) {
      float xv = x[r * ldx + kk];
      for (int c = 0; c < kNr; ++c) acc[r][c] += xv * wrow[c];
    }
  }
  for (int r = 0; r < m; ++r)
    for (int c = 0; c < kNr; ++c) y[r * ldy + c] = acc[r][c];
}

// Code of column c in row r of a quantized group (see PackedWeight).
inline int quant_code(WeightStorage s, const uint8_t* group, int64_t r, int64_t c) {
  if (s == WeightStorage::kQ8) return int(reinterpret_cast<const int8_t*>(group)[r * kNr + c]);
  const uint8_t b = group[r * (kNr / 2) + c % 8];
  return int(c < 8 ? (b & 15) : (b >> 4));
}

// Quantized weights: per group, sum x*q in f32, then scale once per group and column
// (q4 adds min * sum(x) for its offset).
template <WeightStorage kS>
void scalar_quant_microkernel(int m, const float* x, int64_t ldx, const void* panel_v, int64_t kc,
                              float* y, int64_t ldy, const float* init, bool accumulate) {
  const auto* group = static_cast<const uint8_t*>(panel_v);
  float acc[kMaxMr][kNr];
  for (int r = 0; r < m; ++r)
    for (int c = 0; c < kNr; ++c)
      acc[r][c] = accumulate ? y[r * ldy + c] : (init ? init[c] : 0.0f);
  for (int64_t g0 = 0; g0 < kc; g0 += kQuantGroup, group += quant_group_bytes(kS)) {
    float scale[2 * kNr];  // scales, then (q4) mins
    for (int c = 0; c < kNr; ++c) {
      scale[c] = quant_group_value(kS, group, false, c);
      if constexpr (kS == WeightStorage::kQ4) scale[kNr + c] = quant_group_value(kS, group, true, c);
    }
    for (int r = 0; r < m; ++r) {
      float part[kNr] = {}, xsum = 0.0f;
      for (int64_t kk = 0; kk < kQuantGroup; ++kk) {
        const float xv = x[r * ldx + g0 + kk];
        xsum += xv;
        for (int c = 0; c < kNr; ++c) part[c] += xv * float(quant_code(kS, group, kk, c));
      }
      for (int c = 0; c < kNr; ++c) {
        acc[r][c] += part[c] * scale[c];
        if constexpr (kS == WeightStorage::kQ4) acc[r][c] += xsum * scale[kNr + c];  // mins
      }
    }
  }
  for (int r = 0; r < m; ++r)
    for (int c = 0; c < kNr; ++c) y[r * ldy + c] = acc[r][c];
}

LinearMicrokernel scalar_linear_microkernel(WeightStorage s) {
  switch (s) {
    case WeightStorage::kF32: return scalar_microkernel<F32Elems>;
    case WeightStorage::kBF16: return scalar_microkernel<Bf16Elems>;
    case WeightStorage::kF16: return scalar_microkernel<F16Elems>;
    case WeightStorage::kQ8: return scalar_quant_microkernel<WeightStorage::kQ8>;
    case WeightStorage::kQ4: return scalar_quant_microkernel<WeightStorage::kQ4>;
  }
  return nullptr;
}

// quantize_row's row factors are powers of two in [2^-126, 2^113] (core/weight_quant.h);
// an image from a file is checked before packing (pack_quantized_weight).
std::optional<int8_t> quant_row_factor_exp(float factor) {
  int e = 0;
  const float m = std::isfinite(factor) ? std::frexp(factor, &e) : 0.0f;  // factor = 0.5 * 2^e
  if (m != 0.5f || e - 1 < -126 || e - 1 > 127) return std::nullopt;
  return int8_t(e - 1);
}

// Quantizes the panel's 16 rows with the shared q8/q4 quantizer (core/weight_quant.h),
// so every backend runs the same codes and scales, then lays them out group by group:
// f16 scales and mins as stored, the row factor as its exponent (kernels.h).
// With `q` set, the rows come already quantized (pack_quantized_weight) and w is unused.
void pack_quantized_panel(const float* w, const QuantizedRows* q, int64_t n, int64_t k, int64_t p, WeightStorage s,
                          uint8_t* dst) {
  const QuantFormat f = s == WeightStorage::kQ8 ? QuantFormat::kQ8 : QuantFormat::kQ4;
  const int64_t groups = k / kQuantGroup;
  const size_t row_bytes = quant_row_code_bytes(f, k);
  std::vector<uint8_t> codes(size_t(kNr) * row_bytes, 0);
  std::vector<uint16_t> scales(size_t(kNr * groups), 0), mins(size_t(kNr * groups), 0);
  float factor[kNr] = {};  // rows past N keep codes, scales and mins of 0
  for (int64_t c = 0; c < kNr; ++c) {
    const int64_t row = p * kNr + c;
    if (row >= n) continue;
    if (q) {
      std::memcpy(codes.data() + size_t(c) * row_bytes, q->codes.get() + size_t(row) * row_bytes, row_bytes);
      std::memcpy(scales.data() + c * groups, q->scales.get() + row * groups, size_t(groups) * 2);
      if (q->mins) std::memcpy(mins.data() + c * groups, q->mins.get() + row * groups, size_t(groups) * 2);
      factor[c] = q->row_factor[size_t(row)];
      continue;
    }
    quantize_row(w + row * k, k, f, codes.data() + size_t(c) * row_bytes, scales.data() + c * groups,
                 mins.data() + c * groups, &factor[c]);
  }
  int8_t exps[kNr] = {};  // F = 2^e; padding columns 2^0
  for (int64_t c = 0; c < kNr; ++c) exps[c] = quant_row_factor_exp(factor[c]).value_or(0);
  auto code = [&](int64_t c, int64_t i) { return kiln::quant_code(f, codes.data() + size_t(c) * row_bytes, i); };
  for (int64_t g = 0; g < groups; ++g, dst += quant_group_bytes(s)) {
    for (int64_t c = 0; c < kNr; ++c) {
      std::memcpy(dst + quant_scales_at(s) + 2 * c, &scales[size_t(c * groups + g)], 2);
      if (s == WeightStorage::kQ4) std::memcpy(dst + quant_mins_at(s) + 2 * c, &mins[size_t(c * groups + g)], 2);
      dst[quant_exps_at(s) + c] = uint8_t(exps[c]);
    }
    for (int64_t r = 0; r < kQuantGroup; ++r) {
      const int64_t i = g * kQuantGroup + r;
      if (s == WeightStorage::kQ8) {
        for (int64_t c = 0; c < kNr; ++c) reinterpret_cast<int8_t*>(dst)[r * kNr + c] = int8_t(code(c, i));
      } else {
        // Byte j of a row holds column j (low nibble) and column j + 8 (high nibble).
        for (int64_t j = 0; j < kNr / 2; ++j) dst[r * (kNr / 2) + j] = uint8_t(code(j, i) | (code(j + 8, i) << 4));
      }
    }
  }
  // The line padding: zeros (engines store these bytes).
  std::memset(dst, 0, quant_panel_bytes(s, k) - size_t(groups) * quant_group_bytes(s));
}

// Rows of the tile are processed in blocks of `mc` so the x block (mc × kc floats) stays
// in L2 while each kc × 16 panel slice sits in L1 (the BLIS loop order without packing x:
// x rows are already contiguous in K). 132 rows (a multiple of the 6- and 12-row tiles):
// a 128-token prompt is one block, so each weight panel streams in once per Linear
// (BERT-base b1 x 128 on the AVX-512 kernels: 1.06x over 96-row blocks, paired).
constexpr int64_t kMc = 132;

// 16-bit (bf16/f16) panels under row blocks of at least this many rows are widened to
// f32 once per block and K slice, into a per-thread scratch, and the f32 microkernels run
// every tile of the block from it, instead of each tile widening the same slice again in
// registers (a 132-row prefill block: 22 times; TinyLlama bf16 pp128 was 1.23x slower
// with bf16 weights than with f32 ones). Lane for lane the same FMAs: the same bits as the
// 16-bit kernels, so outputs do not depend on the row count. Below it (decode, small
// batches) the 16-bit kernels stream half the bytes of f32.
constexpr int64_t kWidenMinRows = 24;

// A 64-byte aligned scratch of at least `floats`, one per thread, kept between calls.
float* widen_scratch(size_t floats) {
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  thread_local std::unique_ptr<float, Free> buf;
  thread_local size_t cap = 0;
  if (cap < floats) {
    buf.reset(static_cast<float*>(std::aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64)));
    KILN_CHECK(buf != nullptr, "linear: no memory for a ", floats, "-float widening scratch");
    cap = floats;
  }
  return buf.get();
}

struct LinearRun {
  const float* x;
  int64_t t, k, n;
  const PackedWeight* w;
  const float* bias;
  float* y;
  LinearMicrokernel mk;
  LinearMicrokernel2 mk2;  // null: one panel per call
  int mr;
  int64_t kc;
  float tail_bias[kNr];
  // 16-bit panels: their widening and the same ISA's f32 kernels (kWidenMinRows); q8/q4
  // panels under LinearTactic::widen_quant: their dequantization, at every row count.
  LinearWiden widen = nullptr;
  LinearMicrokernel mk_f32 = nullptr;
  LinearMicrokernel2 mk2_f32 = nullptr;
  bool widen_always = false;

  void run(int64_t r0, int64_t r1, int64_t p0, int64_t p1) const {
    for (int64_t mc0 = r0; mc0 < r1; mc0 += kMc) {
      const int64_t mc1 = std::min(r1, mc0 + kMc);
      const bool widened = widen && (widen_always || mc1 - mc0 >= kWidenMinRows);
      float* scratch = widened ? widen_scratch(size_t(2 * kNr * std::min(kc, k))) : nullptr;
      for (int64_t k0 = 0; k0 < k; k0 += kc) {
        const int64_t kb = std::min(kc, k - k0);
        const bool acc = k0 > 0;
        for (int64_t p = p0; p < p1; ++p) {
          const uint8_t* panel = w->panel(p) + w->offset(k0);
          LinearMicrokernel tile_mk = mk;
          if (mk2 && p + 1 < p1 && (p + 2) * kNr <= n) {  // two whole panels: one 32-wide tile
            const float* init = bias ? bias + p * kNr : nullptr;
            LinearMicrokernel2 tile_mk2 = mk2;
            int64_t stride = int64_t(w->panel_bytes());
            if (widened) {
              widen(panel, kb, scratch);
              widen(panel + w->panel_bytes(), kb, scratch + kb * kNr);
              panel = reinterpret_cast<const uint8_t*>(scratch);
              stride = kb * kNr * int64_t(sizeof(float));
              tile_mk2 = mk2_f32;
            }
            for (int64_t r = mc0; r < mc1; r += mr)
              tile_mk2(int(std::min<int64_t>(mr, mc1 - r)), x + r * k + k0, k, panel, stride, kb,
                       y + r * n + p * kNr, n, init, acc);
            ++p;
            continue;
          }
          if (widened) {
            widen(panel, kb, scratch);
            panel = reinterpret_cast<const uint8_t*>(scratch);
            tile_mk = mk_f32;
          }
          const int64_t cols = std::min(kNr, n - p * kNr);
          const float* init = bias ? (cols == kNr ? bias + p * kNr : tail_bias) : nullptr;
          for (int64_t r = mc0; r < mc1; r += mr) {
            const int m = int(std::min<int64_t>(mr, mc1 - r));
            float* yt = y + r * n + p * kNr;
            if (cols == kNr) {
              tile_mk(m, x + r * k + k0, k, panel, kb, yt, n, init, acc);
              continue;
            }
            // The zero-padded last panel computes 16 columns into a scratch tile.
            float tile[kMaxMr * kNr];
            if (acc)
              for (int i = 0; i < m; ++i) std::memcpy(tile + i * kNr, yt + i * n, cols * 4);
            tile_mk(m, x + r * k + k0, k, panel, kb, tile, kNr, init, acc);
            for (int i = 0; i < m; ++i) std::memcpy(yt + i * n, tile + i * kNr, cols * 4);
          }
        }
      }
    }
  }
};

// The last panel's bias, zero past N (its tile is computed 16 columns wide).
void fill_tail_bias(const PackedWeight& w, const float* bias, float* tail) {
  const int64_t last = (w.panels() - 1) * kNr;
  for (int64_t c = 0; c < kNr; ++c) tail[c] = last + c < w.n ? bias[last + c] : 0.0f;
}

// Rows of the int8-activation path per outer block: their codes (kMcInt8 x K bytes a digit,
// 128 KiB at K = 1024, twice that with the second digit) stay in L2 while every panel
// passes over them, as kMc does for the f32 kernels.
constexpr int64_t kMcInt8 = 128;

// linear() for q8/q4 weights on AVX-512 VNNI (kernels.h): x rounded once per call (by
// threads over rows when there is much of it), then per panel blocks of kQGemvInt8RowBlock rows,
// so a panel is read from memory once and stays in L1/L2 across the blocks. Threads own
// contiguous panels, as the f32 kernels' do, or rows when the panels are too few to share
// (linear_default_tactic's rule). Neither the split nor the blocking changes a row's bits.
void linear_qgemv_int8(const float* x, int64_t t, int64_t k, const PackedWeight& w, const float* bias, float* y,
                       int threads, LinearSplit split, bool two_digits) {
  const int64_t groups = k / kQuantGroup, n = w.n;
  thread_local std::vector<int8_t> qx;
  thread_local std::vector<float> scales;
  qx.resize(size_t((two_digits ? 2 : 1) * t * k));
  scales.resize(size_t(2 * t * groups));
  int8_t* q = qx.data();
  int8_t* qlo = two_digits ? q + t * k : nullptr;  // the residual's codes, rows as q's
  float* dx = scales.data();
  float* sx = dx + t * groups;
  const bool q4 = w.storage == WeightStorage::kQ4;
  auto quantize = [&](int64_t r0, int64_t r1) {
    avx512::quantize_rows_groups(x + r0 * k, r1 - r0, k, q + r0 * k, dx + r0 * groups, sx + r0 * groups,
                                 qlo ? qlo + r0 * k : nullptr);
    if (q4) return;
    // q8 codes are signed, so x goes in as vpdpbusd's unsigned operand, x + 128: biased once
    // here instead of per row and code block in the kernel (qgemv_int8).
    for (int8_t* c : {q, qlo})
      if (c)
        for (int64_t i = r0 * k; i < r1 * k; ++i) c[i] = int8_t(uint8_t(c[i]) ^ 0x80u);
  };
  // Rounding x costs ~0.5 ns a value on one core (dev VM): 40 us for 128 rows of 576, a few %
  // of that Linear; threads share it only from 2^18 values on, where it outweighs a second
  // pool hand-off.
  constexpr int64_t kQuantizeRows = 16;
  if (threads <= 1 || t * k < (int64_t(1) << 18))
    quantize(0, t);
  else
    ThreadPool::global().parallel_for(t, [&](int64_t b, int64_t e, int) { quantize(b, e); }, kQuantizeRows);
  float tail_bias[kNr] = {};
  if (bias) fill_tail_bias(w, bias, tail_bias);
  constexpr int64_t kRb = kQGemvInt8RowBlock;
  auto run = [&](int64_t r0, int64_t r1, int64_t p0, int64_t p1) {
    for (int64_t mc0 = r0; mc0 < r1; mc0 += kMcInt8) {
      const int64_t mc1 = std::min(r1, mc0 + kMcInt8);
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t cols = std::min(kNr, n - p * kNr);
        const float* init = bias ? (cols == kNr ? bias + p * kNr : tail_bias) : nullptr;
        for (int64_t r = mc0; r < mc1; r += kRb) {
          const int m = int(std::min(kRb, mc1 - r));
          float* yt = y + r * n + p * kNr;
          const int8_t* lo = qlo ? qlo + r * k : nullptr;
          if (cols == kNr) {
            avx512::qgemv_int8(m, q4, q + r * k, lo, dx + r * groups, sx + r * groups, k, groups, w.panel(p), groups,
                               yt, n, init, false);
            continue;
          }
          // The zero-padded last panel computes 16 columns into a scratch tile.
          float tile[kRb * kNr];
          avx512::qgemv_int8(m, q4, q + r * k, lo, dx + r * groups, sx + r * groups, k, groups, w.panel(p), groups,
                             tile, kNr, init, false);
          for (int i = 0; i < m; ++i) std::memcpy(yt + i * n, tile + i * kNr, size_t(cols) * 4);
        }
      }
    }
  };
  if (threads <= 1)
    run(0, t, 0, w.panels());
  else if (split == LinearSplit::kRows)
    ThreadPool::global().parallel_for(t, [&](int64_t b, int64_t e, int) { run(b, e, 0, w.panels()); }, kRb);
  else
    ThreadPool::global().parallel_for(w.panels(), [&](int64_t b, int64_t e, int) { run(0, t, b, e); }, 1);
}

}  // namespace

void quantize_rows_groups(const float* x, int64_t t, int64_t k, int8_t* qx, float* dx, float* sx, int8_t* qlo) {
  KILN_THROW_IF(k % kQuantGroup != 0, kInvalidArgument, "quantize_rows_groups: K=", k, " is not a multiple of ",
                kQuantGroup);
  const int64_t groups = k / kQuantGroup;
  // rint(v) clamped to [-127, 127]; NaN (x NaN, or inf * 0) -> 0.
  auto code = [](float v) {
    v = std::nearbyint(v);
    return int8_t(v >= 127.0f ? 127 : v <= -127.0f ? -127 : v == v ? int(v) : 0);
  };
  for (int64_t r = 0; r < t; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const float* xg = x + r * k + g * kQuantGroup;
      const int64_t at = r * k + g * kQuantGroup;
      float amax = 0.0f, sum = 0.0f;
      bool nan = false;
      for (int64_t i = 0; i < kQuantGroup; ++i) {
        amax = std::max(amax, std::fabs(xg[i]));
        sum += xg[i];
        nan = nan || xg[i] != xg[i];
      }
      const float inv = amax > 0.0f ? 127.0f / amax : 0.0f, d = amax / 127.0f;
      for (int64_t i = 0; i < kQuantGroup; ++i) {
        qx[at + i] = code(xg[i] * inv);
        // The residual (one rounding: |x - d q| <= d / 2 up to an ulp) in steps of d / 254.
        if (qlo) qlo[at + i] = code(std::fma(-d, float(qx[at + i]), xg[i]) * (inv * 254.0f));
      }
      // A NaN in x makes the group's scale NaN, so the outputs are NaN as x multiplied as
      // given would make them (its code alone would read 0); an infinity already does
      // (d = inf against codes 0).
      dx[r * groups + g] = nan ? sum : d;
      sx[r * groups + g] = sum;
    }
}

const char* weight_storage_name(WeightStorage s) {
  switch (s) {
    case WeightStorage::kF32: return "f32";
    case WeightStorage::kBF16: return "bf16";
    case WeightStorage::kF16: return "f16";
    case WeightStorage::kQ8: return "q8";
    case WeightStorage::kQ4: return "q4";
  }
  return "?";
}

size_t weight_storage_size(WeightStorage s) {
  KILN_CHECK(!weight_storage_quantized(s), "quantized storage has no element size");
  return s == WeightStorage::kF32 ? 4 : 2;
}

PackedWeight pack_weight(const void* w, DType dtype, int64_t n, int64_t k, WeightStorage storage) {
  KILN_THROW_IF(n <= 0 || k <= 0, kInvalidArgument, "pack_weight: expected N, K > 0, got N=", n,
                " K=", k);
  q4_free_scales();  // its switch read here, not first in a pool thread
  KILN_THROW_IF(weight_storage_quantized(storage) && k % kQuantGroup != 0, kInvalidArgument,
                "pack_weight: ", weight_storage_name(storage), " needs K to be a multiple of ",
                kQuantGroup, ", got K=", k);
  KILN_THROW_IF(dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kF16, kInvalidArgument,
                "pack_weight: weights of dtype ", dtype_name(dtype), " (expected f32, bf16 or f16)");
  PackedWeight pw;
  pw.n = n;
  pw.k = k;
  pw.storage = storage;
  pw.data = host_buffer(pw.bytes());
  const size_t es = dtype_size(dtype);
  ThreadPool::global().parallel_for(pw.panels(), [&](int64_t p0, int64_t p1, int) {
    std::vector<float> widened;  // a panel's rows as f32, when w is not f32
    for (int64_t p = p0; p < p1; ++p) {
      uint8_t* dst = pw.data.get() + size_t(p) * pw.panel_bytes();
      // This panel's rows [p * kNr, p * kNr + rows) as f32 (rows past N are zeros below).
      const int64_t first = p * kNr, rows = std::min<int64_t>(kNr, n - first);
      const uint8_t* src = static_cast<const uint8_t*>(w) + size_t(first * k) * es;
      const float* r = reinterpret_cast<const float*>(src);
      if (dtype != DType::kF32) {
        widened.resize(size_t(rows * k));
        dtype_convert(src, dtype, widened.data(), DType::kF32, widened.size());
        r = widened.data();
      }
      if (weight_storage_quantized(storage)) {
        pack_quantized_panel(r, nullptr, rows, k, 0, storage, dst);
        continue;
      }
      for (int64_t c = 0; c < kNr; ++c) {
        for (int64_t kk = 0; kk < pw.stored_k(); ++kk) {
          const float v = c < rows && kk < k ? r[c * k + kk] : 0.0f;
          const int64_t i = panel_index(storage, kk, c);
          switch (storage) {
            case WeightStorage::kF32: reinterpret_cast<float*>(dst)[i] = v; break;
            case WeightStorage::kBF16: reinterpret_cast<uint16_t*>(dst)[i] = f32_to_bf16(v); break;
            case WeightStorage::kF16: reinterpret_cast<uint16_t*>(dst)[i] = f32_to_f16(v); break;
            default: break;
          }
        }
      }
    }
  });
  return pw;
}

PackedWeight pack_weight(const float* w, int64_t n, int64_t k, WeightStorage storage) {
  return pack_weight(w, DType::kF32, n, k, storage);
}

PackedWeight pack_quantized_weight(const QuantizedRows& q) {
  KILN_THROW_IF(q.n <= 0 || q.k <= 0 || q.k % kQuantGroup != 0, kInvalidArgument,
                "pack_quantized_weight: expected N > 0 and K a positive multiple of ", kQuantGroup, ", got N=", q.n,
                " K=", q.k);
  PackedWeight pw;
  pw.n = q.n;
  pw.k = q.k;
  pw.storage = q.format == QuantFormat::kQ8 ? WeightStorage::kQ8 : WeightStorage::kQ4;
  for (int64_t r = 0; r < q.n; ++r)
    KILN_THROW_IF(!quant_row_factor_exp(q.row_factor[size_t(r)]), kInvalidArgument, "pack_quantized_weight: row ", r,
                  "'s row factor ", q.row_factor[size_t(r)], " is not a power of two in [2^-126, 2^127]");
  pw.data = host_buffer(pw.bytes());
  ThreadPool::global().parallel_for(pw.panels(), [&](int64_t p0, int64_t p1, int) {
    for (int64_t p = p0; p < p1; ++p) {
      uint8_t* dst = pw.data.get() + size_t(p) * pw.panel_bytes();
      pack_quantized_panel(nullptr, &q, q.n, q.k, p, pw.storage, dst);
    }
  });
  return pw;
}

LinearTactic linear_default_tactic(int64_t t, int64_t n, int64_t k, int max_mr) {
  LinearTactic tac;
  // From cpu_kernels_bench --sweep (2 threads), one panel a call: the tallest tile wins
  // (6×16 with AVX2, 12×16 with AVX-512 below 6 rows); K up to ~1k runs unblocked (the
  // 16-wide panel slice still fits L1/L2), longer K blocks at 256 (3072->768, T=512: +25%).
  tac.mr = max_mr;
  // One tile of rows (decode) reuses no panel slice: K unblocked, so each thread streams
  // its panels front to back (cpu_kernels_bench --gemv, mlp.proj K = 3072, bf16, 2 threads:
  // 98-118% -> 116-127% of the read-only bandwidth, cold).
  tac.kc = k <= 1024 || t <= max_mr ? k : 256;
  tac.threads = ThreadPool::global().num_threads();
  const int64_t panels = (n + kNr - 1) / kNr;
  tac.panels = 1;
  // AVX-512 (max_mr 12) with rows for a whole 6-row tile: 6 x 32 tiles over two panels
  // (12 accumulators, 8 loads per 12 FMAs) beat the 12 x 16 tile (12 accumulators, 13
  // loads per 12 FMAs) and the 12 x 32 one (24 accumulators): cpu_kernels_bench --sweep,
  // f32, BERT-base shapes at T = 128/512, 2 threads: 280-312 GFLOP/s (84-93% of the zmm
  // peak) against 213-250; K up to 4096 unblocked (mlp.proj, K = 3072: 290-305 unblocked,
  // 200 at kc 128-256 where the y tile is reloaded per block).
  if (max_mr >= 12 && t >= 6) {
    tac.mr = 6;
    tac.panels = 2;
    tac.kc = k <= 4096 ? k : 768;
  }
  // Threads own N panels (each streams its own contiguous slice of the weights) unless
  // there are too few panels to balance and enough rows to split instead.
  tac.split = (panels < 4 * tac.threads && t >= 4 * tac.mr * tac.threads) ? LinearSplit::kRows
                                                                          : LinearSplit::kPanels;
  return tac;
}

void linear(const float* x, int64_t t, int64_t k, const PackedWeight& w, const float* bias,
            float* y, const LinearTactic& tactic) {
  KILN_THROW_IF(k != w.k, kInvalidArgument, "linear: x has K=", k, " but the weight was packed with K=",
                w.k);
  if (t <= 0) return;
  // AVX-512 where the CPU has it (f32/bf16/f16 panels): up to 12-row tiles, one zmm per
  // row, and the two-panel 6 x 32 tile (linear_default_tactic).
  const LinearMicrokernel mk512 = avx512_enabled() ? avx512::linear_microkernel(w.storage) : nullptr;
  const int max_mr = mk512 ? kMaxMr : kMaxMrAvx2;
  LinearTactic tac = linear_default_tactic(t, w.n, k, max_mr);
  if (tactic.mr) tac.mr = tactic.mr;
  if (tactic.kc) tac.kc = tactic.kc;
  if (tactic.split != LinearSplit::kAuto) tac.split = tactic.split;
  if (tactic.threads) tac.threads = tactic.threads;
  if (tactic.panels) tac.panels = tactic.panels;
  KILN_THROW_IF(tac.panels != 1 && tac.panels != 2, kInvalidArgument, "linear: tactic panels must be 1 or 2, got ",
                tac.panels);
  // Quantized panels are walked group by group: K blocks must hold whole groups; bf16
  // panels pair by pair.
  if (weight_storage_quantized(w.storage)) tac.kc = std::max(kQuantGroup, tac.kc / kQuantGroup * kQuantGroup);
  if (w.storage == WeightStorage::kBF16 && tac.kc < k) tac.kc = std::max<int64_t>(2, tac.kc / 2 * 2);
  KILN_THROW_IF(tac.mr < 1 || tac.mr > max_mr, kInvalidArgument, "linear: tactic mr must be in [1, ", max_mr,
                "], got ", tac.mr);

  // Every row count of a q8/q4 Linear takes the int8-activation path where it runs, so a
  // row's output does not depend on how many rows share the call (batch invariance);
  // encoders widen the panels to f32 instead (LinearTactic::widen_quant).
  const bool widen_quant = weight_storage_quantized(w.storage) && tactic.widen_quant && (mk512 || use_avx2());
  if (weight_storage_quantized(w.storage) && tactic.int8_x && !widen_quant && avx512_qgemv_int8_supported()) {
    const int64_t panels = w.panels();
    const LinearSplit split = tactic.split != LinearSplit::kAuto ? tactic.split
                              : panels < 4 * tac.threads && t >= 4 * kQGemvInt8RowBlock * tac.threads
                                  ? LinearSplit::kRows
                                  : LinearSplit::kPanels;
    linear_qgemv_int8(x, t, k, w, bias, y, tac.threads, split, cpu_qgemv_acts() == QGemvActs::kInt16);
    return;
  }
  LinearRun run{x, t, k, w.n, &w, bias, y,
                mk512 ? mk512 : use_avx2() ? avx2::linear_microkernel(w.storage) : scalar_linear_microkernel(w.storage),
                mk512 && tac.panels == 2 ? avx512::linear_microkernel2(w.storage) : nullptr,
                tac.mr, std::min(tac.kc, k), {}};
  if (widen_quant) {  // every block widened: the f32 kernels' tiles, two panels a call included
    run.widen_always = true;
    if (mk512) {
      run.widen = avx512::linear_widen(w.storage);
      run.mk_f32 = avx512::linear_microkernel(WeightStorage::kF32);
      run.mk2 = run.mk2_f32 = tac.panels == 2 ? avx512::linear_microkernel2(WeightStorage::kF32) : nullptr;
    } else {
      run.widen = avx2::linear_widen(w.storage);
      run.mk_f32 = avx2::linear_microkernel(WeightStorage::kF32);
    }
  } else if (w.storage == WeightStorage::kBF16 || w.storage == WeightStorage::kF16) {
    if (mk512) {
      run.widen = avx512::linear_widen(w.storage);
      run.mk_f32 = avx512::linear_microkernel(WeightStorage::kF32);
      run.mk2_f32 = run.mk2 ? avx512::linear_microkernel2(WeightStorage::kF32) : nullptr;
    } else if (use_avx2()) {
      run.widen = avx2::linear_widen(w.storage);
      run.mk_f32 = avx2::linear_microkernel(WeightStorage::kF32);
    }
  }
  if (bias) fill_tail_bias(w, bias, run.tail_bias);
  if (tac.threads <= 1) {
    run.run(0, t, 0, w.panels());
  } else if (tac.split == LinearSplit::kRows) {
    ThreadPool::global().parallel_for(
        t, [&](int64_t b, int64_t e, int) { run.run(b, e, 0, w.panels()); }, tac.mr);
  } else {
    ThreadPool::global().parallel_for(
        w.panels(), [&](int64_t b, int64_t e, int) { run.run(0, t, b, e); }, 1);
  }
}

}  // namespace kiln::cpu
