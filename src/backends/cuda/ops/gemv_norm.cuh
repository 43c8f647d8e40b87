// The GEMV's norm prologue (gemv.h's GemvFusion): a block of W warps normalizes the few x
// rows into shared memory. Included by gemv.cu; tested through the fused Linear cases of
// tests/backends/cuda/prenorm_test.cpp.
#pragma once

#include "backends/cuda/common.cuh"
#include "backends/cuda/ops/gemv.h"

namespace kiln::cuda {
namespace {

// The norm prologue (gemv.h's GemvFusion): the block copies the M rows of x (16-bit, 8
// per chunk) to shared memory, reduces their statistics in f32 and normalizes them in
// place, rounding to T as the norm kernels of norm.cu store them ((v * r) * gamma for
// RMS, (v - mean) * r * gamma + beta for LayerNorm, with the two-pass variance).
// Each thread rewrites only the chunks it copied, so the reductions' barriers and one at
// the end are all the synchronization needed.
template <typename T, int M, int W>
__device__ __forceinline__ void gemv_norm_rows(const uint4* __restrict__ x, uint4* xs, int kv, int k,
                                               GemvNorm norm, const float* __restrict__ gamma,
                                               const float* __restrict__ beta, float eps) {
  __shared__ float red[W][M];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const bool rms = norm == GemvNorm::kRms;
  // Sums over the block of v[m], returned to every thread.
  auto block_sums = [&](float (&v)[M]) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const float s = warp_sum(v[m]);
      if (lane == 0) red[warp][m] = s;
    }
    __syncthreads();
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float s = 0.0f;
#pragma unroll
      for (int w = 0; w < W; ++w) s += red[w][m];
      v[m] = s;
    }
    __syncthreads();  // red is reused
  };
  float acc[M], mean[M], r[M];
#pragma unroll
  for (int m = 0; m < M; ++m) {
    acc[m] = 0.0f;
    for (int i = threadIdx.x; i < kv; i += blockDim.x) {
      const uint4 c = __ldg(x + int64_t(m) * kv + i);
      xs[m * kv + i] = c;
      const T* e = reinterpret_cast<const T*>(&c);
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const float v = to_f32(e[u]);
        acc[m] += rms ? v * v : v;
      }
    }
  }
  block_sums(acc);
#pragma unroll
  for (int m = 0; m < M; ++m) {
    mean[m] = rms ? 0.0f : acc[m] / float(k);
    r[m] = acc[m] / float(k) + eps;
  }
  if (!rms) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
      acc[m] = 0.0f;
      for (int i = threadIdx.x; i < kv; i += blockDim.x) {
        const uint4 c = xs[m * kv + i];
        const T* e = reinterpret_cast<const T*>(&c);
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          const float d = to_f32(e[u]) - mean[m];
          acc[m] += d * d;
        }
      }
    }
    block_sums(acc);
#pragma unroll
    for (int m = 0; m < M; ++m) r[m] = acc[m] / float(k) + eps;
  }
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const float rs = rsqrtf(r[m]);
    for (int i = threadIdx.x; i < kv; i += blockDim.x) {
      uint4 c = xs[m * kv + i];
      T* e = reinterpret_cast<T*>(&c);
      const float4 g0 = __ldg(reinterpret_cast<const float4*>(gamma) + 2 * i);
      const float4 g1 = __ldg(reinterpret_cast<const float4*>(gamma) + 2 * i + 1);
      const float g[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
      float b[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      if (beta) {
        const float4 b0 = __ldg(reinterpret_cast<const float4*>(beta) + 2 * i);
        const float4 b1 = __ldg(reinterpret_cast<const float4*>(beta) + 2 * i + 1);
        b[0] = b0.x, b[1] = b0.y, b[2] = b0.z, b[3] = b0.w, b[4] = b1.x, b[5] = b1.y, b[6] = b1.z, b[7] = b1.w;
      }
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const float v = to_f32(e[u]);
        e[u] = rms ? from_f32<T>(v * rs * g[u]) : from_f32<T>((v - mean[m]) * rs * g[u] + b[u]);
      }
      xs[m * kv + i] = c;
    }
  }
  __syncthreads();
}

}  // namespace
}  // namespace kiln::cuda
