// Producers writing int8 codes (see elementwise_int8.h): one block per row. The
// SmoothQuant Mul reads four elements per thread and step, as int8.cu's quantize kernel
// reads its rows; the activation after a W8A8 GEMM reads 16 bytes a thread (8 bytes where
// the row length or addresses do not allow it) and keeps its results in registers between
// the row's max and its codes. Each value is rounded to T as launch_binary / launch_unary
// store it, then int8_codes.cuh's rounding: the max is exact whatever the order, so the
// codes and row scales are the unfused pair's, bit for bit.
#include "backends/cuda/common.cuh"
#include "backends/cuda/ops/elementwise_int8.h"
#include "backends/cuda/ops/int8_codes.cuh"

#include <algorithm>
#include <cstdint>

namespace kiln::cuda {
namespace {

template <typename T>
struct alignas(4 * sizeof(T)) Vec4 {
  T v[4];
};

template <typename T, bool kDynamic>
__global__ void mul_int8_kernel(const T* __restrict__ x, const T* __restrict__ m, int64_t k, float inv,
                                int8_t* __restrict__ q, float* __restrict__ row_scale) {
  pdl_wait();  // programmatic dependent launch: the previous kernel's writes are visible
  const int64_t r = blockIdx.x, k4 = k / 4;
  const auto* xr = reinterpret_cast<const Vec4<T>*>(x + r * k);
  const auto* mr = reinterpret_cast<const Vec4<T>*>(m);
  auto* qr = reinterpret_cast<char4*>(q + r * k);
  // binary_kernel's product, as stored in T.
  auto product = [&](const Vec4<T>& a, const Vec4<T>& b, int j) { return stored_as<T>(to_f32(a.v[j]) * to_f32(b.v[j])); };
  if constexpr (kDynamic) {
    __shared__ float scratch[32];
    float mx = 0.0f;
    for (int64_t i = threadIdx.x; i < k4; i += blockDim.x) {
      const Vec4<T> a = xr[i], b = mr[i];
#pragma unroll
      for (int j = 0; j < 4; ++j) mx = fmaxf(mx, fabsf(product(a, b, j)));
    }
    const float scale = int8_row_scale_of(block_max(mx, scratch));
    inv = int8_inv_of(scale);
    if (threadIdx.x == 0) row_scale[r] = scale;
  }
  for (int64_t i = threadIdx.x; i < k4; i += blockDim.x) {
    const Vec4<T> a = xr[i], b = mr[i];
    qr[i] = make_char4(char(int8_code(product(a, b, 0), inv)), char(int8_code(product(a, b, 1), inv)),
                       char(int8_code(product(a, b, 2), inv)), char(int8_code(product(a, b, 3), inv)));
  }
}

template <typename T>
void mul_launch(const void* x, const void* m, int64_t rows, int64_t k, float inv, int8_t* q, float* row_scale,
                cudaStream_t s) {
  const int threads = k >= 1024 ? 256 : 128;
  auto* xt = static_cast<const T*>(x);
  auto* mt = static_cast<const T*>(m);
  if (row_scale) launch_k(mul_int8_kernel<T, true>, unsigned(rows), threads, 0, s, xt, mt, k, inv, q, row_scale);
  else launch_k(mul_int8_kernel<T, false>, unsigned(rows), threads, 0, s, xt, mt, k, inv, q, row_scale);
}


// V elements of E, loaded or stored as one access.
template <typename E, int V>
struct alignas(V * sizeof(E)) VecN {
  E e[V];
};

// Vectors a thread keeps in registers: 4 x 8 bf16 a thread covers BERT/Llama FFN rows
// (3072-14336) with 96-448 threads; longer rows compute the rest twice.
constexpr int kActRegs = 4;

template <typename T, UnaryOp kOp, int V, bool kDynamic>
__global__ void unary_int8_kernel(const T* __restrict__ x, int64_t k, float inv, int8_t* __restrict__ q,
                                  float* __restrict__ row_scale) {
  pdl_wait();  // programmatic dependent launch: the previous kernel's writes are visible
  const int64_t r = blockIdx.x, nv = k / V;
  const auto* xr = reinterpret_cast<const VecN<T, V>*>(x + r * k);
  auto* qr = reinterpret_cast<VecN<int8_t, V>*>(q + r * k);
  // unary_kernel's output, as stored in T.
  auto act = [](T v) { return stored_as<T>(unary_f32<kOp>(to_f32(v))); };
  float a[kActRegs][V];
  float mx = 0.0f;
#pragma unroll
  for (int j = 0; j < kActRegs; ++j) {
    const int64_t i = threadIdx.x + int64_t(j) * blockDim.x;
    if (i < nv) {
      const VecN<T, V> v = xr[i];
#pragma unroll
      for (int e = 0; e < V; ++e) {
        a[j][e] = act(v.e[e]);
        mx = fmaxf(mx, fabsf(a[j][e]));
      }
    }
  }
  const int64_t held = int64_t(kActRegs) * blockDim.x;
  if constexpr (kDynamic) {
    for (int64_t i = threadIdx.x + held; i < nv; i += blockDim.x) {
      const VecN<T, V> v = xr[i];
#pragma unroll
      for (int e = 0; e < V; ++e) mx = fmaxf(mx, fabsf(act(v.e[e])));
    }
    __shared__ float scratch[32];
    const float scale = int8_row_scale_of(block_max(mx, scratch));
    inv = int8_inv_of(scale);
    if (threadIdx.x == 0) row_scale[r] = scale;
  }
#pragma unroll
  for (int j = 0; j < kActRegs; ++j) {
    const int64_t i = threadIdx.x + int64_t(j) * blockDim.x;
    if (i < nv) {
      VecN<int8_t, V> c;
#pragma unroll
      for (int e = 0; e < V; ++e) c.e[e] = int8_t(int8_code(a[j][e], inv));
      qr[i] = c;
    }
  }
  for (int64_t i = threadIdx.x + held; i < nv; i += blockDim.x) {
    const VecN<T, V> v = xr[i];
    VecN<int8_t, V> c;
#pragma unroll
    for (int e = 0; e < V; ++e) c.e[e] = int8_t(int8_code(act(v.e[e]), inv));
    qr[i] = c;
  }
}

template <typename T, UnaryOp kOp, int V>
void unary_int8_launch(const void* x, int64_t rows, int64_t k, float inv, int8_t* q, float* row_scale,
                       cudaStream_t s) {
  // Enough warps that kActRegs vectors a thread cover the row, 64 to 1024 threads.
  const int64_t nv = k / V, need = (nv + kActRegs - 1) / kActRegs;
  const int threads = int(std::min<int64_t>(1024, std::max<int64_t>(64, (need + 31) / 32 * 32)));
  auto* xt = static_cast<const T*>(x);
  if (row_scale)
    launch_k(unary_int8_kernel<T, kOp, V, true>, unsigned(rows), threads, 0, s, xt, k, inv, q, row_scale);
  else
    launch_k(unary_int8_kernel<T, kOp, V, false>, unsigned(rows), threads, 0, s, xt, k, inv, q, row_scale);
}

template <typename T, int V>
void unary_int8_op(UnaryOp op, const void* x, int64_t rows, int64_t k, float inv, int8_t* q, float* row_scale,
                   cudaStream_t s) {
  switch (op) {
    case UnaryOp::kGeluErf: unary_int8_launch<T, UnaryOp::kGeluErf, V>(x, rows, k, inv, q, row_scale, s); break;
    case UnaryOp::kGeluTanh: unary_int8_launch<T, UnaryOp::kGeluTanh, V>(x, rows, k, inv, q, row_scale, s); break;
    case UnaryOp::kSilu: unary_int8_launch<T, UnaryOp::kSilu, V>(x, rows, k, inv, q, row_scale, s); break;
    default: throw_error(ErrorCode::kInternal, "cuda: the int8 activation takes gelu_erf, gelu_tanh or silu");
  }
}

template <typename T>
void unary_int8_dtype(UnaryOp op, const void* x, int64_t rows, int64_t k, float inv, int8_t* q, float* row_scale,
                      cudaStream_t s) {
  constexpr int V = 16 / int(sizeof(T));
  // 16-byte loads (V codes stored as one 8-byte access) where the rows and both ends allow.
  if (k % V == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(q) % V == 0)
    unary_int8_op<T, V>(op, x, rows, k, inv, q, row_scale, s);
  else
    unary_int8_op<T, 4>(op, x, rows, k, inv, q, row_scale, s);
}

}  // namespace

void launch_mul_int8(DType t, const void* x, const void* m, int64_t rows, int64_t k, float inv, int8_t* q,
                     float* row_scale, cudaStream_t s) {
  KILN_THROW_IF(k % 4 != 0, kInternal, "cuda int8 Mul: k=", k, " is not a multiple of 4");
  KILN_THROW_IF(rows > 0x7fffffff, kInternal, "cuda int8 Mul: ", rows, " rows");
  if (rows == 0 || k == 0) return;
  if (t == DType::kBF16) mul_launch<__nv_bfloat16>(x, m, rows, k, inv, q, row_scale, s);
  else if (t == DType::kF16) mul_launch<__half>(x, m, rows, k, inv, q, row_scale, s);
  else throw_error(ErrorCode::kInternal, "cuda: the int8 Mul takes bf16 or f16, not ", dtype_name(t));
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_unary_int8(UnaryOp op, DType t, const void* x, int64_t rows, int64_t k, float inv, int8_t* q,
                       float* row_scale, cudaStream_t s) {
  KILN_THROW_IF(k % 4 != 0, kInternal, "cuda int8 activation: k=", k, " is not a multiple of 4");
  KILN_THROW_IF(rows > 0x7fffffff, kInternal, "cuda int8 activation: ", rows, " rows");
  KILN_THROW_IF(reinterpret_cast<uintptr_t>(x) % 8 != 0 || reinterpret_cast<uintptr_t>(q) % 4 != 0, kInternal,
                "cuda int8 activation: x must be 8-byte and q 4-byte aligned");
  if (rows == 0 || k == 0) return;
  if (t == DType::kBF16) unary_int8_dtype<__nv_bfloat16>(op, x, rows, k, inv, q, row_scale, s);
  else if (t == DType::kF16) unary_int8_dtype<__half>(op, x, rows, k, inv, q, row_scale, s);
  else throw_error(ErrorCode::kInternal, "cuda: the int8 activation takes bf16 or f16, not ", dtype_name(t));
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
