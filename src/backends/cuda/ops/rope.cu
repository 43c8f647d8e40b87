// RoPE (see rope.h): one thread per (token, head, pair). Products and differences use
// the _rn intrinsics so nvcc does not contract them into FMAs: the CPU reference and
// PyTorch round each multiply, and f32 mode is compared at 1e-5.
#include "backends/cuda/common.cuh"
#include "backends/cuda/ops/rope.h"

namespace kiln::cuda {
namespace {

template <typename T>
__global__ void rope_kernel(const T* x, T* y, const int32_t* positions, const float* inv_freq,
                            int64_t tokens, int64_t heads, int64_t hd, int64_t half, int64_t pass) {
  pdl_wait();  // programmatic dependent launch: the previous kernel's writes are visible
  const int64_t total = tokens * heads * (half + pass);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t per_head = half + pass;
    const int64_t th = i / per_head, p = i % per_head;
    const int64_t tok = th / heads;
    const T* xv = x + th * hd;
    T* yv = y + th * hd;
    if (p >= half) {  // a pass-through dim beyond the rotary ones
      const int64_t j = 2 * half + (p - half);
      yv[j] = xv[j];
      continue;
    }
    float sn, cs;
    sincosf(__fmul_rn(float(positions[tok]), inv_freq[p]), &sn, &cs);
    const float x1 = to_f32(xv[p]), x2 = to_f32(xv[p + half]);
    yv[p] = from_f32<T>(__fsub_rn(__fmul_rn(x1, cs), __fmul_rn(x2, sn)));
    yv[p + half] = from_f32<T>(__fadd_rn(__fmul_rn(x2, cs), __fmul_rn(x1, sn)));
  }
}

}  // namespace

void launch_rope(DType t, const void* x, void* y, const int32_t* positions, const float* inv_freq,
                 int64_t tokens, int64_t heads, int64_t head_dim, int64_t rotary_dim, cudaStream_t s) {
  if (tokens == 0) return;
  const int64_t half = rotary_dim / 2, pass = head_dim - rotary_dim;
  const int64_t total = tokens * heads * (half + pass);
  KILN_CUDA_DISPATCH_FLOAT(t, T, {
    launch_k(rope_kernel<T>, grid_for(total, 256), 256, 0, s, static_cast<const T*>(x), static_cast<T*>(y), positions,
                                                        inv_freq, tokens, heads, head_dim, half, pass);
  });
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
