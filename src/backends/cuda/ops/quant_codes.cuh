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

// q4 on the 8-bit grid (gemv_quant.h, QuantWeightView::grid8): a group's 16-bit word holds
// its scale code (low byte, 0..255) and its min code + 128 (high byte); its super-group's
// word the exponents Es + 127 (low byte) and Em + 127. The scale and min as floats:
// code * 2^E, the same values as the f16 ones they stand for. `word`: the group's word in
// the low half, the super-group's in the high half.
__device__ __forceinline__ void grid8_scale_min(uint32_t word, float& s, float& mn) {
  const float sc = __uint_as_float(__byte_perm(word, 0x4B000000u, 0x7650)) - 0x1p23f;
  const float mc = __uint_as_float(__byte_perm(word, 0x4B000000u, 0x7651)) - (0x1p23f + 128.0f);
  s = sc * __uint_as_float((word >> 16 & 0xFFu) << 23);
  mn = mc * __uint_as_float((word >> 24) << 23);
}

// Where group g's word and its super-group's lie in a row of a grid8 scale array: 9 words
// a super-group (its exponents, then its up to 8 groups' codes).
// (The image builder, gemv_quant.cu, writes the words at these places.)
static_assert(kQ4SuperGroups == 8, "grid8's word positions assume super-groups of 8 groups");
__host__ __device__ constexpr int grid8_code_at(int g) { return g + (g >> 3) + 1; }
__host__ __device__ constexpr int grid8_exps_at(int g) { return (g >> 3) * 9; }
__host__ __device__ constexpr int grid8_row_words(int groups) { return groups + (groups + 7) / 8; }

// The scale (and q4 min) that chunk c of weight row `row` uses (grid8: a q4 weight on
// the 8-bit grid).
template <QuantFormat F>
__device__ __forceinline__ void load_scale(const void* scales, int64_t row, int groups, int c,
                                           float& s, float& mn, bool grid8 = false) {
  if (F == QuantFormat::kQ4 && grid8) {
    const auto* p = static_cast<const unsigned short*>(scales) + row * grid8_row_words(groups);
    grid8_scale_min(
        uint32_t(__ldg(p + grid8_code_at(c))) | uint32_t(__ldg(p + grid8_exps_at(c))) << 16, s, mn);
    return;
  }
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
