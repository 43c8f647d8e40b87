// Row norms (see norm.h): one block per row. The row is read from global memory once per
// pass (L1/L2 hits after the first); LayerNorm's variance is the two-pass sum of squared
// deviations, as the CPU reference computes it, not E[x²]-mean².
// Launched in a decode step of a few rows (`early`), a norm lets the next kernel launch at
// its start (common.cuh: the GEMV after it then streams its weights meanwhile); gamma and
// beta are requested before the wait either way.
// Every kernel takes its output type Y: T, or uint8_t for the E4M3 codes of the FP8
// Linear's input (the *_fp8 launchers), each value rounded to T first as stored by the
// T kernel, then quantized with fp8_codes.cuh's rounding: the codes of norm -> quantize.
#include "backends/cuda/common.cuh"
#include "backends/cuda/ops/fp8_codes.cuh"
#include "backends/cuda/ops/gemv.h"
#include "backends/cuda/ops/norm.h"

#include <algorithm>
#include <type_traits>

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

// One normalized value as output type Y (see the top of the file).
template <typename T, typename Y>
__device__ __forceinline__ Y norm_out(float v, float inv) {
  if constexpr (std::is_same_v<Y, T>) return from_f32<T>(v);
  else return fp8_code_via<T>(v, inv);
}

// Before the wait: the trigger (early) and this thread's first parameters toward L1.
__device__ __forceinline__ void norm_prologue(bool early, const float* gamma, const float* beta, int64_t first,
                                              int64_t dim) {
  if (early) pdl_trigger();
  if (first < dim) {
    prefetch_l1(gamma + first);
    if (beta) prefetch_l1(beta + first);
  }
  pdl_wait();  // programmatic dependent launch: the previous kernel's writes are visible
}

template <typename T, typename Y>
__global__ void layer_norm_kernel(const T* x, const T* res, T* sum_out, const float* gamma, const float* beta,
                                  float eps, int64_t dim, Y* y, float inv, bool early) {
  norm_prologue(early, gamma, beta, threadIdx.x, dim);
  __shared__ float scratch[32];
  const T* xr = add_residual(x + blockIdx.x * dim, res ? res + blockIdx.x * dim : nullptr,
                             sum_out ? sum_out + blockIdx.x * dim : nullptr, dim);
  Y* yr = y + blockIdx.x * dim;
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
    yr[j] = norm_out<T, Y>((to_f32(xr[j]) - mean) * r * gamma[j] + (beta ? beta[j] : 0.0f), inv);
}

template <typename T, typename Y>
__global__ void rms_norm_kernel(const T* x, const T* res, T* sum_out, const float* w, float eps, int64_t dim,
                                Y* y, float inv, bool early) {
  norm_prologue(early, w, nullptr, threadIdx.x, dim);
  __shared__ float scratch[32];
  const T* xr = add_residual(x + blockIdx.x * dim, res ? res + blockIdx.x * dim : nullptr,
                             sum_out ? sum_out + blockIdx.x * dim : nullptr, dim);
  Y* yr = y + blockIdx.x * dim;
  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
    const float v = to_f32(xr[j]);
    ss += v * v;
  }
  const float r = rsqrtf(block_sum(ss, scratch) / float(dim) + eps);
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) yr[j] = norm_out<T, Y>(to_f32(xr[j]) * r * w[j], inv);
}

