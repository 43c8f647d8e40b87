// The weight-only quantization formats q8 and q4 (groups of kQuantGroup consecutive
// values along K of one output row), defined once for every backend: the CPU packs these
// codes and scales into its panels, the CUDA backend streams them row by row, so both run
// the same quantized weights. Tested in tests/core/weight_quant_test.cpp.
//
// A row [k] is stored as codes, one f16 scale per group (q4: and one f16 min), and one
// power-of-two f32 row factor F:  w[i] ≈ F * (scale[g] * q[i] + min[g]),  g = i / 32.
//   q8: symmetric, q in [-127, 127], scale = max|w| / 127 (GGUF's Q8_0 grid).
//   q4: asymmetric, q in [0, 15], scale = (max - min) / 15, min = the group minimum
//       (GGUF's Q4_1 grid, so Q8_0 / Q4_1 checkpoints keep their exact values).
// Why f16 scales: the GPU streams 5 (q4) / 8.5 (q8) bits per weight instead of 6 / 9.
// Why F: it keeps the f16 scales of a row of tiny weights out of f16's subnormal range
// (F is chosen so the row's largest scale or |min| lands in [2^14, 2^15]). Codes are
// rounded against the stored (f16-rounded) scale and min, to nearest, ties to even.
//
// q4's 8-bit scales. quantize_row does not store free f16 values for q4: along a row, per
// super-group of kQ4SuperGroups groups (256 values; the row's last one may be shorter),
// every scale is an integer 0..255 times 2^Es and every min an integer -127..127 times 2^Em
// (relative to F), Es and Em the super-group's (QuantSuperExp: the smallest powers of two
// that hold its largest scale and |min|), both rounded to nearest. Those values are exact
// f16, so the format and every CPU kernel are unchanged. Such a weight fits 4.5625 bits a
// weight instead of 5 (an 8-bit scale and min code per group, two exponent bytes per
// super-group: q4_super_exps finds them); a CUDA form of those bytes measured slower in the
// instruction-bound batch-1 GEMV and was removed (bench/RESULTS.md, session 56). Measured
// (bench/RESULTS.md, session 55, bench/q4_group_study.py "u8"): all-MiniLM-L6-v2
// embeddings and SmolLM2 perplexity as with free f16 scales, within the run-to-run spread
// of the grids. GGUF Q4_0 / Q4_1 / Q4_K weights keep their own f16 values (and the 5-bit
// device layout).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace kiln {

constexpr int64_t kQuantGroup = 32;

enum class QuantFormat : uint8_t { kQ8, kQ4 };

const char* quant_format_name(QuantFormat f);
// Bytes of codes in a row of k values: k (q8) or k / 2 (q4).
inline size_t quant_row_code_bytes(QuantFormat f, int64_t k) {
  return f == QuantFormat::kQ8 ? size_t(k) : size_t(k) / 2;
}

// Quantizes one row of k values (k % kQuantGroup == 0, checked by callers). Writes
// codes (q8: k int8 as bytes; q4: element 2j in the low nibble of byte j, 2j+1 in the
// high nibble), k / 32 f16 scales, for q4 k / 32 f16 mins (`mins` may be null for q8),
// and the row factor.
void quantize_row(const float* w, int64_t k, QuantFormat f, uint8_t* codes, uint16_t* scales, uint16_t* mins,
                  float* row_factor);

// The pieces of quantize_row, for quantizers that choose codes themselves (quant/gptq.h).
// The row factor F quantize_row picks for w (a power of two; 1 for an all-zero row).
float quant_row_factor(const float* w, int64_t k, QuantFormat f);
// q4's super-groups: kQ4SuperGroups groups of a row share the exponents of their scale and
// min codes (see the top of the file). Es in [-24, 8] keeps 255 * 2^Es <= 65280 and every
// multiple of 2^Es exact in f16, Em in [-24, 9] keeps 127 * 2^Em <= 65024: F puts every
// scale and |min| below 2^15, inside both ranges.
constexpr int64_t kQ4SuperGroups = 8;
constexpr int kQ4ExpMin = -24, kQ4ScaleExpMax = 8, kQ4MinExpMax = 9;
struct QuantSuperExp {
  int scale = kQ4ExpMin, min = kQ4ExpMin;
};
// The exponents of the super-group of `count` values at v (a multiple of kQuantGroup, at
// most kQ4SuperGroups groups) for the row factor F.
QuantSuperExp quant_super_exp(const float* v, int64_t count, float row_factor);
// Super-group s of a row of k values: values [s * 256, min(k, (s + 1) * 256)).
inline int64_t quant_super_groups(int64_t k) {
  return (k / kQuantGroup + kQ4SuperGroups - 1) / kQ4SuperGroups;
}
// Whether a q4 row's stored scales and mins (f16, `groups` of each) lie on the 8-bit grid;
// if so out[s] (quant_super_groups(32 * groups) entries) gets each super-group's exponents
// (the smallest that hold its values). Free f16 values (GGUF's) give false.
bool q4_super_exps(const uint16_t* scales, const uint16_t* mins, int64_t groups,
                   QuantSuperExp* out);
