// Linear layers with a handful of token rows (batch-small decode): y[m,n] = x[m,k]·w[n,k]ᵀ
// (+ bias) as a weight-streaming GEMV, one warp (or 2-4 warps, split-K, when the output has
// few features) per output feature reading its weight row with 16-byte loads, several in
// flight per lane, f32 accumulation, and an optional activation/SwiGLU epilogue. cuBLASLt's choices
// for m=1 leave bandwidth unused; this reads each weight byte once at near copy speed.
// With pass fuse_norm_linear the GEMV also takes the norm in front of it (a prologue: every
// block normalizes the few x rows into shared memory itself) and the residual add after it
// (an epilogue), so a decoder layer's RMSNorm/LayerNorm nodes launch no kernel of their own.
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

// The norm prologue and residual epilogue (pass fuse_norm_linear). With a norm, x holds
// the un-normalized rows (the residual stream) and each block first computes
// norm(x) = x / sqrt(mean(x²) + eps) * gamma (kRms) or (x - mean) / sqrt(var + eps) * gamma
// + beta (kLayer, two-pass variance) in f32, rounded to the dtype exactly where the norm
// kernel would store it, into shared memory; the dot products then read it from there.
// The residual ([m, n], `dtype`) is added to the stored result (after bias and
// activation), rounded as the separate add rounded it.
enum class GemvNorm : uint8_t { kNone, kRms, kLayer };
struct GemvFusion {
  GemvNorm norm = GemvNorm::kNone;
  const float* gamma = nullptr;  // [k] f32, 16-byte aligned
  const float* beta = nullptr;   // [k] f32 or null (kLayer only)
  float eps = 0.0f;
  const void* residual = nullptr;
  // Warps per output row (split-K): 0 the launcher's rule (gemv.cu: split_for); 1, 2 or 4
  // forces it (cuda_gemv_bench compares them).
  int splits = 0;
  // The dependent launch released at the kernel's start instead of after its main loop:
  // for a GEMV read only by the decode attention, whose few CTAs then read their tables
  // and issue their cache copies while this GEMV streams (cuda_ops.cpp sets it).
  bool trigger_early = false;
};
// Shared memory the norm prologue may take per block: the m normalized rows (m·k·2 bytes)
// must fit, so that enough blocks stay resident per SM to keep the weight stream going.
constexpr int64_t kGemvNormSmemBytes = int64_t(32) << 10;

// Whether Linears with few token rows take the GEMV (KILN_CUDA_GEMV: unset or 1, the
// default; 0: cuBLASLt only). Anything else is a kiln::Error naming the variable.
bool gemv_enabled_from_env();

// Whether the GEMVs (16-bit, FP8, dp4a q8/q4) read their per-row epilogue parameters
// (bias, the q8/q4 row factors: weights) before the dependent-launch wait instead of after
// their main loop, where each is one more L2 round trip on the kernel's critical path.
// KILN_CUDA_GEMV_BIAS_EARLY=0 keeps the late reads (A/B); read once per process.
bool gemv_bias_early();

// Whether launch_gemv handles this shape (16-bit dtype, m <= kGemvMaxRows, k % 8 == 0).
bool gemv_supports(DType dtype, int64_t m, int64_t k);
// Whether it also takes a norm prologue for it (the rows fit kGemvNormSmemBytes).
bool gemv_norm_supports(DType dtype, int64_t m, int64_t k);
// All pointers hold `dtype` elements, 16-byte aligned; bias may be null. y is [m, n];
// with kSwiGlu, w holds 2n rows ([gate; up], bias 2n) and y = silu(gate) * up. y must not
// alias x; it may alias fusion.residual.
void launch_gemv(DType dtype, const void* x, const void* w, const void* bias, void* y, int64_t m, int64_t n,
                 int64_t k, cudaStream_t s, GemvEpilogue epi = GemvEpilogue::kNone, const GemvFusion& fusion = {});

}  // namespace kiln::cuda
