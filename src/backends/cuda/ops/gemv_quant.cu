// Weight-only q8/q4 GEMV over the kRows layout, tile dequantization of both layouts,
// and the host side of the layouts (see gemv_quant.h). The kMma GEMV is in
// gemv_quant_mma.cu. In the kRows GEMV, a lane's unit of work is one 16-byte chunk of a row's codes: 32 q4 codes (a whole
// group: one scale, one min) or 16 q8 codes (half a group). A warp owns 4 weight rows
// (4 outputs, or 2 outputs' gate and up rows for SwiGLU); lane j of the warp's split
// part p reads chunks p*32 + j, p*32 + j + S*32, ... of all four, so a warp's loads of
// one row are 512 contiguous bytes, and each x value it converts to f32 serves the four
// rows. Per chunk it forms dot = Σ q·x and (q4) Σ x in f32, then acc += scale·dot
// (+ min·Σx): the CPU kernels' math (linear.cpp), in another summation order.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include "backends/cuda/common.cuh"
#include "backends/cuda/ops/gemv_quant.h"
#include "backends/cuda/ops/quant_codes.cuh"
#include "core/env_switch.h"
#include "core/thread_pool.h"

namespace kiln::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kRows = 4;  // weight rows per warp

__device__ __forceinline__ void bf16x2_to_f32(uint32_t w, float& lo, float& hi) {
  lo = __uint_as_float(w << 16);
  hi = __uint_as_float(w & 0xFFFF0000u);
}

// N consecutive elements of x (N = 8 or 4; p aligned to N elements) as f32.
template <typename T, int N>
__device__ __forceinline__ void load_x(const T* p, float (&f)[N]) {
  if constexpr (std::is_same_v<T, float>) {
#pragma unroll
    for (int j = 0; j < N / 4; ++j) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(p) + j);
      f[4 * j] = v.x, f[4 * j + 1] = v.y, f[4 * j + 2] = v.z, f[4 * j + 3] = v.w;
    }
  } else {
    uint32_t w[N / 2];
    if constexpr (N == 8) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
      w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    } else {
      const uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
      w[0] = v.x, w[1] = v.y;
    }
#pragma unroll
    for (int j = 0; j < N / 2; ++j) {
      if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        bf16x2_to_f32(w[j], f[2 * j], f[2 * j + 1]);
      } else {
        const float2 t = __half22float2(*reinterpret_cast<const __half2*>(&w[j]));
        f[2 * j] = t.x, f[2 * j + 1] = t.y;
      }
    }
  }
}

struct QArgs : QOperands {
  int m, k, n_out, split;
  GemvEpilogue epi;
};

