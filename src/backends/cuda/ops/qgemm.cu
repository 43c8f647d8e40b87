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
#include <type_traits>

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

// ---- The skinny q8/q4 GEMM (launch_qgemm_skinny): up to kQGemmSkinnyMaxRows token rows ----
// Each warp owns 16 weight rows and all the token rows (NT mma n-tiles of 8), a CTA four
// warps (64 weight rows) sharing x through shared memory. A k block is 4 code chunks of 16
// bytes a row (q4: 4 groups, 128 k; q8: 2 groups, 64 k). Lane (g, t) loads chunk t of the
// block for weight rows g and g + 8 straight from global memory into registers (D blocks
// ahead), and dequantizes it there with the tile dequantizer's formula and rounding
// (T(fma(q, scale·factor, min·factor))), so the A fragments hold the very weights the tile
// path multiplies. A dot product does not care which k a slot of the mma stands for, so the
// 4 k slots lane t holds in each m16n8k16 step stand for 4 consecutive values of its own
// chunk, and the x fragments are read at those k: 16 bytes of token row 8j + g for two steps
// from the block's x slice in shared memory (cp.async, double-buffered; each chunk's slice
// padded to 80 / 48 bytes so the 8 lanes of a phase hit 32 distinct banks). The weights are
// thus read once from memory and decoded once, in registers, with no shared-memory trip
// (session 51's fused GEMM decoded into shared memory behind a barrier each step and
// reached a quarter of mma.sync's rate). f32 accumulation; the epilogue adds the bias and
// rounds once. Meant for batch decode and short prompts (6-64 rows by default), where the tile path
// writes every weight as 16 bits per step.
constexpr int kQsWarps = 4;

template <QuantFormat F>
struct QsLayout {
  static constexpr int kChunkVals = QTraits<F>::kPerChunk;  // values of one 16-byte code chunk
  static constexpr int kP = kChunkVals * 2 + 16;  // a token row's x slice of one chunk (padded)
  static constexpr int kRow = 4 * kP;             // a token row's x of one k block
  static constexpr int kSteps = kChunkVals / 4;   // m16n8k16 steps a block
  static constexpr int kPieces = kChunkVals * 2 / 16;  // 16-byte copies of a slice
};

// Split-K: CTA (x, y) takes k blocks [y·bps, (y + 1)·bps) and, with more than one split,
// stores its f32 partial sums to part[y][m][n] for qgemm_skinny_sum_kernel (bias, rounding).
struct QsArgs : QmArgs {
  float* part;
  int splits, bps;  // bps: k blocks a split
};

