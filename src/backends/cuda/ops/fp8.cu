// FP8 E4M3 activation quantization and the device check (see fp8.h). The FP8 GEMV is
// gemv.cu's streaming GEMV instantiated for E4M3 weights (launch_fp8_gemv is there).
#include "backends/cuda/ops/fp8.h"

#include "backends/cuda/common.cuh"
#include "backends/cuda/ops/fp8_codes.cuh"

namespace kiln::cuda {
namespace {

// V elements per thread (n % V == 0; 16-byte loads of T and V-byte stores when V > 1).
template <typename T, int V>
__global__ void quantize_kernel(const T* __restrict__ x, int64_t n, float inv, uint8_t* __restrict__ q) {
  pdl_wait();  // programmatic dependent launch: the previous kernel's writes are visible
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n / V; i += int64_t(gridDim.x) * blockDim.x) {
    const Vec<T, V> v = *reinterpret_cast<const Vec<T, V>*>(x + i * V);
    Vec<uint8_t, V> c;
#pragma unroll
    for (int j = 0; j < V; ++j) c.e[j] = fp8_code(to_f32(v.e[j]), inv);
    *reinterpret_cast<Vec<uint8_t, V>*>(q + i * V) = c;
  }
}

}  // namespace

void launch_fp8_quantize(DType dtype, const void* x, int64_t n, float inv, uint8_t* q, cudaStream_t s) {
  if (n == 0) return;
  KILN_CUDA_DISPATCH_FLOAT(dtype, T, {
    constexpr int V = 16 / int(sizeof(T));
    auto* px = static_cast<const T*>(x);
    if (n % V == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(q) % V == 0)
      launch_k(quantize_kernel<T, V>, grid_for(n / V, 256), 256, 0, s, px, n, inv, q);
    else
      launch_k(quantize_kernel<T, 1>, grid_for(n, 256), 256, 0, s, px, n, inv, q);
  });
  KILN_CUDA_CHECK_LAUNCH();
}

bool fp8_device_supported(int device) {
  int major = 0, minor = 0;
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major * 10 + minor >= 89;
}

}  // namespace kiln::cuda
