// ggml tensor types as stored in GGUF files, and dequantization of their blocks to f32,
// following ggml's block layouts (ggml-common.h) and dequantize_row_* (ggml-quants.c).
// Tested in tests/frontends/gguf_test.cpp against values from the Python gguf package.
#pragma once

#include <cstddef>
#include <cstdint>

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

}  // namespace kiln
