// The one int8 activation rounding of the CUDA backend (core/int8.h's int8_quantize and
// int8_row_scale), shared by the W8A8 Linear's quantize kernel (int8.cu) and the norms
// that write the codes directly (norm.cu, the quantize fused into the producer). A fused
// producer first rounds its f32 result to its storage type T, as the unfused kernel
// stores it, so its codes and row scales are those of the unfused kernel followed by the
// quantize pass, bit for bit. The _rn intrinsics keep nvcc from contracting the steps.
// Included only by .cu files; tested in tests/backends/cuda/w8a8_test.cpp and
// int8_fuse_test.cpp.
#pragma once

#include "backends/cuda/common.cuh"

namespace kiln::cuda {

// clamp(round(x * inv), -127, 127), ties to even, NaN -> -127 (fmaxf returns the non-NaN
// operand, as the CPU's compare-and-select does).
__device__ __forceinline__ int int8_code(float x, float inv) {
  const float v = fminf(fmaxf(__fmul_rn(x, inv), -127.0f), 127.0f);
  return __float2int_rn(v);
}

// int8_code of two values, as the low and high byte, without the float-to-int
// conversions (a quarter-rate pipe): once clamped to [-127, 127], adding 1.5 * 2^23 leaves
// one unit per ulp, so the f32 add rounds to the nearest integer, ties to even (as
// __float2int_rn), and the sum's low byte is that integer's two's-complement byte. The
// same codes as int8_code, bit for bit: the quantize kernel (int8.cu) uses it, and its test
// (w8a8_test.cpp) covers every bf16 value, the ties between codes and the specials.
__device__ __forceinline__ uint32_t int8_code_pair(float a, float b, float inv) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  const float va = __fadd_rn(fminf(fmaxf(__fmul_rn(a, inv), -127.0f), 127.0f), kMagic);
  const float vb = __fadd_rn(fminf(fmaxf(__fmul_rn(b, inv), -127.0f), 127.0f), kMagic);
  return __byte_perm(__float_as_uint(va), __float_as_uint(vb), 0x0040) & 0xffffu;
}

// A row's scale from its max |x| (NaNs dropped by fmaxf): max / 127, or 1 for a row of
// zeros.
__device__ __forceinline__ float int8_row_scale_of(float amax) {
  return amax > 0.0f ? __fdiv_rn(amax, 127.0f) : 1.0f;
}
__device__ __forceinline__ float int8_inv_of(float scale) { return __fdiv_rn(1.0f, scale); }

// v as the unfused kernel would store it in T, as an f32.
template <typename T>
__device__ __forceinline__ float stored_as(float v) {
  return to_f32(from_f32<T>(v));
}

}  // namespace kiln::cuda