// MAXM: x rows the kernel is compiled for (a.m <= MAXM; rows past a.m are skipped by
// warp-uniform branches). U: chunks per lane issued before any is used (U x 4 rows x 16
// bytes in flight per lane).
template <typename T, QuantFormat F, int MAXM, bool kSwiGlu, int U>
__global__ void __launch_bounds__(kWarps * 32) qgemv_kernel(const QArgs a) {
  pdl_wait();  // programmatic dependent launch: the previous kernel's writes are visible
  using Tr = QTraits<F>;
  constexpr int R = kSwiGlu ? kRows / 2 : kRows;  // outputs per warp
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int S = a.split, part = warp % S;
  const int n0 = (int(blockIdx.x) * (kWarps / S) + warp / S) * R;
  const bool live = n0 < a.n_out;
  const int chunks = live ? a.k / Tr::kPerChunk : 0, groups = a.k / kQuantGroup;
  const size_t row_bytes = size_t(a.k / Tr::kRowDiv);
  int64_t wrow[kRows];  // weight rows (past-the-end outputs read row 0 and are not stored)
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int o = n0 + r % R;
    wrow[r] = int64_t(o < a.n_out ? o : 0) + (r >= R ? a.n_out : 0);
  }
  const T* x = static_cast<const T*>(a.x);
  float acc[kRows][MAXM];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int m = 0; m < MAXM; ++m) acc[r][m] = 0.0f;

  for (int c0 = part * 32 + lane; c0 < chunks; c0 += S * 32 * U) {
    uint4 cw[U][kRows];
    float sc[U][kRows], mn[U][kRows];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + u * S * 32;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (c < chunks) {
          cw[u][r] = __ldcs(reinterpret_cast<const uint4*>(a.codes + size_t(wrow[r]) * row_bytes) + c);
          load_scale<F>(a.scales, wrow[r], groups, c, sc[u][r], mn[u][r]);
        } else {
          cw[u][r] = make_uint4(0, 0, 0, 0);
          sc[u][r] = mn[u][r] = 0.0f;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + u * S * 32;
      if (c >= chunks) break;
      float dot[kRows][MAXM], xs[MAXM];
#pragma unroll
      for (int m = 0; m < MAXM; ++m) {
        xs[m] = 0.0f;
#pragma unroll
        for (int r = 0; r < kRows; ++r) dot[r][m] = 0.0f;
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float q[kRows][Tr::kPerWord];
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          const uint32_t word = i == 0 ? cw[u][r].x : i == 1 ? cw[u][r].y : i == 2 ? cw[u][r].z : cw[u][r].w;
          decode_word<F>(word, q[r]);
        }
#pragma unroll
        for (int m = 0; m < MAXM; ++m) {
          if (MAXM > 1 && m >= a.m) break;
          float xf[Tr::kPerWord];
          load_x<T, Tr::kPerWord>(x + int64_t(m) * a.k + int64_t(c) * Tr::kPerChunk + i * Tr::kPerWord, xf);
#pragma unroll
          for (int e = 0; e < Tr::kPerWord; ++e) {
            if constexpr (F == QuantFormat::kQ4) xs[m] += xf[e];
#pragma unroll
            for (int r = 0; r < kRows; ++r) dot[r][m] = fmaf(q[r][e], xf[e], dot[r][m]);
          }
        }
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int m = 0; m < MAXM; ++m) {
          acc[r][m] = fmaf(sc[u][r], dot[r][m], acc[r][m]);
          if constexpr (F == QuantFormat::kQ4) acc[r][m] = fmaf(mn[u][r], xs[m], acc[r][m]);
        }
    }
  }

  pdl_trigger();  // the weights are read: the next kernel may launch (it waits for our writes)
  // Every lane ends with the row sums (of all split parts).
  if (S > 1) {
    __shared__ float red[kWarps][kRows][MAXM];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int m = 0; m < MAXM; ++m) {
        const float v = warp_sum(acc[r][m]);
        if (lane == 0) red[warp][r][m] = v;
      }
    __syncthreads();
    if (part != 0 || !live) return;
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int m = 0; m < MAXM; ++m) {
        float v = 0.0f;
        for (int p = 0; p < S; ++p) v += red[warp + p][r][m];
        acc[r][m] = v;
      }
  } else {
    if (!live) return;
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int m = 0; m < MAXM; ++m) acc[r][m] = warp_sum(acc[r][m]);
  }

  // Lane r * MAXM + m stores output (m, n0 + r), rounded as the unfused kernels would
  // (the GEMV stores T, the activation reads it).
  const T* bias = static_cast<const T*>(a.bias);
  T* y = static_cast<T*>(a.y);
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < MAXM; ++m) {
      const int o = n0 + r;
      if (lane != r * MAXM + m || m >= a.m || o >= a.n_out) continue;
      float v = acc[r][m] * __ldg(a.row_factor + wrow[r]);
      if (bias) v += to_f32(bias[o]);
      const float y0 = to_f32(from_f32<T>(v));
      float out = y0;
      if constexpr (kSwiGlu) {
        float up = acc[r + R][m] * __ldg(a.row_factor + wrow[r + R]);
        if (bias) up += to_f32(bias[a.n_out + o]);
        out = to_f32(from_f32<T>(unary_f32<UnaryOp::kSilu>(y0))) * to_f32(from_f32<T>(up));
      } else if (a.epi == GemvEpilogue::kGeluErf) {
        out = unary_f32<UnaryOp::kGeluErf>(y0);
      } else if (a.epi == GemvEpilogue::kGeluTanh) {
        out = unary_f32<UnaryOp::kGeluTanh>(y0);
      } else if (a.epi == GemvEpilogue::kSilu) {
        out = unary_f32<UnaryOp::kSilu>(y0);
      }
      y[int64_t(m) * a.n_out + o] = from_f32<T>(out);
    }
}

