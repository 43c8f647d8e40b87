// A kernel's opt-in to more than 48 KiB of dynamic shared memory, once per device. Host
// side; included by .cu files (the attention kernels, the int8 quantize with rotation).
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>

#include "backends/cuda/cuda_check.h"
#include "core/status.h"

namespace kiln::cuda {

// The kernel `Kernel` with its dynamic shared-memory attribute set to `Bytes` on the
// current device (a host-side attribute per device, set on a step's eager first run
// before any capture): a kernel of more than 48 KiB of dynamic shared memory needs it.
// Every launch asks, so the check is one atomic load (setting it twice is harmless).
template <auto Kernel, size_t Bytes>
auto smem_kernel_ready() {
  constexpr int kMaxDevices = 64;
  static std::atomic<bool> done[kMaxDevices];
  int dev = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  KILN_CHECK(dev >= 0 && dev < kMaxDevices, "cuda: device ", dev, " out of range");
  if (!done[dev].load(std::memory_order_acquire)) {
    KILN_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Bytes)));
    done[dev].store(true, std::memory_order_release);
  }
  return Kernel;
}

}  // namespace kiln::cuda
