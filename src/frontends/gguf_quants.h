// ggml tensor types as stored in GGUF files, and dequantization of their blocks to f32,
// following ggml's block layouts (ggml-common.h) and dequantize_row_* (ggml-quants.c).
// Tested in tests/frontends/gguf_test.cpp against values from the Python gguf package.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

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
// code, or nullopt: Q8_0 -> q8 (scale d), Q4_0 -> q4 (scale d, min -8d), Q4_1 -> q4
// (scale d, min m), all with row factor 1. K-quants and the rest have no exact image
// (super-block scales, 5/6-bit codes) and keep the dequantize-then-quantize path.
std::optional<QuantFormat> ggml_exact_quant_format(uint32_t type);

// Re-lays n rows of k elements of ggml type `type` (rows contiguous, k % 32 == 0) as
// kiln QuantizedRows holding the same values: dequantize_row of row r equals ggml's own
// dequantization of that row. nullopt when the type has no exact image or a block does
// not fit the format (a Q8_0 code of -128, or a Q4_0 min -8d that overflows f16); the
// caller then dequantizes instead. kInvalidArgument when k is not a multiple of 32.
std::optional<QuantizedRows> ggml_to_quantized_rows(uint32_t type, const uint8_t* src, int64_t n, int64_t k);

}  // namespace kiln
