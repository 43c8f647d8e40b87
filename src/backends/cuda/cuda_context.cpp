// CudaContext and the CUDA error reporting behind KILN_CUDA_CHECK (see cuda_context.h,
// cuda_check.h).
#include "backends/cuda/cuda_context.h"

#include "core/status.h"

namespace kiln::cuda {

void cuda_fail(cudaError_t err, const char* expr, const char* file, int line) {
  ErrorCode code = ErrorCode::kInternal;
  if (err == cudaErrorMemoryAllocation) code = ErrorCode::kOutOfMemory;
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) code = ErrorCode::kUnsupported;
  throw_error(code, file, ":", line, ": ", expr, " failed: ", cudaGetErrorName(err), " (",
              cudaGetErrorString(err), ")");
}

CudaContext::CudaContext(int dev) : device(dev) {
  KILN_CUDA_CHECK(cudaSetDevice(device));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  gemm = std::make_unique<Gemm>();
}

CudaContext::~CudaContext() {
  if (stream) {
    (void)cudaSetDevice(device);
    cudaStreamSynchronize(stream);
    gemm.reset();
    tables.clear();
    cudaStreamDestroy(stream);
  }
}

}  // namespace kiln::cuda
