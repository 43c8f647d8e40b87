// GatherRows and SeqMeanPool (see rows.h): one block per output row.
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

template <typename T>
__global__ void seq_mean_pool_kernel(const T* x, const int32_t* seqs, int64_t seq_stride, int64_t dim, T* out) {
  pdl_wait();  // programmatic dependent launch: the previous kernel's writes are visible
  const int32_t start = seqs[blockIdx.x * seq_stride], len = seqs[blockIdx.x * seq_stride + 1];
  const float inv = len > 0 ? 1.0f / float(len) : 0.0f;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
    float acc = 0.0f;
    for (int32_t i = 0; i < len; ++i) acc += to_f32(x[(int64_t(start) + i) * dim + j]);
    out[int64_t(blockIdx.x) * dim + j] = from_f32<T>(acc * inv);
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
    launch_k(seq_mean_pool_kernel<T>, unsigned(b), 128, 0, s, static_cast<const T*>(x), seqs, seq_stride, dim,
                                                        static_cast<T*>(out));
  });
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
