// Row norms (see norm.h). LayerNorm's variance is the two-pass sum of squared deviations,
// as the CPU reference computes it, not E[x²]-mean². Two kernels:
// - norm_regs_kernel where the row is whole 16-byte vectors: each thread loads its NCH
//   vectors of the row (and of the residual) at once and keeps them in registers, so the
//   row is read from memory once. A block per row, each row spread over as many threads
//   as it has vectors (up to 1024; two or four vectors a thread beyond). Measured on the
//   H200 (bench/cuda_norm_bench's sweep, 2026-11-30): four vectors a thread and rows
//   packed into 256-thread blocks streamed 10-15% slower at prefill and encoder sizes
//   ([2048, 4096] AddRMSNorm 2666 vs 3139 GB/s; [4096, 768] LayerNorm 830 vs 983), so
//   every row count takes this shape; launch_add_norm_shaped forces others for the sweep.
// - norm_warp_kernel for short rows (at most 128 vectors: BERT's 768) from
//   kNormWarpMinRows rows on (or any count with KILN_CUDA_NORM_SHORT=warp): a block per row of 768 bf16 is 96 threads whose row waits on
//   its loads, then two block_sums over 3 warps (two __syncthreads each), then the
//   stores: a latency chain per row with little in flight per thread ([4096, 768]
//   AddLayerNorm: 1288 GB/s, 30% of copy, with no launch shape above ~1850). Here a warp
//   owns a row (3 vectors a lane at 768) and reduces with shuffles only, several rows a
//   block and two rows a warp: the next row's loads are issued before the current row's
//   reductions, and gamma and beta stay in registers across the warp's rows.
// - the multi-pass kernels, one block per row re-reading it per pass (L1/L2 hits), for
//   rows of other lengths.
// Launched in a decode step of a few rows (`early`), a norm lets the next kernel launch at
// its start (common.cuh: the GEMV after it then streams its weights meanwhile); gamma and
// beta are requested before the wait either way.
// Every kernel writes one of six outputs (NormOut): T; the E4M3 codes of an FP8 Linear's
// input; the int8 codes of a W8A8 Linear's input with a static scale, or with each row's
// own scale (per token); or T and those int8 codes both (the dual output, for a norm
// whose output other nodes read too: cuda_int8_fuse.h). Each value is rounded to T first,
// as the T kernel stores it, then quantized with fp8_codes.cuh's / int8_codes.cuh's
// rounding: the codes (and row scales) of norm -> quantize, bit for bit. The output mode
// is a template parameter, so the T-only kernels are the same code as before.
#include "backends/cuda/common.cuh"
#include "backends/cuda/ops/fp8_codes.cuh"
#include "backends/cuda/ops/gemv.h"
#include "backends/cuda/ops/int8_codes.cuh"
#include "backends/cuda/ops/norm.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