// Warps per 4-row block: enough that about 8192 warps stream the matrix, while each lane
// keeps at least two chunks per row.
int qsplit_for(int64_t row_blocks, int64_t chunks) {
  int s = 1;
  while (s < kWarps && row_blocks * s < 8192 && chunks >= int64_t(64) * s * 2) s *= 2;
  return s;
}

template <typename T, QuantFormat F, bool kSwiGlu>
void launch_qgemv(const QArgs& a, cudaStream_t s) {
  constexpr int R = kSwiGlu ? kRows / 2 : kRows;
  const int64_t row_blocks = (int64_t(a.n_out) + R - 1) / R;
  const dim3 grid(unsigned((row_blocks * a.split + kWarps - 1) / kWarps));
  if (a.m == 1) launch_k(qgemv_kernel<T, F, 1, kSwiGlu, 2>, grid, kWarps * 32, 0, s, a);
  else if (a.m == 2) launch_k(qgemv_kernel<T, F, 2, kSwiGlu, 2>, grid, kWarps * 32, 0, s, a);
  else if (a.m <= 4) launch_k(qgemv_kernel<T, F, 4, kSwiGlu, 1>, grid, kWarps * 32, 0, s, a);
  else launch_k(qgemv_kernel<T, F, 8, kSwiGlu, 1>, grid, kWarps * 32, 0, s, a);
  KILN_CUDA_CHECK_LAUNCH();
}

// kRows layout: one thread per 32-bit code word (q4: 8 values, one 16-byte store of
// 16-bit values; q8: 4, one 8-byte store), so a warp reads 128 contiguous code bytes and
// writes 256-512 contiguous output bytes: whole sectors on both sides (one thread per
// 16-byte chunk wrote 4 stores 64 bytes apart, each half a sector: the tile path's
// dequantize ran at ~1.2 TB/s of output on an H100). Grid: (words of a row / 256 threads,
// rows of this launch); row r of the launch is weight row r0 + r.
// launch_dequant_rows(..., words = false) runs the earlier kernel (dequant_chunk_kernel)
// for A/B timing.
constexpr int kDequantThreads = 256;

template <typename T, QuantFormat F>
__global__ void dequant_chunk_kernel(const uint8_t* __restrict__ codes,
                                     const void* __restrict__ scales,
                                     const float* __restrict__ row_factor, int k, int64_t r0,
                                     int64_t rows, T* __restrict__ out) {
  using Tr = QTraits<F>;
  const int chunks = k / Tr::kPerChunk;
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * chunks) return;
  const int64_t r = idx / chunks, row = r0 + r;
  const int c = int(idx % chunks);
  const uint4 cw = __ldcs(reinterpret_cast<const uint4*>(codes + size_t(row) * size_t(k / Tr::kRowDiv)) + c);
  float s, mn;
  load_scale<F>(scales, row, k / kQuantGroup, c, s, mn);
  const float f = row_factor[row];
  s *= f;
  mn *= f;
  T* o = out + r * k + int64_t(c) * Tr::kPerChunk;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float q[Tr::kPerWord];
    decode_word<F>(i == 0 ? cw.x : i == 1 ? cw.y : i == 2 ? cw.z : cw.w, q);
    alignas(16) T v[Tr::kPerWord];
