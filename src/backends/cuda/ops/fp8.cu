// FP8 E4M3 activation quantization and GEMV (see fp8.h). The GEMV follows gemv.cu: a
// warp (or S warps, split-K) per output feature, lane j reading 16-byte chunks j, j+32,
// ... of the weight row (16 weights each), kUnroll chunks in flight, weights with the
// streaming hint; x codes (tiny, shared by every warp) through the read-only cache.
// Both operands decode through cvt.e4m3x2 -> f16x2 (exact: every E4M3 value is an f16)
// and multiply in f32, where the product of two E4M3 values is exact.
#include <cuda_fp8.h>

#include "backends/cuda/common.cuh"
#include "backends/cuda/ops/fp8.h"

namespace kiln::cuda {
namespace {

constexpr int kWarps = 4, kUnroll = 8;

template <typename T>
__global__ void quantize_kernel(const T* __restrict__ x, int64_t n, float inv, uint8_t* __restrict__ q) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    q[i] = __nv_cvt_float_to_fp8(to_f32(x[i]) * inv, __NV_SATFINITE, __NV_E4M3);
}

// Four E4M3 codes (little-endian in v) as f32.
__device__ __forceinline__ void decode4(uint32_t v, float* out) {
  const __half2 lo(__nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(v & 0xffffu), __NV_E4M3));
  const __half2 hi(__nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(v >> 16), __NV_E4M3));
  const float2 a = __half22float2(lo), b = __half22float2(hi);
  out[0] = a.x;
  out[1] = a.y;
  out[2] = b.x;
  out[3] = b.y;
}

// acc += Σ of the 16 products of one chunk of weights and x.
__device__ __forceinline__ void fma16(float& acc, uint4 w, uint4 x) {
  const uint32_t wv[4] = {w.x, w.y, w.z, w.w}, xv[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float wf[4], xf[4];
    decode4(wv[i], wf);
    decode4(xv[i], xf);
#pragma unroll
    for (int j = 0; j < 4; ++j) acc = fmaf(wf[j], xf[j], acc);
  }
}

// R = 2 (SwiGLU): the warp streams the gate row and the up row of its output feature.
// S > 1 (split-K): S warps share a row and meet in shared memory (gemv.cu's scheme).
template <int M, GemvEpilogue E, int S>
__global__ void __launch_bounds__(kWarps * 32)
fp8_gemv_kernel(const uint8_t* __restrict__ x, const uint8_t* __restrict__ w, float scale,
                const __nv_bfloat16* __restrict__ bias, __nv_bfloat16* __restrict__ y, int n, int k) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
  // E4M3 conversions are instructions from sm_89 on; emulating them bloats the portable
  // PTX for no use (the FP8 Linear refuses older devices at compile time).
  __trap();
#else
  using T = __nv_bfloat16;
  constexpr int R = E == GemvEpilogue::kSwiGlu ? 2 : 1;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, part = warp % S;
  const int row = blockIdx.x * (kWarps / S) + warp / S;
  if (S == 1 && row >= n) return;
  const bool live = row < n;
  const int kv = live ? k / 16 : 0;  // 16-byte chunks per row
  const uint4* wr[R];
#pragma unroll
  for (int r = 0; r < R; ++r) wr[r] = reinterpret_cast<const uint4*>(w + (int64_t(live ? row : 0) + int64_t(r) * n) * k);
  const uint4* xr = reinterpret_cast<const uint4*>(x);
  float acc[R][M];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;
  for (int i0 = part * 32 + lane; i0 < kv; i0 += S * 32 * kUnroll) {
    uint4 wv[R][kUnroll];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int i = i0 + u * 32 * S;
        wv[r][u] = i < kv ? __ldcs(wr[r] + i) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = i0 + u * 32 * S;
      if (i < kv) {
#pragma unroll
        for (int m = 0; m < M; ++m) {
          const uint4 xv = __ldg(xr + int64_t(m) * kv + i);
#pragma unroll
          for (int r = 0; r < R; ++r) fma16(acc[r][m], wv[r][u], xv);
        }
      }
    }
  }
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
      if (bias) v[r] += to_f32(bias[row + r * n]);
    }
    if (lane != 0) continue;
    // Round as the unfused kernels would: the GEMV stores T, the activation reads it.
    const float y0 = to_f32(from_f32<T>(v[0]));
    float out = y0;
    if constexpr (E == GemvEpilogue::kGeluErf) out = unary_f32<UnaryOp::kGeluErf>(y0);
    if constexpr (E == GemvEpilogue::kGeluTanh) out = unary_f32<UnaryOp::kGeluTanh>(y0);
    if constexpr (E == GemvEpilogue::kSilu) out = unary_f32<UnaryOp::kSilu>(y0);
    if constexpr (E == GemvEpilogue::kSwiGlu)
      out = to_f32(from_f32<T>(unary_f32<UnaryOp::kSilu>(y0))) * to_f32(from_f32<T>(v[R - 1]));
    y[int64_t(m) * n + row] = from_f32<T>(out);
  }