// NT: mma n-tiles of 8 token rows (m <= 8 NT); D: k blocks of codes in flight a lane (1
// or 2, KILN_CUDA_QGEMM_SKINNY_DEPTH), two register sets taken in turn at D = 2.
template <typename T, QuantFormat F, int NT, int D>
__global__ void __launch_bounds__(kQsWarps * 32) qgemm_skinny_kernel(const QsArgs a) {
  using L = QsLayout<F>;
  using Tr = QTraits<F>;
  constexpr int kTok = 8 * NT;
  __shared__ __align__(16) unsigned char xs[2][kTok * L::kRow];
  const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int chunks = a.k / L::kChunkVals, groups = a.k / kQuantGroup;
  const int split = int(blockIdx.y), b0 = split * a.bps, blocks = min((chunks + 3) / 4, b0 + a.bps);
  const int row0 = (int(blockIdx.x) * kQsWarps + warp) * 16;
  // Rows past n read row 0 (valid memory) and are not stored.
  const int r_lo = row0 + g < a.n ? row0 + g : 0, r_hi = row0 + g + 8 < a.n ? row0 + g + 8 : 0;
  const size_t row_bytes = size_t(a.k / Tr::kRowDiv);
  const uint4* c_lo = reinterpret_cast<const uint4*>(a.codes + size_t(r_lo) * row_bytes);
  const uint4* c_hi = reinterpret_cast<const uint4*>(a.codes + size_t(r_hi) * row_bytes);
  const float f_lo = __ldg(a.row_factor + r_lo), f_hi = __ldg(a.row_factor + r_hi);
  const T* x = static_cast<const T*>(a.x);

  // Block b's x slices into stage b & 1 (token rows past m and chunks past k: zeros).
  auto issue_x = [&](int b) {
    if (b < blocks) {
      unsigned char* st = xs[b & 1];
      for (int p = tid; p < kTok * 4 * L::kPieces; p += kQsWarps * 32) {
        const int r = p / (4 * L::kPieces), ch = (p / L::kPieces) % 4, i = p % L::kPieces,
                  c = b * 4 + ch;
        const bool in = r < a.m && c < chunks;
        cp_async16(st + r * L::kRow + ch * L::kP + i * 16,
                   in ? x + int64_t(r) * a.k + int64_t(c) * L::kChunkVals + i * 8 : x, in);
      }
    }
    cp_async_commit();
  };
  // Block b's codes and (scale, min) of this lane's chunk for both rows; zeros past k.
  auto load_codes = [&](int b, uint4& lo, uint4& hi, float(&sc)[4]) {
    const int c = b * 4 + t;
    if (b < blocks && c < chunks) {
      lo = __ldcs(c_lo + c);
      hi = __ldcs(c_hi + c);
      load_scale<F>(a.scales, r_lo, groups, c, sc[0], sc[1]);
      load_scale<F>(a.scales, r_hi, groups, c, sc[2], sc[3]);
    } else {
      lo = hi = make_uint4(0, 0, 0, 0);
      sc[0] = sc[1] = sc[2] = sc[3] = 0.0f;
    }
  };
  // A chunk's values as 16-bit pairs (pr[p]: values 2p, 2p + 1).
  auto decode = [&](const uint4& cw, float s, float mn, uint32_t(&pr)[L::kChunkVals / 2]) {
    const uint32_t w[4] = {cw.x, cw.y, cw.z, cw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float q[Tr::kPerWord];
      decode_word<F>(w[i], q);
#pragma unroll
      for (int e = 0; e < Tr::kPerWord; e += 2)
        pr[(i * Tr::kPerWord + e) / 2] = qm_pack<T>(fmaf(q[e], s, mn), fmaf(q[e + 1], s, mn));
    }
  };

  // Weights and scales are never written by a kernel: requested before the dependent-launch
  // wait. x comes from the previous kernel.
  uint4 alo, ahi, blo, bhi;
  float asc[4], bsc[4];
  load_codes(b0, alo, ahi, asc);
  if constexpr (D == 2) load_codes(b0 + 1, blo, bhi, bsc);
  pdl_wait();
  issue_x(b0);
  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

  // Block b from the register set (nlo, nhi, nsc), which then takes block b + D.
  auto step = [&](int b, uint4& nlo, uint4& nhi, float(&nsc)[4]) {
    const uint4 lo = nlo, hi = nhi;
    const float s_lo = nsc[0] * f_lo, m_lo = nsc[1] * f_lo, s_hi = nsc[2] * f_hi,
                m_hi = nsc[3] * f_hi;
    load_codes(b + D, nlo, nhi, nsc);  // in flight during the next D blocks
    issue_x(b + 1);  // into the stage block b - 1 used (free: its closing barrier)
    uint32_t plo[L::kChunkVals / 2], phi[L::kChunkVals / 2];
    decode(lo, s_lo, m_lo, plo);
    decode(hi, s_hi, m_hi, phi);
    cp_async_wait<1>();  // block b's copies (this thread's) have landed...
    __syncthreads();     // ...and everyone's
    const unsigned char* st = xs[b & 1];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const uint4* xr = reinterpret_cast<const uint4*>(st + (8 * j + g) * L::kRow + t * L::kP);
#pragma unroll
      for (int s2 = 0; s2 < L::kSteps / 2; ++s2) {
        const uint4 xv = xr[s2];  // values 8 s2 .. 8 s2 + 7 of the chunk: steps 2 s2 and 2 s2 + 1
        const uint32_t a0[4] = {plo[4 * s2], phi[4 * s2], plo[4 * s2 + 1], phi[4 * s2 + 1]};
        mma16816<T>(acc[j], a0, xv.x, xv.y);
        const uint32_t a1[4] = {plo[4 * s2 + 2], phi[4 * s2 + 2], plo[4 * s2 + 3], phi[4 * s2 + 3]};
        mma16816<T>(acc[j], a1, xv.z, xv.w);
      }
    }
    __syncthreads();  // every warp is done with stage b & 1 before block b + 2's copies land in it
  };
  if constexpr (D == 1) {
    for (int b = b0; b < blocks; ++b) step(b, alo, ahi, asc);
  } else {
    for (int b = b0; b < blocks; b += 2) {
      step(b, alo, ahi, asc);
      if (b + 1 < blocks) step(b + 1, blo, bhi, bsc);
    }
  }
  cp_async_wait<0>();

  // acc[j]: rows g (0, 1) and g + 8 (2, 3), token rows 8j + 2t (0, 2) and 8j + 2t + 1.
  T* y = static_cast<T*>(a.y);
  const T* bias = static_cast<const T*>(a.bias);
  float* part = a.splits > 1 ? a.part + int64_t(split) * a.m * a.n : nullptr;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + g + 8 * h;
    if (row >= a.n) continue;
    const float bv = bias && !part ? to_f32(bias[row]) : 0.0f;
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int tok = 8 * j + 2 * t + e;
        if (tok >= a.m) continue;
        if (part)
          part[int64_t(tok) * a.n + row] = acc[j][2 * h + e];
        else
          y[int64_t(tok) * a.ldy + row] = from_f32<T>(acc[j][2 * h + e] + bv);
      }
  }
}