#pragma unroll
    for (int e = 0; e < Tr::kPerWord; ++e) v[e] = from_f32<T>(fmaf(q[e], s, mn));
    T* dst = o + i * Tr::kPerWord;
    if constexpr (sizeof(v) % 16 == 0) {
#pragma unroll
      for (int j = 0; j < int(sizeof(v) / 16); ++j) reinterpret_cast<uint4*>(dst)[j] = reinterpret_cast<const uint4*>(v)[j];
    } else {
      *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(v);
    }
  }
}

template <typename T, QuantFormat F>
__global__ void __launch_bounds__(kDequantThreads)
    dequant_kernel(const uint8_t* __restrict__ codes, const void* __restrict__ scales,
                   const float* __restrict__ row_factor, int k, int64_t r0, T* __restrict__ out) {
  using Tr = QTraits<F>;
  const int words = k / Tr::kPerWord, wi = int(blockIdx.x) * kDequantThreads + int(threadIdx.x);
  if (wi >= words) return;
  const int64_t r = blockIdx.y, row = r0 + r;
  const uint32_t cw = __ldcs(
      reinterpret_cast<const unsigned int*>(codes + size_t(row) * size_t(k / Tr::kRowDiv)) + wi);
  float s, mn;
  load_scale<F>(scales, row, k / kQuantGroup, wi / 4, s, mn);
  const float f = __ldg(row_factor + row);
  s *= f;
  mn *= f;
  float q[Tr::kPerWord];
  decode_word<F>(cw, q);
  alignas(16) T v[Tr::kPerWord];
#pragma unroll
  for (int e = 0; e < Tr::kPerWord; ++e) v[e] = from_f32<T>(fmaf(q[e], s, mn));
  T* dst = out + r * k + int64_t(wi) * Tr::kPerWord;
  if constexpr (sizeof(v) == 16)
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(v);
  else if constexpr (sizeof(v) == 8)
    *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(v);
  else {  // f32 q4: two 16-byte stores
#pragma unroll
    for (int j = 0; j < int(sizeof(v) / 16); ++j)
      reinterpret_cast<uint4*>(dst)[j] = reinterpret_cast<const uint4*>(v)[j];
  }
}

// kMma layout: one thread per 16-byte lane slice (row, block, quarter t), writing the
// slice's 8 values of each group of the block; the same f32 formula as dequant_kernel.
template <typename T, QuantFormat F>
__global__ void dequant_mma_kernel(const uint8_t* __restrict__ codes, const void* __restrict__ scales,
                                   const float* __restrict__ row_factor, int k, int64_t code_stride,
                                   int64_t scale_stride, int64_t r0, int64_t rows, T* __restrict__ out) {
  constexpr int kGroupsPerBlock = F == QuantFormat::kQ4 ? 4 : 2;
  const int64_t slices = code_stride / 16, groups = k / kQuantGroup;
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * slices) return;
  const int64_t r = idx / slices, row = r0 + r, b = (idx % slices) / 4;
  const int t = int(idx % 4);
  const uint4 cw = __ldcs(reinterpret_cast<const uint4*>(codes + size_t(row) * size_t(code_stride)) + (idx % slices));
  const uint32_t words[4] = {cw.x, cw.y, cw.z, cw.w};
  const float f = row_factor[row];
