// Elementwise dtype cast (see convert.h).
#include "backends/cuda/common.cuh"
#include "backends/cuda/ops/convert.h"

namespace kiln::cuda {
namespace {

template <typename S, typename D>
__global__ void convert_kernel(const S* src, D* dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = from_f32<D>(to_f32<S>(src[i]));
}

template <typename D>
__global__ void fill_random_kernel(D* dst, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;  // a cheap integer hash (Knuth, xorshift)
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    dst[i] = from_f32<D>(float(h >> 8) * (2.0f / 16777216.0f) - 1.0f);
  }
}

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void spin_kernel(int64_t ns) {
  const uint64_t t0 = global_ns();
  while (global_ns() - t0 < uint64_t(ns)) {
  }
}

}  // namespace

void launch_spin(int64_t us, cudaStream_t s) {
  spin_kernel<<<1, 1, 0, s>>>(us * 1000);
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_fill_random(void* dst, DType t, int64_t n, uint32_t seed, cudaStream_t s) {
  if (n == 0) return;
  KILN_CUDA_DISPATCH_FLOAT(t, D, {
    fill_random_kernel<D><<<grid_for(n, 256), 256, 0, s>>>(static_cast<D*>(dst), n, seed);
  });
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_convert(const void* src, DType from, void* dst, DType to, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  KILN_CUDA_DISPATCH_FLOAT(from, S, KILN_CUDA_DISPATCH_FLOAT(to, D, {
    convert_kernel<S, D><<<grid_for(n, 256), 256, 0, s>>>(static_cast<const S*>(src), static_cast<D*>(dst), n);
  }));
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
