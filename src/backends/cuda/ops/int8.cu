// INT8 activation quantization, dequantize epilogue and GEMV (see int8.h). The float
// steps use the _rn intrinsics so nvcc cannot contract them into FMAs the CPU kernel does
// not use. The GEMV follows fp8.cu: a warp per output feature, lane j reading 16-byte
// chunks j, j+32, ... of the weight row (16 codes each, kUnroll in flight, streaming
// hint), x codes through the read-only cache, four dp4a per chunk and x row. The GEMV and
// the quantize kernels take part in programmatic dependent launch (common.cuh): the GEMV
// requests its first weights before the wait and triggers after its main loop; the
// quantize kernels wait first and, in decode steps, trigger at their start so the GEMV
// after them streams its weights meanwhile.
#include <algorithm>
#include <cstdlib>

#include "backends/cuda/common.cuh"
#include "backends/cuda/ops/int8.h"
#include "backends/cuda/ops/int8_codes.cuh"
#include "backends/cuda/smem_attr.cuh"

namespace kiln::cuda {
namespace {

constexpr int kWarps = 4, kUnroll = 4;

// core/int8.h's int8_quantize (int8_codes.cuh).
__device__ __forceinline__ int quantize_one(float x, float inv) { return int8_code(x, inv); }

template <typename T>
struct alignas(4 * sizeof(T)) Vec4 {
  T v[4];
};

// One block per row; four elements per thread and step.
template <typename T, bool kDynamic>
__global__ void quantize_rows_kernel(const T* __restrict__ x, int64_t k, float inv, int8_t* __restrict__ q,
                                     float* __restrict__ row_scale, bool early) {
  if (early) pdl_trigger();  // a decode step: the GEMV after this launches and streams its weights
  pdl_wait();                // programmatic dependent launch: the previous kernel's writes are visible
  const int64_t r = blockIdx.x;
  const auto* xr = reinterpret_cast<const Vec4<T>*>(x + r * k);
  auto* qr = reinterpret_cast<char4*>(q + r * k);
  const int64_t k4 = k / 4;
  if constexpr (kDynamic) {
    __shared__ float scratch[32];
    float m = 0.0f;
    for (int64_t i = threadIdx.x; i < k4; i += blockDim.x) {
      const Vec4<T> v = xr[i];
#pragma unroll
      for (int j = 0; j < 4; ++j) m = fmaxf(m, fabsf(to_f32(v.v[j])));
    }
    m = block_max(m, scratch);
    const float scale = int8_row_scale_of(m);  // core/int8.h int8_row_scale
    inv = int8_inv_of(scale);
    if (threadIdx.x == 0) row_scale[r] = scale;
  }
  for (int64_t i = threadIdx.x; i < k4; i += blockDim.x) {
    const Vec4<T> v = xr[i];
    // int8_code_pair: int8_code's codes without float-to-int conversions (this kernel's
    // test, over every bf16 value, ties and specials, checks the two against core/int8.h).
    const uint32_t lo = int8_code_pair(to_f32(v.v[0]), to_f32(v.v[1]), inv),
                   hi = int8_code_pair(to_f32(v.v[2]), to_f32(v.v[3]), inv);
    reinterpret_cast<uint32_t*>(qr)[i] = lo | hi << 16;
  }
}

// The rows of x through core/hadamard.h's transform (blocks of b = 2^log2b values), then
// quantized as quantize_rows_kernel quantizes: one block per row, the row in f32 in
// dynamic shared memory. Pass h (1, 2, 4, ... < b) pairs j and j + h for every j whose bit
// h is clear, as the host's loops do; each pair is independent within a pass, so only
// the order of the passes shapes the f32 sums, and it is the host's. The passes h < 32 run
// in registers as the row is read (lane l of a warp holding element 32 c + l of chunk c;
// its partner is lane l ^ h), the others in shared memory.
constexpr int kHadamardMaxBytes = int(kInt8HadamardMaxK * sizeof(float));

template <typename T, bool kDynamic>
__global__ void quantize_rows_hadamard_kernel(const T* __restrict__ x, int k, int log2b, float inv,
                                              int8_t* __restrict__ q, float* __restrict__ row_scale, bool early) {
  if (early) pdl_trigger();  // as quantize_rows_kernel
  pdl_wait();
  extern __shared__ float row[];
  const int64_t r = blockIdx.x;
  const T* xr = x + r * k;
  const int lane = int(threadIdx.x) & 31, warps = int(blockDim.x) >> 5, k4 = k / 4;
  const int in_warp = min(log2b, 5);
  // Chunks past k (k % 32 != 0, so b <= 16) hold zeros whose results are dropped: a pair
  // never leaves its block of b, which lies inside the row.
  for (int c = int(threadIdx.x) >> 5; c < (k + 31) / 32; c += warps) {
    const int e = c * 32 + lane;
    float v = e < k ? to_f32(xr[e]) : 0.0f;
    for (int s = 0; s < in_warp; ++s) {
      const float o = __shfl_xor_sync(0xffffffffu, v, 1 << s);
      v = lane & (1 << s) ? __fsub_rn(o, v) : __fadd_rn(v, o);  // x[j] + x[j + h] / x[j] - x[j + h]
    }
    if (e < k) row[e] = v;
  }
  __syncthreads();
  const int pairs = k / 2;
  for (int s = in_warp; s < log2b; ++s) {
    const int h = 1 << s;
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
      const int j = ((p >> s) << (s + 1)) | (p & (h - 1));
      const float a = row[j], c = row[j + h];
      row[j] = __fadd_rn(a, c);
      row[j + h] = __fsub_rn(a, c);
    }
    __syncthreads();
  }
  if constexpr (kDynamic) {
    __shared__ float scratch[32];
    float m = 0.0f;
    for (int i = threadIdx.x; i < k; i += blockDim.x) m = fmaxf(m, fabsf(row[i]));
    m = block_max(m, scratch);
    const float scale = int8_row_scale_of(m);
    inv = int8_inv_of(scale);
    if (threadIdx.x == 0) row_scale[r] = scale;
  }
  auto* qr = reinterpret_cast<char4*>(q + r * k);
  for (int i = threadIdx.x; i < k4; i += blockDim.x)
    qr[i] = make_char4(char(quantize_one(row[4 * i], inv)), char(quantize_one(row[4 * i + 1], inv)),
                       char(quantize_one(row[4 * i + 2], inv)), char(quantize_one(row[4 * i + 3], inv)));
}

// float(a) * (xs * w_scale[j]) + bias[j], then the activation: linear_int8's epilogue.
__device__ __forceinline__ float dequant_one(int32_t a, float xs, int64_t j, const Int8Epilogue& e) {
  const float v = __fmul_rn(float(a), __fmul_rn(xs, e.w_scale[j]));
  return e.bias ? __fadd_rn(v, e.bias[j]) : v;
}

template <GemvEpilogue E>
__device__ __forceinline__ float activate(float v) {
  if constexpr (E == GemvEpilogue::kGeluErf) return unary_f32<UnaryOp::kGeluErf>(v);
  if constexpr (E == GemvEpilogue::kGeluTanh) return unary_f32<UnaryOp::kGeluTanh>(v);
  if constexpr (E == GemvEpilogue::kSilu) return unary_f32<UnaryOp::kSilu>(v);
  return v;
}

// Output j of a row whose sums are `acc` (the [gate | up] halves n_out apart with SwiGLU).
template <GemvEpilogue E>
__device__ __forceinline__ float output_one(const int32_t* acc, float xs, int64_t j, int64_t n_out,
                                            const Int8Epilogue& e) {
  if constexpr (E == GemvEpilogue::kSwiGlu) {
    const float g = dequant_one(acc[j], xs, j, e), u = dequant_one(acc[n_out + j], xs, n_out + j, e);
    return __fmul_rn(unary_f32<UnaryOp::kSilu>(g), u);
  } else {
    return activate<E>(dequant_one(acc[j], xs, j, e));
  }
}

// V consecutive outputs per thread (V = 4 when n_out and the row stride n of the sums
// are multiples of 4: 16-byte loads of sums).
template <typename T, GemvEpilogue E, int V>
__global__ void dequant_kernel(const int32_t* __restrict__ acc, int64_t t, int64_t n, int64_t n_out, Int8Epilogue e,
                               T* __restrict__ y) {
  const int64_t groups = t * (n_out / V);
  for (int64_t g = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; g < groups; g += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = g / (n_out / V), j0 = (g % (n_out / V)) * V;
    const float xs = e.row_scale ? e.row_scale[r] : e.x_scale;
    const int32_t* ar = acc + r * n;
    if constexpr (V == 4) {
      const int4 lo = *reinterpret_cast<const int4*>(ar + j0);
      int4 hi = make_int4(0, 0, 0, 0);
      if constexpr (E == GemvEpilogue::kSwiGlu) hi = *reinterpret_cast<const int4*>(ar + n_out + j0);
      const int32_t a[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
      Vec4<T> out;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float v;
        if constexpr (E == GemvEpilogue::kSwiGlu) {
          const float gv = dequant_one(a[i], xs, j0 + i, e), uv = dequant_one(a[4 + i], xs, n_out + j0 + i, e);
          v = __fmul_rn(unary_f32<UnaryOp::kSilu>(gv), uv);
        } else {
          v = activate<E>(dequant_one(a[i], xs, j0 + i, e));
        }
        out.v[i] = from_f32<T>(v);
      }
      *reinterpret_cast<Vec4<T>*>(y + r * n_out + j0) = out;
    } else {
      y[r * n_out + j0] = from_f32<T>(output_one<E>(ar, xs, j0, n_out, e));
    }
  }
}

template <typename T, GemvEpilogue E>
void dequant_launch(const int32_t* acc, int64_t t, int64_t n, int64_t n_out, const Int8Epilogue& e, T* y,
                    cudaStream_t s) {
  if (n_out % 4 == 0 && n % 4 == 0)
    dequant_kernel<T, E, 4><<<grid_for(t * n_out / 4, 256), 256, 0, s>>>(acc, t, n, n_out, e, y);
  else
    dequant_kernel<T, E, 1><<<grid_for(t * n_out, 256), 256, 0, s>>>(acc, t, n, n_out, e, y);
}

__device__ __forceinline__ int warp_sum_i(int v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ int dot16(uint4 w, uint4 x, int acc) {
  acc = __dp4a(int(w.x), int(x.x), acc);
  acc = __dp4a(int(w.y), int(x.y), acc);
  acc = __dp4a(int(w.z), int(x.z), acc);
  return __dp4a(int(w.w), int(x.w), acc);
}

// R = 2 (SwiGLU): the warp streams the gate row and the up row of its output feature.
template <typename T, int M, GemvEpilogue E>
__global__ void __launch_bounds__(kWarps * 32)
int8_gemv_kernel(const int8_t* __restrict__ x, const int8_t* __restrict__ w, int64_t n_out, int64_t k,
                 Int8Epilogue e, T* __restrict__ y) {
  constexpr int R = E == GemvEpilogue::kSwiGlu ? 2 : 1;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kWarps + warp;
  // Returning before pdl_wait() is safe: the warps that store wait, so this grid still
  // completes only after the one before it.
  if (row >= n_out) return;
  const int64_t kv = k / 16;
  const uint4* wr[R];
#pragma unroll
  for (int r = 0; r < R; ++r) wr[r] = reinterpret_cast<const uint4*>(w + (row + r * n_out) * k);
  const uint4* xr = reinterpret_cast<const uint4*>(x);
  int acc[R][M] = {};
  uint4 wv[R][kUnroll];
  auto load_weights = [&](int64_t i0) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t i = i0 + u * 32;
        wv[r][u] = i < kv ? __ldcs(wr[r] + i) : make_uint4(0, 0, 0, 0);
      }
  };
  // The first weights are requested before the wait (no kernel writes them), so they
  // stream while the kernel before this one finishes.
  load_weights(lane);
  pdl_wait();  // programmatic dependent launch: the previous kernel's writes (x) are visible
  for (int64_t i0 = lane; i0 < kv; i0 += 32 * kUnroll) {
    if (i0 != lane) load_weights(i0);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = i0 + u * 32;
      if (i < kv) {
#pragma unroll
        for (int m = 0; m < M; ++m) {
          const uint4 xv = __ldg(xr + m * kv + i);
#pragma unroll
          for (int r = 0; r < R; ++r) acc[r][m] = dot16(wv[r][u], xv, acc[r][m]);
        }
      }
    }
  }
  pdl_trigger();  // the weights are read: the next kernel may launch (it waits for our writes)