#pragma unroll
  for (int gi = 0; gi < kGroupsPerBlock; ++gi) {
    const int64_t g = b * kGroupsPerBlock + gi;
    if (g >= groups) break;
    float s, mn;
    if constexpr (F == QuantFormat::kQ4) {
      const uint32_t sm = static_cast<const uint32_t*>(scales)[row * scale_stride + g];
      s = __half2float(__ushort_as_half(uint16_t(sm & 0xFFFFu)));
      mn = __half2float(__ushort_as_half(uint16_t(sm >> 16)));
    } else {
      s = __half2float(__ushort_as_half(static_cast<const unsigned short*>(scales)[row * scale_stride + g]));
      mn = 0.0f;
    }
    s *= f;
    mn *= f;
    float q[8];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if constexpr (F == QuantFormat::kQ4) {
        q[2 * j] = float((words[gi] >> (4 * j)) & 15u);
        q[2 * j + 1] = float((words[gi] >> (16 + 4 * j)) & 15u);
      } else {
        q[j] = float(int8_t(uint8_t(words[2 * gi] >> (8 * j))));
        q[4 + j] = float(int8_t(uint8_t(words[2 * gi + 1] >> (8 * j))));
      }
    }
    alignas(16) T v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = from_f32<T>(fmaf(q[e], s, mn));
    T* dst = out + r * k + g * kQuantGroup + 8 * t;
#pragma unroll
    for (int j = 0; j < int(sizeof(v) / 16); ++j) reinterpret_cast<uint4*>(dst)[j] = reinterpret_cast<const uint4*>(v)[j];
  }
}

template <typename T>
void launch_typed(const void* x, const QuantWeightView& w, const void* bias, void* y, int64_t m, int64_t n_out,
                  cudaStream_t s, GemvEpilogue epi) {
  const bool swiglu = epi == GemvEpilogue::kSwiGlu;
  const int64_t chunks = w.k / (w.format == QuantFormat::kQ4 ? 32 : 16);
  const int64_t row_blocks = (n_out + (swiglu ? 1 : 3)) / (swiglu ? 2 : 4);
  QArgs a{x, w.codes, w.scales, w.row_factor, bias, y, int(m), int(w.k), int(n_out),
          qsplit_for(row_blocks, chunks), epi};
  if (w.format == QuantFormat::kQ4) {
    if (swiglu) launch_qgemv<T, QuantFormat::kQ4, true>(a, s);
    else launch_qgemv<T, QuantFormat::kQ4, false>(a, s);
  } else {
    if (swiglu) launch_qgemv<T, QuantFormat::kQ8, true>(a, s);
    else launch_qgemv<T, QuantFormat::kQ8, false>(a, s);
  }
}

}  // namespace

QuantWeightView quant_view_shape(QuantFormat f, int64_t n, int64_t k, QuantLayout layout) {
  QuantWeightView v;
  v.format = f;
  v.n = n;
  v.k = k;
  v.layout = layout;
  const int64_t groups = k / kQuantGroup;
  if (layout == QuantLayout::kRows) {
    v.code_stride = int64_t(quant_row_code_bytes(f, k));
    v.scale_stride = groups;
  } else {
    const int64_t per_block = f == QuantFormat::kQ4 ? 4 : 2, blocks = (groups + per_block - 1) / per_block;
    v.code_stride = 64 * blocks;
    v.scale_stride = per_block * blocks;
  }
  return v;
}

QuantWeightView QuantImage::view_at(const void* base) const {
  QuantWeightView v = shape;
  auto* b = static_cast<const uint8_t*>(base);
  v.codes = b;
  v.scales = b + scales_off;
  v.row_factor = reinterpret_cast<const float*>(b + factor_off);
  return v;
}