namespace kiln::cuda {
namespace {

enum class NormOut { kT, kFp8, kI8, kI8Row, kTI8, kTI8Row };

// T and int8 codes (static scale, or per token).
constexpr bool norm_dual(NormOut o) { return o == NormOut::kTI8 || o == NormOut::kTI8Row; }
// Int8 codes with each row's own scale.
constexpr bool norm_row_scaled(NormOut o) { return o == NormOut::kI8Row || o == NormOut::kTI8Row; }

// The element type of output y (the dual outputs' codes go to NormArgs::q).
template <typename T, NormOut O>
using NormY = std::conditional_t<O == NormOut::kT || norm_dual(O), T,
                                 std::conditional_t<O == NormOut::kFp8, uint8_t, int8_t>>;

// A norm launch: sum = x + res when res is set (stored where sum is set), y = norm(sum or x).
template <typename T, typename Y>
struct NormArgs {
  const T* x;
  const T* res;
  T* sum;
  const float* gamma;
  const float* beta;  // null: none (RMSNorm, LayerNorm without bias)
  float eps;
  int64_t rows, dim;
  Y* y;
  float inv;         // kFp8, kI8, kTI8: the static scale's inverse
  float* row_scale;  // kI8Row, kTI8Row: [rows], each row's scale
  int8_t* q;         // kTI8, kTI8Row: the codes of y, [rows, dim]
  bool early;
};

// One normalized value as output Y, with the row's (or the static) inverse scale.
template <typename T, NormOut O>
__device__ __forceinline__ NormY<T, O> norm_code(float v, float inv) {
  if constexpr (O == NormOut::kT || norm_dual(O)) return from_f32<T>(v);
  else if constexpr (O == NormOut::kFp8) return fp8_code_via<T>(v, inv);
  else return int8_t(int8_code(stored_as<T>(v), inv));
}

// The dual outputs' code of y as stored in T: the codes the quantize pass makes of it.
template <typename T>
__device__ __forceinline__ int8_t dual_code(T y, float inv) {
  return int8_t(int8_code(to_f32(y), inv));
}

// With a residual (the fused AddLayerNorm/AddRMSNorm), the row is first x + res,
// rounded to T and written to `sum` — exactly what the unfused Add would have stored —
// and the norm reads that; each thread reads back only elements it wrote itself. With
// no sum to store (null), the row is null and the kernel adds at each read instead.
template <typename T>
__device__ const T* add_residual(const T* xr, const T* res, T* sum, int64_t dim) {
  if (!res) return xr;
  if (!sum) return nullptr;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) sum[j] = from_f32<T>(to_f32(xr[j]) + to_f32(res[j]));
  return sum;
}

// Before the wait: the trigger (early) and this thread's first parameters toward L1.
__device__ __forceinline__ void norm_prologue(bool early, const float* gamma, const float* beta, int64_t first,
                                              int64_t dim) {
  if (early) pdl_trigger();
  if (first < dim) {
    prefetch_l1(gamma + first);
    if (beta) prefetch_l1(beta + first);
  }
  pdl_wait();  // programmatic dependent launch: the previous kernel's writes are visible
}

// The multi-pass kernel: one block per row.
template <typename T, NormOut O, bool kRms>
__global__ void norm_rows_kernel(NormArgs<T, NormY<T, O>> a) {
  const int64_t dim = a.dim, off = int64_t(blockIdx.x) * dim;
  norm_prologue(a.early, a.gamma, a.beta, threadIdx.x, dim);
  __shared__ float scratch[32];
  const T* xr = add_residual(a.x + off, a.res ? a.res + off : nullptr, a.sum ? a.sum + off : nullptr, dim);
  // Element j of the row (x + res rounded to T where the sum is not stored).
  auto xat = [&](int64_t j) {
    return xr ? to_f32(xr[j]) : to_f32(from_f32<T>(to_f32(a.x[off + j]) + to_f32(a.res[off + j])));
  };
  float mean = 0.0f, r;
  if constexpr (kRms) {
    float ss = 0.0f;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
      const float v = xat(j);
      ss += v * v;
    }
    r = rsqrtf(block_sum(ss, scratch) / float(dim) + a.eps);
  } else {
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) sum += xat(j);
    mean = block_sum(sum, scratch) / float(dim);
    float var = 0.0f;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
      const float d = xat(j) - mean;
      var += d * d;
    }
    r = rsqrtf(block_sum(var, scratch) / float(dim) + a.eps);
  }
  auto value = [&](int64_t j) {
    if constexpr (kRms) return xat(j) * r * a.gamma[j];
    else return (xat(j) - mean) * r * a.gamma[j] + (a.beta ? a.beta[j] : 0.0f);
  };
  float inv = a.inv;
  if constexpr (norm_row_scaled(O)) {  // the row's max over its T-rounded outputs
    float m = 0.0f;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) m = fmaxf(m, fabsf(stored_as<T>(value(j))));
    const float scale = int8_row_scale_of(block_max(m, scratch));
    inv = int8_inv_of(scale);
    if (threadIdx.x == 0) a.row_scale[blockIdx.x] = scale;
  }
  NormY<T, O>* yr = a.y + off;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
    const NormY<T, O> o = norm_code<T, O>(value(j), inv);
    yr[j] = o;
    if constexpr (norm_dual(O)) a.q[off + j] = dual_code(o, inv);
  }
}

// Sum (max) over the blockDim.x threads of this thread's row, threadIdx.y (a multiple of
// 32; the block's warps at most 32); every thread of the row gets it. A warp per row needs
// no shared memory and no barrier; with one row per block this is block_sum (block_max).
template <bool kMax>
__device__ __forceinline__ float row_reduce(float v, float* scratch) {
  v = kMax ? warp_max(v) : warp_sum(v);
  const int wpr = int(blockDim.x) >> 5;
  if (wpr == 1) return v;  // the same for every thread of the block
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  float* s = scratch + threadIdx.y * wpr;
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) s[w] = v;
  __syncthreads();
  v = lane < wpr ? s[lane] : 0.0f;
  return kMax ? warp_max(v) : warp_sum(v);
}

// VEC floats of gamma or beta at element j (16-byte aligned).
template <int VEC>
__device__ __forceinline__ void load_params(const float* p, int j, float (&out)[VEC]) {
#pragma unroll
  for (int q = 0; q < VEC / 4; ++q) {
    const float4 f = *reinterpret_cast<const float4*>(p + j + 4 * q);
    out[4 * q] = f.x, out[4 * q + 1] = f.y, out[4 * q + 2] = f.z, out[4 * q + 3] = f.w;
  }
}

// The dual outputs' codes of VEC stored values, as one VEC-byte store.
template <int VEC, typename T>
__device__ __forceinline__ void store_dual_codes(const T (&y)[VEC], float inv, int8_t* q) {
  struct alignas(VEC) Codes {
    int8_t e[VEC];
  } c;
#pragma unroll
  for (int u = 0; u < VEC; ++u) c.e[u] = dual_code(y[u], inv);
  *reinterpret_cast<Codes*>(q) = c;
}