#pragma unroll
  for (int m = 0; m < M; ++m) {
    int32_t sums[R];
#pragma unroll
    for (int r = 0; r < R; ++r) sums[r] = warp_sum_i(acc[r][m]);
    if (lane != 0) continue;
    const float xs = e.row_scale ? e.row_scale[m] : e.x_scale;
    float v;
    if constexpr (E == GemvEpilogue::kSwiGlu) {
      const float g = dequant_one(sums[0], xs, row, e), u = dequant_one(sums[R - 1], xs, n_out + row, e);
      v = __fmul_rn(unary_f32<UnaryOp::kSilu>(g), u);
    } else {
      v = activate<E>(dequant_one(sums[0], xs, row, e));
    }
    y[m * n_out + row] = from_f32<T>(v);
  }
}

template <typename T, GemvEpilogue E>
void gemv_launch(const int8_t* x, const int8_t* w, int64_t m, int64_t n_out, int64_t k, const Int8Epilogue& e, T* y,
                 cudaStream_t s) {
  const dim3 grid(unsigned((n_out + kWarps - 1) / kWarps));
  switch (m) {
    case 1: launch_k(int8_gemv_kernel<T, 1, E>, grid, kWarps * 32, 0, s, x, w, n_out, k, e, y); break;
    case 2: launch_k(int8_gemv_kernel<T, 2, E>, grid, kWarps * 32, 0, s, x, w, n_out, k, e, y); break;
    case 3: launch_k(int8_gemv_kernel<T, 3, E>, grid, kWarps * 32, 0, s, x, w, n_out, k, e, y); break;
    default: launch_k(int8_gemv_kernel<T, 4, E>, grid, kWarps * 32, 0, s, x, w, n_out, k, e, y); break;
  }
}