QuantImage quant_image(const QuantizedRows& q, QuantLayout layout) {
  QuantImage img;
  img.shape = quant_view_shape(q.format, q.n, q.k, layout);
  const bool q4 = q.format == QuantFormat::kQ4;
  const size_t n = size_t(q.n), groups = size_t(q.groups()), row_bytes = quant_row_code_bytes(q.format, q.k);
  const size_t cs = size_t(img.shape.code_stride), ss = size_t(img.shape.scale_stride);
  auto up = [](size_t b) { return (b + 255) / 256 * 256; };
  img.scales_off = up(n * cs);
  img.factor_off = img.scales_off + up(n * ss * img.shape.scale_bytes());
  img.bytes.assign(img.factor_off + n * 4, 0);
  uint8_t* codes = img.bytes.data();
  uint8_t* scales = img.bytes.data() + img.scales_off;
  ThreadPool::global().parallel_for(int64_t(n), [&](int64_t r0, int64_t r1, int) {
    for (size_t r = size_t(r0); r < size_t(r1); ++r) {
      const uint8_t* src = q.codes.get() + r * row_bytes;
      uint8_t* dst = codes + r * cs;
      if (layout == QuantLayout::kRows) {
        std::memcpy(dst, src, row_bytes);
      } else {
        for (size_t g = 0; g < groups; ++g)
          for (size_t t = 0; t < 4; ++t) {
            if (q4) {  // codes 32g + 8t + 2j (low nibble of source byte j) and + 2j + 1 (high)
              const uint8_t* sb = src + g * 16 + t * 4;
              uint32_t w = 0;
              for (int j = 0; j < 4; ++j) w |= uint32_t(sb[j] & 15u) << (4 * j) | uint32_t(sb[j] >> 4) << (16 + 4 * j);
              std::memcpy(dst + (g / 4) * 64 + t * 16 + (g % 4) * 4, &w, 4);
            } else {
              std::memcpy(dst + (g / 2) * 64 + t * 16 + (g % 2) * 8, src + g * 32 + t * 8, 8);
            }
          }
      }
      for (size_t g = 0; g < groups; ++g) {
        const size_t at = r * groups + g;
        if (q4) {
          const uint32_t sm = uint32_t(q.scales[at]) | (uint32_t(q.mins[at]) << 16);
          std::memcpy(scales + (r * ss + g) * 4, &sm, 4);
        } else {
          std::memcpy(scales + (r * ss + g) * 2, &q.scales[at], 2);
        }
      }
    }
  });
  std::memcpy(img.bytes.data() + img.factor_off, q.row_factor.get(), n * 4);
  return img;
}

const char* qgemv_kernel_name(QGemvKernel k) {
  return k == QGemvKernel::kMma ? "mma" : k == QGemvKernel::kDp4a ? "dp4a" : "old";
}

QGemvKernel qgemv_kernel(DType dtype) {
  const char* e = std::getenv("KILN_CUDA_QGEMV");
  const std::string v = e ? e : "";
  KILN_THROW_IF(!v.empty() && v != "old" && v != "mma" && v != "dp4a", kInvalidArgument, "KILN_CUDA_QGEMV='", v,
                "': expected old, mma or dp4a (or unset: dp4a)");
  if (dtype != DType::kBF16 && dtype != DType::kF16) return QGemvKernel::kRows;
  if (v == "old") return QGemvKernel::kRows;
  int device = 0, major = 0, minor = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  if (v == "mma") return major >= 8 ? QGemvKernel::kMma : QGemvKernel::kRows;  // mma.sync with bf16: sm_80+
  return 10 * major + minor >= 61 ? QGemvKernel::kDp4a : QGemvKernel::kRows;   // dp4a: sm_61+
}

QuantLayout qgemv_kernel_layout(QGemvKernel k) { return k == QGemvKernel::kMma ? QuantLayout::kMma : QuantLayout::kRows; }

QuantLayout qgemv_layout(DType dtype) { return qgemv_kernel_layout(qgemv_kernel(dtype)); }

bool gemv_quant_supports(DType dtype, int64_t m) {
  return (dtype == DType::kBF16 || dtype == DType::kF16 || dtype == DType::kF32) && m >= 1 && m <= kQGemvMaxRows;
}

void launch_gemv_quant(DType dtype, const void* x, const QuantWeightView& w, const void* bias, void* y, int64_t m,
                       int64_t n_out, cudaStream_t s, GemvEpilogue epi) {
  launch_gemv_quant(dtype, x, w, bias, y, m, n_out, s, epi,
                    w.layout == QuantLayout::kMma ? QGemvKernel::kMma : QGemvKernel::kRows);
}

