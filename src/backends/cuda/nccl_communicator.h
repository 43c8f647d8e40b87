// Tensor-parallel communicators over NCCL for the CUDA backend: one GPU per rank, all
// ranks in this process (LlmRunner runs each rank's step on a thread of its own), made
// at once by ncclCommInitAll. NCCL is loaded at run time (dlopen of libnccl.so.2, or the
// file KILN_NCCL_LIBRARY names), so kiln needs it only when a model runs with --tp > 1
// on CUDA, and a missing library is a clear error instead of a failed start. NVLink
// SHARP / multicast (NVLS) is left off (NCCL_NVLS_ENABLE=0 unless set). Tested in
// tests/backends/cuda/tensor_parallel_test.cpp.
#pragma once

#include <memory>
#include <vector>

#include "backends/communicator.h"

namespace kiln::cuda {

// Ranks 0..world_size-1 on CUDA devices first_device..first_device+world_size-1. Throws
// kUnsupported naming what is missing: too few devices, or no loadable NCCL.
std::vector<std::shared_ptr<Communicator>> make_nccl_communicators(int world_size, int first_device);

// NCCL's version as "2.27.7", or "" when it cannot be loaded (never throws).
std::string nccl_version();

}  // namespace kiln::cuda
