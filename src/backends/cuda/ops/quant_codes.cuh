// The q8/q4 kRows codes on the device (gemv_quant.h's layout): codes per chunk, their exact
// float values and a chunk's scale and min. Shared by the kRows GEMV and the tile dequantizer
// (gemv_quant.cu) and the prompt GEMM that dequantizes in shared memory (qgemm.cu), so all
// three decode a weight alike.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "core/weight_quant.h"

namespace kiln::cuda {
namespace {

// The operands every q8/q4 kernel's parameters start with: x, the weight's codes, scales and
// row factors, the bias (may be null) and y.
struct QOperands {
  const void* x;
  const uint8_t* codes;
  const void* scales;
  const float* row_factor;
  const void* bias;
  void* y;
};

template <QuantFormat F>
struct QTraits {
  static constexpr int kPerChunk = F == QuantFormat::kQ4 ? 32 : 16;  // codes per 16 bytes
  static constexpr int kPerWord = kPerChunk / 4;                     // codes per 32 bits
  static constexpr int kRowDiv = F == QuantFormat::kQ4 ? 2 : 1;      // k / row bytes
};

__device__ __forceinline__ float magic(uint32_t bits) {
  return __uint_as_float(bits | 0x4B000000u);
}

// The codes of one 32-bit word as exact floats, without int-to-float conversions (a
// quarter-rate instruction): a code's bits OR-ed under the exponent of 2^23 make the
// float 2^23 + code·2^p exactly; one FMA scales it back by 2^-p and removes the offset.
// q4: code i of the word is nibble i (bits 4i..4i+3). q8: byte i holds an int8 code,
// XOR 0x80 turns it into code + 128 in [1, 255].
template <QuantFormat F>
__device__ __forceinline__ void decode_word(uint32_t v, float (&q)[QTraits<F>::kPerWord]) {
  if constexpr (F == QuantFormat::kQ4) {
    const uint32_t h = v >> 16;
    q[0] = magic(v & 0xFu) - 0x1p23f;
    q[1] = fmaf(magic(v & 0xF0u), 0x1p-4f, -0x1p19f);
    q[2] = fmaf(magic(v & 0xF00u), 0x1p-8f, -0x1p15f);
    q[3] = fmaf(magic(v & 0xF000u), 0x1p-12f, -0x1p11f);
    q[4] = magic(h & 0xFu) - 0x1p23f;
    q[5] = fmaf(magic(h & 0xF0u), 0x1p-4f, -0x1p19f);
    q[6] = fmaf(magic(h & 0xF00u), 0x1p-8f, -0x1p15f);
    q[7] = fmaf(magic(h & 0xF000u), 0x1p-12f, -0x1p11f);
  } else {
    const uint32_t u = v ^ 0x80808080u, h = u >> 16;
    q[0] = magic(u & 0xFFu) - (0x1p23f + 128.0f);
    q[1] = fmaf(magic(u & 0xFF00u), 0x1p-8f, -(0x1p15f + 128.0f));
    q[2] = magic(h & 0xFFu) - (0x1p23f + 128.0f);
    q[3] = fmaf(magic(h & 0xFF00u), 0x1p-8f, -(0x1p15f + 128.0f));
  }
}

// The scale (and q4 min) that chunk c of weight row `row` uses.
template <QuantFormat F>
__device__ __forceinline__ void load_scale(const void* scales, int64_t row, int groups, int c,
                                           float& s, float& mn) {
  if constexpr (F == QuantFormat::kQ4) {
    const uint32_t sm = __ldg(static_cast<const unsigned int*>(scales) + row * groups + c);
    s = __half2float(__ushort_as_half(uint16_t(sm & 0xFFFFu)));
    mn = __half2float(__ushort_as_half(uint16_t(sm >> 16)));
  } else {
    s = __half2float(
        __ushort_as_half(__ldg(static_cast<const unsigned short*>(scales) + row * groups + c / 2)));
    mn = 0.0f;
  }
}

}  // namespace
}  // namespace kiln::cuda
