// The weight-only q8/q4 GEMV over the kMma layout (see gemv_quant.h), on tensor cores.
// A warp owns MT tiles of 16 weight rows (16 outputs; with SwiGLU 8 outputs, their gate
// rows in tile rows 0-7 and up rows in 8-15, so one lane ends with both halves of an
// output) and all 8 token rows (the mma's N; tokens past m read zeros). Per 32-k group,
// two m16n8k16 mma.sync form dot[row][token] = Σ q·x with f32 accumulation from codes
// decoded exactly to 16-bit integers, for q4 two more with an all-ones A form Σx, and the
// lane does acc += scale·dot (+ min·Σx) in f32: the kRows kernel's and the CPU kernels'
// math, in another summation order. By the fragment layout lane (g = lane/4, t = lane%4)
// holds tile rows g and g+8 and token g at k slots {2t, 2t+1, 2t+8, 2t+9}; a dot product
// does not care which k a slot stands for, so the lane's slots stand for the 8 codes of
// its own layout slice (k = 32G + 8t ...) and it loads x at those same k: one 16-byte
// load per row and block gives a lane its codes, one per group its x, with no shuffles.
// Split-K over S warps of the CTA. Tested with the q8/q4 cases of
// tests/backends/cuda/quant_test.cpp; timed by bench/cuda_gemv_bench.
#include <type_traits>

#include "backends/cuda/ops/gemv_quant.h"
#include "backends/cuda/ops/linear_common.cuh"
#include "backends/cuda/ops/quant_codes.cuh"

namespace kiln::cuda {
namespace {

constexpr int kWarps = 4;

struct MArgs : QOperands {
  int m, k, n_out, split, blocks, groups;
  int64_t code_stride, scale_stride;
  GemvEpilogue epi;
};

__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// The 16-bit type's constants: a magic number whose f16/bf16 spacing is 1 (128 for bf16,
// 1024 for f16), so OR-ing a small integer into its mantissa makes magic + integer
// exactly; and the pair (1, 1).
template <typename T>
struct Bits16 {
  static constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  static constexpr uint32_t kMagic = kBf16 ? 0x43004300u : 0x64006400u;
  static constexpr uint32_t kOnes = kBf16 ? 0x3F803F80u : 0x3C003C00u;
  __device__ static __forceinline__ uint32_t sub(uint32_t a, uint32_t b) {
    if constexpr (kBf16) {
      const __nv_bfloat162 r =
          __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&a), *reinterpret_cast<const __nv_bfloat162*>(&b));
      return *reinterpret_cast<const uint32_t*>(&r);
    } else {
      const __half2 r = __hsub2(*reinterpret_cast<const __half2*>(&a), *reinterpret_cast<const __half2*>(&b));
      return *reinterpret_cast<const uint32_t*>(&r);
    }
  }
};

// Codes 2j and 2j+1 of a q4 slice word (nibbles j and j+4) as a 16-bit pair of integers.
template <typename T>
__device__ __forceinline__ uint32_t q4_pair(uint32_t w, int j) {
  return Bits16<T>::sub(((w >> (4 * j)) & 0x000F000Fu) | Bits16<T>::kMagic, Bits16<T>::kMagic);
}

// Codes 2j and 2j+1 (bytes of a q8 slice word, int8) as a 16-bit pair of integers. XOR
// 0x80 makes byte b the integer c + 128 in [1, 255]; f16: 1024 + (c + 128) - 1152 in
// f16 pairs; bf16 (too few mantissa bits for 255 values): through exact f32 magic.
template <typename T>
__device__ __forceinline__ uint32_t q8_pair(uint32_t w, int j) {
  const uint32_t u = w ^ 0x80808080u;
  if constexpr (Bits16<T>::kBf16) {
    const float lo = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7440u + 2 * j)) - (0x1p23f + 128.0f);
    const float hi = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7441u + 2 * j)) - (0x1p23f + 128.0f);
    const __nv_bfloat162 r = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&r);
  } else {
    return Bits16<T>::sub(__byte_perm(u, 0x64646464u, 0x4140u + 0x202u * j), 0x64806480u);
  }
}