#endif
}

template <GemvEpilogue E, int S>
void launch_split(const uint8_t* x, const uint8_t* w, float scale, const __nv_bfloat16* b, __nv_bfloat16* y, int64_t m,
                  int64_t n, int64_t k, cudaStream_t s) {
  const dim3 grid(unsigned((n * S + kWarps - 1) / kWarps));
  switch (m) {
    case 1: fp8_gemv_kernel<1, E, S><<<grid, kWarps * 32, 0, s>>>(x, w, scale, b, y, int(n), int(k)); break;
    case 2: fp8_gemv_kernel<2, E, S><<<grid, kWarps * 32, 0, s>>>(x, w, scale, b, y, int(n), int(k)); break;
    case 3: fp8_gemv_kernel<3, E, S><<<grid, kWarps * 32, 0, s>>>(x, w, scale, b, y, int(n), int(k)); break;
    default: fp8_gemv_kernel<4, E, S><<<grid, kWarps * 32, 0, s>>>(x, w, scale, b, y, int(n), int(k)); break;
  }
}

// Warps per row as gemv.cu picks them: about 8192 warps streaming the matrix, no split
// for long outputs or short rows.
int split_for(int64_t n, int64_t k) {
  if (k < 1024) return 1;
  const int64_t want = (8192 + n - 1) / n;
  return want >= 4 ? 4 : want >= 2 ? 2 : 1;
}

template <GemvEpilogue E>
void launch_rows(const uint8_t* x, const uint8_t* w, float scale, const __nv_bfloat16* b, __nv_bfloat16* y, int64_t m,
                 int64_t n, int64_t k, cudaStream_t s) {
  switch (split_for(n, k)) {
    case 1: launch_split<E, 1>(x, w, scale, b, y, m, n, k, s); break;
    case 2: launch_split<E, 2>(x, w, scale, b, y, m, n, k, s); break;
    default: launch_split<E, 4>(x, w, scale, b, y, m, n, k, s); break;
  }
}

}  // namespace

void launch_fp8_quantize(DType dtype, const void* x, int64_t n, float inv, uint8_t* q, cudaStream_t s) {
  if (n == 0) return;
  KILN_CUDA_DISPATCH_FLOAT(dtype, T, {
    quantize_kernel<T><<<grid_for(n, 256), 256, 0, s>>>(static_cast<const T*>(x), n, inv, q);
  });
  KILN_CUDA_CHECK_LAUNCH();
}

bool fp8_device_supported(int device) {
  int major = 0, minor = 0;
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major * 10 + minor >= 89;
}

bool fp8_gemv_supports(int64_t m, int64_t k) {
  return m >= 1 && m <= kGemvMaxRows && k % 16 == 0 && k > 0 && k < (int64_t(1) << 30);
}

void launch_fp8_gemv(const uint8_t* x, const uint8_t* w, float scale, const void* bias, void* y, int64_t m,
                     int64_t n, int64_t k, cudaStream_t s, GemvEpilogue epi) {
  KILN_THROW_IF(!fp8_gemv_supports(m, k), kInternal, "cuda fp8 gemv: unsupported m=", m, " k=", k);
  if (n == 0) return;
  auto* b = static_cast<const __nv_bfloat16*>(bias);
  auto* yt = static_cast<__nv_bfloat16*>(y);
  switch (epi) {
    case GemvEpilogue::kNone: launch_rows<GemvEpilogue::kNone>(x, w, scale, b, yt, m, n, k, s); break;
    case GemvEpilogue::kGeluErf: launch_rows<GemvEpilogue::kGeluErf>(x, w, scale, b, yt, m, n, k, s); break;
    case GemvEpilogue::kGeluTanh: launch_rows<GemvEpilogue::kGeluTanh>(x, w, scale, b, yt, m, n, k, s); break;
    case GemvEpilogue::kSilu: launch_rows<GemvEpilogue::kSilu>(x, w, scale, b, yt, m, n, k, s); break;
    case GemvEpilogue::kSwiGlu: launch_rows<GemvEpilogue::kSwiGlu>(x, w, scale, b, yt, m, n, k, s); break;
  }
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