// The register-held kernel (see the top of the file): blockDim.x threads per row, each
// holding vectors threadIdx.x + i * blockDim.x (i < NCH) of its row; blockDim.y rows per
// block. The residual sum is rounded to T before the statistics, exactly as stored in `sum`.
template <typename T, NormOut O, int NCH, bool kRms>
__global__ void __launch_bounds__(1024) norm_regs_kernel(NormArgs<T, NormY<T, O>> a) {
  using Y = NormY<T, O>;
  constexpr int VEC = 16 / int(sizeof(T));
  const int tpr = int(blockDim.x), dim = int(a.dim), nvec = dim / VEC;
  const int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool live = row < a.rows;
  if (a.early) pdl_trigger();
#pragma unroll
  for (int i = 0; i < NCH; ++i) {
    const int j = (int(threadIdx.x) + i * tpr) * VEC;  // this thread's vector i
    if (j < dim) {
      prefetch_l1(a.gamma + j);
      if (a.beta) prefetch_l1(a.beta + j);
    }
  }
  pdl_wait();  // programmatic dependent launch: the previous kernel's writes are visible
  __shared__ float scratch[32];
  const int64_t base = row * dim;
  // Every load of the row first (and of the residual), then the arithmetic.
  uint4 xv[NCH], rv[NCH];
#pragma unroll
  for (int i = 0; i < NCH; ++i) {
    const int vi = int(threadIdx.x) + i * tpr;
    xv[i] = rv[i] = make_uint4(0, 0, 0, 0);  // +0 in every float type
    if (!live || vi >= nvec) continue;
    xv[i] = *reinterpret_cast<const uint4*>(a.x + base + int64_t(vi) * VEC);
    if (a.res) rv[i] = *reinterpret_cast<const uint4*>(a.res + base + int64_t(vi) * VEC);
  }
  if (a.res) {
#pragma unroll
    for (int i = 0; i < NCH; ++i) {
      const int vi = int(threadIdx.x) + i * tpr;
      T* xe = reinterpret_cast<T*>(&xv[i]);
      const T* re = reinterpret_cast<const T*>(&rv[i]);
#pragma unroll
      for (int u = 0; u < VEC; ++u) xe[u] = from_f32<T>(to_f32(xe[u]) + to_f32(re[u]));
      if (live && vi < nvec && a.sum) *reinterpret_cast<uint4*>(a.sum + base + int64_t(vi) * VEC) = xv[i];
    }
  }
  auto elem = [&](int i, int u) { return to_f32(reinterpret_cast<const T*>(&xv[i])[u]); };
  float acc = 0.0f;
#pragma unroll
  for (int i = 0; i < NCH; ++i)
    if (int(threadIdx.x) + i * tpr < nvec)
#pragma unroll
      for (int u = 0; u < VEC; ++u) acc += kRms ? elem(i, u) * elem(i, u) : elem(i, u);
  float mean = 0.0f, r;
  if constexpr (kRms) {
    r = rsqrtf(row_reduce<false>(acc, scratch) / float(dim) + a.eps);
  } else {
    mean = row_reduce<false>(acc, scratch) / float(dim);
    float var = 0.0f;
#pragma unroll
    for (int i = 0; i < NCH; ++i)
      if (int(threadIdx.x) + i * tpr < nvec)
#pragma unroll
        for (int u = 0; u < VEC; ++u) {
          const float d = elem(i, u) - mean;
          var += d * d;
        }
    r = rsqrtf(row_reduce<false>(var, scratch) / float(dim) + a.eps);
  }
  // The VEC outputs of vector i, in f32.
  auto outputs = [&](int i, float (&o)[VEC]) {
    const int j = (int(threadIdx.x) + i * tpr) * VEC;
    float g[VEC], b[VEC];
    load_params<VEC>(a.gamma, j, g);
    if (!kRms && a.beta) load_params<VEC>(a.beta, j, b);
#pragma unroll
    for (int u = 0; u < VEC; ++u) {
      if constexpr (kRms) o[u] = elem(i, u) * r * g[u];
      else o[u] = (elem(i, u) - mean) * r * g[u] + (a.beta ? b[u] : 0.0f);
    }
  };
  float inv = a.inv;
  if constexpr (norm_row_scaled(O)) {  // the row's max over its T-rounded outputs
    float m = 0.0f;
#pragma unroll
    for (int i = 0; i < NCH; ++i) {
      if (int(threadIdx.x) + i * tpr >= nvec) continue;
      float o[VEC];
      outputs(i, o);
#pragma unroll
      for (int u = 0; u < VEC; ++u) m = fmaxf(m, fabsf(stored_as<T>(o[u])));
    }
    const float scale = int8_row_scale_of(row_reduce<true>(m, scratch));
    inv = int8_inv_of(scale);
    if (live && threadIdx.x == 0) a.row_scale[row] = scale;
  }
  if (!live) return;
#pragma unroll
  for (int i = 0; i < NCH; ++i) {
    const int vi = int(threadIdx.x) + i * tpr;
    if (vi >= nvec) continue;
    // VEC outputs: 16 bytes of T, or VEC bytes of codes.
    struct alignas(VEC * sizeof(Y)) Out {
      Y e[VEC];
    } out;
    float o[VEC];
    outputs(i, o);
#pragma unroll
    for (int u = 0; u < VEC; ++u) out.e[u] = norm_code<T, O>(o[u], inv);
    *reinterpret_cast<Out*>(a.y + base + int64_t(vi) * VEC) = out;
    if constexpr (norm_dual(O)) store_dual_codes<VEC>(out.e, inv, a.q + base + int64_t(vi) * VEC);
  }
}

// The warp-per-row kernel (see the top of the file): warp w of the grid takes rows
// w, w + W, w + 2W... (W: the grid's warps); lane l holds vectors l + 32 i (i < NCH) of its
// row. The loop condition is the same for the whole warp, so every lane takes part in
// every shuffle. Each row's arithmetic is the register-held kernel's, with the row's sums
// over 32 lanes instead of a block.
constexpr int kWarpMaxWarps = 8;
constexpr int kWarpDefaultRowsPerWarp = 2;
constexpr int kWarpMaxVectors = 128;  // 4 a lane

