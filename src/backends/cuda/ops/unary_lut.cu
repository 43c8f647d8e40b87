// Activation lookup tables and the passes reading them (see unary_lut.h). The passes move
// the input's bits only: a T -> T table turns 16 bits into 16 bits, a codes table 16 bits
// into one byte, whatever T is; only the per-token pass converts the looked-up T to f32
// (its row max and int8_code, as launch_unary_int8 does).
// Why tables: the erf GELU is ~24 instructions + the rounding (+ the int8 code) per
// element, which made the GELU pass after a GEMM compute-bound on the H200; a lookup is
// one shared-memory load. Staged tables cost each block 128 KB (64 KB) of L2 reads before
// it streams; the kGlobal variant skips that and relies on L1 holding the hot entries.
// Shared-memory lookups of random entries conflict on banks (32 lanes, 32 banks): the hot
// region of activations (|x| within a few powers of two of 1) spans ~1-2K words, so a few
// lanes share a bank in a typical lookup (an estimate, not measured: cuda_int8_gemm_bench's
// GELU rows compare both reads with the arithmetic).
#include "backends/cuda/common.cuh"
#include "backends/cuda/ops/int8_codes.cuh"
#include "backends/cuda/ops/unary_lut.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

namespace kiln::cuda {
namespace {

constexpr int kLutThreads = 512;
// Vectors a thread loads before it looks them up (bytes in flight: one block of 512
// threads an SM with a staged 128 KB table needs 4 x 16 B a thread to cover HBM latency).
constexpr int kLutUnroll = 4;
// Vectors a lane of the per-token pass keeps between its row's max and its codes: 12 x 8
// covers BERT's FFN rows (3072) with a warp; longer rows look the rest up twice.
constexpr int kLutHeld = 12;

template <typename T>
__device__ __forceinline__ T from_bits(uint16_t b);
template <>
__device__ __forceinline__ __nv_bfloat16 from_bits<__nv_bfloat16>(uint16_t b) {
  return __ushort_as_bfloat16(b);
}
template <>
__device__ __forceinline__ __half from_bits<__half>(uint16_t b) {
  return __ushort_as_half(b);
}
__device__ __forceinline__ uint16_t to_bits(__nv_bfloat16 v) { return __bfloat16_as_ushort(v); }
__device__ __forceinline__ uint16_t to_bits(__half v) { return __half_as_ushort(v); }

// unary_kernel's expression for one element, on every bit pattern.
template <typename T, UnaryOp kOp>
__global__ void lut_fill_values_kernel(uint16_t* __restrict__ values) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < kUnaryLutEntries) values[i] = to_bits(from_f32<T>(unary_f32<kOp>(to_f32(from_bits<T>(uint16_t(i))))));
}

// unary_int8_kernel's expression for one element (static scale), on every bit pattern.
template <typename T, UnaryOp kOp>
__global__ void lut_fill_codes_kernel(float inv, int8_t* __restrict__ codes) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < kUnaryLutEntries)
    codes[i] = int8_t(int8_code(stored_as<T>(unary_f32<kOp>(to_f32(from_bits<T>(uint16_t(i))))), inv));
}

extern __shared__ uint4 lut_smem[];

// Copies the table (a multiple of 16 bytes) into this block's shared memory. The tables
// are written before any step runs (prepare time), never by a kernel of a step: read
// before pdl_wait(), like weights, so the copy overlaps the previous kernel's tail.
__device__ __forceinline__ void lut_stage(const void* table, int bytes) {
  const auto* src = static_cast<const uint4*>(table);
#pragma unroll 4
  for (int i = threadIdx.x; i < bytes / 16; i += blockDim.x) lut_smem[i] = __ldg(src + i);
  __syncthreads();
}

template <bool kShared, typename E>
__device__ __forceinline__ E lut_get(const E* tab, uint16_t b) {
  if constexpr (kShared) return tab[b];
  else return __ldg(tab + b);
}