// One group's stored scale and min (f16 relative to F; q8: saturating at f16's range; q4:
// on the 8-bit grid of its super-group's exponents `e`) and the values they stand for;
// code(v) rounds v to the nearest code (ties to even), clamped.
struct QuantGroup {
  uint16_t scale16 = 0, min16 = 0;  // min16: q4 only
  float scale = 0, min = 0;
  int code(float v, QuantFormat f) const {
    const float q = scale > 0.0f ? std::nearbyint((v - min) / scale) : 0.0f;
    return f == QuantFormat::kQ8 ? int(std::clamp(q, -127.0f, 127.0f)) : int(std::clamp(q, 0.0f, 15.0f));
  }
  float value(int code) const { return scale * float(code) + min; }
};
QuantGroup quant_group(const float* v, QuantFormat f, float row_factor,
                       const QuantSuperExp& e);  // v: 32 values
// KILN_Q4_SCALES=f16: q4 groups get free f16 scales and mins as before the 8-bit grid (for
// accuracy comparisons; such weights take the 5-bit device layout); "8bit" or unset: the
// grid. Read once, on the first call: the quantizers call it on their calling thread
// before their parallel loops, so another value is a kInvalidArgument error naming the
// variable there (not in a pool thread).
bool q4_free_scales();
void q4_free_scales_set(bool free);  // for tests: as if KILN_Q4_SCALES were f16 (true) or 8bit
// Stores code (q8: -127..127; q4: 0..15) as element i of a quantized row.
void set_quant_code(QuantFormat f, uint8_t* codes, int64_t i, int code);

// The code of element i of a quantized row (q8: -127..127; q4: 0..15).
inline int quant_code(QuantFormat f, const uint8_t* codes, int64_t i) {
  if (f == QuantFormat::kQ8) return int(int8_t(codes[i]));
  const uint8_t b = codes[i / 2];
  return (i & 1) ? (b >> 4) : (b & 15);
}

// The values a quantized row stands for: out[i] = F * (scale[g] * q[i] + min[g]) (q8: no
// min), the inverse of quantize_row up to its rounding. Used to measure quantization
// error (quant/awq.h) and by tests.
void dequantize_row(const uint8_t* codes, const uint16_t* scales, const uint16_t* mins, float row_factor, int64_t k,
                    QuantFormat f, float* out);

// A whole [n, k] weight in row-major form, rows quantized in parallel on the global
// thread pool: codes [n][quant_row_code_bytes], scales and (q4) mins [n][k / 32],
// row factors [n]. kInvalidArgument when k is not a multiple of kQuantGroup.
struct QuantizedRows {
  QuantFormat format = QuantFormat::kQ4;
  int64_t n = 0, k = 0;
  std::unique_ptr<uint8_t[]> codes;
  std::unique_ptr<uint16_t[]> scales, mins;  // mins: q4 only
  std::unique_ptr<float[]> row_factor;
  int64_t groups() const { return k / kQuantGroup; }
};
QuantizedRows quantize_rows(const float* w, int64_t n, int64_t k, QuantFormat f);
// Rows [r0, r1) of q as dequantize_row gives them, into out (r1 - r0 rows of q.k floats).
void dequantize_rows(const QuantizedRows& q, int64_t r0, int64_t r1, float* out);

// QuantizedRows as one byte image of n rows of quant_image_row_bytes(f, k) bytes each:
// a row's codes, then its f16 scales, (q4) its f16 mins, then its f32 row factor. Rows
// are self-contained, so images of equal K stack along N by concatenation (fused
// q/k/v or gate/up Linears) and permute by row. This is how a weight that arrives
// already quantized (a GGUF Q8_0 / Q4_0 / Q4_1 / Q4_K tensor) travels in the graph: a u8
// [n, row_bytes] weight of a Linear with attrs weight_quant ("q8"/"q4") and weight_k.
size_t quant_image_row_bytes(QuantFormat f, int64_t k);
void quant_rows_to_image(const QuantizedRows& q, uint8_t* dst);  // dst: n * row bytes
// kInvalidArgument when k is not a positive multiple of kQuantGroup.
QuantizedRows quant_rows_from_image(const uint8_t* src, int64_t n, int64_t k, QuantFormat f);
// The values of one image row (quant_image_row_bytes(f, k) bytes at `row`), as
// dequantize_row gives them: a quantized lookup table's rows are read so (Embedding).
void dequantize_image_row(const uint8_t* row, int64_t k, QuantFormat f, float* out);
// "q8" / "q4" -> the format; kInvalidArgument naming `what` otherwise.
QuantFormat quant_format_from_name(const std::string& name, const std::string& what);

}  // namespace kiln