// The splits' partial sums added in split order (the same bits on every run), plus the
// bias, rounded once.
template <typename T>
__global__ void qgemm_skinny_sum_kernel(const QsArgs a) {
  pdl_wait();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(a.m) * a.n) return;
  const int64_t tok = i / a.n, row = i % a.n;
  float v = 0.0f;
  for (int p = 0; p < a.splits; ++p) v += a.part[int64_t(p) * a.m * a.n + i];
  if (a.bias) v += to_f32(static_cast<const T*>(a.bias)[row]);
  static_cast<T*>(a.y)[tok * a.ldy + row] = from_f32<T>(v);
}

template <typename T, QuantFormat F, int D>
void launch_qgemm_skinny_depth(const QsArgs& a, cudaStream_t s) {
  const dim3 grid(unsigned((a.n + kQsWarps * 16 - 1) / (kQsWarps * 16)), unsigned(a.splits));
  const dim3 block(kQsWarps * 32);
  if (a.m <= 8)
    launch_k(qgemm_skinny_kernel<T, F, 1, D>, grid, block, 0, s, a);
  else if (a.m <= 16)
    launch_k(qgemm_skinny_kernel<T, F, 2, D>, grid, block, 0, s, a);
  else if (a.m <= 32)
    launch_k(qgemm_skinny_kernel<T, F, 4, D>, grid, block, 0, s, a);
  else
    launch_k(qgemm_skinny_kernel<T, F, 8, D>, grid, block, 0, s, a);
}