template <typename T, NormOut O, int NCH, bool kRms>
__global__ void __launch_bounds__(32 * kWarpMaxWarps) norm_warp_kernel(NormArgs<T, NormY<T, O>> a) {
  using Y = NormY<T, O>;
  constexpr int VEC = 16 / int(sizeof(T));
  const int lane = int(threadIdx.x) & 31, nvec = int(a.dim) / VEC, wpb = int(blockDim.x) >> 5;
  const int64_t step = int64_t(gridDim.x) * wpb;
  int64_t row = int64_t(blockIdx.x) * wpb + (int(threadIdx.x) >> 5);
  if (a.early) pdl_trigger();
  // gamma and beta are never written by a kernel: read before the wait, kept for every row.
  float g[NCH][VEC], b[NCH][VEC];
#pragma unroll
  for (int i = 0; i < NCH; ++i) {
#pragma unroll
    for (int u = 0; u < VEC; ++u) g[i][u] = b[i][u] = 0.0f;
    const int vi = lane + 32 * i;
    if (vi < nvec) {
      load_params<VEC>(a.gamma, vi * VEC, g[i]);
      if (!kRms && a.beta) load_params<VEC>(a.beta, vi * VEC, b[i]);
    }
  }
  pdl_wait();  // programmatic dependent launch: the previous kernel's writes are visible
  uint4 xv[NCH], rv[NCH];  // the next row's vectors, loaded ahead
  auto load = [&](int64_t r) {
#pragma unroll
    for (int i = 0; i < NCH; ++i) {
      const int vi = lane + 32 * i;
      xv[i] = rv[i] = make_uint4(0, 0, 0, 0);  // +0 in every float type
      if (r >= a.rows || vi >= nvec) continue;
      const int64_t at = r * a.dim + int64_t(vi) * VEC;
      xv[i] = *reinterpret_cast<const uint4*>(a.x + at);
      if (a.res) rv[i] = *reinterpret_cast<const uint4*>(a.res + at);
    }
  };
  load(row);
  for (; row < a.rows; row += step) {
    const int64_t base = row * a.dim;
    uint4 cv[NCH];
#pragma unroll
    for (int i = 0; i < NCH; ++i) cv[i] = xv[i];
    if (a.res) {
#pragma unroll
      for (int i = 0; i < NCH; ++i) {
        const int vi = lane + 32 * i;
        T* xe = reinterpret_cast<T*>(&cv[i]);
        const T* re = reinterpret_cast<const T*>(&rv[i]);
#pragma unroll
        for (int u = 0; u < VEC; ++u) xe[u] = from_f32<T>(to_f32(xe[u]) + to_f32(re[u]));
        if (vi < nvec && a.sum) *reinterpret_cast<uint4*>(a.sum + base + int64_t(vi) * VEC) = cv[i];
      }
    }
    load(row + step);  // in flight while this row reduces and stores
    auto elem = [&](int i, int u) { return to_f32(reinterpret_cast<const T*>(&cv[i])[u]); };
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < NCH; ++i)
      if (lane + 32 * i < nvec)
#pragma unroll
        for (int u = 0; u < VEC; ++u) acc += kRms ? elem(i, u) * elem(i, u) : elem(i, u);
    float mean = 0.0f, r;
    if constexpr (kRms) {
      r = rsqrtf(warp_sum(acc) / float(a.dim) + a.eps);
    } else {
      mean = warp_sum(acc) / float(a.dim);
      float var = 0.0f;
#pragma unroll
      for (int i = 0; i < NCH; ++i)
        if (lane + 32 * i < nvec)
#pragma unroll
          for (int u = 0; u < VEC; ++u) {
            const float d = elem(i, u) - mean;
            var += d * d;
          }
      r = rsqrtf(warp_sum(var) / float(a.dim) + a.eps);
    }
    auto out = [&](int i, int u) {
      if constexpr (kRms) return elem(i, u) * r * g[i][u];
      else return (elem(i, u) - mean) * r * g[i][u] + b[i][u];
    };
    float inv = a.inv;
    if constexpr (norm_row_scaled(O)) {  // the row's max over its T-rounded outputs
      float m = 0.0f;
#pragma unroll
      for (int i = 0; i < NCH; ++i)
        if (lane + 32 * i < nvec)
#pragma unroll
          for (int u = 0; u < VEC; ++u) m = fmaxf(m, fabsf(stored_as<T>(out(i, u))));
      const float scale = int8_row_scale_of(warp_max(m));
      inv = int8_inv_of(scale);
      if (lane == 0) a.row_scale[row] = scale;
    }
#pragma unroll
    for (int i = 0; i < NCH; ++i) {
      const int vi = lane + 32 * i;
      if (vi >= nvec) continue;
      struct alignas(VEC * sizeof(Y)) Out {
        Y e[VEC];
      } o;
#pragma unroll
      for (int u = 0; u < VEC; ++u) o.e[u] = norm_code<T, O>(out(i, u), inv);
      *reinterpret_cast<Out*>(a.y + base + int64_t(vi) * VEC) = o;
      if constexpr (norm_dual(O)) store_dual_codes<VEC>(o.e, inv, a.q + base + int64_t(vi) * VEC);
    }
  }
}

// Decode steps of a few rows: the next kernel is a GEMV, worth launching early.
bool early_trigger(int64_t rows) { return rows <= kGemvMaxRows; }