QGemvDp4aTuning qgemv_one_row_form_parse(const char* value) {
  const std::string v = value ? value : "";
  QGemvDp4aTuning t;
  if (v.empty()) return t;
  const char* const kParts = "outs1, outs2, chunks1, chunks2, depth2, depth4, depth8, '+' between parts";
  for (size_t at = 0; at <= v.size();) {
    const size_t end = std::min(v.find('+', at), v.size());
    const std::string part = v.substr(at, end - at);
    const bool known = part == "outs1" || part == "outs2" || part == "chunks1" || part == "chunks2" ||
                       part == "depth2" || part == "depth4" || part == "depth8";
    KILN_THROW_IF(!known, kInvalidArgument, "KILN_CUDA_QGEMV_ONE_ROW='", v, "': '", part, "' is not a part (",
                  kParts, ")");
    int* field = part[0] == 'o' ? &t.outs_one_row : part[0] == 'c' ? &t.chunks_per_step : &t.depth;
    KILN_THROW_IF(*field != 0, kInvalidArgument, "KILN_CUDA_QGEMV_ONE_ROW='", v, "': '", part,
                  "' sets a part already set");
    *field = part.back() - '0';
    at = end + 1;
  }
  KILN_THROW_IF(!qgemv_dp4a_one_row_built(t), kInvalidArgument, "KILN_CUDA_QGEMV_ONE_ROW='", v,
                "': no such one-row form is built (1 output and 1 chunk at depth 2, 4 or 8; 2 and / or 2 at depth "
                "4; 2 and 2 at depth 2; unset parts: outs2, chunks2, depth4)");
  return t;
}

void launch_gemv_quant(DType dtype, const void* x, const QuantWeightView& w, const void* bias,
                       void* y, int64_t m, int64_t n_out, cudaStream_t s, GemvEpilogue epi,
                       QGemvKernel kernel, bool beside_attention) {
  KILN_THROW_IF(qgemv_kernel_layout(kernel) != w.layout, kInternal, "cuda quantized gemv: the ",
                qgemv_kernel_name(kernel), " kernel does not read a weight of the other layout");
  KILN_THROW_IF(!gemv_quant_supports(dtype, m), kInternal, "cuda quantized gemv: unsupported ", dtype_name(dtype),
                " m=", m);
  const int64_t want_rows = epi == GemvEpilogue::kSwiGlu ? 2 * n_out : n_out;
  KILN_THROW_IF(w.k % kQuantGroup != 0 || w.k <= 0 || w.k >= (int64_t(1) << 30) || w.n != want_rows ||
                    n_out >= (int64_t(1) << 30),
                kInternal, "cuda quantized gemv: weight [", w.n, ", ", w.k, "] for ", n_out, " outputs");
  const QuantWeightView want = quant_view_shape(w.format, w.n, w.k, w.layout);
  KILN_THROW_IF(w.code_stride != want.code_stride || w.scale_stride != want.scale_stride, kInternal,
                "cuda quantized gemv: strides ", w.code_stride, "/", w.scale_stride, " of a [", w.n, ", ", w.k,
                "] weight, expected ", want.code_stride, "/", want.scale_stride);
  if (n_out == 0) return;
  if (w.layout == QuantLayout::kMma) {
    KILN_THROW_IF(dtype == DType::kF32, kInternal, "cuda quantized gemv: the mma layout needs bf16/f16 activations");
    launch_qgemv_mma(dtype, x, w, bias, y, m, n_out, s, epi);
    return;
  }
  if (kernel == QGemvKernel::kDp4a && qgemv_dp4a_supports(dtype, m, w.k)) {
    static const QGemvDp4aTuning form = qgemv_one_row_form_parse(std::getenv("KILN_CUDA_QGEMV_ONE_ROW"));
    QGemvDp4aTuning tune = form;
    tune.beside_attention = beside_attention;
    static const bool l2_prefetch = env_switch_off_value(
        "KILN_CUDA_QGEMV_L2_PREFETCH", std::getenv("KILN_CUDA_QGEMV_L2_PREFETCH"),
        "the dp4a GEMV loads its weights from DRAM as it goes",
        "each warp first asks for its first output units' weight rows in L2");
    tune.l2_prefetch = l2_prefetch;
    launch_qgemv_dp4a(dtype, x, w, bias, y, m, n_out, s, epi, tune);
    return;
  }
  KILN_CUDA_DISPATCH_FLOAT(dtype, T, launch_typed<T>(x, w, bias, y, m, n_out, s, epi));
}

