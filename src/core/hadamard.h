// The Walsh-Hadamard transform kiln rotates vectors with (the int8/fp8 KV cache's keys,
// KvLayout::k_rotate; W8A8 Linear inputs, quant/w8a8.h's `hadamard`): unnormalized, over
// blocks of b values where b is the largest power of two dividing the vector's length
// (64 -> 64, 96 -> 32, 1536 -> 512), butterflies x[j], x[j + h] -> x[j] + x[j + h],
// x[j] - x[j + h] for h = 1, 2, 4, ... in that order, so every backend rounds alike. H is
// symmetric with H H = b I. Tested in tests/backends/cpu/kv_int8_test.cpp (KvRotation).
#pragma once

#include <cstdint>

namespace kiln {

// The block of the transform of a vector of d values: d & -d.
inline int64_t hadamard_block(int64_t d) { return d & -d; }

// x[0, d) through the transform, in place.
inline void hadamard_transform(float* x, int64_t d) {
  const int64_t b = hadamard_block(d);
  for (int64_t h = 1; h < b; h *= 2)
    for (int64_t i = 0; i < d; i += 2 * h)  // 2h divides b, which divides d: no pair crosses a block
      for (int64_t j = i; j < i + h; ++j) {
        const float a = x[j], c = x[j + h];
        x[j] = a + c;
        x[j + h] = a - c;
      }
}

}  // namespace kiln