template <typename T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::kF32;
  else if constexpr (std::is_same_v<T, __half>) return DType::kF16;
  else return DType::kBF16;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The register-held kernel's shape: NCH vectors per thread, tpr threads per row, rpb rows
// per block.
struct RegsShape {
  int nch = 0, tpr = 0, rpb = 0;
};

// The shape for rows of `nvec` vectors, or `forced` (the bench's sweep: vectors per
// thread and rows per block); nch 0 when the row does not fit.
RegsShape regs_shape(int64_t nvec, NormShape forced) {
  RegsShape sh;
  sh.nch = forced.vectors ? forced.vectors : nvec <= 1024 ? 1 : nvec <= 2048 ? 2 : 4;
  sh.tpr = int(std::max<int64_t>(32, ((nvec + sh.nch - 1) / sh.nch + 31) / 32 * 32));
  sh.rpb = forced.vectors ? std::max(1, forced.rows_per_block) : 1;
  if ((sh.nch != 1 && sh.nch != 2 && sh.nch != 4) || sh.tpr * sh.rpb > 1024) return {};
  return sh;
}

// Whether every operand is 16-byte aligned (y and q: one vector's outputs).
template <typename T, typename Y>
bool operands_aligned(const NormArgs<T, Y>& a) {
  constexpr int VEC = 16 / int(sizeof(T));
  return aligned16(a.x) && aligned16(a.res) && aligned16(a.sum) && aligned16(a.gamma) && aligned16(a.beta) &&
         reinterpret_cast<uintptr_t>(a.y) % (VEC * sizeof(Y)) == 0 && reinterpret_cast<uintptr_t>(a.q) % VEC == 0;
}

// Launches norm_regs_kernel when the row fits (whole 16-byte vectors, at most 4 per
// thread of 1024, 16-byte aligned operands); returns false otherwise.
template <typename T, NormOut O, bool kRms>
bool launch_norm_regs(const NormArgs<T, NormY<T, O>>& a, NormShape forced, cudaStream_t s) {
  constexpr int VEC = 16 / int(sizeof(T));
  if (a.dim % VEC != 0 || a.dim / VEC > 4096 || !operands_aligned(a)) return false;
  const RegsShape sh = regs_shape(a.dim / VEC, forced);
  if (!sh.nch) return false;
  const unsigned grid = unsigned((a.rows + sh.rpb - 1) / sh.rpb);
  const dim3 block(unsigned(sh.tpr), unsigned(sh.rpb));
  switch (sh.nch) {
    case 1: launch_k(norm_regs_kernel<T, O, 1, kRms>, grid, block, 0, s, a); break;
    case 2: launch_k(norm_regs_kernel<T, O, 2, kRms>, grid, block, 0, s, a); break;
    default: launch_k(norm_regs_kernel<T, O, 4, kRms>, grid, block, 0, s, a); break;
  }
  return true;
}

// Launches norm_warp_kernel when the row fits (whole 16-byte vectors, at most
// kWarpMaxVectors, 16-byte aligned operands): `warps` warps a block, each taking about
// `rows_per_warp` rows (0: the defaults). Returns false otherwise.
template <typename T, NormOut O, bool kRms>
bool launch_norm_warp(const NormArgs<T, NormY<T, O>>& a, int warps, int rows_per_warp, cudaStream_t s) {
  constexpr int VEC = 16 / int(sizeof(T));
  if (a.dim % VEC != 0 || a.dim / VEC > kWarpMaxVectors || !operands_aligned(a)) return false;
  warps = warps ? warps : kWarpMaxWarps;
  rows_per_warp = rows_per_warp ? rows_per_warp : kWarpDefaultRowsPerWarp;
  if (warps < 1 || warps > kWarpMaxWarps || rows_per_warp < 1) return false;
  // Fewer rows than warps a block: a warp per row, none idle.
  const int64_t wpb = std::min<int64_t>(warps, a.rows);
  const int64_t per_block = wpb * rows_per_warp;
  const unsigned grid = unsigned(std::min<int64_t>((a.rows + per_block - 1) / per_block, 0x7fffffff));
  const unsigned block = unsigned(32 * wpb);
  switch ((a.dim / VEC + 31) / 32) {
    case 1: launch_k(norm_warp_kernel<T, O, 1, kRms>, grid, block, 0, s, a); break;
    case 2: launch_k(norm_warp_kernel<T, O, 2, kRms>, grid, block, 0, s, a); break;
    case 3: launch_k(norm_warp_kernel<T, O, 3, kRms>, grid, block, 0, s, a); break;
    default: launch_k(norm_warp_kernel<T, O, 4, kRms>, grid, block, 0, s, a); break;
  }
  return true;
}

int threads_for(int64_t dim) {
  int t = 32;
  while (t < 1024 && t * 4 < dim) t *= 2;
  return t;
}

