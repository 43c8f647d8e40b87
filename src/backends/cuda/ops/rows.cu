// GatherRows (see rows.h): one block per output row. SeqMeanPool: a block per sequence and
// slice of kPoolCols vectors of V columns, its kPoolGroups warps' rows summed apart (a
// thread's rows in flight four at a time), then across the warps in shared memory; with
// one block per sequence and a thread per column, BERT-base's pooling took 52 us at 1 and
// at 32 sequences of 128 rows (128 dependent loads a thread; ncu, H100); 7-8 us so (H200).
#include "backends/cuda/common.cuh"
#include "backends/cuda/ops/rows.h"

namespace kiln::cuda {
namespace {

template <typename T>
__global__ void gather_rows_kernel(const T* x, const int32_t* rows, int64_t dim, T* out) {
  pdl_wait();  // programmatic dependent launch: the previous kernel's writes are visible
  const T* src = x + int64_t(rows[blockIdx.x]) * dim;
  T* dst = out + int64_t(blockIdx.x) * dim;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) dst[j] = src[j];
}

constexpr int kPoolCols = 16, kPoolGroups = 16;

// V elements of T at p as f32 (V * sizeof(T) is 16 bytes, or V = 1).
template <typename T, int V>
__device__ __forceinline__ void pool_load(const T* p, float (&f)[V]) {
  if constexpr (V == 1) {
    f[0] = to_f32(*p);
  } else {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int v = 0; v < V; ++v) f[v] = to_f32(e[v]);
  }
}

// Block (x: sequence, y: slice of kPoolCols * V columns) of kPoolCols x kPoolGroups threads.
template <typename T, int V>
__global__ void __launch_bounds__(kPoolCols * kPoolGroups)
    seq_mean_pool_kernel(const T* x, const int32_t* seqs, int64_t seq_stride, int64_t dim, T* out) {
  __shared__ float part[kPoolGroups][kPoolCols * V];
  const int32_t start = seqs[blockIdx.x * seq_stride], len = seqs[blockIdx.x * seq_stride + 1];
  pdl_wait();  // programmatic dependent launch: the previous kernel's writes (x) are visible
  const int c = threadIdx.x % kPoolCols, grp = threadIdx.x / kPoolCols;
  const int64_t col = (int64_t(blockIdx.y) * kPoolCols + c) * V;
  const bool live = col < dim;
  float acc[V] = {};
  if (live) {
    const T* p = x + int64_t(start) * dim + col;
    int32_t i = grp;
    for (; i + 3 * kPoolGroups < len; i += 4 * kPoolGroups) {
      float f[4][V];
#pragma unroll
      for (int u = 0; u < 4; ++u) pool_load<T, V>(p + int64_t(i + u * kPoolGroups) * dim, f[u]);
#pragma unroll
      for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int v = 0; v < V; ++v) acc[v] += f[u][v];
    }
    for (; i < len; i += kPoolGroups) {
      float f[V];
      pool_load<T, V>(p + int64_t(i) * dim, f);
#pragma unroll
      for (int v = 0; v < V; ++v) acc[v] += f[v];
    }
  }
#pragma unroll
  for (int v = 0; v < V; ++v) part[grp][c * V + v] = acc[v];
  __syncthreads();
  const float inv = len > 0 ? 1.0f / float(len) : 0.0f;
  for (int j = threadIdx.x; j < kPoolCols * V; j += kPoolCols * kPoolGroups) {
    const int64_t oc = int64_t(blockIdx.y) * kPoolCols * V + j;
    if (oc >= dim) break;
    float s = 0.0f;
#pragma unroll
    for (int g = 0; g < kPoolGroups; ++g) s += part[g][j];
    out[int64_t(blockIdx.x) * dim + oc] = from_f32<T>(s * inv);
  }
}

}  // namespace

void launch_gather_rows(DType t, const void* x, const int32_t* rows, int64_t r, int64_t dim, void* out,
                        cudaStream_t s) {
  if (r == 0) return;
  KILN_CUDA_DISPATCH_FLOAT(t, T, {
    launch_k(gather_rows_kernel<T>, unsigned(r), 128, 0, s, static_cast<const T*>(x), rows, dim, static_cast<T*>(out));
  });
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_seq_mean_pool(DType t, const void* x, const int32_t* seqs, int64_t seq_stride, int64_t b,
                          int64_t dim, void* out, cudaStream_t s) {
  if (b == 0) return;
  KILN_CUDA_DISPATCH_FLOAT(t, T, {
    constexpr int kV = 16 / int(sizeof(T));
    // 16-byte loads where every row starts 16-byte aligned; else one element a thread.
    const bool wide = dim % kV == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
    const int v = wide ? kV : 1;
    const dim3 grid(unsigned(b), unsigned((dim + int64_t(kPoolCols) * v - 1) / (int64_t(kPoolCols) * v)));
    if (wide)
      launch_k(seq_mean_pool_kernel<T, kV>, grid, kPoolCols * kPoolGroups, 0, s, static_cast<const T*>(x), seqs,
               seq_stride, dim, static_cast<T*>(out));
    else
      launch_k(seq_mean_pool_kernel<T, 1>, grid, kPoolCols * kPoolGroups, 0, s, static_cast<const T*>(x), seqs,
               seq_stride, dim, static_cast<T*>(out));
  });
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