// MT: 16-row tiles per warp (they share x and Σx). U: blocks whose loads are issued
// before any is used (U x MT x 2 x 16 bytes of codes in flight per lane, plus scales and x).
template <typename T, QuantFormat F, int MT, bool kSwiGlu, int U>
__global__ void __launch_bounds__(kWarps * 32, 4) qgemv_mma_kernel(const MArgs a) {
  pdl_wait();  // programmatic dependent launch: the previous kernel's writes are visible
  constexpr bool kQ4 = F == QuantFormat::kQ4;
  constexpr int kPerBlock = kQ4 ? 4 : 2;       // groups per 64-byte block
  constexpr int kOuts = kSwiGlu ? 8 : 16;      // outputs per tile
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int S = a.split, part = warp % S;
  const int o0 = (int(blockIdx.x) * (kWarps / S) + warp / S) * MT * kOuts;
  const bool live = o0 < a.n_out;
  const int blocks = live ? a.blocks : 0;

  // This lane's weight rows: tile i, half h (tile row g + 8h). Rows of outputs past n_out
  // read row 0 (valid memory) and are not stored.
  const uint4* crow[MT][2];
  const void* srow[MT][2];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int64_t row;
      if constexpr (kSwiGlu) {
        const int o = o0 + i * kOuts + g;
        row = int64_t(o < a.n_out ? o : 0) + (h ? a.n_out : 0);
      } else {
        const int o = o0 + i * kOuts + g + 8 * h;
        row = o < a.n_out ? o : 0;
      }
      crow[i][h] = reinterpret_cast<const uint4*>(a.codes + row * a.code_stride) + t;
      srow[i][h] = static_cast<const uint8_t*>(a.scales) + row * a.scale_stride * (kQ4 ? 4 : 2);
    }
  const bool x_live = g < a.m;  // this lane's token
  const uint4* xrow = reinterpret_cast<const uint4*>(static_cast<const T*>(a.x) + int64_t(x_live ? g : 0) * a.k) + t;

  float acc[MT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[i][c] = 0.0f;
  const float zero[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const uint32_t ones[4] = {Bits16<T>::kOnes, Bits16<T>::kOnes, Bits16<T>::kOnes, Bits16<T>::kOnes};

  for (int b0 = part; b0 < blocks; b0 += S * U) {
    uint4 cw[U][MT][2], xv[U][kPerBlock];
    uint32_t sc[U][MT][2][kQ4 ? 4 : 1];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int b = b0 + u * S;
      const bool in = b < blocks;
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          cw[u][i][h] = in ? __ldcs(crow[i][h] + int64_t(b) * 4) : make_uint4(0, 0, 0, 0);
          if constexpr (kQ4) {
            const uint4 s4 = in ? __ldg(static_cast<const uint4*>(srow[i][h]) + b) : make_uint4(0, 0, 0, 0);
            sc[u][i][h][0] = s4.x, sc[u][i][h][1] = s4.y, sc[u][i][h][2] = s4.z, sc[u][i][h][3] = s4.w;
          } else {
            sc[u][i][h][0] = in ? __ldg(static_cast<const unsigned int*>(srow[i][h]) + b) : 0u;
          }
        }
#pragma unroll
      for (int gi = 0; gi < kPerBlock; ++gi) {
        const int grp = b * kPerBlock + gi;
        xv[u][gi] = in && x_live && grp < a.groups ? __ldg(xrow + int64_t(grp) * 4) : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int b = b0 + u * S;
      if (b >= blocks) break;  // warp-uniform, as every branch around an mma
#pragma unroll
      for (int gi = 0; gi < kPerBlock; ++gi) {
        if (b * kPerBlock + gi >= a.groups) break;  // the zero padding of the last block
        float xs[4];
        if constexpr (kQ4) {
          mma_16816<T>(xs, ones, xv[u][gi].x, xv[u][gi].y, zero);
          mma_16816<T>(xs, ones, xv[u][gi].z, xv[u][gi].w, xs);
        }
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          uint32_t a0[4], a1[4];
          if constexpr (kQ4) {
            const uint32_t w0 = word_of(cw[u][i][0], gi), w1 = word_of(cw[u][i][1], gi);
            a0[0] = q4_pair<T>(w0, 0), a0[1] = q4_pair<T>(w1, 0), a0[2] = q4_pair<T>(w0, 1), a0[3] = q4_pair<T>(w1, 1);
            a1[0] = q4_pair<T>(w0, 2), a1[1] = q4_pair<T>(w1, 2), a1[2] = q4_pair<T>(w0, 3), a1[3] = q4_pair<T>(w1, 3);
          } else {
            const uint32_t w00 = word_of(cw[u][i][0], 2 * gi), w01 = word_of(cw[u][i][0], 2 * gi + 1);
            const uint32_t w10 = word_of(cw[u][i][1], 2 * gi), w11 = word_of(cw[u][i][1], 2 * gi + 1);
            a0[0] = q8_pair<T>(w00, 0), a0[1] = q8_pair<T>(w10, 0), a0[2] = q8_pair<T>(w00, 1), a0[3] = q8_pair<T>(w10, 1);
            a1[0] = q8_pair<T>(w01, 0), a1[1] = q8_pair<T>(w11, 0), a1[2] = q8_pair<T>(w01, 1), a1[3] = q8_pair<T>(w11, 1);
          }
          float d[4];
          mma_16816<T>(d, a0, xv[u][gi].x, xv[u][gi].y, zero);
          mma_16816<T>(d, a1, xv[u][gi].z, xv[u][gi].w, d);
          // d[0], d[1]: row g, tokens 2t, 2t+1; d[2], d[3]: row g+8 (xs alike, rows equal).
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const uint32_t sw = kQ4 ? sc[u][i][h][kQ4 ? gi : 0] : sc[u][i][h][0];
            const float2 sf = __half22float2(*reinterpret_cast<const __half2*>(&sw));
            // q4: (scale, min) of this group; q8: the scales of the block's two groups.
            const float s = kQ4 ? sf.x : (gi == 0 ? sf.x : sf.y);
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              acc[i][2 * h + j] = fmaf(s, d[2 * h + j], acc[i][2 * h + j]);
              if constexpr (kQ4) acc[i][2 * h + j] = fmaf(sf.y, xs[j], acc[i][2 * h + j]);
            }
          }
        }
      }
    }
  }

  pdl_trigger();  // the weights are read: the next kernel may launch (it waits for our writes)
  if (S > 1) {
    __shared__ float red[kWarps][MT][4][32];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c) red[warp][i][c][lane] = acc[i][c];
    __syncthreads();
    if (part != 0 || !live) return;
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        float v = 0.0f;
        for (int p = 0; p < S; ++p) v += red[warp + p][i][c][lane];
        acc[i][c] = v;
      }
  } else if (!live) {
    return;
  }

  // Outputs rounded as the unfused kernels would (linear_common.cuh).
  const T* bias = static_cast<const T*>(a.bias);
  T* y = static_cast<T*>(a.y);
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int tok = 2 * t + j;
      if (tok >= a.m) continue;
      if constexpr (kSwiGlu) {
        const int o = o0 + i * kOuts + g;
        if (o >= a.n_out) continue;
        float gate = acc[i][j] * __ldg(a.row_factor + o);
        float up = acc[i][2 + j] * __ldg(a.row_factor + a.n_out + o);
        if (bias) gate += to_f32(bias[o]), up += to_f32(bias[a.n_out + o]);
        y[int64_t(tok) * a.n_out + o] = linear_swiglu_out<T>(gate, up);
      } else {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int o = o0 + i * kOuts + g + 8 * h;
          if (o >= a.n_out) continue;
          float v = acc[i][2 * h + j] * __ldg(a.row_factor + o);
          if (bias) v += to_f32(bias[o]);
          y[int64_t(tok) * a.n_out + o] = linear_epilogue_out<T>(a.epi, v);
        }
      }
    }
}