// A norm into output O with norm_kernel_for's kernel (the same choice for every O, so all
// round alike), or the forced one (the bench's sweep; false when the row does not take it).
template <typename T, NormOut O, bool kRms>
bool launch_norm(const void* x, const void* res, const float* gamma, const float* beta, float eps, int64_t rows,
                 int64_t dim, void* sum, void* y, float inv, float* row_scale, int8_t* q, cudaStream_t s,
                 NormShape forced = {}) {
  KILN_THROW_IF(norm_dual(O) != (q != nullptr) || norm_row_scaled(O) != (row_scale != nullptr), kInternal,
                "cuda norm: the codes or row scales do not match the output mode");
  KILN_THROW_IF(rows > 0x7fffffff, kInternal, "cuda norm: ", rows, " rows");
  const NormShort mode = norm_short_mode();  // a bad KILN_CUDA_NORM_SHORT throws even with no rows
  if (rows == 0) return true;
  const NormArgs<T, NormY<T, O>> a{static_cast<const T*>(x), static_cast<const T*>(res), static_cast<T*>(sum), gamma,
                                   beta, eps, rows, dim, static_cast<NormY<T, O>*>(y), inv, row_scale, q,
                                   early_trigger(rows)};
  if (forced.vectors) return launch_norm_regs<T, O, kRms>(a, forced, s);
  if (forced.warps) return launch_norm_warp<T, O, kRms>(a, forced.warps, forced.rows_per_warp, s);
  const NormKernel k = operands_aligned(a) ? norm_kernel_for(dtype_of<T>(), dim, mode, rows) : NormKernel::kRows;
  if (k == NormKernel::kWarp && launch_norm_warp<T, O, kRms>(a, 0, 0, s)) return true;
  if (k != NormKernel::kRows && launch_norm_regs<T, O, kRms>(a, {}, s)) return true;
  launch_k(norm_rows_kernel<T, O, kRms>, unsigned(rows), threads_for(dim), 0, s, a);
  return true;
}

}  // namespace

NormShort norm_short_from_value(const char* v) {
  if (!v || !*v || std::strcmp(v, "auto") == 0) return NormShort::kAuto;
  if (std::strcmp(v, "block") == 0) return NormShort::kBlock;
  if (std::strcmp(v, "warp") == 0) return NormShort::kWarp;
  throw_error(ErrorCode::kInvalidArgument, "KILN_CUDA_NORM_SHORT='", v,
              "': expected 'auto' (the default: a warp per row from ", kNormWarpMinRows,
              " rows on, else a block per row), 'block' (a block per row) or 'warp' (a warp per row), for rows of at "
              "most ",
              kWarpMaxVectors, " 16-byte vectors");
}

namespace {
std::atomic<int> g_norm_short_override{-1};  // -1: the environment's
}  // namespace

NormShort norm_short_mode() {
  const int o = g_norm_short_override.load(std::memory_order_relaxed);
  if (o >= 0) return NormShort(o);
  static const NormShort env = norm_short_from_value(std::getenv("KILN_CUDA_NORM_SHORT"));
  return env;
}

void set_norm_short_mode(std::optional<NormShort> mode) {
  g_norm_short_override.store(mode ? int(*mode) : -1, std::memory_order_relaxed);
}

NormKernel norm_kernel_for(DType t, int64_t dim, NormShort mode, int64_t rows) {
  KILN_THROW_IF(t != DType::kF32 && t != DType::kF16 && t != DType::kBF16, kInternal, "cuda norm: dtype ",
                dtype_name(t));
  const int64_t vec = 16 / int64_t(dtype_size(t));
  if (dim <= 0 || dim % vec != 0) return NormKernel::kRows;
  const bool warp = mode == NormShort::kWarp || (mode == NormShort::kAuto && rows >= kNormWarpMinRows);
  if (warp && dim / vec <= kWarpMaxVectors) return NormKernel::kWarp;
  return dim / vec <= 4096 ? NormKernel::kRegs : NormKernel::kRows;
}

void launch_layer_norm(DType t, const void* x, const float* gamma, const float* beta, float eps,
                       int64_t rows, int64_t dim, void* y, cudaStream_t s) {
  launch_add_layer_norm(t, x, nullptr, gamma, beta, eps, rows, dim, nullptr, y, s);
}

