// One-shot peer-to-peer all-reduce (see allreduce.h). Block b of every rank owns the same
// slice of the vector: it pushes the slice to each peer's staging area (parity = epoch & 1,
// so a peer still reading the previous call's data is never overwritten: reaching the
// call after next needs this rank's flag of the next call, raised only after this call's
// reads), fences, raises its flag in every peer's memory with a system-scope release,
// waits for every peer's flag (acquire; epochs only grow, so a peer already one call
// ahead also satisfies it), then reads its local staging area - written by the peers over
// NVLink - and sums the ranks in rank order.
#include "backends/cuda/common.cuh"
#include "backends/cuda/ops/allreduce.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 512;

__device__ __forceinline__ void store_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    p2p_all_reduce_kernel(const T* send, T* recv, int64_t n, int64_t per_block, bool vec_ok, P2pRankBuffers b) {
  __shared__ uint32_t s_epoch;
  const int blk = int(blockIdx.x), tid = int(threadIdx.x);
  if (tid == 0) s_epoch = ++b.epochs[blk];
  __syncthreads();
  const uint32_t epoch = s_epoch;
  const int64_t lo = int64_t(blk) * per_block, hi = min(n, lo + per_block);
  const int64_t region = kP2pAllReduceMaxBytes / int64_t(sizeof(T));  // elements per [parity][sender]
  const int64_t mine = (int64_t(epoch & 1u) * b.world + b.rank) * region;
  // 16-byte vectors where the slice allows (slices start at multiples of 16 bytes).
  constexpr int kVec = 16 / int(sizeof(T));
  const int64_t vec_hi = lo + (vec_ok && hi > lo ? (hi - lo) / kVec * kVec : 0);
  for (int64_t i = lo + int64_t(tid) * kVec; i < vec_hi; i += int64_t(kThreads) * kVec) {
    const uint4 v = *reinterpret_cast<const uint4*>(send + i);
    for (int p = 0; p < b.world; ++p)
      if (p != b.rank) *reinterpret_cast<uint4*>(static_cast<T*>(b.stage[p]) + mine + i) = v;
  }
  for (int64_t i = vec_hi + tid; i < hi; i += kThreads)
    for (int p = 0; p < b.world; ++p)
      if (p != b.rank) static_cast<T*>(b.stage[p])[mine + i] = send[i];
  __threadfence_system();
  __syncthreads();
  if (tid < b.world && tid != b.rank) {
    store_release_sys(b.flags[tid] + blk * b.world + b.rank, epoch);
    const uint32_t* mine_flag = b.flags[b.rank] + blk * b.world + tid;
    while (int32_t(load_acquire_sys(mine_flag) - epoch) < 0) {
    }
  }
  __syncthreads();
  const T* stage = static_cast<const T*>(b.stage[b.rank]) + int64_t(epoch & 1u) * b.world * region;
  for (int64_t i = lo + tid; i < hi; i += kThreads) {
    float acc = 0.0f;
    for (int r = 0; r < b.world; ++r) acc += to_f32(r == b.rank ? send[i] : __ldcg(stage + int64_t(r) * region + i));
    recv[i] = from_f32<T>(acc);
  }
}

}  // namespace

void launch_p2p_all_reduce(DType t, const void* send, void* recv, int64_t n, const P2pRankBuffers& b,
                           cudaStream_t s) {
  const int64_t bytes = n * int64_t(dtype_size(t));
  KILN_CHECK(n >= 0 && bytes <= kP2pAllReduceMaxBytes && b.world >= 2 && b.world <= kP2pMaxRanks,
             "p2p all-reduce of ", n, " ", dtype_name(t), " over ", b.world, " ranks");
  if (n == 0) return;
  // Slices of whole 16-byte vectors, at least 8 KB each, at most kP2pMaxBlocks of them:
  // the same grid on every rank (it depends on n and t only).
  const int64_t vec = 16 / int64_t(dtype_size(t));
  const int64_t min_slice = 8192 / int64_t(dtype_size(t));
  int64_t blocks = std::min<int64_t>(kP2pMaxBlocks, (n + min_slice - 1) / min_slice);
  int64_t per_block = (n + blocks - 1) / blocks;
  per_block = (per_block + vec - 1) / vec * vec;
  blocks = (n + per_block - 1) / per_block;
  const bool vec_ok = reinterpret_cast<uintptr_t>(send) % 16 == 0;  // staging areas are 256-byte aligned
  KILN_CUDA_DISPATCH_FLOAT(t, T, {
    // No programmatic dependent launch: the spin-wait relies on this grid's blocks all
    // being resident, and on the previous kernel having completed.
    p2p_all_reduce_kernel<T><<<unsigned(blocks), kThreads, 0, s>>>(static_cast<const T*>(send), static_cast<T*>(recv),
                                                                   n, per_block, vec_ok, b);
  });
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