// Warps per tile group: split K until about 2048 warps stream the matrix (an H200 keeps
// ~16 of these 128-thread, ~128-register warps per SM: 2112), while each warp keeps at
// least two rounds of U blocks.
int mma_split_for(int64_t units, int64_t blocks, int u) {
  int s = 1;
  while (s < kWarps && units * s < 2048 && blocks >= int64_t(2 * u) * (2 * s)) s *= 2;
  return s;
}

template <typename T, QuantFormat F, bool kSwiGlu>
void launch_format(MArgs a, cudaStream_t s) {
  constexpr int kOuts = kSwiGlu ? 8 : 16, U = F == QuantFormat::kQ4 ? 2 : 4;  // 2 x 16 bytes of codes per row
  // Two tiles per warp halve the x loads (which grow with the token rows) where the matrix
  // still gives each SM enough warps.
  const int64_t tiles = (int64_t(a.n_out) + kOuts - 1) / kOuts;
  const bool two = a.m >= 3 && tiles >= 2 * 1024;
  const int64_t units = two ? (tiles + 1) / 2 : tiles;
  a.split = mma_split_for(units, a.blocks, U);
  const dim3 grid(unsigned((units * a.split + kWarps - 1) / kWarps));
  if (two) launch_k(qgemv_mma_kernel<T, F, 2, kSwiGlu, U / 2>, grid, kWarps * 32, 0, s, a);  // (U: registers)
  else launch_k(qgemv_mma_kernel<T, F, 1, kSwiGlu, U>, grid, kWarps * 32, 0, s, a);
  KILN_CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_typed(MArgs a, QuantFormat f, cudaStream_t s) {
  const bool swiglu = a.epi == GemvEpilogue::kSwiGlu;
  if (f == QuantFormat::kQ4) {
    if (swiglu) launch_format<T, QuantFormat::kQ4, true>(a, s);
    else launch_format<T, QuantFormat::kQ4, false>(a, s);
  } else {
    if (swiglu) launch_format<T, QuantFormat::kQ8, true>(a, s);
    else launch_format<T, QuantFormat::kQ8, false>(a, s);
  }
}

}  // namespace

void launch_qgemv_mma(DType dtype, const void* x, const QuantWeightView& w, const void* bias, void* y, int64_t m,
                      int64_t n_out, cudaStream_t s, GemvEpilogue epi) {
  MArgs a{x,      w.codes,         w.scales, w.row_factor, bias, y, int(m), int(w.k), int(n_out), 1,
          int(w.code_stride / 64), int(w.k / kQuantGroup), w.code_stride, w.scale_stride, epi};
  if (dtype == DType::kBF16) launch_typed<__nv_bfloat16>(a, w.format, s);
  else if (dtype == DType::kF16) launch_typed<__half>(a, w.format, s);
  else throw_error(ErrorCode::kInternal, "cuda quantized gemv: the mma layout needs bf16/f16, got ", dtype_name(dtype));
}

}  // namespace kiln::cuda