// The same norms with the row held in registers: each thread loads NCH 16-byte vectors
// of the row (and of the residual) once, so the kernel makes one pass over memory (the
// kernels above re-read the row per pass). Same rounding: the residual sum is rounded
// to T before the statistics, exactly as stored in `sum`.
template <typename T, typename Y, int NCH, bool kRms>
__global__ void norm_regs_kernel(const T* x, const T* res, T* sum_out, const float* gamma, const float* beta,
                                 float eps, int dim, Y* y, float inv, bool early) {
  constexpr int VEC = 16 / int(sizeof(T));
  if (early) pdl_trigger();
#pragma unroll
  for (int i = 0; i < NCH; ++i) {
    const int j = (int(threadIdx.x) + i * int(blockDim.x)) * VEC;  // this thread's vector i
    if (j < dim) {
      prefetch_l1(gamma + j);
      if (beta) prefetch_l1(beta + j);
    }
  }
  pdl_wait();  // programmatic dependent launch: the previous kernel's writes are visible
  __shared__ float scratch[32];
  const int nvec = dim / VEC;
  const int64_t base = int64_t(blockIdx.x) * dim;
  float v[NCH][VEC];
  float acc = 0.0f;
#pragma unroll
  for (int i = 0; i < NCH; ++i) {
    const int vi = threadIdx.x + i * blockDim.x;
#pragma unroll
    for (int u = 0; u < VEC; ++u) v[i][u] = 0.0f;
    if (vi >= nvec) continue;
    uint4 xr = *reinterpret_cast<const uint4*>(x + base + int64_t(vi) * VEC);
    const T* xe = reinterpret_cast<const T*>(&xr);
    if (res) {
      uint4 rr = *reinterpret_cast<const uint4*>(res + base + int64_t(vi) * VEC);
      const T* re = reinterpret_cast<const T*>(&rr);
      uint4 so;
      T* se = reinterpret_cast<T*>(&so);
#pragma unroll
      for (int u = 0; u < VEC; ++u) {
        se[u] = from_f32<T>(to_f32(xe[u]) + to_f32(re[u]));
        v[i][u] = to_f32(se[u]);
      }
      if (sum_out) *reinterpret_cast<uint4*>(sum_out + base + int64_t(vi) * VEC) = so;
    } else {
#pragma unroll
      for (int u = 0; u < VEC; ++u) v[i][u] = to_f32(xe[u]);
    }
#pragma unroll
    for (int u = 0; u < VEC; ++u) acc += kRms ? v[i][u] * v[i][u] : v[i][u];
  }
  float mean = 0.0f, r;
  if constexpr (kRms) {
    r = rsqrtf(block_sum(acc, scratch) / float(dim) + eps);
  } else {
    mean = block_sum(acc, scratch) / float(dim);
    float var = 0.0f;
#pragma unroll
    for (int i = 0; i < NCH; ++i)
      if (int(threadIdx.x) + i * int(blockDim.x) < nvec)
#pragma unroll
        for (int u = 0; u < VEC; ++u) {
          const float d = v[i][u] - mean;
          var += d * d;
        }
    r = rsqrtf(block_sum(var, scratch) / float(dim) + eps);
  }
#pragma unroll
  for (int i = 0; i < NCH; ++i) {
    const int vi = threadIdx.x + i * blockDim.x;
    if (vi >= nvec) continue;
    // VEC outputs: 16 bytes of T, or VEC bytes of codes.
    struct alignas(VEC * sizeof(Y)) Out {
      Y e[VEC];
    } out;
#pragma unroll
    for (int u = 0; u < VEC; ++u) {
      const int j = vi * VEC + u;
      out.e[u] = kRms ? norm_out<T, Y>(v[i][u] * r * gamma[j], inv)
                      : norm_out<T, Y>((v[i][u] - mean) * r * gamma[j] + (beta ? beta[j] : 0.0f), inv);
    }
    *reinterpret_cast<Out*>(y + base + int64_t(vi) * VEC) = out;
  }
}

// Decode steps of a few rows: the next kernel is a GEMV, worth launching early.
bool early_trigger(int64_t rows) { return rows <= kGemvMaxRows; }

// Launches norm_regs_kernel when the row fits (whole 16-byte vectors, at most 4 per
// thread of 1024); returns false otherwise.
template <typename T, typename Y, bool kRms>
bool launch_norm_regs(const T* x, const T* res, T* sum, const float* gamma, const float* beta, float eps,
                      int64_t rows, int64_t dim, Y* y, float inv, cudaStream_t s) {
  constexpr int VEC = 16 / int(sizeof(T));
  if (dim % VEC != 0 || dim / VEC > 4096) return false;
  const int nvec = int(dim / VEC);
  const int nch = nvec <= 1024 ? 1 : nvec <= 2048 ? 2 : 4;
  const int threads = std::max(32, ((nvec + nch - 1) / nch + 31) / 32 * 32);
  const bool early = early_trigger(rows);
  switch (nch) {
    case 1: launch_k(norm_regs_kernel<T, Y, 1, kRms>, unsigned(rows), threads, 0, s, x, res, sum, gamma, beta, eps, int(dim), y, inv, early); break;
    case 2: launch_k(norm_regs_kernel<T, Y, 2, kRms>, unsigned(rows), threads, 0, s, x, res, sum, gamma, beta, eps, int(dim), y, inv, early); break;
    default: launch_k(norm_regs_kernel<T, Y, 4, kRms>, unsigned(rows), threads, 0, s, x, res, sum, gamma, beta, eps, int(dim), y, inv, early); break;
  }
  return true;
}