template <typename T, QuantFormat F>
void launch_qgemm_skinny_typed(const QsArgs& a, int depth, cudaStream_t s) {
  if (depth == 2)
    launch_qgemm_skinny_depth<T, F, 2>(a, s);
  else
    launch_qgemm_skinny_depth<T, F, 1>(a, s);
  KILN_CUDA_CHECK_LAUNCH();
  if (a.splits > 1) {
    const int64_t outs = int64_t(a.m) * a.n;
    launch_k(qgemm_skinny_sum_kernel<T>, dim3(unsigned((outs + 255) / 256)), dim3(256), 0, s, a);
    KILN_CUDA_CHECK_LAUNCH();
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
         w.k > 0 && w.k % kQuantGroup == 0 && w.n % 2 == 0 && w.n <= INT32_MAX - 128 &&
         w.k <= INT32_MAX && w.code_stride == (q4 ? w.k / 2 : w.k) &&
         w.scale_stride == w.k / kQuantGroup;
}

namespace {

// fn(std::type_identity<T>, std::integral_constant<QuantFormat, F>) for the 16-bit
// activation type T of `dtype` (bf16, else f16) and the weight format F.
template <typename Fn>
void with_qgemm_types(DType dtype, QuantFormat f, Fn&& fn) {
  using Q4 = std::integral_constant<QuantFormat, QuantFormat::kQ4>;
  using Q8 = std::integral_constant<QuantFormat, QuantFormat::kQ8>;
  const bool q4 = f == QuantFormat::kQ4;
  if (dtype == DType::kBF16) {
    if (q4)
      fn(std::type_identity<__nv_bfloat16>{}, Q4{});
    else
      fn(std::type_identity<__nv_bfloat16>{}, Q8{});
  } else {
    if (q4)
      fn(std::type_identity<__half>{}, Q4{});
    else
      fn(std::type_identity<__half>{}, Q8{});
  }
}

// k blocks of 4 code chunks (q4: 128 values, q8: 64).
int64_t skinny_blocks(int64_t k, QuantFormat f) {
  const int64_t chunk = f == QuantFormat::kQ4 ? QTraits<QuantFormat::kQ4>::kPerChunk
                                              : QTraits<QuantFormat::kQ8>::kPerChunk;
  return (k / chunk + 3) / 4;
}

}  // namespace

int qgemm_skinny_splits(int64_t n, int64_t k, QuantFormat f, int sms) {
  const int64_t ctas = (n + kQsWarps * 16 - 1) / (kQsWarps * 16), blocks = skinny_blocks(k, f);
  int s = 1;
  while (s < kQGemmSkinnyMaxSplits && ctas * s < 2 * int64_t(sms) && blocks >= int64_t(8) * s)
    s *= 2;
  return s;
}

void launch_qgemm_skinny(DType dtype, const void* x, const QuantWeightView& w, const void* bias,
                         void* y, int64_t m, int64_t ldy, cudaStream_t s, int splits, void* ws,
                         size_t ws_bytes, int depth) {
  KILN_THROW_IF(
      !qgemm_supports(dtype, w) || m < 0 || m > kQGemmSkinnyMaxRows || ldy < w.n || ldy > INT32_MAX,
      kInternal, "cuda skinny q8/q4 GEMM: ", dtype_name(dtype), " x [", m, ", ", w.k, "] by a [",
      w.n, ", ", w.k, "] ", w.layout == QuantLayout::kRows ? "kRows" : "kMma",
      " weight into rows of ", ldy,
      " (needs bf16/f16, the kRows layout's strides, k % 32 == 0, m <= ", kQGemmSkinnyMaxRows,
      " and ldy >= n)");
  KILN_THROW_IF(splits < 1 || splits > kQGemmSkinnyMaxSplits, kInternal,
                "cuda skinny q8/q4 GEMM: ", splits, " splits (1..", kQGemmSkinnyMaxSplits, ")");
  KILN_THROW_IF(depth != 1 && depth != 2, kInternal, "cuda skinny q8/q4 GEMM: ", depth,
                " k blocks in flight (1 or 2)");
  if (m == 0 || w.n == 0) return;
  // Even splits of whole k blocks, none empty; one where the workspace is short.
  const int64_t blocks = skinny_blocks(w.k, w.format);
  int64_t bps = (blocks + splits - 1) / splits, used = (blocks + bps - 1) / bps;
  if (used > 1 && (!ws || ws_bytes < size_t(used * m * w.n) * sizeof(float)))
    used = 1, bps = blocks;
  QsArgs a;
  static_cast<QmArgs&>(a) =
      QmArgs{x, w.codes, w.scales, w.row_factor, bias, y, int(m), int(w.n), int(w.k), int(ldy)};
  a.part = static_cast<float*>(ws);
  a.splits = int(used);
  a.bps = int(bps);
  with_qgemm_types(dtype, w.format, [&](auto t, auto f) {
    launch_qgemm_skinny_typed<typename decltype(t)::type, decltype(f)::value>(a, depth, s);
  });
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
    with_qgemm_types(dtype, w.format, [&](auto t, auto f) {
      launch_qgemm_typed<typename decltype(t)::type, decltype(f)::value>(a, warps, s);
    });
  }
}

}  // namespace kiln::cuda
