// Elementwise kernels (see elementwise.h). Grid-stride loops, 16 bytes a thread where the
// length and addresses allow (one element otherwise; the same arithmetic either way); the
// activations use the same formulas as the CPU reference (erfc form of GELU, x/(1+e^-2u)
// for GELU-tanh).
// The *_fp8 kernels write E4M3 codes of the same T values (fp8_codes.cuh), V elements per
// thread (16-byte loads where the length allows).
#include "backends/cuda/common.cuh"
#include "backends/cuda/ops/elementwise.h"
#include "backends/cuda/ops/elementwise_fp8.h"
#include "backends/cuda/ops/fp8_codes.cuh"

#include <cstdint>
#include <type_traits>

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

// V elements per thread (n % V == 0; 16-byte loads and stores when V > 1).
template <typename T, UnaryOp kOp, int V>
__global__ void unary_kernel(const T* x, int64_t n, T* out) {
  pdl_wait();  // programmatic dependent launch: the previous kernel's writes are visible
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n / V; i += int64_t(gridDim.x) * blockDim.x) {
    Vec<T, V> v = *reinterpret_cast<const Vec<T, V>*>(x + i * V);
#pragma unroll
    for (int j = 0; j < V; ++j) v.e[j] = from_f32<T>(unary_f32<kOp>(to_f32(v.e[j])));
    *reinterpret_cast<Vec<T, V>*>(out + i * V) = v;
  }
}

// SwiGLU over rows of [gate | up]: out[r, i] = silu(gate) * up (GeGLU: gelu_tanh(gate) *
// up, kGate kGeluTanh). The gate's activation is rounded to T before the product, as the
// unfused Silu / Gelu -> Mul pair would store it; swiglu_f32 is that product before its
// own rounding.
template <typename T, UnaryOp kGate = UnaryOp::kSilu>
__device__ __forceinline__ float swiglu_f32(T gate, T up) {
  const float g = to_f32(from_f32<T>(unary_f32<kGate>(to_f32(gate))));
  return g * to_f32(up);
}

// V columns per thread (inter % V == 0; 16-byte loads and stores when V > 1).
template <typename T, int V, UnaryOp kGate>
__global__ void swiglu_kernel(const T* x, int64_t rows, int64_t inter, T* out) {
  pdl_wait();  // programmatic dependent launch: the previous kernel's writes are visible
  const int64_t per_row = inter / V, n = rows * per_row;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / per_row, c = (i - r * per_row) * V;
    const T* row = x + r * 2 * inter;
    const Vec<T, V> g = *reinterpret_cast<const Vec<T, V>*>(row + c);
    const Vec<T, V> u = *reinterpret_cast<const Vec<T, V>*>(row + inter + c);
    Vec<T, V> y;
#pragma unroll
    for (int j = 0; j < V; ++j) y.e[j] = from_f32<T>(swiglu_f32<T, kGate>(g.e[j], u.e[j]));
    *reinterpret_cast<Vec<T, V>*>(out + r * inter + c) = y;
  }
}

// E4M3 codes of SwiGLU, V columns per thread (inter % V == 0).
template <typename T, int V>
__global__ void swiglu_fp8_kernel(const T* x, int64_t rows, int64_t inter, float inv, uint8_t* out) {
  pdl_wait();  // programmatic dependent launch: the previous kernel's writes are visible
  const int64_t per_row = inter / V, n = rows * per_row;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / per_row, c = (i - r * per_row) * V;
    const T* row = x + r * 2 * inter;
    const Vec<T, V> g = *reinterpret_cast<const Vec<T, V>*>(row + c);
    const Vec<T, V> u = *reinterpret_cast<const Vec<T, V>*>(row + inter + c);
    Vec<uint8_t, V> q;
#pragma unroll
    for (int j = 0; j < V; ++j) q.e[j] = fp8_code_via<T>(swiglu_f32(g.e[j], u.e[j]), inv);
    *reinterpret_cast<Vec<uint8_t, V>*>(out + r * inter + c) = q;
  }
}