// Runs f.template operator()<E>() for the runtime epilogue.
template <typename F>
void dispatch_epilogue(GemvEpilogue epi, F&& f) {
  switch (epi) {
    case GemvEpilogue::kNone: f.template operator()<GemvEpilogue::kNone>(); break;
    case GemvEpilogue::kGeluErf: f.template operator()<GemvEpilogue::kGeluErf>(); break;
    case GemvEpilogue::kGeluTanh: f.template operator()<GemvEpilogue::kGeluTanh>(); break;
    case GemvEpilogue::kSilu: f.template operator()<GemvEpilogue::kSilu>(); break;
    case GemvEpilogue::kSwiGlu: f.template operator()<GemvEpilogue::kSwiGlu>(); break;
  }
}

}  // namespace

void launch_int8_quantize(DType dtype, const void* x, int64_t t, int64_t k, float inv, int8_t* q, float* row_scale,
                          cudaStream_t s) {
  KILN_THROW_IF(k % 4 != 0, kInternal, "cuda int8 quantize: k=", k, " is not a multiple of 4");
  if (t == 0 || k == 0) return;
  KILN_THROW_IF(t > 0x7fffffff, kInternal, "cuda int8 quantize: ", t, " rows");
  const int threads = k >= 1024 ? 256 : 128;
  KILN_CUDA_DISPATCH_FLOAT(dtype, T, {
    auto* xt = static_cast<const T*>(x);
    const bool early = t <= kGemvMaxRows;
    if (row_scale)
      launch_k(quantize_rows_kernel<T, true>, unsigned(t), threads, 0, s, xt, k, inv, q, row_scale, early);
    else
      launch_k(quantize_rows_kernel<T, false>, unsigned(t), threads, 0, s, xt, k, inv, q, nullptr, early);
  });
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_int8_quantize_hadamard(DType dtype, const void* x, int64_t t, int64_t k, int64_t b, float inv, int8_t* q,
                                   float* row_scale, cudaStream_t s) {
  KILN_THROW_IF(k % 4 != 0, kInternal, "cuda int8 quantize (rotated): k=", k, " is not a multiple of 4");
  KILN_THROW_IF(b < 2 || (b & (b - 1)) != 0 || k % b != 0, kInternal, "cuda int8 quantize (rotated): block ", b,
                " for rows of ", k, " (a power of two >= 2 dividing k)");
  KILN_THROW_IF(k > kInt8HadamardMaxK, kUnsupported, "cuda int8 quantize (rotated): rows of ", k,
                " values; the kernel holds a row in shared memory, at most ", kInt8HadamardMaxK);
  if (t == 0) return;
  KILN_THROW_IF(t > 0x7fffffff, kInternal, "cuda int8 quantize (rotated): ", t, " rows");
  int log2b = 0;
  while ((int64_t(1) << log2b) < b) ++log2b;
  const int threads = k >= 4096 ? 1024 : k >= 1024 ? 512 : 128;
  const size_t smem = size_t(k) * sizeof(float);
  const bool early = t <= kGemvMaxRows;
  KILN_CUDA_DISPATCH_FLOAT(dtype, T, {
    auto* xt = static_cast<const T*>(x);
    if (row_scale)
      launch_k(smem_kernel_ready<quantize_rows_hadamard_kernel<T, true>, kHadamardMaxBytes>(), unsigned(t), threads,
               smem, s, xt, int(k), log2b, inv, q, row_scale, early);
    else
      launch_k(smem_kernel_ready<quantize_rows_hadamard_kernel<T, false>, kHadamardMaxBytes>(), unsigned(t), threads,
               smem, s, xt, int(k), log2b, inv, q, static_cast<float*>(nullptr), early);
  });
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_int8_dequant(DType dtype, const int32_t* acc, int64_t t, int64_t ld, int64_t n_out, const Int8Epilogue& e,
                         void* y, cudaStream_t s) {
  const bool swiglu = e.act == GemvEpilogue::kSwiGlu;
  KILN_THROW_IF(ld < (swiglu ? 2 : 1) * n_out, kInternal, "cuda int8 dequant: rows of ", ld, " sums for ", n_out,
                " outputs", swiglu ? " (swiglu)" : "");
  if (t == 0 || n_out == 0) return;
  KILN_CUDA_DISPATCH_FLOAT(dtype, T, {
    dispatch_epilogue(e.act, [&]<GemvEpilogue E>() { dequant_launch<T, E>(acc, t, ld, n_out, e, static_cast<T*>(y), s); });
  });
  KILN_CUDA_CHECK_LAUNCH();
}

int64_t int8_tile_rows(int64_t t, int64_t n) {
  static const size_t tile_bytes = [] {
    const char* e = std::getenv("KILN_CUDA_W8A8_TILE_MB");
    return size_t(e && *e ? std::max(0, std::atoi(e)) : 24) << 20;
  }();
  const size_t sums = size_t(t) * size_t(n) * 4;
  if (tile_bytes == 0 || sums <= tile_bytes) return t;
  const int64_t tiles = int64_t((sums + tile_bytes - 1) / tile_bytes);
  const int64_t rows = (t + tiles - 1) / tiles;
  return std::max<int64_t>(256, (rows + 255) / 256 * 256);
}

bool int8_gemv_supports(int64_t m, int64_t k) {
  return m >= 1 && m <= kGemvMaxRows && k > 0 && k % 16 == 0 && k < (int64_t(1) << 30);
}

void launch_int8_gemv(DType dtype, const int8_t* x, const int8_t* w, int64_t m, int64_t n_out, int64_t k,
                      const Int8Epilogue& e, void* y, cudaStream_t s) {
  KILN_THROW_IF(!int8_gemv_supports(m, k), kInternal, "cuda int8 gemv: unsupported m=", m, " k=", k);
  if (n_out == 0) return;
  KILN_CUDA_DISPATCH_FLOAT(dtype, T, {
    dispatch_epilogue(e.act, [&]<GemvEpilogue E>() { gemv_launch<T, E>(x, w, m, n_out, k, e, static_cast<T*>(y), s); });
  });
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
