// Device-side helpers shared by the CUDA kernels: conversions between the storage
// types (f32, f16, bf16) and f32 math, the one dtype dispatch macro, warp reductions.
// Included only by .cu files; exercised by every op test in tests/backends/cuda/.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <utility>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/ops/elementwise.h"
#include "core/dtype.h"
#include "core/status.h"

namespace kiln::cuda {

template <typename T> __device__ __forceinline__ float to_f32(T x);
template <> __device__ __forceinline__ float to_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ float to_f32<__half>(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// V elements of E moved as one aligned load or store (the 16-byte-a-thread kernels).
template <typename E, int V>
struct alignas(V * sizeof(E)) Vec {
  E e[V];
};

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// WarpOp over a block of blockDim.x threads (a multiple of 32, at most 1024); every thread
// gets the result; lanes past the block's warps contribute 0 (the identity of the sum,
// and of the max of values >= 0). `scratch` holds 32 floats of shared memory.
template <float (*WarpOp)(float)>
__device__ __forceinline__ float block_reduce(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = WarpOp(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = int(blockDim.x) >> 5;
  v = lane < warps ? scratch[lane] : 0.0f;
  return WarpOp(v);
}
__device__ __forceinline__ float block_sum(float v, float* scratch) { return block_reduce<warp_sum>(v, scratch); }
// Of values >= 0; a NaN is dropped (fmaxf).
__device__ __forceinline__ float block_max(float v, float* scratch) { return block_reduce<warp_max>(v, scratch); }

// GELU (erf form) = x Phi(x), Phi(x) = erfc(-x / sqrt2) / 2, with erfc(t) for t = |x| / sqrt2
// as tau exp(-t^2 + P(tau)), tau = 1 / (1 + t/2): the Chebyshev fit of Numerical Recipes'
// erfcc (fractional error < 1.2e-7), x >= 0 taking x - (x/2) erfc(t). In f32 (t^2 = x^2/2
// exact inside the FMA) with an exact reciprocal its worst relative error against the exact
// GELU was 8.6e-7 over [-12, 12] (outputs above 1.2e-5 in magnitude; checked on every
// float), against 1.3e-6 for 0.5x * erfcf(-x/sqrt2) evaluated in f32, the CPU reference's
// formula; tau now comes from the approximate reciprocal (MUFU.RCP, within 1 ulp, so tau
// within 2 ulp), which adds at most a few 1e-7 (the GPU op tests hold it to the CPU's
// GELU). It is a third of erfcf's instructions (PTX: 24 vs 75), which made GELU passes
// compute-bound: the W8A8 FFN-up's GELU-to-codes pass over [4096, 3072] took ~25 us for
// 38 MB. The IEEE division's slow-path call had cost the GELU epilogue of the int8 GEMM
// (cuda_int8_gemm_bench, FFN up at 4096 rows) 56.3 us against 37.1 now.
__device__ __forceinline__ float gelu_erf_f32(float x) {
  const float a = fabsf(x);
  const float tau = __fdividef(1.0f, fmaf(0.35355339059327373f, a, 1.0f));
  float p = 0.17087277f;
  p = fmaf(p, tau, -0.82215223f);
  p = fmaf(p, tau, 1.48851587f);
  p = fmaf(p, tau, -1.13520398f);
  p = fmaf(p, tau, 0.27886807f);
  p = fmaf(p, tau, -0.18628806f);
  p = fmaf(p, tau, 0.09678418f);
  p = fmaf(p, tau, 0.37409196f);
  p = fmaf(p, tau, 1.00002368f);
  p = fmaf(p, tau, -1.26551223f);
  const float e = tau * expf(fmaf(-0.5f * a, a, p));  // erfc(t)
  const float h = 0.5f * x;
  return x >= 0.0f ? fmaf(-h, e, x) : h * e;
}

// The activations in f32: GELU-erf as above, x/(1+e^-2u) for GELU-tanh (the CPU
// reference's formula); shared by the elementwise kernels, GEMV and GEMM epilogues.
template <UnaryOp kOp>
__device__ __forceinline__ float unary_f32(float x) {
  if constexpr (kOp == UnaryOp::kGeluErf) return gelu_erf_f32(x);
  if constexpr (kOp == UnaryOp::kGeluTanh) {
    const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    return x / (1.0f + expf(-2.0f * u));
  }
  if constexpr (kOp == UnaryOp::kSilu) return x / (1.0f + expf(-x));
  return tanhf(x);
}

// Programmatic dependent launch (Hopper+): kernels launched by launch_k may start while the
// previous kernel on the stream is still finishing (their launch latency and block
// scheduling overlap its tail). Every kernel so launched calls pdl_wait() before touching
// memory that a kernel writes - it returns once the previous kernel has completed and its
// writes are visible - and every grid has threads that wait before they store, so a grid
// completes only after all before it. Weights are never written by a kernel: the GEMVs
// request their first weights before pdl_wait(), and the norms their parameters.
// Where the trigger sits:
// - the streaming GEMVs and the decode attention call pdl_trigger() once their main loop
//   has read the weights / the cache, letting the next kernel launch while they reduce
//   and store;
// - in decode steps of a few rows (<= kGemvMaxRows), the latency-bound kernels (norms,
//   embedding, the fused decode attention) trigger at their start, so the GEMV after them launches at once and streams its weights while they run;
// - everything else triggers implicitly as its blocks exit (a trigger at the start let
//   early dependents, cuBLASLt's GEMMs among them, take SM slots that multi-wave grids
//   still needed: BERT-base batch 32 +11%).
// A dependent launches only once every CTA of its primary has triggered (so is resident)
// or exited; a kernel whose CTAs wait on other CTAs or other GPUs must not trigger early
// unless those are guaranteed to run: the P2P all-reduce (ops/allreduce.cu) spins on peer
// flags and so launches without the attribute and never triggers. Both are no-ops before
// sm_90 and when launched without the attribute. KILN_CUDA_PDL=0 turns the attribute off.
// Measured on the H200: decode steps (GEMV chains) gain 1-9%; steps with cuBLASLt GEMMs
// (prefill, encoders) lost 7-10%, so those keep plain launches. The W8A8 Linears' CUTLASS
// GEMMs take part (ops/cutlass_launch.cuh): a graph whose every GEMM is one uses dependent
// launch in its steps of up to kPdlMaxStepRows rows too (convert.h: pdl_in_step).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Starts pulling the line holding p toward L1 (no result, no fault on a valid address):
// read-only parameters requested before pdl_wait().
__device__ __forceinline__ void prefetch_l1(const void* p) {
  asm volatile("prefetch.global.L1 [%0];\n" ::"l"(p));
}

// Whether launches on the current device carry the programmatic-serialization attribute:
// a Hopper-class device, KILN_CUDA_PDL not 0, and this thread's steps allow it
// (set_pdl_allowed in convert.h; the backend allows it in decode steps and pdl_in_step's).
bool pdl_enabled();

// launch_k for a kernel whose blocks form thread-block clusters of `cluster` (sm_90+;
// a 1x1x1 cluster launches without the attribute).
template <typename... Params, typename... Args>
inline void launch_k_cluster(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                             dim3 cluster, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (pdl_enabled()) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (cluster.x * cluster.y * cluster.z > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster.x;
    attr[n].val.clusterDim.y = cluster.y;
    attr[n].val.clusterDim.z = cluster.z;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  KILN_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

template <typename... Params, typename... Args>
inline void launch_k(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args&&... args) {
  launch_k_cluster(kernel, grid, block, smem, s, dim3(1, 1, 1), std::forward<Args>(args)...);
}

inline unsigned grid_for(int64_t n, int threads, int64_t max_blocks = 65535LL * 32) {
  int64_t b = (n + threads - 1) / threads;
  return unsigned(b < 1 ? 1 : (b > max_blocks ? max_blocks : b));
}

}  // namespace kiln::cuda

// Runs the statement with `T` bound to the storage type of a float DType; the single
// place where a runtime dtype becomes a template argument.
#define KILN_CUDA_DISPATCH_FLOAT(dtype, T, ...)                                        \
  switch (dtype) {                                                                     \
    case ::kiln::DType::kF32: { using T = float; __VA_ARGS__; break; }                  \
    case ::kiln::DType::kF16: { using T = __half; __VA_ARGS__; break; }                 \
    case ::kiln::DType::kBF16: { using T = __nv_bfloat16; __VA_ARGS__; break; }         \
    default:                                                                           \
      ::kiln::throw_error(::kiln::ErrorCode::kUnsupported, "cuda: dtype ",              \
                          ::kiln::dtype_name(dtype), " is not a float storage type");  \
  }