// SwiGLU of E4M3 [gate | up] rows (a GEMM's output codes, value = decode * gu_scale) into
// E4M3 codes, V columns per thread: all in f32, the CPU's emulation of that GEMM (the
// decoded values, silu, the product, then e4m3(v * inv)), no bf16 rounding in between.
__device__ __forceinline__ float fp8_decode(uint8_t c) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(c), __NV_E4M3)));
}

template <int V>
__global__ void swiglu_e4m3_kernel(const uint8_t* x, int64_t rows, int64_t inter, float gu_scale, float inv,
                                   uint8_t* out) {
  pdl_wait();  // programmatic dependent launch: the previous kernel's writes are visible
  const int64_t per_row = inter / V, n = rows * per_row;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / per_row, c = (i - r * per_row) * V;
    const uint8_t* row = x + r * 2 * inter;
    const Vec<uint8_t, V> g = *reinterpret_cast<const Vec<uint8_t, V>*>(row + c);
    const Vec<uint8_t, V> u = *reinterpret_cast<const Vec<uint8_t, V>*>(row + inter + c);
    Vec<uint8_t, V> q;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float gf = fp8_decode(g.e[j]) * gu_scale, uf = fp8_decode(u.e[j]) * gu_scale;
      q.e[j] = fp8_code(unary_f32<UnaryOp::kSilu>(gf) * uf, inv);
    }
    *reinterpret_cast<Vec<uint8_t, V>*>(out + r * inter + c) = q;
  }
}

// E4M3 codes of an activation, V elements per thread (n % V == 0).
template <typename T, UnaryOp kOp, int V>
__global__ void unary_fp8_kernel(const T* x, int64_t n, float inv, uint8_t* out) {
  pdl_wait();  // programmatic dependent launch: the previous kernel's writes are visible
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n / V; i += int64_t(gridDim.x) * blockDim.x) {
    const Vec<T, V> v = *reinterpret_cast<const Vec<T, V>*>(x + i * V);
    Vec<uint8_t, V> q;
#pragma unroll
    for (int j = 0; j < V; ++j) q.e[j] = fp8_code_via<T>(unary_f32<kOp>(to_f32(v.e[j])), inv);
    *reinterpret_cast<Vec<uint8_t, V>*>(out + i * V) = q;
  }
}

// 16-byte loads of T when the row length and the addresses allow, else one element.
template <typename T>
constexpr int kFp8Vec = 16 / int(sizeof(T));
bool fp8_vec_ok(int64_t len, int vec, const void* x, const void* out) {
  return len % vec == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % vec == 0;
}

// Whether V elements of T a thread fit: the length a multiple of V, both ends 16-byte aligned.
template <typename T>
bool vec_ok(int64_t len, const void* x, const void* out) {
  return len % (16 / int64_t(sizeof(T))) == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(out) % 16 == 0;
}

}  // namespace