int threads_for(int64_t dim) {
  int t = 32;
  while (t < 1024 && t * 4 < dim) t *= 2;
  return t;
}

// Either norm into Y: the register-held kernel where the row fits, else the multi-pass
// one (the same choice for Y = T and Y = codes, so both round alike).
template <typename T, typename Y, bool kRms>
void launch_norm(const void* x, const void* res, const float* gamma, const float* beta, float eps, int64_t rows,
                 int64_t dim, void* sum, Y* y, float inv, cudaStream_t s) {
  auto* px = static_cast<const T*>(x);
  auto* pr = static_cast<const T*>(res);
  auto* ps = static_cast<T*>(sum);
  if (launch_norm_regs<T, Y, kRms>(px, pr, ps, gamma, beta, eps, rows, dim, y, inv, s)) return;
  if constexpr (kRms)
    launch_k(rms_norm_kernel<T, Y>, unsigned(rows), threads_for(dim), 0, s, px, pr, ps, gamma, eps, dim, y, inv,
             early_trigger(rows));
  else
    launch_k(layer_norm_kernel<T, Y>, unsigned(rows), threads_for(dim), 0, s, px, pr, ps, gamma, beta, eps, dim, y,
             inv, early_trigger(rows));
}

}  // namespace

void launch_layer_norm(DType t, const void* x, const float* gamma, const float* beta, float eps,
                       int64_t rows, int64_t dim, void* y, cudaStream_t s) {
  launch_add_layer_norm(t, x, nullptr, gamma, beta, eps, rows, dim, nullptr, y, s);
}

void launch_add_layer_norm(DType t, const void* x, const void* res, const float* gamma, const float* beta,
                           float eps, int64_t rows, int64_t dim, void* sum, void* y, cudaStream_t s) {
  if (rows == 0) return;
  KILN_CUDA_DISPATCH_FLOAT(t, T, { launch_norm<T, T, false>(x, res, gamma, beta, eps, rows, dim, sum, static_cast<T*>(y), 1.0f, s); });
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_rms_norm(DType t, const void* x, const float* w, float eps, int64_t rows, int64_t dim,
                     void* y, cudaStream_t s) {
  launch_add_rms_norm(t, x, nullptr, w, eps, rows, dim, nullptr, y, s);
}

void launch_add_rms_norm(DType t, const void* x, const void* res, const float* w, float eps, int64_t rows,
                         int64_t dim, void* sum, void* y, cudaStream_t s) {
  if (rows == 0) return;
  KILN_CUDA_DISPATCH_FLOAT(t, T, { launch_norm<T, T, true>(x, res, w, nullptr, eps, rows, dim, sum, static_cast<T*>(y), 1.0f, s); });
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_add_layer_norm_fp8(DType t, const void* x, const void* res, const float* gamma, const float* beta,
                               float eps, int64_t rows, int64_t dim, void* sum, uint8_t* y, float inv,
                               cudaStream_t s) {
  KILN_THROW_IF(t != DType::kBF16, kInternal, "cuda: the E4M3 LayerNorm takes bf16, not ", dtype_name(t));
  if (rows == 0) return;
  launch_norm<__nv_bfloat16, uint8_t, false>(x, res, gamma, beta, eps, rows, dim, sum, y, inv, s);
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_add_rms_norm_fp8(DType t, const void* x, const void* res, const float* w, float eps, int64_t rows,
                             int64_t dim, void* sum, uint8_t* y, float inv, cudaStream_t s) {
  KILN_THROW_IF(t != DType::kBF16, kInternal, "cuda: the E4M3 RMSNorm takes bf16, not ", dtype_name(t));
  if (rows == 0) return;
  launch_norm<__nv_bfloat16, uint8_t, true>(x, res, w, nullptr, eps, rows, dim, sum, y, inv, s);
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