void launch_dequant_rows(DType dtype, const QuantWeightView& w, int64_t r0, int64_t rows, void* out,
                         cudaStream_t s, bool words) {
  KILN_THROW_IF(r0 < 0 || rows < 0 || r0 + rows > w.n || w.k % kQuantGroup != 0, kInternal,
                "cuda dequantize: rows [", r0, ", +", rows, ") of a [", w.n, ", ", w.k, "] weight");
  const bool q4 = w.format == QuantFormat::kQ4;
  if (w.layout == QuantLayout::kMma) {
    const int64_t total = rows * (w.code_stride / 16);
    if (total == 0) return;
    const unsigned blocks = unsigned((total + 255) / 256);
    KILN_CUDA_DISPATCH_FLOAT(dtype, T, {
      if (q4)
        dequant_mma_kernel<T, QuantFormat::kQ4><<<blocks, 256, 0, s>>>(
            w.codes, w.scales, w.row_factor, int(w.k), w.code_stride, w.scale_stride, r0, rows, static_cast<T*>(out));
      else
        dequant_mma_kernel<T, QuantFormat::kQ8><<<blocks, 256, 0, s>>>(
            w.codes, w.scales, w.row_factor, int(w.k), w.code_stride, w.scale_stride, r0, rows, static_cast<T*>(out));
      KILN_CUDA_CHECK_LAUNCH();
    });
    return;
  }
  KILN_THROW_IF(w.k >= (int64_t(1) << 30), kInternal, "cuda dequantize: k=", w.k, " too long");
  if (!words) {
    const int64_t total = rows * (w.k / (q4 ? 32 : 16));
    if (total == 0) return;
    const unsigned blocks = unsigned((total + 255) / 256);
    KILN_CUDA_DISPATCH_FLOAT(dtype, T, {
      if (q4)
        dequant_chunk_kernel<T, QuantFormat::kQ4><<<blocks, 256, 0, s>>>(
            w.codes, w.scales, w.row_factor, int(w.k), r0, rows, static_cast<T*>(out));
      else
        dequant_chunk_kernel<T, QuantFormat::kQ8><<<blocks, 256, 0, s>>>(
            w.codes, w.scales, w.row_factor, int(w.k), r0, rows, static_cast<T*>(out));
      KILN_CUDA_CHECK_LAUNCH();
    });
    return;
  }
  const int64_t row_words = w.k / (q4 ? 8 : 4);
  if (rows == 0 || row_words == 0) return;
  constexpr int64_t kMaxGridRows = 65535;  // gridDim.y
  const unsigned bx = unsigned((row_words + kDequantThreads - 1) / kDequantThreads);
  for (int64_t rb = 0; rb < rows; rb += kMaxGridRows) {
    const dim3 grid(bx, unsigned(std::min(kMaxGridRows, rows - rb)));
    KILN_CUDA_DISPATCH_FLOAT(dtype, T, {
      T* o = static_cast<T*>(out) + rb * w.k;
      if (q4)
        dequant_kernel<T, QuantFormat::kQ4><<<grid, kDequantThreads, 0, s>>>(
            w.codes, w.scales, w.row_factor, int(w.k), r0 + rb, o);
      else
        dequant_kernel<T, QuantFormat::kQ8><<<grid, kDequantThreads, 0, s>>>(
            w.codes, w.scales, w.row_factor, int(w.k), r0 + rb, o);
      KILN_CUDA_CHECK_LAUNCH();
    });
  }
}

}  // namespace kiln::cuda
