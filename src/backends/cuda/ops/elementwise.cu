// Elementwise kernels (see elementwise.h). Grid-stride loops; the activations use the
// same formulas as the CPU reference (erfc form of GELU, x/(1+e^-2u) for GELU-tanh).
#include "backends/cuda/common.cuh"
#include "backends/cuda/ops/elementwise.h"

namespace kiln::cuda {
namespace {

template <typename T, BinaryOp kOp>
__global__ void binary_kernel(const T* a, const T* b, int64_t n, int64_t b_n, T* out) {
  pdl_wait();  // programmatic dependent launch: the previous kernel's writes are visible
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float x = to_f32(a[i]), y = to_f32(b[b_n == n ? i : i % b_n]);
    out[i] = from_f32<T>(kOp == BinaryOp::kAdd ? x + y : x * y);
  }
}

template <typename T, UnaryOp kOp>
__global__ void unary_kernel(const T* x, int64_t n, T* out) {
  pdl_wait();  // programmatic dependent launch: the previous kernel's writes are visible
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = from_f32<T>(unary_f32<kOp>(to_f32(x[i])));
}

// SwiGLU over rows of [gate | up]: out[r, i] = silu(gate) * up. silu is rounded to T
// before the product, as the unfused Silu -> Mul pair would store it.
template <typename T>
__global__ void swiglu_kernel(const T* x, int64_t rows, int64_t inter, T* out) {
  pdl_wait();  // programmatic dependent launch: the previous kernel's writes are visible
  const int64_t n = rows * inter;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / inter, c = i - r * inter;
    const T* row = x + r * 2 * inter;
    const float g = to_f32(from_f32<T>(unary_f32<UnaryOp::kSilu>(to_f32(row[c]))));
    out[i] = from_f32<T>(g * to_f32(row[inter + c]));
  }
}

}  // namespace

void launch_swiglu(DType t, const void* x, int64_t rows, int64_t inter, void* out, cudaStream_t s) {
  if (rows * inter == 0) return;
  KILN_CUDA_DISPATCH_FLOAT(t, T, {
    launch_k(swiglu_kernel<T>, grid_for(rows * inter, 256), 256, 0, s, static_cast<const T*>(x), rows, inter,
                                                                 static_cast<T*>(out));
  });
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_binary(BinaryOp op, DType t, const void* a, const void* b, int64_t n, int64_t b_n,
                   void* out, cudaStream_t s) {
  if (n == 0) return;
  KILN_CUDA_DISPATCH_FLOAT(t, T, {
    auto* pa = static_cast<const T*>(a);
    auto* pb = static_cast<const T*>(b);
    auto* po = static_cast<T*>(out);
    if (op == BinaryOp::kAdd) launch_k(binary_kernel<T, BinaryOp::kAdd>, grid_for(n, 256), 256, 0, s, pa, pb, n, b_n, po);
    else launch_k(binary_kernel<T, BinaryOp::kMul>, grid_for(n, 256), 256, 0, s, pa, pb, n, b_n, po);
  });
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_unary(UnaryOp op, DType t, const void* x, int64_t n, void* out, cudaStream_t s) {
  if (n == 0) return;
  KILN_CUDA_DISPATCH_FLOAT(t, T, {
    auto* px = static_cast<const T*>(x);
    auto* po = static_cast<T*>(out);
    const unsigned g = grid_for(n, 256);
    switch (op) {
      case UnaryOp::kGeluErf: launch_k(unary_kernel<T, UnaryOp::kGeluErf>, g, 256, 0, s, px, n, po); break;
      case UnaryOp::kGeluTanh: launch_k(unary_kernel<T, UnaryOp::kGeluTanh>, g, 256, 0, s, px, n, po); break;
      case UnaryOp::kSilu: launch_k(unary_kernel<T, UnaryOp::kSilu>, g, 256, 0, s, px, n, po); break;
      case UnaryOp::kTanh: launch_k(unary_kernel<T, UnaryOp::kTanh>, g, 256, 0, s, px, n, po); break;
    }
  });
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
