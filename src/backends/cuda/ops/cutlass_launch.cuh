// What the CUTLASS 3 GEMMs of the CUDA backend (int8_gemm_sm90.cuh) share around CUTLASS's
// device adapter: can_implement as a message, and a launch whose every failure is a kiln
// error naming the kernel. Included only by translation units compiled with CUTLASS
// (sm_90a).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_check.h"
#include "core/status.h"
#include "cutlass/cutlass.h"

namespace kiln::cuda {

// Empty when the adapter accepts the arguments, else CUTLASS's status.
template <class Gemm>
std::string cutlass_check(const typename Gemm::Arguments& args) {
  const cutlass::Status st = Gemm::can_implement(args);
  return st == cutlass::Status::kSuccess ? std::string() : std::string(cutlassGetStatusString(st));
}

// Initializes and launches Gemm on s with its workspace; `what` names the kernel in errors.
// Where the step allows it (pdl_enabled(), common.cuh) the launch carries the programmatic
// dependent launch attribute: the kernels are compiled with CUTLASS_ENABLE_GDC_FOR_SM90
// (CMakeLists.txt), so their producer warps wait for the previous kernel before their first
// load (griddepcontrol.wait) and the consumers trigger the next launch after their last
// tile's main loop, the same contract as kiln's own kernels.
template <class Gemm>
void cutlass_launch(const typename Gemm::Arguments& args, void* workspace, cudaStream_t s, const char* what) {
  Gemm gemm;
  cutlass::Status st = gemm.initialize(args, workspace, s);
  KILN_THROW_IF(st != cutlass::Status::kSuccess, kInternal, what, ": initialize failed: ", cutlassGetStatusString(st));
  st = gemm.run(s, nullptr, pdl_enabled());
  KILN_THROW_IF(st != cutlass::Status::kSuccess, kInternal, what, ": launch failed: ", cutlassGetStatusString(st), " (",
                cudaGetErrorString(cudaGetLastError()), ")");
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
