// Collectives between tensor-parallel ranks. The interface is what a sharded graph's
// AllReduce node needs; LocalCommunicator implements it for ranks that are threads of
// one process (the CPU backend, and tests of the sharding math): a sum in rank order,
// so every rank gets bit-identical results. The CUDA backend's NCCL communicator
// (backends/cuda/nccl_communicator.h) reduces device memory on the ranks' streams.
// Tested in tests/parallel/tensor_parallel_test.cpp and tests/backends/cuda/.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "core/dtype.h"

namespace kiln {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // In place: data = sum over ranks of each rank's data (all ranks pass the same n).
  virtual void all_reduce_sum(float* data, int64_t n) = 0;
  // Device memory (a GPU backend's activations): recv = sum over ranks of each rank's
  // send, n elements of `dtype` (send may equal recv), enqueued on `stream` (a
  // cudaStream_t) and not waited for. Host-memory communicators throw kUnsupported.
  virtual void all_reduce_sum_device(const void* send, void* recv, int64_t n, DType dtype, void* stream);
};

// Shared state of one group of in-process ranks; make_local_communicators hands out
// one Communicator per rank, each to be used by exactly one thread.
class LocalGroup;
std::vector<std::shared_ptr<Communicator>> make_local_communicators(int world_size);

}  // namespace kiln
