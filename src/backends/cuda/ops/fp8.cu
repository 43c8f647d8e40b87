// FP8 E4M3 activation quantization and the device check (see fp8.h). The FP8 GEMV is
// gemv.cu's streaming GEMV instantiated for E4M3 weights (launch_fp8_gemv is there).
#include "backends/cuda/ops/fp8.h"

#include "backends/cuda/common.cuh"
#include "backends/cuda/ops/fp8_codes.cuh"

namespace kiln::cuda {
namespace {

template <typename T>
__global__ void quantize_kernel(const T* __restrict__ x, int64_t n, float inv, uint8_t* __restrict__ q) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    q[i] = fp8_code(to_f32(x[i]), inv);
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

}  // namespace kiln::cuda
