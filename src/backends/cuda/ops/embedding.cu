// Embedding rows (see embedding.h): one block per token, threads along the row.
#include "backends/cuda/common.cuh"
#include "backends/cuda/ops/embedding.h"
#include "backends/cuda/ops/gemv.h"

namespace kiln::cuda {
namespace {

template <typename T>
__global__ void embedding_kernel(const T* table, const int32_t* ids, int64_t dim, T* out, bool early) {
  // A decode step's first kernel: with a few rows, the first layer's GEMV may launch now
  // and stream its weights while the rows are copied (common.cuh).
  if (early) pdl_trigger();
  pdl_wait();  // programmatic dependent launch: the previous kernel's writes are visible
  const T* src = table + int64_t(ids[blockIdx.x]) * dim;
  T* dst = out + int64_t(blockIdx.x) * dim;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) dst[j] = src[j];
}

}  // namespace

void launch_embedding(DType t, const void* table, const int32_t* ids, int64_t n, int64_t dim,
                      void* out, cudaStream_t s) {
  if (n == 0) return;
  KILN_CUDA_DISPATCH_FLOAT(t, T, {
    launch_k(embedding_kernel<T>, unsigned(n), 128, 0, s, static_cast<const T*>(table), ids, dim, static_cast<T*>(out),
             n <= kGemvMaxRows);
  });
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
