// Weight-streaming GEMV (see gemv.h), one kernel templated on the weight format: 16-bit
// weights times 16-bit x, or FP8 E4M3 codes times E4M3 x codes with one scale (fp8.h's
// launch_fp8_gemv). A warp (or S warps, split-K) owns one output feature: lane j reads
// 16-byte chunks j, j+32, ... of the weight row, kUnroll of them issued before any is
// used so enough bytes are in flight to cover DRAM latency; x (tiny, shared by every
// warp) comes through the read-only cache. Weights are loaded with the streaming hint
// (evict-first) so they do not push x and the KV cache out of L2. The first kUnroll chunks
// are requested before pdl_wait(): weights are never written by a kernel, so in a decode
// step they stream in while the previous kernel finishes. With a norm prologue (GemvFusion) x is instead normalized by each block into shared memory first:
// the rows are at most kGemvMaxRows x a hidden size, an L2-resident read per block.
#include <cuda_fp8.h>

#include <cstdlib>
#include <cstring>

#include "backends/cuda/common.cuh"
#include "backends/cuda/ops/fp8.h"
#include "backends/cuda/ops/gemv.h"
#include "backends/cuda/ops/gemv_norm.cuh"
#include "backends/cuda/ops/linear_common.cuh"
#include "core/env_switch.h"

namespace kiln::cuda {
namespace {

constexpr int kWarps = 4, kUnroll = 8;

// 16-bit weights and activations of type T: 8 per 16-byte chunk.
template <typename T>
struct Wide16 {
  using X = T;
  using W = T;
  using Y = T;
  static constexpr int kPerChunk = 8;
  // acc += Σ of the 8 products of one chunk of weights and x.
  __device__ static __forceinline__ void fma(float& acc, uint4 w, uint4 x) {
    const T* wv = reinterpret_cast<const T*>(&w);
    const T* xv = reinterpret_cast<const T*>(&x);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc = fmaf(to_f32(wv[i]), to_f32(xv[i]), acc);
  }
};

// FP8 E4M3 codes for weights and x, 16 per chunk, bf16 out. Both decode through
// cvt.e4m3x2 -> f16x2 (exact: every E4M3 value is an f16) and multiply in f32, where the
// product of two E4M3 values is exact.
struct E4M3 {
  using X = uint8_t;
  using W = uint8_t;
  using Y = __nv_bfloat16;
  static constexpr int kPerChunk = 16;
  __device__ static __forceinline__ void fma(float& acc, uint4 w, uint4 x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
    // E4M3 conversions are instructions from sm_89 on; emulating them bloats the portable
    // PTX for no use (the FP8 Linear refuses older devices at compile time).
    __trap();
#else
    const uint32_t wv[4] = {w.x, w.y, w.z, w.w}, xv[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float wf[4], xf[4];
      decode4(wv[i], wf);
      decode4(xv[i], xf);
#pragma unroll
      for (int j = 0; j < 4; ++j) acc = fmaf(wf[j], xf[j], acc);
    }
#endif
  }
  // Four E4M3 codes (little-endian in v) as f32.
  __device__ static __forceinline__ void decode4(uint32_t v, float* out) {
    const __half2 lo(__nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(v & 0xffffu), __NV_E4M3));
    const __half2 hi(__nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(v >> 16), __NV_E4M3));
    const float2 a = __half22float2(lo), b = __half22float2(hi);
    out[0] = a.x;
    out[1] = a.y;
    out[2] = b.x;
    out[3] = b.y;
  }
};

