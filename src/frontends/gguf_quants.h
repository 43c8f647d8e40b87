// ggml tensor types as stored in GGUF files, dequantization of their blocks to f32
// following ggml's block layouts (ggml-common.h) and dequantize_row_* (ggml-quants.c),
// and the re-lay of Q8_0 / Q4_0 / Q4_1 / Q4_K blocks as kiln q8 / q4 codes. Tested in
// tests/frontends/gguf_test.cpp against values from the Python gguf package.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "core/tensor.h"
#include "core/weight_quant.h"

namespace kiln {

// Numbering is ggml's `enum ggml_type`, which GGUF stores on disk.
enum class GgmlType : uint32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ8_1 = 9,
  kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kQ8_K = 15,
  kI8 = 24, kI16 = 25, kI32 = 26, kI64 = 27, kF64 = 28, kBF16 = 30,
};

struct GgmlTypeTraits {
  const char* name;
  int64_t block_size;  // elements per block (1 for plain types)
  size_t type_size;    // bytes per block
  // Dequantizes n elements (a multiple of block_size) from src; null when unsupported.
  void (*to_f32)(const uint8_t* src, float* dst, int64_t n);
};

// Traits of a type kiln knows, or nullptr (an unknown or unsupported type id).
const GgmlTypeTraits* ggml_type_traits(uint32_t type);
// "Q4_K", or "type 123" for an unknown id.
const char* ggml_type_name(uint32_t type);

// The kiln weight format (core/weight_quant.h) a ggml type maps onto exactly, code for
// code, or nullopt: Q8_0 -> q8 (scale d), Q5_0 -> q8 (codes q - 16, scale d), Q4_0 -> q4
// (scale d, min -8d), Q4_1 -> q4 (scale d, min m), all with row factor 1.
std::optional<QuantFormat> ggml_exact_quant_format(uint32_t type);
// The kiln format whose codes a ggml type keeps at load (--weight-dtype q8/q4): the exact
// ones above, and Q4_K -> q4, which is *nearly* exact: each 32-element sub-block is one
// q4 group with the identical 4-bit codes, scale d * sc and min -dmin * m, but those
// products are rounded to f16 (to nearest, relative error <= 2^-11 each, under a
// per-row power-of-two row factor that keeps them in f16's normal range), so an element
// differs from ggml's d * sc * q - dmin * m by at most (2^-11 + 2^-22) * (|d * sc * q| +
// |dmin * m|) (the last term: f32 rounding of both sums). The types whose codes have no
// q8/q4 image (5- and 6-bit codes with a min or under 16-element sub-blocks, or 2/3-bit
// codes: Q5_1, Q2_K, Q3_K, Q5_K, Q6_K) map onto q8 by requantization (ggml_requantized_to_q8),
// so a Q4_K_M / Q5_K_M / Q6_K file's Linears all stay quantized instead of expanding to
// f32: 8.5 bits a weight instead of the file's 2.6-6.6 (Q6_K: 6.56), each value moved
// by at most half a q8 step (<= amax / 254 of its group of 32, about 1/8 of a Q6_K step).
std::optional<QuantFormat> ggml_kept_quant_format(uint32_t type);
// True for the types ggml_kept_quant_format maps onto q8 by dequantizing each row and
// quantizing it again (quantize_row), rather than by keeping their codes.
bool ggml_requantized_to_q8(uint32_t type);

// Re-lays n rows of k elements of ggml type `type` (rows contiguous, k a multiple of the
// type's block size) as kiln QuantizedRows holding the same codes: dequantize_row of
// row r equals ggml's own dequantization of that row (Q4_K: within the bound above;
// requantized types: quantize_row of that dequantization, the bits --weight-dtype q8
// gives the f32 weight). nullopt when the type has no kept format, a requantized row
// holds a non-finite value, or a block does not fit it (a Q8_0 code of
// -128, a Q4_0 min -8d that overflows f16, a Q4_K row whose nonzero scales / mins span
// more than f16's normal range under one row factor, or a non-finite Q4_K d / dmin);
// the caller then dequantizes instead. kInvalidArgument when k is not a positive
// multiple of the block size (32, Q4_K 256). Rows are converted in parallel.
std::optional<QuantizedRows> ggml_to_quantized_rows(uint32_t type, const uint8_t* src, int64_t n, int64_t k);
// The same rows written straight into one u8 [n, quant_image_row_bytes] image (the layout
// quant_rows_to_image writes; how a kept weight travels in the graph): what loading uses,
// one copy of the weight fewer than QuantizedRows and an image. ggml_to_quantized_rows is
// this image read back (quant_rows_from_image).
std::optional<Tensor> ggml_to_quantized_image(uint32_t type, const uint8_t* src, int64_t n, int64_t k);

}  // namespace kiln