// out[i] = table[x[i]]: E uint16_t (the T -> T values) or int8_t (the static codes), V
// elements a thread and access. Each thread loads its kLutUnroll vectors, then looks all
// of them up, then stores: the gathers of one vector do not wait behind the previous
// vector's stores (compiled one vector at a time they issued in dependent groups of 8).
// In place allowed (E uint16_t): every thread loads its vectors before it stores them.
template <typename E, int V, bool kShared>
__global__ void __launch_bounds__(kLutThreads)
    unary_lut_map_kernel(const E* __restrict__ table, const uint16_t* x, int64_t n, E* out) {
  const E* tab = table;
  if constexpr (kShared) {
    lut_stage(table, int(kUnaryLutEntries * sizeof(E)));
    tab = reinterpret_cast<const E*>(lut_smem);
  }
  pdl_wait();  // programmatic dependent launch: the previous kernel's writes are visible
  using VX = Vec<uint16_t, V>;
  using VO = Vec<E, V>;
  const int64_t nv = n / V, step = int64_t(gridDim.x) * blockDim.x * kLutUnroll;
  const auto* xv = reinterpret_cast<const VX*>(x);
  auto* ov = reinterpret_cast<VO*>(out);
  for (int64_t base = int64_t(blockIdx.x) * blockDim.x * kLutUnroll + threadIdx.x; base < nv; base += step) {
    VX v[kLutUnroll];
#pragma unroll
    for (int u = 0; u < kLutUnroll; ++u)
      if (base + int64_t(u) * blockDim.x < nv) v[u] = xv[base + int64_t(u) * blockDim.x];
    VO o[kLutUnroll];
#pragma unroll
    for (int u = 0; u < kLutUnroll; ++u)
      if (base + int64_t(u) * blockDim.x < nv) {
#pragma unroll
        for (int e = 0; e < V; ++e) o[u].e[e] = lut_get<kShared>(tab, v[u].e[e]);
      }
#pragma unroll
    for (int u = 0; u < kLutUnroll; ++u) {
      const int64_t i = base + int64_t(u) * blockDim.x;
      if (i < nv) ov[i] = o[u];
    }
  }
}

// Per-token codes: one warp a row (no block-wide reduction), rows strided over the
// persistent grid. The looked-up T values are those unary_int8_kernel rounds its
// activation to; the max over them is exact in any order, then int8_codes.cuh's rounding.
template <typename T, int V, bool kShared>
__global__ void __launch_bounds__(kLutThreads)
    unary_lut_int8_rows_kernel(const uint16_t* __restrict__ table, const uint16_t* __restrict__ x, int64_t rows,
                               int64_t k, int8_t* __restrict__ q, float* __restrict__ row_scale) {
  const uint16_t* tab = table;
  if constexpr (kShared) {
    lut_stage(table, int(kUnaryLutEntries * 2));
    tab = reinterpret_cast<const uint16_t*>(lut_smem);
  }
  pdl_wait();  // programmatic dependent launch: the previous kernel's writes are visible
  using VX = Vec<uint16_t, V>;
  using VQ = Vec<int8_t, V>;
  auto value = [](uint16_t b) { return to_f32(from_bits<T>(b)); };
  const int lane = threadIdx.x & 31;
  const int64_t warps = blockDim.x >> 5, nv = k / V;
  for (int64_t r = int64_t(blockIdx.x) * warps + (threadIdx.x >> 5); r < rows; r += int64_t(gridDim.x) * warps) {
    const auto* xr = reinterpret_cast<const VX*>(x + r * k);
    auto* qr = reinterpret_cast<VQ*>(q + r * k);
    VX a[kLutHeld];
#pragma unroll
    for (int j = 0; j < kLutHeld; ++j)
      if (lane + int64_t(j) * 32 < nv) a[j] = xr[lane + int64_t(j) * 32];
    float mx = 0.0f;
#pragma unroll
    for (int j = 0; j < kLutHeld; ++j)
      if (lane + int64_t(j) * 32 < nv) {
#pragma unroll
        for (int e = 0; e < V; ++e) {
          a[j].e[e] = lut_get<kShared>(tab, a[j].e[e]);
          mx = fmaxf(mx, fabsf(value(a[j].e[e])));
        }
      }
    for (int64_t i = lane + int64_t(kLutHeld) * 32; i < nv; i += 32) {
      const VX v = xr[i];
#pragma unroll
      for (int e = 0; e < V; ++e) mx = fmaxf(mx, fabsf(value(lut_get<kShared>(tab, v.e[e]))));
    }
    const float scale = int8_row_scale_of(warp_max(mx));
    const float inv = int8_inv_of(scale);
    if (lane == 0) row_scale[r] = scale;
#pragma unroll
    for (int j = 0; j < kLutHeld; ++j)
      if (lane + int64_t(j) * 32 < nv) {
        VQ c;
#pragma unroll
        for (int e = 0; e < V; ++e) c.e[e] = int8_t(int8_code(value(a[j].e[e]), inv));
        qr[lane + int64_t(j) * 32] = c;
      }
    for (int64_t i = lane + int64_t(kLutHeld) * 32; i < nv; i += 32) {
      const VX v = xr[i];
      VQ c;
#pragma unroll
      for (int e = 0; e < V; ++e) c.e[e] = int8_t(int8_code(value(lut_get<kShared>(tab, v.e[e])), inv));
      qr[i] = c;
    }
  }
}

