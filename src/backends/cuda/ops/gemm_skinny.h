// A 16-bit GEMM for few rows (decode steps of many sequences, short encoder batches):
// y[m,n] = x[m,k]·w[n,k]ᵀ (+ bias[n]) (+ residual[m,n]) in bf16/f16 with f32 accumulation,
// for m <= kSkinnyMaxRows. cuBLASLt's tiles at such m cover n with a few dozen CTAs on
// 132 SMs (the 1B-shape o projection at 64 rows: 16 CTAs, 1.0 TB/s of weights). Here a
// CTA takes 64 or 128 weight rows and all m token rows over a 1/splits share of k, the
// `splits` CTAs of one row slice form a thread-block cluster, and they add their partial tiles
// through distributed shared memory in a fixed order (deterministic, no workspace, no
// second kernel); the bias and residual are added in f32 before the one rounding.
// Weights are requested before the kernel waits on the previous one (programmatic
// dependent launch in decode steps). Tensor cores through mma.sync m16n8k16 (weights as
// the 16-row A operand, tokens as the 8-column B operand), cp.async 4-stage pipeline.
// With KILN_CUDA_SKINNY_GEMM=1, Gemm (gemm.h) offers the configurations as extra tactics
// of its 16-bit plans and keeps one only where it times faster than cuBLASLt's algorithms.
// Off by default: on the H200 (bench/cuda_gemm_skinny_bench, CUDA graphs) it is within
// 0.9-1.08x of cuBLASLt at 16-32 rows and 0.45-0.8x at 64-128. Not for want of copies: a
// TMA load path and precomputed addresses measured the same; a 64-wide k step takes ~0.8 us
// with one 4-warp CTA an SM (ncu), and more splits pay the prologue and the cluster
// reduction on fewer steps each (bench/RESULTS.md, 2026-11-30 session 11). Tested against
// an f64 host reference in tests/backends/cuda/gemm_skinny_test.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backends/cuda/ops/gemv.h"
#include "core/dtype.h"

namespace kiln::cuda {

inline constexpr int64_t kSkinnyMaxRows = 128;
// A configuration: weight rows a CTA (64: 4 warps, 128: 8 warps, x read from L2 half as
// often) and the split count (the cluster size: at most 8, the portable limit).
struct SkinnyConfig {
  int rows, splits;
};
inline constexpr SkinnyConfig kSkinnyConfigList[] = {{64, 1},  {64, 2},  {64, 4},  {64, 8},
                                                     {128, 1}, {128, 2}, {128, 4}, {128, 8}};
inline constexpr int kSkinnyConfigs = 8;

// Whether the kernel takes this call: t bf16/f16, 1 <= m <= kSkinnyMaxRows, k % 8 == 0,
// ldy >= n and even, n even, and x, w, y, bias, residual 16-byte aligned (row starts
// included: k and ldy multiples of 8), on an sm_90 device (clusters); the caller uses
// cuBLASLt otherwise.
bool gemm_skinny_supported(DType t, int64_t m, int64_t n, int64_t k, int64_t ldy, const void* x, const void* w,
                           const void* bias, const void* y, const void* residual);

// The configurations worth timing for k: those leaving every CTA at least two 64-wide k steps.
bool gemm_skinny_config_useful(int config, int64_t k);

// Launches configuration kSkinnyConfigList[config]; ldy 0 means n (even, >= n). residual
// may be y itself (in place: each element is read before it is written by the same thread).
// act (not kSwiGlu): y = T(act(T(x·wᵀ + bias))) (+ residual, rounded again), as cuBLASLt's
// output followed by the activation pass and the residual add would give it, bit for bit.
void launch_gemm_skinny(int config, DType t, const void* x, const void* w, const void* bias, const void* residual,
                        void* y, int64_t m, int64_t n, int64_t k, int64_t ldy, cudaStream_t s,
                        GemvEpilogue act = GemvEpilogue::kNone);

}  // namespace kiln::cuda
