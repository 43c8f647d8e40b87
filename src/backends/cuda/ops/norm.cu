// Row norms (see norm.h): one block per row. The row is read from global memory once per
// pass (L1/L2 hits after the first); LayerNorm's variance is the two-pass sum of squared
// deviations, as the CPU reference computes it, not E[x²]-mean².
#include "backends/cuda/common.cuh"
#include "backends/cuda/ops/norm.h"

namespace kiln::cuda {
namespace {

// With a residual (the fused AddLayerNorm/AddRMSNorm), the row is first x + res,
// rounded to T and written to `sum` — exactly what the unfused Add would have stored —
// and the norm reads that; each thread reads back only elements it wrote itself.
template <typename T>
__device__ const T* add_residual(const T* xr, const T* res, T* sum, int64_t dim) {
  if (!res) return xr;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) sum[j] = from_f32<T>(to_f32(xr[j]) + to_f32(res[j]));
  return sum;
}

template <typename T>
__global__ void layer_norm_kernel(const T* x, const T* res, T* sum_out, const float* gamma, const float* beta,
                                  float eps, int64_t dim, T* y) {
  __shared__ float scratch[32];
  const T* xr = add_residual(x + blockIdx.x * dim, res ? res + blockIdx.x * dim : nullptr,
                             sum_out ? sum_out + blockIdx.x * dim : nullptr, dim);
  T* yr = y + blockIdx.x * dim;
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) sum += to_f32(xr[j]);
  const float mean = block_sum(sum, scratch) / float(dim);
  float var = 0.0f;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
    const float d = to_f32(xr[j]) - mean;
    var += d * d;
  }
  const float r = rsqrtf(block_sum(var, scratch) / float(dim) + eps);
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x)
    yr[j] = from_f32<T>((to_f32(xr[j]) - mean) * r * gamma[j] + (beta ? beta[j] : 0.0f));
}

template <typename T>
__global__ void rms_norm_kernel(const T* x, const T* res, T* sum_out, const float* w, float eps, int64_t dim,
                                T* y) {
  __shared__ float scratch[32];
  const T* xr = add_residual(x + blockIdx.x * dim, res ? res + blockIdx.x * dim : nullptr,
                             sum_out ? sum_out + blockIdx.x * dim : nullptr, dim);
  T* yr = y + blockIdx.x * dim;
  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
    const float v = to_f32(xr[j]);
    ss += v * v;
  }
  const float r = rsqrtf(block_sum(ss, scratch) / float(dim) + eps);
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) yr[j] = from_f32<T>(to_f32(xr[j]) * r * w[j]);
}

int threads_for(int64_t dim) {
  int t = 32;
  while (t < 1024 && t * 4 < dim) t *= 2;
  return t;
}

}  // namespace

void launch_layer_norm(DType t, const void* x, const float* gamma, const float* beta, float eps,
                       int64_t rows, int64_t dim, void* y, cudaStream_t s) {
  launch_add_layer_norm(t, x, nullptr, gamma, beta, eps, rows, dim, nullptr, y, s);
}

void launch_add_layer_norm(DType t, const void* x, const void* res, const float* gamma, const float* beta,
                           float eps, int64_t rows, int64_t dim, void* sum, void* y, cudaStream_t s) {
  if (rows == 0) return;
  KILN_CUDA_DISPATCH_FLOAT(t, T, {
    layer_norm_kernel<T><<<unsigned(rows), threads_for(dim), 0, s>>>(
        static_cast<const T*>(x), static_cast<const T*>(res), static_cast<T*>(sum), gamma, beta, eps, dim,
        static_cast<T*>(y));
  });
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_rms_norm(DType t, const void* x, const float* w, float eps, int64_t rows, int64_t dim,
                     void* y, cudaStream_t s) {
  launch_add_rms_norm(t, x, nullptr, w, eps, rows, dim, nullptr, y, s);
}

void launch_add_rms_norm(DType t, const void* x, const void* res, const float* w, float eps, int64_t rows,
                         int64_t dim, void* sum, void* y, cudaStream_t s) {
  if (rows == 0) return;
  KILN_CUDA_DISPATCH_FLOAT(t, T, {
    rms_norm_kernel<T><<<unsigned(rows), threads_for(dim), 0, s>>>(
        static_cast<const T*>(x), static_cast<const T*>(res), static_cast<T*>(sum), w, eps, dim,
        static_cast<T*>(y));
  });
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