// Blocks of a persistent grid for `kernel`: as many as fit on the device at once (the
// staged variants: one to three an SM), no more than the work needs. The first launch on
// a device sets the kernel's dynamic shared memory limit (the default is 48 KB) and asks
// the occupancy, kept per (kernel, device): later launches make no CUDA calls here (these
// are host-side calls, allowed while a stream is being captured, but need not repeat).
template <typename... Params>
unsigned lut_grid(void (*kernel)(Params...), size_t smem, int64_t work_blocks) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, int64_t> resident;  // blocks the device holds at once
  int dev = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  const auto key = std::make_pair(reinterpret_cast<const void*>(kernel), dev);
  int64_t most = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = resident.find(key);
    if (it == resident.end()) {
      int sms = 0, per_sm = 0;
      KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
      if (smem > 48 * 1024)
        KILN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
      KILN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kLutThreads, smem));
      KILN_CHECK(per_sm > 0, "cuda: a lookup-table kernel with ", smem, " bytes of shared memory fits no SM");
      it = resident.emplace(key, int64_t(sms) * per_sm).first;
    }
    most = it->second;
  }
  return unsigned(std::max<int64_t>(1, std::min<int64_t>(work_blocks, most)));
}

template <template <typename, UnaryOp> class Fill, typename T, typename F>
void dispatch_fill(UnaryOp op, F&& go) {
  switch (op) {
    case UnaryOp::kGeluErf: go(Fill<T, UnaryOp::kGeluErf>{}); break;
    case UnaryOp::kGeluTanh: go(Fill<T, UnaryOp::kGeluTanh>{}); break;
    case UnaryOp::kSilu: go(Fill<T, UnaryOp::kSilu>{}); break;
    case UnaryOp::kTanh: go(Fill<T, UnaryOp::kTanh>{}); break;
  }
}

template <typename T, UnaryOp kOp>
struct FillValues {
  static constexpr auto kernel = lut_fill_values_kernel<T, kOp>;
};
template <typename T, UnaryOp kOp>
struct FillCodes {
  static constexpr auto kernel = lut_fill_codes_kernel<T, kOp>;
};

void check_lut_dtype(DType t, const char* what) {
  KILN_THROW_IF(t != DType::kBF16 && t != DType::kF16, kInternal, "cuda: ", what, " takes bf16 or f16, not ",
                dtype_name(t));
}

}  // namespace