// R = 2 (SwiGLU): the warp streams the gate row and the up row of its output feature.
// S > 1 (split-K): S warps share a row, warp part p reading chunks p*32 + lane + S*32*j,
// and their sums meet in shared memory. Few rows (n of a few thousand) then still give
// enough warps to keep every SM's loads in flight. The sums are multiplied by `scale`
// (1 for 16-bit weights, exact) before the bias.
// kNorm: the norm prologue, x normalized into dynamic shared memory (16-bit formats only).
// The residual (may alias y) is added to each stored output when not null.
template <typename F, int M, GemvEpilogue E, int S, bool kNorm>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_kernel(const typename F::X* __restrict__ x, const typename F::W* __restrict__ w,
                float scale, const typename F::Y* __restrict__ bias, typename F::Y* y, int n, int k,
                GemvNorm norm, const float* __restrict__ gamma, const float* __restrict__ beta,
                float eps, const typename F::Y* residual, bool bias_early, bool trigger_early) {
  using T = typename F::Y;
  constexpr int R = E == GemvEpilogue::kSwiGlu ? 2 : 1;
  extern __shared__ uint4 gemv_xs[];  // kNorm: the M normalized rows
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, part = warp % S;
  const int row = blockIdx.x * (kWarps / S) + warp / S;
  if (trigger_early) pdl_trigger();  // GemvFusion::trigger_early
  // A warp without a row is done unless it joins a barrier below (split-K, norm prologue).
  // Returning before pdl_wait() is safe: the warps that store wait, so this grid still
  // completes only after the previous one.
  if constexpr (S == 1 && !kNorm) {
    if (row >= n) return;
  }
  const bool live = row < n;
  const int kv = live ? k / F::kPerChunk : 0;  // 16-byte chunks per row
  const uint4* wr[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    // Gate row (r = 0) and up row (r = 1) of output `row`: n rows apart.
    const int64_t wrow = (live ? row : 0) + int64_t(r) * n;
    wr[r] = reinterpret_cast<const uint4*>(w + wrow * k);
  }
  const uint4* xr = reinterpret_cast<const uint4*>(x);
  float acc[R][M];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;
  uint4 wv[R][kUnroll];
  auto load_w = [&](int i0) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int i = i0 + u * 32 * S;
        wv[r][u] = i < kv ? __ldcs(wr[r] + i) : make_uint4(0, 0, 0, 0);
      }
  };
  const int first = part * 32 + lane;
  // The first weight chunks are requested before anything waits: weights are never
  // written by a kernel, so they may stream in while the previous kernel finishes
  // (dependent launch) and, with a norm prologue, while the block normalizes x.
  load_w(first);
  // So is the bias (a weight): read here, it is not an L2 round trip after the reduction.
  float bv[R];
#pragma unroll
  for (int r = 0; r < R; ++r) bv[r] = bias_early && bias && live ? to_f32(bias[row + r * n]) : 0.0f;
  pdl_wait();  // programmatic dependent launch: the previous kernel's writes (x) are visible
  if constexpr (kNorm) {
    gemv_norm_rows<T, M, kWarps>(xr, gemv_xs, k / F::kPerChunk, k, norm, gamma, beta, eps);
    if (S == 1 && !live) return;
  }
  for (int i0 = first; i0 < kv; i0 += S * 32 * kUnroll) {
    if (i0 != first) load_w(i0);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = i0 + u * 32 * S;
      if (i < kv) {
#pragma unroll
        for (int m = 0; m < M; ++m) {
          uint4 xv;
          if constexpr (kNorm) xv = gemv_xs[m * kv + i];
          else xv = __ldg(xr + int64_t(m) * kv + i);
#pragma unroll
          for (int r = 0; r < R; ++r) F::fma(acc[r][m], wv[r][u], xv);
        }
      }
    }
  }
  pdl_trigger();  // the weights are read: the next kernel may launch (it waits for our writes)
  if constexpr (S > 1) {
    __shared__ float red[kWarps][R][M];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const float v = warp_sum(acc[r][m]);
        if (lane == 0) red[warp][r][m] = v;
      }
    __syncthreads();
    if (part != 0 || !live) return;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float v = 0.0f;
#pragma unroll
        for (int p = 0; p < S; ++p) v += red[warp + p][r][m];
        acc[r][m] = lane == 0 ? v : 0.0f;  // the warp_sum below then leaves v unchanged
      }
  }
#pragma unroll
  for (int m = 0; m < M; ++m) {
    float v[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      v[r] = warp_sum(acc[r][m]) * scale;
      if (bias) v[r] += bias_early ? bv[r] : to_f32(bias[row + r * n]);
    }
    if (lane != 0) continue;
    // Rounded as the unfused kernels would (linear_common.cuh).
    const int64_t at = int64_t(m) * n + row;
    T out;
    if constexpr (E == GemvEpilogue::kSwiGlu) out = linear_swiglu_out<T>(v[0], v[R - 1]);
    else out = linear_epilogue_out<T>(E, v[0]);
    // The residual add of the unfused graph read the stored T output: round, add, round.
    if (residual) out = from_f32<T>(to_f32(out) + to_f32(residual[at]));
    y[at] = out;
  }
}

