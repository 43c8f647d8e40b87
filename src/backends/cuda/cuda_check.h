// Checking every CUDA runtime call and kernel launch (STYLE.md: "check every CUDA call").
// A failed call throws kiln::Error naming the call, file:line and CUDA's error string:
// out-of-memory is kOutOfMemory, a missing device or driver kUnsupported, the rest
// kInternal. Plain C++ (no device code), so host-only files can include it.
#pragma once

#include <cuda_runtime_api.h>

namespace kiln::cuda {

[[noreturn]] void cuda_fail(cudaError_t err, const char* expr, const char* file, int line);

}  // namespace kiln::cuda

#define KILN_CUDA_CHECK(expr)                                                    \
  do {                                                                           \
    const cudaError_t kiln_err_ = (expr);                                        \
    if (kiln_err_ != cudaSuccess) [[unlikely]]                                   \
      ::kiln::cuda::cuda_fail(kiln_err_, #expr, __FILE__, __LINE__);             \
  } while (0)

// After every <<<...>>>: catches bad launch configurations at once (asynchronous
// faults surface at the next checked call, typically the step's final synchronize).
#define KILN_CUDA_CHECK_LAUNCH() KILN_CUDA_CHECK(cudaGetLastError())