void launch_unary_lut_fill(UnaryOp op, DType t, uint16_t* values, cudaStream_t s) {
  check_lut_dtype(t, "an activation table");
  const unsigned g = unsigned(kUnaryLutEntries / 256);
  auto go = [&](auto f) { decltype(f)::kernel<<<g, 256, 0, s>>>(values); };
  if (t == DType::kBF16) dispatch_fill<FillValues, __nv_bfloat16>(op, go);
  else dispatch_fill<FillValues, __half>(op, go);
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_unary_lut_fill_codes(UnaryOp op, DType t, float inv, int8_t* codes, cudaStream_t s) {
  check_lut_dtype(t, "an activation codes table");
  const unsigned g = unsigned(kUnaryLutEntries / 256);
  auto go = [&](auto f) { decltype(f)::kernel<<<g, 256, 0, s>>>(inv, codes); };
  if (t == DType::kBF16) dispatch_fill<FillCodes, __nv_bfloat16>(op, go);
  else dispatch_fill<FillCodes, __half>(op, go);
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_unary_lut(const UnaryLut& lut, const void* x, int64_t n, void* out, cudaStream_t s, UnaryLutRead read) {
  check_lut_dtype(lut.dtype, "the table activation");
  KILN_CHECK(lut.values, "cuda: the table activation has no values table");
  if (n == 0) return;
  const auto* px = static_cast<const uint16_t*>(x);
  auto* po = static_cast<uint16_t*>(out);
  const bool shared = read == UnaryLutRead::kShared;
  const size_t smem = shared ? size_t(kUnaryLutEntries) * 2 : 0;
  auto go = [&](auto kernel, int v) {
    const int64_t per_block = int64_t(kLutThreads) * kLutUnroll * v;
    launch_k(kernel, lut_grid(kernel, smem, (n / v + per_block - 1) / per_block), kLutThreads, smem, s, lut.values, px,
             n, po);
  };
  const bool vec = n % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0;
  if (vec) shared ? go(unary_lut_map_kernel<uint16_t, 8, true>, 8) : go(unary_lut_map_kernel<uint16_t, 8, false>, 8);
  else shared ? go(unary_lut_map_kernel<uint16_t, 1, true>, 1) : go(unary_lut_map_kernel<uint16_t, 1, false>, 1);
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_unary_int8_lut(const UnaryLut& lut, const void* x, int64_t rows, int64_t k, float inv, int8_t* q,
                           float* row_scale, cudaStream_t s, UnaryLutRead read) {
  check_lut_dtype(lut.dtype, "the table int8 activation");
  KILN_THROW_IF(k % 4 != 0, kInternal, "cuda int8 table activation: k=", k, " is not a multiple of 4");
  KILN_THROW_IF(rows > 0x7fffffff, kInternal, "cuda int8 table activation: ", rows, " rows");
  KILN_THROW_IF(reinterpret_cast<uintptr_t>(x) % 8 != 0 || reinterpret_cast<uintptr_t>(q) % 4 != 0, kInternal,
                "cuda int8 table activation: x must be 8-byte and q 4-byte aligned");
  if (row_scale) {
    KILN_CHECK(lut.values, "cuda: the per-token table activation has no values table");
  } else {
    KILN_CHECK(lut.codes, "cuda: the static table activation has no codes table");
    KILN_CHECK(std::memcmp(&lut.inv, &inv, sizeof inv) == 0, "cuda: the codes table was made for inv ", lut.inv,
               ", the pass quantizes with ", inv);
  }
  if (rows == 0 || k == 0) return;
  const auto* px = static_cast<const uint16_t*>(x);
  const bool shared = read == UnaryLutRead::kShared;
  if (!row_scale) {
    const int64_t n = rows * k;
    const size_t smem = shared ? size_t(kUnaryLutEntries) : 0;
    auto go = [&](auto kernel, int v) {
      const int64_t per_block = int64_t(kLutThreads) * kLutUnroll * v;
      launch_k(kernel, lut_grid(kernel, smem, (n / v + per_block - 1) / per_block), kLutThreads, smem, s, lut.codes,
               px, n, q);
    };
    // 16-byte loads and 8-byte stores where the length and both ends allow, else 8 and 4.
    if (n % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(q) % 8 == 0)
      shared ? go(unary_lut_map_kernel<int8_t, 8, true>, 8) : go(unary_lut_map_kernel<int8_t, 8, false>, 8);
    else
      shared ? go(unary_lut_map_kernel<int8_t, 4, true>, 4) : go(unary_lut_map_kernel<int8_t, 4, false>, 4);
    KILN_CUDA_CHECK_LAUNCH();
    return;
  }
  const size_t smem = shared ? size_t(kUnaryLutEntries) * 2 : 0;
  const int64_t warps = kLutThreads / 32;
  auto go = [&](auto kernel) {
    launch_k(kernel, lut_grid(kernel, smem, (rows + warps - 1) / warps), kLutThreads, smem, s, lut.values, px, rows, k,
             q, row_scale);
  };
  auto typed = [&](auto type_tag) {
    using T = decltype(type_tag);
    if (k % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(q) % 8 == 0)
      shared ? go(unary_lut_int8_rows_kernel<T, 8, true>) : go(unary_lut_int8_rows_kernel<T, 8, false>);
    else
      shared ? go(unary_lut_int8_rows_kernel<T, 4, true>) : go(unary_lut_int8_rows_kernel<T, 4, false>);
  };
  if (lut.dtype == DType::kBF16) typed(__nv_bfloat16{});
  else typed(__half{});
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