// What launch_format passes through to the kernel besides the GEMV's own operands.
template <typename F>
struct Fused {
  GemvNorm norm = GemvNorm::kNone;
  const float* gamma = nullptr;
  const float* beta = nullptr;
  float eps = 0.0f;
  const typename F::Y* residual = nullptr;
  int splits = 0;  // GemvFusion::splits
  bool trigger_early = false;
};

template <typename F, GemvEpilogue E, int S, bool kNorm>
void launch_split_norm(const typename F::X* x, const typename F::W* w, float scale, const typename F::Y* b,
                       typename F::Y* y, int64_t m, int64_t n, int64_t k, cudaStream_t s, const Fused<F>& f) {
  const dim3 grid(unsigned((n * S + kWarps - 1) / kWarps));
  const size_t smem = kNorm ? size_t(m * k) * sizeof(typename F::X) : 0;
#define KILN_GEMV_LAUNCH(M_)                                                                       \
  launch_k(gemv_kernel<F, M_, E, S, kNorm>, grid, kWarps * 32, smem, s, x, w, scale, b, y, int(n), \
           int(k), f.norm, f.gamma, f.beta, f.eps, f.residual, gemv_bias_early(), f.trigger_early)
  switch (m) {
    case 1: KILN_GEMV_LAUNCH(1); break;
    case 2: KILN_GEMV_LAUNCH(2); break;
    case 3: KILN_GEMV_LAUNCH(3); break;
    default: KILN_GEMV_LAUNCH(4); break;
  }
#undef KILN_GEMV_LAUNCH
}

// The norm prologue exists for 16-bit x only (one row element per 2 bytes of shared memory).
template <typename F, GemvEpilogue E, int S>
void launch_split(const typename F::X* x, const typename F::W* w, float scale, const typename F::Y* b,
                  typename F::Y* y, int64_t m, int64_t n, int64_t k, cudaStream_t s, const Fused<F>& f) {
  if constexpr (F::kPerChunk == 8) {
    if (f.norm != GemvNorm::kNone) return launch_split_norm<F, E, S, true>(x, w, scale, b, y, m, n, k, s, f);
  }
  launch_split_norm<F, E, S, false>(x, w, scale, b, y, m, n, k, s, f);
}

// Warps per output row (split-K), from the H200 sweep of `cuda_gemv_bench` (bench/RESULTS.md,
// 2026-12-01 session 18: 1, 2, 4 splits at 1, 2, 4 token rows on the Llama-3.1-8B, TinyLlama
// and GPT-2 Linears): the most splits that leave each warp a slice of at least min_slice
// elements of K - 1024 at one token row (8B gate|up 60.1 -> 55.9 us, down 36.2 -> 34.0 us against one
// split; TinyLlama's k = 2048 slower at 4), 1280 at more rows (8B gate|up at 2 rows 64.4
// -> 58.9 us at 2 splits; 4 lose there) - and more for short outputs, until about 2048
// warps stream the matrix, slices of at least 512 (GPT-2's 768x3072 projection at 2 rows:
// 6.0 us unsplit, 4.2 us at 4 splits; its 768x768 o projection split in 2 made the whole
// step ~3% slower, paired median of a binary A/B).
int split_for(int64_t m, int64_t n, int64_t k) {
  const int64_t min_slice = m == 1 ? 1024 : 1280;
  int s = k >= 4 * min_slice ? 4 : k >= 2 * min_slice ? 2 : 1;
  while (s < 4 && n * s < 2048 && k / (2 * s) >= 512) s *= 2;
  return s;
}

template <typename F, GemvEpilogue E>
void launch_rows(const typename F::X* x, const typename F::W* w, float scale, const typename F::Y* b,
                 typename F::Y* y, int64_t m, int64_t n, int64_t k, cudaStream_t s, const Fused<F>& f) {
  switch (f.splits ? f.splits : split_for(m, n, k)) {
    case 1: launch_split<F, E, 1>(x, w, scale, b, y, m, n, k, s, f); break;
    case 2: launch_split<F, E, 2>(x, w, scale, b, y, m, n, k, s, f); break;
    default: launch_split<F, E, 4>(x, w, scale, b, y, m, n, k, s, f); break;
  }
}