namespace {

template <UnaryOp kGate>
void launch_gated(DType t, const void* x, int64_t rows, int64_t inter, void* out, cudaStream_t s) {
  if (rows * inter == 0) return;
  KILN_CUDA_DISPATCH_FLOAT(t, T, {
    constexpr int V = 16 / int(sizeof(T));
    auto* px = static_cast<const T*>(x);
    auto* po = static_cast<T*>(out);
    if (vec_ok<T>(inter, x, out))
      launch_k(swiglu_kernel<T, V, kGate>, grid_for(rows * inter / V, 256), 256, 0, s, px, rows, inter, po);
    else
      launch_k(swiglu_kernel<T, 1, kGate>, grid_for(rows * inter, 256), 256, 0, s, px, rows, inter, po);
  });
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_swiglu(DType t, const void* x, int64_t rows, int64_t inter, void* out, cudaStream_t s) {
  launch_gated<UnaryOp::kSilu>(t, x, rows, inter, out, s);
}

void launch_geglu(DType t, const void* x, int64_t rows, int64_t inter, void* out, cudaStream_t s) {
  launch_gated<UnaryOp::kGeluTanh>(t, x, rows, inter, out, s);
}

void launch_swiglu_fp8(DType t, const void* x, int64_t rows, int64_t inter, float inv, uint8_t* out,
                       cudaStream_t s) {
  KILN_THROW_IF(t != DType::kBF16, kInternal, "cuda: the E4M3 SwiGLU takes bf16, not ", dtype_name(t));
  if (rows * inter == 0) return;
  using T = __nv_bfloat16;
  constexpr int V = kFp8Vec<T>;
  auto* px = static_cast<const T*>(x);
  if (fp8_vec_ok(inter, V, x, out))
    launch_k(swiglu_fp8_kernel<T, V>, grid_for(rows * inter / V, 256), 256, 0, s, px, rows, inter, inv, out);
  else
    launch_k(swiglu_fp8_kernel<T, 1>, grid_for(rows * inter, 256), 256, 0, s, px, rows, inter, inv, out);
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_unary_fp8(UnaryOp op, DType t, const void* x, int64_t n, float inv, uint8_t* out, cudaStream_t s) {
  KILN_THROW_IF(t != DType::kBF16, kInternal, "cuda: the E4M3 activation takes bf16, not ", dtype_name(t));
  if (n == 0) return;
  using T = __nv_bfloat16;
  constexpr int V = kFp8Vec<T>;
  auto* px = static_cast<const T*>(x);
  auto go = [&](auto vec) {
    constexpr int W = decltype(vec)::value;
    const unsigned g = grid_for(n / W, 256);
    switch (op) {
      case UnaryOp::kGeluErf: launch_k(unary_fp8_kernel<T, UnaryOp::kGeluErf, W>, g, 256, 0, s, px, n, inv, out); break;
      case UnaryOp::kGeluTanh: launch_k(unary_fp8_kernel<T, UnaryOp::kGeluTanh, W>, g, 256, 0, s, px, n, inv, out); break;
      case UnaryOp::kSilu: launch_k(unary_fp8_kernel<T, UnaryOp::kSilu, W>, g, 256, 0, s, px, n, inv, out); break;
      case UnaryOp::kTanh: launch_k(unary_fp8_kernel<T, UnaryOp::kTanh, W>, g, 256, 0, s, px, n, inv, out); break;
    }
  };
  if (fp8_vec_ok(n, V, x, out)) go(std::integral_constant<int, V>{});
  else go(std::integral_constant<int, 1>{});
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
    auto go = [&](auto vec) {
      constexpr int W = decltype(vec)::value;
      const unsigned g = grid_for(n / W, 256);
      switch (op) {
        case UnaryOp::kGeluErf: launch_k(unary_kernel<T, UnaryOp::kGeluErf, W>, g, 256, 0, s, px, n, po); break;
        case UnaryOp::kGeluTanh: launch_k(unary_kernel<T, UnaryOp::kGeluTanh, W>, g, 256, 0, s, px, n, po); break;
        case UnaryOp::kSilu: launch_k(unary_kernel<T, UnaryOp::kSilu, W>, g, 256, 0, s, px, n, po); break;
        case UnaryOp::kTanh: launch_k(unary_kernel<T, UnaryOp::kTanh, W>, g, 256, 0, s, px, n, po); break;
      }
    };
    if (vec_ok<T>(n, x, out)) go(std::integral_constant<int, 16 / int(sizeof(T))>{});
    else go(std::integral_constant<int, 1>{});
  });
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda

namespace kiln::cuda {

void launch_swiglu_e4m3(const uint8_t* x, int64_t rows, int64_t inter, float gu_scale, float inv, uint8_t* out,
                        cudaStream_t s) {
  if (rows * inter == 0) return;
  constexpr int V = 16;
  const bool vec = inter % V == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0;
  if (vec)
    launch_k(swiglu_e4m3_kernel<V>, grid_for(rows * inter / V, 256), 256, 0, s, x, rows, inter, gu_scale, inv, out);
  else
    launch_k(swiglu_e4m3_kernel<1>, grid_for(rows * inter, 256), 256, 0, s, x, rows, inter, gu_scale, inv, out);
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
