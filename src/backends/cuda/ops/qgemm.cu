// The q8/q4 prompt GEMM (gemv_quant.h: launch_qgemm): y[m, n] = x[m, k]·wᵀ (+ bias) for a
// kRows weight, dequantizing in shared memory instead of through a workspace. A CTA of 4
// or 8 warps owns a 64 (token rows) x 128 (weight rows) output tile and walks k one quant
// group (32) at a time: cp.async brings the x tile and the 128 rows' codes of the group (16
// bytes a row for q4, 32 for q8) into a 4-stage ring; each thread then decodes one weight
// row's 32 values (8 warps: half of them) into a 16-bit tile with the tile dequantizer's
// formula and rounding (T(fma(q, scale·factor, min·factor))), its scale read from global one
// group ahead; the warps (2 x 2 of 32 x 64, or 2 x 4 of 32 x 32) multiply the tiles with
// mma.sync m16n8k16 (ldmatrix fragments, f32 accumulators). So its output differs from the
// dequantize + cuBLASLt path only in summation order. The epilogue adds the bias in f32 and rounds
// once. Tested in tests/backends/cuda/quant_test.cpp: bit for bit against the tile dequantizer's
// weights (x the identity), against f64 sums over them, and through the Linear op
// (KILN_CUDA_QGEMM=fused) against the CPU backend.
#include <algorithm>
#include <cstring>

#include "backends/cuda/common.cuh"
#include "backends/cuda/ops/gemv_quant.h"
#include "backends/cuda/ops/mma_util.cuh"
#include "backends/cuda/ops/quant_codes.cuh"

