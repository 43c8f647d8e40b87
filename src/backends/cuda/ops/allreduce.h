// One-shot all-reduce over peer-to-peer (NVLink) memory for the tensor-parallel ranks of
// one process (one GPU each), for the small sums of decode steps: NCCL's ring costs
// ~10 us of latency per call even for 8 KB, and a decoder layer makes two of them.
// Every rank pushes its input into each peer's staging buffer (remote stores), raises a
// flag in the peer's memory, waits for every peer's flag, and sums the ranks' values in
// rank order in f32 (identical results on every rank, one rounding per element). The
// per-block epochs live in device memory, so the kernel replays inside CUDA graphs.
// Used by the NCCL communicator below kP2pAllReduceMaxBytes (nccl_communicator.cpp);
// tested in tests/backends/cuda/tensor_parallel_test.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace kiln::cuda {

constexpr int kP2pMaxRanks = 8;
constexpr int kP2pMaxBlocks = 32;
constexpr int64_t kP2pAllReduceMaxBytes = int64_t(1) << 20;

// One rank's view of the group's buffers (device pointers; peers' through peer access).
struct P2pRankBuffers {
  int rank = 0, world = 0;
  // stage[r]: rank r's staging area, [2 parities][world senders][kP2pAllReduceMaxBytes].
  void* stage[kP2pMaxRanks] = {};
  // flags[r]: rank r's flags, [kP2pMaxBlocks][world senders] epochs.
  uint32_t* flags[kP2pMaxRanks] = {};
  // This rank's per-block epoch counters [kP2pMaxBlocks] (only block b touches entry b).
  uint32_t* epochs = nullptr;
};

// recv = sum over the ranks of send (n elements of t, send may equal recv); every rank
// calls it with the same n and t, in the same order. n * size(t) <= kP2pAllReduceMaxBytes.
void launch_p2p_all_reduce(DType t, const void* send, void* recv, int64_t n, const P2pRankBuffers& b,
                           cudaStream_t s);

}  // namespace kiln::cuda