// The one dispatch from the runtime epilogue to the kernel's template argument.
template <typename F>
void launch_format(const void* x, const void* w, float scale, const void* bias, void* y, int64_t m, int64_t n,
                   int64_t k, cudaStream_t s, GemvEpilogue epi, const GemvFusion& fusion = {}) {
  auto* xt = static_cast<const typename F::X*>(x);
  auto* wt = static_cast<const typename F::W*>(w);
  auto* bt = static_cast<const typename F::Y*>(bias);
  auto* yt = static_cast<typename F::Y*>(y);
  const Fused<F> f{fusion.norm,
                   fusion.gamma,
                   fusion.beta,
                   fusion.eps,
                   static_cast<const typename F::Y*>(fusion.residual),
                   fusion.splits,
                   fusion.trigger_early};
  switch (epi) {
    case GemvEpilogue::kNone: launch_rows<F, GemvEpilogue::kNone>(xt, wt, scale, bt, yt, m, n, k, s, f); break;
    case GemvEpilogue::kGeluErf: launch_rows<F, GemvEpilogue::kGeluErf>(xt, wt, scale, bt, yt, m, n, k, s, f); break;
    case GemvEpilogue::kGeluTanh: launch_rows<F, GemvEpilogue::kGeluTanh>(xt, wt, scale, bt, yt, m, n, k, s, f); break;
    case GemvEpilogue::kSilu: launch_rows<F, GemvEpilogue::kSilu>(xt, wt, scale, bt, yt, m, n, k, s, f); break;
    case GemvEpilogue::kSwiGlu: launch_rows<F, GemvEpilogue::kSwiGlu>(xt, wt, scale, bt, yt, m, n, k, s, f); break;
  }
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool gemv_bias_early() {
  static const bool on =
      env_switch("KILN_CUDA_GEMV_BIAS_EARLY", "the GEMVs read bias and row factors before the wait",
                 "after their main loop");
  return on;
}

bool gemv_enabled_from_env() {
  const char* e = std::getenv("KILN_CUDA_GEMV");
  if (!e || !*e || std::strcmp(e, "1") == 0) return true;
  if (std::strcmp(e, "0") == 0) return false;
  throw_error(ErrorCode::kInvalidArgument, "KILN_CUDA_GEMV='", e,
              "': expected 1 (the default: few-row Linears take the GEMV) or 0 (cuBLASLt only)");
}

bool gemv_supports(DType dtype, int64_t m, int64_t k) {
  return (dtype == DType::kBF16 || dtype == DType::kF16) && m >= 1 && m <= kGemvMaxRows && k % 8 == 0 &&
         k < (int64_t(1) << 30);
}

bool gemv_norm_supports(DType dtype, int64_t m, int64_t k) {
  return gemv_supports(dtype, m, k) && m * k * int64_t(dtype_size(dtype)) <= kGemvNormSmemBytes;
}

void launch_gemv(DType dtype, const void* x, const void* w, const void* bias, void* y, int64_t m, int64_t n,
                 int64_t k, cudaStream_t s, GemvEpilogue epi, const GemvFusion& fusion) {
  KILN_THROW_IF(!gemv_supports(dtype, m, k), kInternal, "cuda gemv: unsupported ", dtype_name(dtype), " m=", m,
                " k=", k);
  KILN_THROW_IF(fusion.norm != GemvNorm::kNone && (!gemv_norm_supports(dtype, m, k) || !fusion.gamma), kInternal,
                "cuda gemv: no norm prologue for ", dtype_name(dtype), " m=", m, " k=", k);
  KILN_THROW_IF(fusion.splits != 0 && fusion.splits != 1 && fusion.splits != 2 && fusion.splits != 4, kInternal,
                "cuda gemv: ", fusion.splits, " splits (expected 1, 2 or 4)");
  if (n == 0) return;
  if (dtype == DType::kBF16)
    launch_format<Wide16<__nv_bfloat16>>(x, w, 1.0f, bias, y, m, n, k, s, epi, fusion);
  else
    launch_format<Wide16<__half>>(x, w, 1.0f, bias, y, m, n, k, s, epi, fusion);
}

bool fp8_gemv_supports(int64_t m, int64_t k) {
  return m >= 1 && m <= kGemvMaxRows && k % 16 == 0 && k > 0 && k < (int64_t(1) << 30);
}

void launch_fp8_gemv(const uint8_t* x, const uint8_t* w, float scale, const void* bias, void* y, int64_t m,
                     int64_t n, int64_t k, cudaStream_t s, GemvEpilogue epi) {
  KILN_THROW_IF(!fp8_gemv_supports(m, k), kInternal, "cuda fp8 gemv: unsupported m=", m, " k=", k);
  if (n == 0) return;
  launch_format<E4M3>(x, w, scale, bias, y, m, n, k, s, epi);
}

}  // namespace kiln::cuda