void launch_add_layer_norm(DType t, const void* x, const void* res, const float* gamma, const float* beta,
                           float eps, int64_t rows, int64_t dim, void* sum, void* y, cudaStream_t s) {
  KILN_CUDA_DISPATCH_FLOAT(t, T, {
    launch_norm<T, NormOut::kT, false>(x, res, gamma, beta, eps, rows, dim, sum, y, 1.0f, nullptr, nullptr, s);
  });
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_rms_norm(DType t, const void* x, const float* w, float eps, int64_t rows, int64_t dim,
                     void* y, cudaStream_t s) {
  launch_add_rms_norm(t, x, nullptr, w, eps, rows, dim, nullptr, y, s);
}

void launch_add_rms_norm(DType t, const void* x, const void* res, const float* w, float eps, int64_t rows,
                         int64_t dim, void* sum, void* y, cudaStream_t s) {
  KILN_CUDA_DISPATCH_FLOAT(t, T, {
    launch_norm<T, NormOut::kT, true>(x, res, w, nullptr, eps, rows, dim, sum, y, 1.0f, nullptr, nullptr, s);
  });
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_add_layer_norm_fp8(DType t, const void* x, const void* res, const float* gamma, const float* beta,
                               float eps, int64_t rows, int64_t dim, void* sum, uint8_t* y, float inv,
                               cudaStream_t s) {
  KILN_THROW_IF(t != DType::kBF16, kInternal, "cuda: the E4M3 LayerNorm takes bf16, not ", dtype_name(t));
  launch_norm<__nv_bfloat16, NormOut::kFp8, false>(x, res, gamma, beta, eps, rows, dim, sum, y, inv, nullptr, nullptr,
                                                   s);
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_add_rms_norm_fp8(DType t, const void* x, const void* res, const float* w, float eps, int64_t rows,
                             int64_t dim, void* sum, uint8_t* y, float inv, cudaStream_t s) {
  KILN_THROW_IF(t != DType::kBF16, kInternal, "cuda: the E4M3 RMSNorm takes bf16, not ", dtype_name(t));
  launch_norm<__nv_bfloat16, NormOut::kFp8, true>(x, res, w, nullptr, eps, rows, dim, sum, y, inv, nullptr, nullptr, s);
  KILN_CUDA_CHECK_LAUNCH();
}

namespace {

// The int8 norms for a 16-bit T: static or per-token codes, alone (y null) or with y in T
// (the dual output).
template <bool kRms>
void launch_norm_int8(DType t, const void* x, const void* res, const float* gamma, const float* beta, float eps,
                      int64_t rows, int64_t dim, void* sum, void* y, int8_t* q, float inv, float* row_scale,
                      cudaStream_t s) {
  auto go = [&]<typename T>() {
    if (y && row_scale)
      launch_norm<T, NormOut::kTI8Row, kRms>(x, res, gamma, beta, eps, rows, dim, sum, y, inv, row_scale, q, s);
    else if (y)
      launch_norm<T, NormOut::kTI8, kRms>(x, res, gamma, beta, eps, rows, dim, sum, y, inv, nullptr, q, s);
    else if (row_scale)
      launch_norm<T, NormOut::kI8Row, kRms>(x, res, gamma, beta, eps, rows, dim, sum, q, inv, row_scale, nullptr, s);
    else
      launch_norm<T, NormOut::kI8, kRms>(x, res, gamma, beta, eps, rows, dim, sum, q, inv, nullptr, nullptr, s);
  };
  if (t == DType::kBF16) go.template operator()<__nv_bfloat16>();
  else if (t == DType::kF16) go.template operator()<__half>();
  else throw_error(ErrorCode::kInternal, "cuda: the int8 norms take bf16 or f16, not ", dtype_name(t));
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_add_layer_norm_int8(DType t, const void* x, const void* res, const float* gamma, const float* beta,
                                float eps, int64_t rows, int64_t dim, void* sum, int8_t* q, float inv,
                                float* row_scale, cudaStream_t s) {
  launch_norm_int8<false>(t, x, res, gamma, beta, eps, rows, dim, sum, nullptr, q, inv, row_scale, s);
}

void launch_add_rms_norm_int8(DType t, const void* x, const void* res, const float* w, float eps, int64_t rows,
                              int64_t dim, void* sum, int8_t* q, float inv, float* row_scale, cudaStream_t s) {
  launch_norm_int8<true>(t, x, res, w, nullptr, eps, rows, dim, sum, nullptr, q, inv, row_scale, s);
}

void launch_add_layer_norm_dual(DType t, const void* x, const void* res, const float* gamma, const float* beta,
                                float eps, int64_t rows, int64_t dim, void* sum, void* y, int8_t* q, float inv,
                                float* row_scale, cudaStream_t s) {
  KILN_THROW_IF(!y || !q, kInternal, "cuda: the dual LayerNorm needs its T output and its codes");
  launch_norm_int8<false>(t, x, res, gamma, beta, eps, rows, dim, sum, y, q, inv, row_scale, s);
}

void launch_add_rms_norm_dual(DType t, const void* x, const void* res, const float* w, float eps, int64_t rows,
                              int64_t dim, void* sum, void* y, int8_t* q, float inv, float* row_scale,
                              cudaStream_t s) {
  KILN_THROW_IF(!y || !q, kInternal, "cuda: the dual RMSNorm needs its T output and its codes");
  launch_norm_int8<true>(t, x, res, w, nullptr, eps, rows, dim, sum, y, q, inv, row_scale, s);
}

bool launch_add_norm_shaped(DType t, bool rms, const void* x, const void* res, const float* gamma, const float* beta,
                            float eps, int64_t rows, int64_t dim, void* sum, void* y, NormShape shape,
                            cudaStream_t s) {
  KILN_THROW_IF(shape.vectors == 0 && shape.warps == 0, kInternal,
                "cuda norm: a forced shape needs its vectors per thread or its warps per block");
  bool ok = false;
  KILN_CUDA_DISPATCH_FLOAT(t, T, {
    ok = rms ? launch_norm<T, NormOut::kT, true>(x, res, gamma, nullptr, eps, rows, dim, sum, y, 1.0f, nullptr, nullptr,
                                                 s, shape)
             : launch_norm<T, NormOut::kT, false>(x, res, gamma, beta, eps, rows, dim, sum, y, 1.0f, nullptr, nullptr,
                                                  s, shape);
  });
  KILN_CUDA_CHECK_LAUNCH();
  return ok;
}

namespace {

// HeadRMSNorm: a warp per (row, head), kHeadWarps to a block, so a decode row's heads
// spread over several SMs instead of queueing in one block. A lane holds E = d / 32
// consecutive values of its head (one load of 2E bytes at 16 bits; any d takes the
// generic per-value loop, E = 0); the sum of squares in f32 as the CPU's, reduced with
// shuffles. The row's tail (values past the normalized heads: v of a packed q|k|v row) is
// copied by extra warps, 32 x kHeadTailPerLane values each. Launched with dependent launch
// like the norms: the weights toward L1 before the wait and, in a decode step of a few
// rows, the trigger at the start (the attention after it then issues its cache reads).
constexpr int kHeadWarps = 4, kHeadTailPerLane = 8;

template <typename T, int E>
struct alignas(sizeof(T) * E) HeadVec {
  T v[E];
};

template <typename T, int E>
__global__ void __launch_bounds__(kHeadWarps * 32)
head_rms_norm_kernel(const T* x, const float* __restrict__ w, int64_t w_stride, float eps, int64_t rows,
                     int64_t width, int64_t groups, int64_t tail_tasks, int d, T* y, bool early) {
  const int lane = int(threadIdx.x) % 32;
  const int64_t task = int64_t(blockIdx.x) * kHeadWarps + int(threadIdx.x) / 32;
  const int64_t per_row = groups + tail_tasks;
  const int64_t row = task / per_row, g = task % per_row;
  if (early) pdl_trigger();
  if (row >= rows) return;  // no barrier below: a warp without a task is done
  const T* xr = x + row * width;
  T* yr = y + row * width;
  if (g >= groups) {  // the tail, copied
    const int64_t t0 = groups * d + (g - groups) * 32 * kHeadTailPerLane;
    pdl_wait();
    const int64_t t1 = t0 + 32 * kHeadTailPerLane < width ? t0 + 32 * kHeadTailPerLane : width;
    for (int64_t i = t0 + lane; i < t1; i += 32) yr[i] = xr[i];
    return;
  }
  const float* wg = w + g * w_stride;
  if constexpr (E > 0) {
    float wv[E];
#pragma unroll
    for (int e = 0; e < E; ++e) wv[e] = wg[lane * E + e];  // requested before the wait
    pdl_wait();  // programmatic dependent launch: the previous kernel's writes are visible
    const HeadVec<T, E> xv = *reinterpret_cast<const HeadVec<T, E>*>(xr + g * d + lane * E);
    float ss = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const float v = to_f32(xv.v[e]);
      ss += v * v;
    }
    const float r = 1.0f / sqrtf(warp_sum(ss) / float(d) + eps);
    HeadVec<T, E> out;
#pragma unroll
    for (int e = 0; e < E; ++e) out.v[e] = from_f32<T>(to_f32(xv.v[e]) * r * wv[e]);
    *reinterpret_cast<HeadVec<T, E>*>(yr + g * d + lane * E) = out;
  } else {
    if (lane < d) prefetch_l1(wg + lane);
    pdl_wait();
    const T* xg = xr + g * d;
    float ss = 0.0f;
    for (int i = lane; i < d; i += 32) {
      const float v = to_f32(xg[i]);
      ss += v * v;
    }
    const float r = 1.0f / sqrtf(warp_sum(ss) / float(d) + eps);
    for (int i = lane; i < d; i += 32) yr[g * d + i] = from_f32<T>(to_f32(xg[i]) * r * wg[i]);
  }
}

template <typename T, int E>
void launch_head_typed(const void* x, const float* w, int64_t w_stride, float eps, int64_t rows, int64_t width,
                       int64_t groups, int64_t d, void* y, cudaStream_t s) {
  const int64_t tail = width - groups * d, tail_tasks = (tail + 32 * kHeadTailPerLane - 1) / (32 * kHeadTailPerLane);
  const int64_t tasks = rows * (groups + tail_tasks);
  launch_k(head_rms_norm_kernel<T, E>, dim3(unsigned((tasks + kHeadWarps - 1) / kHeadWarps)), kHeadWarps * 32, 0, s,
           static_cast<const T*>(x), w, w_stride, eps, rows, width, groups, tail_tasks, int(d), static_cast<T*>(y),
           early_trigger(rows));
}

}  // namespace

void launch_head_rms_norm(DType t, const void* x, const float* w, int64_t w_stride, float eps, int64_t rows,
                          int64_t width, int64_t groups, int64_t d, void* y, cudaStream_t s) {
  KILN_THROW_IF(groups * d > width || d <= 0 || d > (int64_t(1) << 20), kInternal, "cuda head norm: ", groups,
                " groups of ", d, " values (head dims 1 to 2^20, groups x head dim <= the row) in rows of ", width);
  if (rows == 0) return;
  KILN_CUDA_DISPATCH_FLOAT(t, T, {
    // A lane's d / 32 values in one load where they are whole, aligned vectors.
    const int64_t e = d % 32 == 0 ? d / 32 : 0;
    const bool vec = (e == 2 || e == 4 || (e == 8 && sizeof(T) == 2)) && width % e == 0 &&
                     reinterpret_cast<uintptr_t>(x) % (sizeof(T) * e) == 0 &&
                     reinterpret_cast<uintptr_t>(y) % (sizeof(T) * e) == 0;
    if (!vec) launch_head_typed<T, 0>(x, w, w_stride, eps, rows, width, groups, d, y, s);
    else if (e == 2) launch_head_typed<T, 2>(x, w, w_stride, eps, rows, width, groups, d, y, s);
    else if (e == 4) launch_head_typed<T, 4>(x, w, w_stride, eps, rows, width, groups, d, y, s);
    else if constexpr (sizeof(T) == 2) launch_head_typed<T, 8>(x, w, w_stride, eps, rows, width, groups, d, y, s);
  });
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
