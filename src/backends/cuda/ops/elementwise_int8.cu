// The SmoothQuant Mul writing int8 codes (see elementwise_int8.h): one block per row, four
// elements per thread and step, as int8.cu's quantize kernel reads its rows; each product
// rounded to T as launch_binary stores it, then int8_codes.cuh's rounding.
#include "backends/cuda/common.cuh"
#include "backends/cuda/ops/elementwise_int8.h"
#include "backends/cuda/ops/int8_codes.cuh"

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

}  // namespace kiln::cuda