namespace kiln::cuda {
namespace {

constexpr int kQmBM = 64, kQmBN = 128, kQmBK = 32;  // tile: token rows, weight rows, k (one group)
constexpr int kQmStages = 4;
constexpr int kQmLd = kQmBK + 8;  // 16-bit elements per shared row: ldmatrix without bank conflicts
static_assert(kQuantGroup == kQmBK, "one quant group per k step");

template <QuantFormat F>
struct QmLayout {
  static constexpr int kCodeBytes = F == QuantFormat::kQ4 ? 16 : 32;  // a row's codes of one group
  static constexpr int kX = kQmBM * kQmLd * 2;                        // x tile, 16-bit
  static constexpr int kCodes = kQmBN * kCodeBytes;
  static constexpr int kStage = kX + kCodes;
  static constexpr int kW = kQmBN * kQmLd * 2;  // the decoded weight tile
  static constexpr int kBytes = kQmStages * kStage + kW;
};

struct QmArgs : QOperands {
  int m, n, k, ldy;
};

template <typename T>
__device__ __forceinline__ uint32_t qm_pack(float a, float b) {
  const T lo = from_f32<T>(a), hi = from_f32<T>(b);
  uint16_t l, h;
  memcpy(&l, &lo, 2);
  memcpy(&h, &hi, 2);
  return uint32_t(l) | (uint32_t(h) << 16);
}

// WN: warps along the weight rows (2 or 4; 2 along the token rows), so 4 or 8 warps, and 1
// or 2 threads decoding each weight row's group.
template <typename T, QuantFormat F, int WN>
__global__ void __launch_bounds__(64 * WN) qgemm_kernel(const QmArgs a) {
  using L = QmLayout<F>;
  using Tr = QTraits<F>;
  constexpr int kThreads = 64 * WN;
  constexpr int TPR = kThreads / kQmBN;           // threads decoding one weight row
  constexpr int kDecBytes = L::kCodeBytes / TPR;  // the codes one thread decodes a step
  constexpr int kDecVals = kQmBK / TPR;           // and their values
  constexpr int kWN = kQmBN / WN, NI = kWN / 8;   // a warp's weight rows and their n8 tiles
  static_assert(TPR == 1 || TPR == 2);
  extern __shared__ __align__(16) unsigned char smem[];
  const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  const int m0 = int(blockIdx.y) * kQmBM, n0 = int(blockIdx.x) * kQmBN;
  const int steps = a.k / kQmBK, groups = steps;
  const size_t row_bytes = size_t(a.k / Tr::kRowDiv);
  const T* x = static_cast<const T*>(a.x);
  unsigned char* wtile = smem + kQmStages * L::kStage;

  // This thread's weight row (its share decoded by it each step): its factor, and its scale
  // one group ahead.
  const int drow = tid / TPR, dpart = tid % TPR;
  const int wrow = n0 + drow;
  const bool wlive = wrow < a.n;
  const float factor = wlive ? __ldg(a.row_factor + wrow) : 0.0f;
  auto scale_of = [&](int g, float& s, float& mn) {
    if (wlive && g < groups) {
      load_scale<F>(a.scales, wrow, groups, g * (F == QuantFormat::kQ4 ? 1 : 2), s, mn);
    } else {
      s = 0.0f;
      mn = 0.0f;
    }
  };

  // Step i's copies into stage i % kQmStages (past the last step: an empty group).
  auto issue = [&](int i) {
    if (i < steps) {
      unsigned char* st = smem + (i % kQmStages) * L::kStage;
      const int k0 = i * kQmBK;
      // x: 64 rows x 64 bytes = 256 chunks of 16 bytes.
#pragma unroll
      for (int c = tid; c < kQmBM * 4; c += kThreads) {
        const int r = c >> 2, part = c & 3, row = m0 + r;
        const bool in = row < a.m;
        cp_async16(st + r * kQmLd * 2 + part * 16, in ? x + int64_t(row) * a.k + k0 + part * 8 : x,
                   in);
      }
      // codes: 128 rows x 16 (q4) or 32 (q8) bytes.
#pragma unroll
      for (int c = tid; c < kQmBN * (L::kCodeBytes / 16); c += kThreads) {
        const int r = c / (L::kCodeBytes / 16), part = c % (L::kCodeBytes / 16), row = n0 + r;
        const bool in = row < a.n;
        cp_async16(st + L::kX + r * L::kCodeBytes + part * 16,
                   in ? a.codes + size_t(row) * row_bytes + size_t(i) * L::kCodeBytes + part * 16
                      : a.codes,
                   in);
      }
    }
    cp_async_commit();
  };

  // Weights and scales are never written by a kernel: requested before the dependent-launch
  // wait. x comes from the previous kernel.
  float s_next, mn_next;
  scale_of(0, s_next, mn_next);
  pdl_wait();
#pragma unroll
  for (int i = 0; i < kQmStages - 1; ++i) issue(i);

  const int wm = warp / WN, wn = warp % WN;  // the warp's 32 x kWN part of the tile
  float acc[2][NI][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;

  for (int i = 0; i < steps; ++i) {
    cp_async_wait<kQmStages - 2>();  // step i's copies (this thread's) have landed...
    __syncthreads();           // ...and everyone's; every warp is done with the last step's tiles
    issue(i + kQmStages - 1);  // into the stage step i - 1 used
    const unsigned char* st = smem + (i % kQmStages) * L::kStage;
    // Decode this thread's share of its row's group: the tile dequantizer's formula and rounding.
    {
      float s = s_next * factor, mn = mn_next * factor;
      scale_of(i + 1, s_next, mn_next);
      const unsigned char* src = st + L::kX + drow * L::kCodeBytes + dpart * kDecBytes;
      uint32_t words[kDecBytes / 4];
      if constexpr (kDecBytes % 16 == 0) {
#pragma unroll
        for (int c = 0; c < kDecBytes / 16; ++c) {
          const uint4 v = reinterpret_cast<const uint4*>(src)[c];
          words[4 * c] = v.x, words[4 * c + 1] = v.y, words[4 * c + 2] = v.z,
                    words[4 * c + 3] = v.w;
        }
      } else {
        const uint2 v = *reinterpret_cast<const uint2*>(src);
        words[0] = v.x, words[1] = v.y;
      }
      uint32_t packed[kDecVals / 2];
#pragma unroll
      for (int w = 0; w < kDecBytes / 4; ++w) {
        float q[Tr::kPerWord];
        decode_word<F>(words[w], q);
#pragma unroll
        for (int e = 0; e < Tr::kPerWord; e += 2)
          packed[(w * Tr::kPerWord + e) / 2] = qm_pack<T>(fmaf(q[e], s, mn), fmaf(q[e + 1], s, mn));
      }
      uint4* dst = reinterpret_cast<uint4*>(wtile + (drow * kQmLd + dpart * kDecVals) * 2);
#pragma unroll
      for (int c = 0; c < kDecVals / 8; ++c)
        dst[c] = make_uint4(packed[4 * c], packed[4 * c + 1], packed[4 * c + 2], packed[4 * c + 3]);
    }
    __syncthreads();  // the weight tile is complete
    const unsigned char* xt = st;
#pragma unroll
    for (int kk = 0; kk < kQmBK; kk += 16) {
      uint32_t af[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
        ldmatrix_x4(af[mi],
                    xt + ((wm * 32 + mi * 16 + (lane & 15)) * kQmLd + kk + (lane >> 4) * 8) * 2);
#pragma unroll
      for (int p = 0; p < NI / 2; ++p) {
        uint32_t bf[4];
        ldmatrix_x4(bf, wtile + ((wn * kWN + p * 16 + ((lane >> 4) << 3) + (lane & 7)) * kQmLd +
                                 kk + ((lane >> 3) & 1) * 8) *
                                    2);
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          mma16816<T>(acc[mi][2 * p], af[mi], bf[0], bf[1]);
          mma16816<T>(acc[mi][2 * p + 1], af[mi], bf[2], bf[3]);
        }
      }
    }
  }
  cp_async_wait<0>();
  // No early trigger: a prompt GEMM's grid takes several waves, and dependents launched now
  // would hold SM slots its later CTAs need (common.cuh); the launch is released at exit.

  // Epilogue: thread (g, t) of a warp holds rows g and g + 8, columns 2t and 2t + 1 of each
  // m16n8 tile; bias in f32, one rounding, pairs stored as 32 bits (n is even).
  const int g = lane >> 2, t = lane & 3;
  T* y = static_cast<T*>(a.y);
  const T* bias = static_cast<const T*>(a.bias);
#pragma unroll
  for (int nj = 0; nj < NI; ++nj) {
    const int col = n0 + wn * kWN + nj * 8 + 2 * t;
    if (col >= a.n) continue;
    const float b0 = bias ? to_f32(bias[col]) : 0.0f, b1 = bias ? to_f32(bias[col + 1]) : 0.0f;
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = m0 + wm * 32 + mi * 16 + g + h * 8;
        if (row >= a.m) continue;
        *reinterpret_cast<uint32_t*>(y + int64_t(row) * a.ldy + col) =
            qm_pack<T>(acc[mi][nj][2 * h] + b0, acc[mi][nj][2 * h + 1] + b1);
      }
  }
}

template <typename T, QuantFormat F>
void launch_qgemm_typed(const QmArgs& a, int warps, cudaStream_t s) {
  constexpr int bytes = QmLayout<F>::kBytes;
  static_assert(bytes <= 48 * 1024, "within the default dynamic shared memory of a CTA");
  const dim3 grid(unsigned((a.n + kQmBN - 1) / kQmBN), unsigned((a.m + kQmBM - 1) / kQmBM));
  if (warps == 8)
    launch_k(qgemm_kernel<T, F, 4>, grid, dim3(256), size_t(bytes), s, a);
  else
    launch_k(qgemm_kernel<T, F, 2>, grid, dim3(128), size_t(bytes), s, a);
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool qgemm_supports(DType dtype, const QuantWeightView& w) {
  const bool q4 = w.format == QuantFormat::kQ4;
  return (dtype == DType::kBF16 || dtype == DType::kF16) && w.layout == QuantLayout::kRows &&
         w.k > 0 && w.k % kQuantGroup == 0 && w.n % 2 == 0 && w.n <= INT32_MAX &&
         w.k <= INT32_MAX && w.code_stride == (q4 ? w.k / 2 : w.k) &&
         w.scale_stride == w.k / kQuantGroup;
}

void launch_qgemm(DType dtype, const void* x, const QuantWeightView& w, const void* bias, void* y,
                  int64_t m, int64_t ldy, cudaStream_t s, int warps) {
  KILN_THROW_IF(warps != 4 && warps != 8, kInternal, "cuda q8/q4 GEMM: ", warps,
                " warps a CTA (4 or 8)");
  KILN_THROW_IF(!qgemm_supports(dtype, w) || m < 0 || ldy < w.n || ldy % 2 != 0 || ldy > INT32_MAX,
                kInternal, "cuda q8/q4 GEMM: ", dtype_name(dtype), " x [", m, ", ", w.k, "] by a [",
                w.n, ", ", w.k, "] ", w.layout == QuantLayout::kRows ? "kRows" : "kMma",
                " weight (code stride ", w.code_stride, ", scale stride ", w.scale_stride,
                ") into rows of ", ldy,
                " (needs bf16/f16, the kRows layout's strides, k % 32 == 0, even n and ldy >= n)");
  if (m == 0 || w.n == 0) return;
  const bool q4 = w.format == QuantFormat::kQ4;
  const size_t es = dtype_size(dtype);
  // Row chunks within the grid's y limit (65535 tiles of kQmBM rows).
  constexpr int64_t kMaxRows = int64_t(65535) * kQmBM;
  for (int64_t r0 = 0; r0 < m; r0 += kMaxRows) {
    const int64_t rows = std::min(kMaxRows, m - r0);
    QmArgs a{static_cast<const char*>(x) + size_t(r0 * w.k) * es,
             w.codes,
             w.scales,
             w.row_factor,
             bias,
             static_cast<char*>(y) + size_t(r0 * ldy) * es,
             int(rows),
             int(w.n),
             int(w.k),
             int(ldy)};
    if (dtype == DType::kBF16) {
      if (q4)
        launch_qgemm_typed<__nv_bfloat16, QuantFormat::kQ4>(a, warps, s);
      else
        launch_qgemm_typed<__nv_bfloat16, QuantFormat::kQ8>(a, warps, s);
    } else {
      if (q4)
        launch_qgemm_typed<__half, QuantFormat::kQ4>(a, warps, s);
      else
        launch_qgemm_typed<__half, QuantFormat::kQ8>(a, warps, s);
    }
  }
}

}  // namespace kiln::cuda
