// Linear layers with tens of token rows (batch decode of 5-128 sequences, short prefill
// chunks): y[m,n] = x[m,k]·w[n,k]ᵀ (+ bias) for bf16/f16 operands, f32 accumulation on the
// tensor cores, streaming the weight once at near copy bandwidth. Each CTA owns a tile of
// weight rows and every token row; its weight tile and the activations flow through a
// multi-stage cp.async ring; where the weight has too few row tiles to fill the device,
// the CTAs of a thread-block cluster split K and add their partial sums through
// distributed shared memory in a fixed order (deterministic, no scratch, graph-safe).
// Epilogues as the GEMV (gemv.h): bias, GELU/SiLU, SwiGLU on a merged gate|up weight.
// Tested against the CPU backend and a host reference in tests/backends/cuda/skinny_test.cpp;
// timed against cuBLASLt by bench/cuda_gemv_bench.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backends/cuda/ops/gemv.h"
#include "core/dtype.h"

namespace kiln::cuda {

constexpr int64_t kSkinnyMaxRows = 128;
constexpr int kSkinnyMaxSplit = 8;  // CTAs of one cluster (the portable maximum)

// Whether launch_skinny_gemm handles this shape on the current device: bf16/f16,
// 1 <= m <= kSkinnyMaxRows, k % 8 == 0 (16-byte rows), an sm_80+ device (split-K needs
// sm_90's clusters; older devices run unsplit).
bool skinny_supports(DType dtype, int64_t m, int64_t k);

// The row limit that Linear dispatch uses: KILN_CUDA_SKINNY unset -> 0 (off: measured slower than cuBLASLt); "0" ->
// 0 (off: GEMV then cuBLASLt as before); a number in 1..kSkinnyMaxRows -> that limit.
// Anything else is a kiln::Error naming the variable.
int64_t skinny_rows_limit();

// The split-K factor launch_skinny_gemm picks for this shape on the current device (1..8).
int skinny_split_for(int64_t m, int64_t n_out, int64_t k, GemvEpilogue epi);

// All pointers hold `dtype` elements, 16-byte aligned; bias may be null. y is [m, n];
// w must not be written by the kernel queued just before this one (its first tiles are
// read before the programmatic-dependent-launch wait: Linear weights never are).
// with kSwiGlu, w holds 2n rows ([gate; up], bias 2n) and y = silu(gate) * up. split 0
// picks skinny_split_for (KILN_CUDA_SKINNY_SPLIT overrides it); 1..8 forces it.
void launch_skinny_gemm(DType dtype, const void* x, const void* w, const void* bias, void* y, int64_t m, int64_t n,
                        int64_t k, cudaStream_t s, GemvEpilogue epi = GemvEpilogue::kNone, int split = 0);

}  // namespace kiln::cuda
