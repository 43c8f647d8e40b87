// Linear layers with a handful of token rows (batch-small decode): y[m,n] = x[m,k]·w[n,k]ᵀ
// (+ bias) as a weight-streaming GEMV, one warp (or 2-4 warps, split-K, when the output has
// few features) per output feature reading its weight row with 16-byte loads, several in
// flight per lane, f32 accumulation, and an optional activation/SwiGLU epilogue. cuBLASLt's choices
// for m=1 leave bandwidth unused; this reads each weight byte once at near copy speed.
// Tested against the CPU backend through the Linear cases of tests/backends/cuda/ops_test.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace kiln::cuda {

constexpr int64_t kGemvMaxRows = 4;

// What is applied to each output before it is stored (pass fuse_linear_activation, and
// SwiGLU after a merged gate|up projection). Results are rounded to the storage type
// exactly where the unfused GEMV -> elementwise kernels would round them, so fused and
// unfused give the same bits.
enum class GemvEpilogue : uint8_t { kNone, kGeluErf, kGeluTanh, kSilu, kSwiGlu };

// Whether launch_gemv handles this shape (16-bit dtype, m <= kGemvMaxRows, k % 8 == 0).
bool gemv_supports(DType dtype, int64_t m, int64_t k);
// All pointers hold `dtype` elements, 16-byte aligned; bias may be null. y is [m, n];
// with kSwiGlu, w holds 2n rows ([gate; up], bias 2n) and y = silu(gate) * up.
void launch_gemv(DType dtype, const void* x, const void* w, const void* bias, void* y, int64_t m, int64_t n,
                 int64_t k, cudaStream_t s, GemvEpilogue epi = GemvEpilogue::kNone);

}  // namespace kiln::cuda
