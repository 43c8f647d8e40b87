// Element types and conversions between them. f16/bf16/fp8-e4m3 are stored as raw
// bits; conversions round to nearest even, as PyTorch does. Tested in
// tests/core/dtype_test.cpp against exhaustive/known values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace kiln {

enum class DType : uint8_t { kF32, kF16, kBF16, kI8, kFP8E4M3, kI32, kI64, kU8 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);
// Parses "f32", "float32", "F16", "bf16", ... ; throws kiln::Error on an unknown name.
DType dtype_from_name(std::string_view name);
bool dtype_is_float(DType t);

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float bf16_to_f32(uint16_t h) { return f32_from_bits(uint32_t(h) << 16); }
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return uint16_t(u >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
// FP8 E4M3 (OCP "E4M3FN", CUDA's __nv_fp8_e4m3): exact decoding (0x7f/0xff are NaN);
// encoding rounds to nearest even, saturates to +-448 (inf included: the "satfinite"
// rule), maps NaN to 0x7f and keeps the sign of values that round to zero.
float fp8e4m3_to_f32(uint8_t v);
uint8_t f32_to_fp8e4m3(float f);

// Converts n elements of type `from` at src into `to` at dst (float types and ints).
void dtype_convert(const void* src, DType from, void* dst, DType to, size_t n);

}  // namespace kiln
