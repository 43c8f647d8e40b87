// The weight-only q8/q4 GEMV on the integer dot-product instruction (the default for
// bf16/f16 activations; KILN_CUDA_QGEMV=dp4a forces it), over the kRows layout
// (gemv_quant.h), bf16/f16 activations, 1..8 token rows.
// Why: the f32 kernels spend ~5 instructions per weight (unpack, convert, scale, FMA) and
// so reach only 31-64% of copy bandwidth at one row. Here x is rounded to int8 per group of
// 32 (d = max|x| / 127, xq = rint(x / d)), and per 16-byte chunk of a weight row (q4: one
// group of 32 codes; q8: half a group, 16 codes) a lane forms the exact integer Σ q·xq with
// dp4a: for q4, w & 0x0F0F0F0F (the low nibbles: even elements) against x's even codes and
// w & 0xF0F0F0F0 (16 x the odd elements' codes, no shift needed) against the odd ones, so
// 8 weights cost 2 masks + 2 dp4a. Then acc += scale·d·Σq·xq (+ min·Σx, Σx the exact f32
// sum of the group's x) in f32: about 0.75 instructions per weight, so the loop is bound
// by memory. The only new error is x's rounding: |Δy| <= F Σ_g scale_g Σ_i |q_i| ·
// max_g|x| / 254 (plus f32 sums), tested against an f64 evaluation with that bound in
// tests/backends/cuda/qgemv_dp4a_test.cpp; timed by `cuda_gemv_bench qgemv`.
//
// The grid is persistent (CTAs per SM x SMs, fewer for small weights): each CTA first
// issues its first weight loads (the weights are never written by a kernel, so this may
// precede the PDL wait), then rounds x into shared memory once (mostly two x loads in
// flight per thread: half the L2 round trips of one at a time), then its warps
// stream their outputs. A warp owns RL outputs at a time (RL = 2 at one or two token rows,
// 4 at more: more rows reuse each x load from shared memory; QGemvDp4aTuning::outs_one_row;
// 1 beside a decode attention), 32 / RL lanes along K of each, and a lane takes SC chunks a
// step (2 at one row, QGemvDp4aTuning::chunks_per_step; 1 at more). At one row the two
// halve the loop's bookkeeping and the per-output reduction and pointer setup per chunk (by
// the SASS, ~60 instructions a chunk on the loop's fast path down to ~50, the per-unit ~75
// shared by twice the chunks): Llama-3.1-8B q4 decode 1.044x on an H100 (bench/RESULTS.md,
// session 57). Split-K inside the CTA (S = 1, 2, 4 or 8): S consecutive warps form a group
// that shares RL outputs, warp s of it taking the s-th of S ranges of K; the partial sums
// meet in shared memory (double-buffered, one named barrier per output unit) and the
// group's first warp adds them in a fixed order and applies the epilogue (bias,
// activation, SwiGLU) once. Small or long-K weights so spread over more warps (qkv/o: few
// outputs; down: k = 14336) without a global reduction or a second pass. A group's outputs
// are g, g + G, ... of the grid's G groups, and the loads of the next P steps (SC 16-byte
// chunks per lane and weight row each) are always in flight, across output boundaries too.
#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "backends/cuda/ops/gemv_quant.h"
#include "backends/cuda/ops/linear_common.cuh"
#include "backends/cuda/ops/quant_codes.cuh"

namespace kiln::cuda {
namespace {

constexpr int kMaxDevices = 64;
constexpr int kMaxSplits = 8;
constexpr int kDefaultCtasPerSm = 1;  // one CTA of dp4a_warps() warps per SM

// Warps of a CTA: the SM's whole share (24 warps at <= 80 registers; the SwiGLU kernels
// need up to 128 registers, so 16), in one CTA per SM. Each CTA rounds all of x into its
// shared memory before its main loop; one CTA per SM does that once per SM instead of
// once per 8 warps (`cuda_gemv_bench qprologue`: three 8-warp CTAs per SM spent 1.1 us of a
// 7.2 us q4 q|k|v GEMV and 4.6 of 16.1 us of the down projection, k = 14336, in that
// prologue).
template <bool kSwiGlu>
constexpr int dp4a_warps() {
  return kSwiGlu ? 16 : 24;
}
constexpr int kDefaultDepth = 4;  // 16-byte chunks of loads in flight per lane
// Warps of a one-row CTA launched beside a decode attention (QGemvDp4aTuning::beside_attention):
// at the 24-warp kernel's 80 registers, 16 warps leave 24K registers for an attention CTA.
constexpr int kBesideAttnWarps = 16;

struct DArgs : QOperands {
  int m, k, n_out, groups, chunks, steps, units;
  int splits, sps;  // split-K: S warps per output unit, each ceil(steps / S) = sps steps
  GemvEpilogue epi;
  int skip_x;     // timing ablation (QGemvDp4aTuning::skip_x)
  int epi_early;  // gemv_bias_early(): each unit's row factors and bias read as it starts
  int trigger_early;  // the dependent launch released at the start (beside_attention)
  int l2_units;  // QGemvDp4aTuning::l2_prefetch: units of each warp whose rows it prefetches into L2
  int64_t weight_bytes;  // host side: QuantWeightView::bytes(), what the launch streams
};

// Outputs per warp (RL) for MAXM token rows; 32 / RL lanes share an output along K.
template <int MAXM>
constexpr int outs_per_warp() {
  return MAXM == 1 ? 1 : MAXM == 2 ? 2 : 4;
}

// The one-row launch a tuning selects, its zeros resolved to the defaults: outputs a warp
// (RL), chunks a step (SC) and chunks in flight per lane (depth = P x SC).
struct OneRowForm {
  int outs, chunks, depth;
};
constexpr int kDefaultOutsOneRow = 2, kDefaultChunksOneRow = 2;
OneRowForm one_row_form(const QGemvDp4aTuning& t) {
  return {t.outs_one_row ? t.outs_one_row : kDefaultOutsOneRow,
          t.chunks_per_step ? t.chunks_per_step : kDefaultChunksOneRow, t.depth ? t.depth : kDefaultDepth};
}
// The forms launch_rows instantiates: plain at depth 2, 4 or 8; outs 2 and / or chunks 2 at
// depth 4; outs 2 with chunks 2 at depth 2.
bool one_row_form_built(const OneRowForm& r) {
  if (r.outs == 1 && r.chunks == 1) return r.depth == 2 || r.depth == 4 || r.depth == 8;
  return r.depth == 4 || (r.depth == 2 && r.outs == 2 && r.chunks == 2);
}

}  // namespace

bool qgemv_dp4a_one_row_built(const QGemvDp4aTuning& tune) { return one_row_form_built(one_row_form(tune)); }

namespace {

// d = c + Σ a.bytes (unsigned) · b.bytes (signed).
__device__ __forceinline__ int dp4a_us(uint32_t a, uint32_t b, int c) {
  int d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// Bytes 0 of a, b, c, d as one word (a in the low byte).
__device__ __forceinline__ uint32_t pack4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  return __byte_perm(__byte_perm(a, b, 0x0040), __byte_perm(c, d, 0x0040), 0x5410);
}

// Eight 16-bit values (one 16-byte load) as f32.
template <typename T>
__device__ __forceinline__ void to_f32x8(const uint4 u, float (&v)[8]) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    float2 f;
    if constexpr (std::is_same_v<T, __nv_bfloat16>) f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[j]));
    else f = __half22float2(*reinterpret_cast<const __half2*>(&w[j]));
    v[2 * j] = f.x, v[2 * j + 1] = f.y;
  }
}

// x [m, k] rounded into shared memory, 4 threads per group (8 values each).
//  xq, per token row (k bytes): q4: two planes of groups x 16 bytes, group g's words
//    (even 0-7, odd 0-7, even 8-15, odd 8-15) in plane 0 and (even 16-23, odd 16-23,
//    even 24-31, odd 24-31) in plane 1 ("even 0-7": the codes of elements 0, 2, 4, 6,
//    as the low nibbles of a code word hold them), so lane j's two 16-byte reads of group
//    j are conflict-free; q8: the codes in element order.
//  xd[row * groups + g] = (d, Σx) with d = max|x| / 127 (q4: / 16 more, undoing the odd
//    codes' factor 16), Σx the f32 sum of the group's values as given.
// Rounding: fma(x, 127 / max|x|, 1.5·2^23) holds rint(x·127/max|x|) in its low mantissa
// bits (|.| <= 127), ties to even, its low byte the int8 code.
// kXBatch: x chunks a thread loads before rounding any; kThreads: the CTA's threads.
template <typename T, bool kQ4, int kXBatch, int kThreads, int MAXM>
__device__ void quantize_x(const T* __restrict__ x, int m, int k, int groups, uint8_t* xq, float2* xd) {
  const int tasks = m * groups * 4;
  // Uniform trip count (the shuffles see every lane); kXBatch loads in flight per thread.
  for (int base = 0; base < tasks; base += kThreads * kXBatch) {
    uint4 raw[kXBatch];
#pragma unroll
    for (int b = 0; b < kXBatch; ++b) {
      const int task = base + b * kThreads + int(threadIdx.x);
      if (task < tasks) {
        const int row = MAXM == 1 ? 0 : task / (groups * 4), rem = task - row * groups * 4;
        raw[b] = __ldg(reinterpret_cast<const uint4*>(x + int64_t(row) * k + (rem >> 2) * 32 + (rem & 3) * 8));
      } else {
        raw[b] = make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int b = 0; b < kXBatch; ++b) {
      if (base + b * kThreads >= tasks) break;  // uniform: no lane of this or later rounds has a task
      const int task = base + b * kThreads + int(threadIdx.x);
      const bool on = task < tasks;
      const int row = on && MAXM > 1 ? task / (groups * 4) : 0, rem = on ? task - row * groups * 4 : 0;
      const int g = rem >> 2, sub = rem & 3;
      float v[8];
      to_f32x8<T>(raw[b], v);
      float amax = 0.0f, sum = 0.0f;
#pragma unroll
      for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(v[e])), sum += v[e];
#pragma unroll
      for (int o = 1; o < 4; o <<= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
      }
      const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      uint32_t q[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) q[e] = __float_as_uint(fmaf(v[e], inv, 0x1.8p23f));
      if (!on) continue;
      uint8_t* dst = xq + int64_t(row) * k;
      if constexpr (kQ4) {
        const uint2 out = make_uint2(pack4(q[0], q[2], q[4], q[6]), pack4(q[1], q[3], q[5], q[7]));
        *reinterpret_cast<uint2*>(dst + (sub >> 1) * (k / 2) + g * 16 + (sub & 1) * 8) = out;
      } else {
        const uint2 out = make_uint2(pack4(q[0], q[1], q[2], q[3]), pack4(q[4], q[5], q[6], q[7]));
        *reinterpret_cast<uint2*>(dst + g * 32 + sub * 8) = out;
      }
      if (sub == 0) xd[row * groups + g] = make_float2(amax / 127.0f * (kQ4 ? 0.0625f : 1.0f), sum);
    }
  }
}

// The scale words of a format: q4 (scale, min) f16 pairs, q8 f16 scales.
template <bool kQ4>
using ScaleWord = std::conditional_t<kQ4, unsigned int, unsigned short>;

// One step's loads for the RU weight rows of a lane (16 code bytes and the chunk's scale
// word each, at the cursor's pointers), or zeros.
// `ofs`: chunks past the cursor (the second chunk of a two-chunk step).
template <bool kQ4, int RU>
__device__ __forceinline__ void issue_step(uint4 (&cw)[RU], uint32_t (&sw)[RU],
                                           const uint4* const (&cp)[RU],
                                           const ScaleWord<kQ4>* const (&sp)[RU], bool on,
                                           int ofs) {
#pragma unroll
  for (int r = 0; r < RU; ++r) {
    cw[r] = on ? __ldcs(cp[r] + ofs) : make_uint4(0, 0, 0, 0);
    sw[r] = on ? uint32_t(__ldcs(sp[r] + (kQ4 ? ofs : ofs / 2))) : 0u;
  }
}

// acc[r][m] += this chunk's share of row r's dot product with token row m.
template <bool kQ4, int RU, int MAXM>
__device__ __forceinline__ void consume_step(float (&acc)[RU][MAXM], const uint4 (&cw)[RU], const uint32_t (&sw)[RU],
                                             const uint8_t* xq, const float2* xd, const DArgs& a, int c) {
  float s[RU], mn[RU];
#pragma unroll
  for (int r = 0; r < RU; ++r) {
    if constexpr (kQ4) {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&sw[r]));
      s[r] = f.x, mn[r] = f.y;
    } else {
      s[r] = __half2float(__ushort_as_half(uint16_t(sw[r]))), mn[r] = 0.0f;
    }
  }
#pragma unroll
  for (int m = 0; m < MAXM; ++m) {
    if (MAXM > 1 && m >= a.m) break;
    const uint8_t* xr = xq + int64_t(m) * a.k;
    if constexpr (kQ4) {
      const uint4 xa = reinterpret_cast<const uint4*>(xr)[c], xb = reinterpret_cast<const uint4*>(xr + a.k / 2)[c];
      const float2 ds = xd[m * a.groups + c];
#pragma unroll
      for (int r = 0; r < RU; ++r) {
        constexpr uint32_t kLo = 0x0F0F0F0Fu, kHi = 0xF0F0F0F0u;
        int lo = dp4a_us(cw[r].x & kLo, xa.x, 0), hi = dp4a_us(cw[r].x & kHi, xa.y, 0);
        lo = dp4a_us(cw[r].y & kLo, xa.z, lo), hi = dp4a_us(cw[r].y & kHi, xa.w, hi);
        lo = dp4a_us(cw[r].z & kLo, xb.x, lo), hi = dp4a_us(cw[r].z & kHi, xb.y, hi);
        lo = dp4a_us(cw[r].w & kLo, xb.z, lo), hi = dp4a_us(cw[r].w & kHi, xb.w, hi);
        acc[r][m] = fmaf(s[r], float(lo * 16 + hi) * ds.x, acc[r][m]);  // exact integer: |.| < 2^20
        acc[r][m] = fmaf(mn[r], ds.y, acc[r][m]);
      }
    } else {
      const uint4 xa = reinterpret_cast<const uint4*>(xr)[c];
      const float d = xd[m * a.groups + c / 2].x;
#pragma unroll
      for (int r = 0; r < RU; ++r) {
        int dot = __dp4a(int(cw[r].x), int(xa.x), 0);
        dot = __dp4a(int(cw[r].y), int(xa.y), dot);
        dot = __dp4a(int(cw[r].z), int(xa.z), dot);
        dot = __dp4a(int(cw[r].w), int(xa.w), dot);
        acc[r][m] = fmaf(s[r], float(dot) * d, acc[r][m]);
      }
    }
  }
}

// The load pointers of a lane for output o's RU weight rows (row 0 for outputs past the
// end: valid memory, never stored) at chunk `c0` (this lane's first chunk).
template <bool kQ4, bool kSwiGlu, int RU>
__device__ __forceinline__ void rows_at(int o, bool live, const DArgs& a, int c0, const uint4* (&cp)[RU],
                                        const ScaleWord<kQ4>* (&sp)[RU]) {
  const int64_t r0 = live && o < a.n_out ? o : 0;
  const size_t row_bytes = kQ4 ? size_t(a.k / 2) : size_t(a.k);
  const auto* scales = static_cast<const ScaleWord<kQ4>*>(a.scales);
#pragma unroll
  for (int r = 0; r < RU; ++r) {
    const int64_t row = r0 + (r ? a.n_out : 0);
    cp[r] = reinterpret_cast<const uint4*>(a.codes + size_t(row) * row_bytes) + c0;
    sp[r] = scales + row * a.groups + (kQ4 ? c0 : c0 / 2);
  }
}

// Floats of the split-K exchange per warp: RL outputs x RU weight rows x MAXM token rows.
template <int MAXM, bool kSwiGlu, int RL = outs_per_warp<MAXM>()>
constexpr int red_per_warp() {
  return RL * (kSwiGlu ? 2 : 1) * MAXM;
}

// The row factors (ef[r]) and bias (ef[RU + r]) of output o, or zeros where !on.
template <typename T, int RU>
__device__ __forceinline__ void load_epi(const DArgs& a, const T* bias, int o, bool on,
                                         float (&ef)[2 * RU]) {
#pragma unroll
  for (int r = 0; r < RU; ++r) {
    ef[r] = on ? __ldg(a.row_factor + r * a.n_out + o) : 0.0f;
    ef[RU + r] = on && bias ? to_f32(bias[r * a.n_out + o]) : 0.0f;
  }
}

// Asks for [p, p + bytes) in L2 without waiting (cp.async.bulk.prefetch, sm_90+; a hint:
// nothing is written). p and bytes: multiples of 16.
__device__ __forceinline__ void prefetch_l2(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#else
  (void)p, (void)bytes;
#endif
}

// The codes and scales of output unit u's weight rows (RL outputs from u * RL, and with
// SwiGLU the up rows n_out further), prefetched into L2 by one lane. Scale rows are cut to
// whole 16-byte lines inside them (the hint may miss a line's worth).
template <bool kQ4, int RL, int RU>
__device__ __forceinline__ void prefetch_unit(const DArgs& a, int u) {
  const int o0 = u * RL, outs = min(RL, a.n_out - o0);
  if (outs <= 0) return;
  const size_t row_bytes = kQ4 ? size_t(a.k / 2) : size_t(a.k);
  const size_t scale_row = size_t(a.groups) * sizeof(ScaleWord<kQ4>);
  const auto* codes = static_cast<const uint8_t*>(a.codes);
  const auto* scales = static_cast<const uint8_t*>(a.scales);
#pragma unroll
  for (int r = 0; r < RU; ++r) {
    const size_t row = size_t(o0) + (r ? size_t(a.n_out) : 0);
    prefetch_l2(codes + row * row_bytes, uint32_t(outs * row_bytes));
    const size_t s0 = (row * scale_row + 15) & ~size_t(15), s1 = ((row + outs) * scale_row) & ~size_t(15);
    if (s1 > s0) prefetch_l2(scales + s0, uint32_t(s1 - s0));
  }
}

// Named barrier `id` (1..15; 0 is __syncthreads) over `threads` threads of the CTA.
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// One CTA of dp4a_warps() warps per SM: the compiler caps registers at 80 (24 warps; the
// one-row depth-8 kernel spills 20-24 bytes there) or 128 (16 warps; -Xptxas -v).
// KW: the warps launched, dp4a_warps() or fewer under the same register cap (kBesideAttnWarps:
// room left on the SM for a decode attention CTA launched beside it).
// RL: outputs a warp owns at a time (outs_per_warp at more rows; at one row 2 by default,
// 1 on request: QGemvDp4aTuning::outs_one_row). SC: chunks a lane loads and consumes per
// step, KL chunks apart (QGemvDp4aTuning::chunks_per_step).
template <typename T, QuantFormat F, int MAXM, bool kSwiGlu, int P, int KW, int RL, int SC>
__global__ void __launch_bounds__(dp4a_warps<kSwiGlu>() * 32, 1) qgemv_dp4a_kernel(const DArgs a) {
  constexpr int kWarps = KW, kThreads = kWarps * 32;
  static_assert(KW <= dp4a_warps<kSwiGlu>());
  if (a.trigger_early) pdl_trigger();  // QGemvDp4aTuning::beside_attention
  constexpr bool kQ4 = F == QuantFormat::kQ4;
  constexpr int KL = 32 / RL, RU = kSwiGlu ? 2 : 1, kRed = red_per_warp<MAXM, kSwiGlu, RL>();
  extern __shared__ __align__(16) uint8_t smem[];
  uint8_t* xq = smem;
  float2* xd = reinterpret_cast<float2*>(smem + size_t(a.m) * size_t(a.k));
  float* red = reinterpret_cast<float*>(xd + a.m * a.groups);  // [2][kWarps][kRed], only when S > 1
  const int lane = int(threadIdx.x) & 31, rs = lane / KL, kl = lane % KL, warp = int(threadIdx.x) >> 5;
  const int S = a.splits, split = warp % S, group = warp / S, per_cta = kWarps / S;
  const int stride = int(gridDim.x) * per_cta, first = int(blockIdx.x) * per_cta + group;
  const int kbase = split * a.sps * KL * SC + kl;  // this lane's first chunk of every output unit

  // The load cursor (output unit lu, step lci: chunks kbase + (lci * SC + j) * KL, j < SC)
  // runs P steps ahead of the compute cursor; its pointers advance by SC * KL chunks a step.
  int lu = first, lci = 0;
  const uint4* cp[RU];
  const ScaleWord<kQ4>* sp[RU];
  rows_at<kQ4, kSwiGlu, RU>(lu * RL + rs, lu < a.units, a, kbase, cp, sp);
  uint4 cw[P][SC][RU];
  uint32_t sw[P][SC][RU];
  auto issue_and_advance = [&](uint4(&c)[SC][RU], uint32_t(&w)[SC][RU]) {
#pragma unroll
    for (int j = 0; j < SC; ++j)
      issue_step<kQ4, RU>(c[j], w[j], cp, sp,
                          lu < a.units && kbase + (lci * SC + j) * KL < a.chunks, j * KL);
    if (++lci == a.sps) {
      lci = 0;
      lu += stride;
      rows_at<kQ4, kSwiGlu, RU>(lu * RL + rs, lu < a.units, a, kbase, cp, sp);
    } else {
#pragma unroll
      for (int r = 0; r < RU; ++r) cp[r] += SC * KL, sp[r] += SC * (kQ4 ? KL : KL / 2);
    }
  };
#pragma unroll
  for (int p = 0; p < P; ++p) issue_and_advance(cw[p], sw[p]);
  // QGemvDp4aTuning::l2_prefetch: the rows of this warp's first l2_units units asked for
  // in L2 before the wait (weights are never written), so the loads after the first P
  // steps find them there.
  if (a.l2_units > 0 && split == 0 && lane == 0)
    for (int i = 0, u = first; i < a.l2_units && u < a.units; ++i, u += stride) prefetch_unit<kQ4, RL, RU>(a, u);
  const T* bias = static_cast<const T*>(a.bias);
  // The row factors (ef[r]) and bias (ef[RU + r]) of the output this lane stores for unit
  // u (weights: the first unit's are read before the wait, each next one's as its unit
  // starts, so none is an L2 round trip between the reduction and the store).
  float ef[2 * RU];
  auto load_unit_epi = [&](int u) {
    const int o = u * RL + rs;
    load_epi<T, RU>(a, bias, o, a.epi_early && split == 0 && u < a.units && o < a.n_out, ef);
  };
  load_unit_epi(first);

  pdl_wait();  // x is the previous kernel's output
  // x's loads in flight per thread: 3 (24 warps: k <= 18K in one round trip at one row),
  // 4 (16 warps: k <= 16K), 2 where the depth-8 kernel's registers are short.
  constexpr int kXBatch = P == 8 ? 2 : kSwiGlu ? 4 : 3;
  if (!a.skip_x)
    quantize_x<T, kQ4, kXBatch, kThreads, MAXM>(static_cast<const T*>(a.x), a.m, a.k, a.groups, xq, xd);
  __syncthreads();

  T* y = static_cast<T*>(a.y);
  float acc[RU][MAXM];
#pragma unroll
  for (int r = 0; r < RU; ++r)
#pragma unroll
    for (int m = 0; m < MAXM; ++m) acc[r][m] = 0.0f;
  int cu = first, cci = 0, parity = 0;
  while (cu < a.units) {  // uniform over a split-K group: its warps walk the same units
#pragma unroll
    for (int p = 0; p < P; ++p) {
      if (cu >= a.units) break;  // warp-uniform
#pragma unroll
      for (int j = 0; j < SC; ++j) {
        const int c = kbase + (cci * SC + j) * KL;
        if (c < a.chunks) consume_step<kQ4, RU, MAXM>(acc, cw[p][j], sw[p][j], xq, xd, a, c);
      }
      issue_and_advance(cw[p], sw[p]);
      if (++cci < a.sps) continue;
      // Output unit cu done: sum its KL lanes (every lane gets the sum), one token row at a
      // time (fewer live registers). With split-K the other splits write theirs to shared
      // memory first; split 0 adds them in split order and stores.
      const int o = cu * RL + rs;
      float* slot = red + (parity * kWarps + warp) * kRed + rs * RU * MAXM;
      if (S > 1) {
        if (split != 0) {
#pragma unroll
          for (int m = 0; m < MAXM; ++m) {
            if (MAXM > 1 && m >= a.m) break;
#pragma unroll
            for (int r = 0; r < RU; ++r) {
#pragma unroll
              for (int off = KL / 2; off > 0; off >>= 1) acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], off);
              if (kl == 0) slot[r * MAXM + m] = acc[r][m];
            }
          }
        }
        named_barrier(1 + group, S * 32);
        parity ^= 1;  // the next unit writes the other buffer: no second barrier needed
      }
      if (split == 0) {
#pragma unroll
        for (int m = 0; m < MAXM; ++m) {
          if (MAXM > 1 && m >= a.m) break;
#pragma unroll
          for (int r = 0; r < RU; ++r) {
#pragma unroll
            for (int off = KL / 2; off > 0; off >>= 1) acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], off);
            for (int j = 1; j < S; ++j) acc[r][m] += slot[j * kRed + r * MAXM + m];
          }
          if (kl == m && o < a.n_out) {  // lane kl == m stores token row m
            if (!a.epi_early) load_epi<T, RU>(a, bias, o, true, ef);
            if constexpr (kSwiGlu) {
              float gate = acc[0][m] * ef[0], up = acc[1][m] * ef[1];
              if (bias) gate += ef[2], up += ef[3];
              y[int64_t(m) * a.n_out + o] = linear_swiglu_out<T>(gate, up);
            } else {
              float v = acc[0][m] * ef[0];
              if (bias) v += ef[1];
              y[int64_t(m) * a.n_out + o] = linear_epilogue_out<T>(a.epi, v);
            }
          }
        }
      }
#pragma unroll
      for (int r = 0; r < RU; ++r)
#pragma unroll
        for (int m = 0; m < MAXM; ++m) acc[r][m] = 0.0f;
      cci = 0;
      cu += stride;
      load_unit_epi(cu);
    }
  }
  pdl_trigger();  // this CTA's weights are read
}

struct DeviceInfo {
  int sms = 0, smem_optin = 0, cc = 0, l2 = 0;
};

DeviceInfo device_info() {
  static std::atomic<int> sms[kMaxDevices], smem[kMaxDevices], cc[kMaxDevices], l2[kMaxDevices];
  int dev = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  KILN_CHECK(dev >= 0 && dev < kMaxDevices, "cuda dp4a gemv: device ", dev, " out of range");
  if (sms[dev].load() == 0) {  // racing threads store the same values
    int v = 0, minor = 0;
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    smem[dev].store(v);
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, dev));
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    cc[dev].store(10 * v + minor);
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrL2CacheSize, dev));
    l2[dev].store(v);
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    sms[dev].store(v);  // last: the flag the others are read under
  }
  return {sms[dev].load(), smem[dev].load(), cc[dev].load(), l2[dev].load()};
}

// x's codes and (d, Σx) pairs; then, with split-K, the [2][warps][red floats] exchange.
size_t smem_bytes(int64_t m, int64_t k, size_t red_floats = 0, int warps = 0) {
  return size_t(m * k) + size_t(m * (k / kQuantGroup)) * sizeof(float2) + 2 * size_t(warps) * red_floats * sizeof(float);
}

// CTAs of `kernel` resident per SM with `smem` bytes each; the kernel's dynamic shared
// memory limit raised to the device's opt-in maximum once per device (a host-side
// attribute: set on a step's eager first run, before any capture).
int occupancy(const void* kernel, int threads, size_t smem) {
  static std::mutex mu;
  static std::map<std::tuple<const void*, int, size_t>, int> seen;
  int dev = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  auto it = seen.find({kernel, dev, smem});
  if (it != seen.end()) return it->second;
  if (!seen.count({kernel, dev, size_t(0)})) {
    KILN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, device_info().smem_optin));
    seen[{kernel, dev, size_t(0)}] = 0;  // marks the attribute as set (smem 0 is never asked for)
  }
  int n = 0;
  KILN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem));
  KILN_CHECK(n > 0, "cuda dp4a gemv: ", smem, " bytes of shared memory leave no CTA resident");
  seen[{kernel, dev, smem}] = n;
  return n;
}

template <typename T, QuantFormat F, int MAXM, bool kSwiGlu, int P, int KW = dp4a_warps<kSwiGlu>(),
          int RL = outs_per_warp<MAXM>(), int SC = 1>
void launch_depth(DArgs a, const QGemvDp4aTuning& tune, cudaStream_t s, QGemvDp4aPlan* plan) {
  auto* kernel = qgemv_dp4a_kernel<T, F, MAXM, kSwiGlu, P, KW, RL, SC>;
  constexpr int kWarps = KW, kThreads = kWarps * 32;
  a.steps = (a.chunks + SC * 32 / RL - 1) / (SC * 32 / RL);
  a.units = (a.n_out + RL - 1) / RL;
  const DeviceInfo d = device_info();
  const int cap = tune.ctas_per_sm > 0 ? tune.ctas_per_sm : kDefaultCtasPerSm;
  // The split-K exchange needs shared memory; where x leaves too little, no split.
  int splits = tune.splits > 0 ? tune.splits : 0;
  if (smem_bytes(a.m, a.k, red_per_warp<MAXM, kSwiGlu, RL>(), kWarps) > size_t(d.smem_optin))
    splits = 1;
  if (splits == 0) {
    const int per_sm =
        std::min(occupancy(reinterpret_cast<const void*>(kernel), kThreads, smem_bytes(a.m, a.k)), cap);
    splits = qgemv_dp4a_default_splits(a.units, a.steps, int64_t(d.sms) * per_sm * kWarps);
  }
  a.splits = splits;
  a.sps = (a.steps + splits - 1) / splits;
  const size_t smem =
      smem_bytes(a.m, a.k, splits > 1 ? red_per_warp<MAXM, kSwiGlu, RL>() : 0, kWarps);
  const int per_sm = std::min(occupancy(reinterpret_cast<const void*>(kernel), kThreads, smem), cap);
  // As many rounds of output units per split-K group as the resident groups need, spread
  // evenly over the groups.
  const int64_t per_cta = kWarps / splits, resident = int64_t(d.sms) * per_sm * per_cta;
  const int64_t rounds = (a.units + resident - 1) / resident;
  const int64_t groups = (a.units + rounds - 1) / rounds;
  const unsigned ctas = unsigned((groups + per_cta - 1) / per_cta);
  // L2 prefetch: each warp's first units, as many rounds as fit half the L2 (at least one).
  a.l2_units = 0;
  // (prefetch_unit rounds offsets from the codes and scales, which must then be 16-byte
  // aligned, as quant images place them.)
  if (tune.l2_prefetch && d.cc >= 90 && reinterpret_cast<uintptr_t>(a.codes) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(a.scales) % 16 == 0) {
    a.l2_units =
        int(std::clamp<int64_t>(int64_t(d.l2 / 2) * rounds / std::max<int64_t>(a.weight_bytes, 1), 1, rounds));
  }
  if (plan) {
    *plan = {per_sm, P * SC, splits, int(ctas)};
    return;
  }
  launch_k(kernel, dim3(ctas), kThreads, smem, s, a);
  KILN_CUDA_CHECK_LAUNCH();
}

template <typename T, QuantFormat F, int MAXM, bool kSwiGlu>
void launch_rows(const DArgs& a, const QGemvDp4aTuning& tune, cudaStream_t s, QGemvDp4aPlan* plan) {
  // A one-row GEMV read by the decode attention: fewer warps (the attention CTAs fit beside
  // them), the dependent launch released at the start.
  if constexpr (MAXM == 1 && !kSwiGlu) {
    if (tune.beside_attention) {
      DArgs b = a;
      b.trigger_early = 1;
      return launch_depth<T, F, MAXM, kSwiGlu, kDefaultDepth, kBesideAttnWarps>(b, tune, s, plan);
    }
  }
  // One row: the form the tuning resolves to (one_row_form); each is a kernel to compile.
  if constexpr (MAXM == 1) {
    constexpr int kW = dp4a_warps<kSwiGlu>();
    const OneRowForm r = one_row_form(tune);
    if (r.outs == 2 && r.chunks == 2 && r.depth == 4)
      return launch_depth<T, F, MAXM, kSwiGlu, 2, kW, 2, 2>(a, tune, s, plan);
    if (r.outs == 2 && r.chunks == 2 && r.depth == 2)
      return launch_depth<T, F, MAXM, kSwiGlu, 1, kW, 2, 2>(a, tune, s, plan);
    if (r.outs == 2 && r.chunks == 1 && r.depth == 4)
      return launch_depth<T, F, MAXM, kSwiGlu, 4, kW, 2, 1>(a, tune, s, plan);
    if (r.outs == 1 && r.chunks == 2 && r.depth == 4)
      return launch_depth<T, F, MAXM, kSwiGlu, 2, kW, 1, 2>(a, tune, s, plan);
    if (r.depth == 2) return launch_depth<T, F, MAXM, kSwiGlu, 2>(a, tune, s, plan);
    if (r.depth == 8) return launch_depth<T, F, MAXM, kSwiGlu, 8>(a, tune, s, plan);
  }
  launch_depth<T, F, MAXM, kSwiGlu, kDefaultDepth>(a, tune, s, plan);
}

template <typename T, QuantFormat F, bool kSwiGlu>
void launch_format(const DArgs& a, const QGemvDp4aTuning& tune, cudaStream_t s, QGemvDp4aPlan* plan) {
  if (a.m == 1) launch_rows<T, F, 1, kSwiGlu>(a, tune, s, plan);
  else if (a.m == 2) launch_rows<T, F, 2, kSwiGlu>(a, tune, s, plan);
  else if (a.m <= 4) launch_rows<T, F, 4, kSwiGlu>(a, tune, s, plan);
  else launch_rows<T, F, 8, kSwiGlu>(a, tune, s, plan);
}

template <typename T>
void launch_typed(const DArgs& a, QuantFormat f, const QGemvDp4aTuning& tune, cudaStream_t s, QGemvDp4aPlan* plan) {
  const bool swiglu = a.epi == GemvEpilogue::kSwiGlu;
  if (f == QuantFormat::kQ4) {
    if (swiglu) launch_format<T, QuantFormat::kQ4, true>(a, tune, s, plan);
    else launch_format<T, QuantFormat::kQ4, false>(a, tune, s, plan);
  } else {
    if (swiglu) launch_format<T, QuantFormat::kQ8, true>(a, tune, s, plan);
    else launch_format<T, QuantFormat::kQ8, false>(a, tune, s, plan);
  }
}

}  // namespace

int qgemv_dp4a_default_splits(int64_t units, int64_t steps, int64_t resident_warps) {
  // Split K only where the output units leave most resident warps idle (a few outputs of
  // a long K). Measured on the H200 (`cuda_gemv_bench qgemv 8B`, bench/RESULTS.md): on
  // every Llama-3.1-8B shape at 1-8 rows no split beat one by more than 1%, and the
  // earlier rule's splits of o / down / gate|up at 2-8 rows cost 12-50%. Then: the serial
  // steps of the busiest warp (rounds of units per group x steps per split) must fall by
  // more than 10% per split (each adds an exchange and a barrier per unit), and a split
  // keeps at least 2 steps, so that exchange is shared by two steps of loads.
  if (units * 2 > resident_warps) return 1;
  int best = 1;
  int64_t best_cost = 0;
  for (int s = 1; s <= kMaxSplits; s *= 2) {
    const int64_t sps = (steps + s - 1) / s;
    if (s > 1 && sps < 2) break;
    const int64_t groups = std::max<int64_t>(1, resident_warps / s);
    const int64_t cost = (units + groups - 1) / groups * sps;
    if (s == 1 || cost * 10 < best_cost * 9) best = s, best_cost = cost;
  }
  return best;
}

bool qgemv_dp4a_supports(DType dtype, int64_t m, int64_t k) {
  if (dtype != DType::kBF16 && dtype != DType::kF16) return false;
  if (m < 1 || m > kQGemvMaxRows || k <= 0 || k % kQuantGroup != 0) return false;
  const DeviceInfo d = device_info();
  return d.cc >= 61 && smem_bytes(m, k) <= size_t(d.smem_optin);
}

void launch_qgemv_dp4a(DType dtype, const void* x, const QuantWeightView& w, const void* bias, void* y, int64_t m,
                       int64_t n_out, cudaStream_t s, GemvEpilogue epi, const QGemvDp4aTuning& tune,
                       QGemvDp4aPlan* plan_only) {
  KILN_THROW_IF(w.layout != QuantLayout::kRows, kInternal, "cuda dp4a gemv: needs the kRows layout");
  KILN_THROW_IF(tune.depth != 0 && tune.depth != 2 && tune.depth != 4 && tune.depth != 8, kInternal,
                "cuda dp4a gemv: depth ", tune.depth, " (expected 2, 4 or 8)");
  KILN_THROW_IF(tune.splits != 0 && tune.splits != 1 && tune.splits != 2 && tune.splits != 4 && tune.splits != 8,
                kInternal, "cuda dp4a gemv: splits ", tune.splits, " (expected 1, 2, 4 or 8)");
  KILN_THROW_IF(tune.ctas_per_sm < 0, kInternal, "cuda dp4a gemv: ctas_per_sm ", tune.ctas_per_sm);
  KILN_THROW_IF(tune.outs_one_row < 0 || tune.outs_one_row > 2, kInternal,
                "cuda dp4a gemv: outs_one_row ", tune.outs_one_row, " (expected 0, 1 or 2)");
  KILN_THROW_IF(tune.chunks_per_step < 0 || tune.chunks_per_step > 2, kInternal,
                "cuda dp4a gemv: chunks_per_step ", tune.chunks_per_step, " (expected 0, 1 or 2)");
  // (Beside a decode attention, a one-row GEMV without SwiGLU has its own form.)
  if (m == 1 && !(tune.beside_attention && epi != GemvEpilogue::kSwiGlu)) {
    const OneRowForm r = one_row_form(tune);
    KILN_THROW_IF(!one_row_form_built(r), kInternal, "cuda dp4a gemv: no one-row kernel with ", r.outs,
                  " outputs a warp, ", r.chunks, " chunks a step and depth ", r.depth,
                  " (built: 1 and 1 at depth 2, 4 or 8; 2 and / or 2 at depth 4; 2 and 2 at depth 2)");
  }
  KILN_THROW_IF(!qgemv_dp4a_supports(dtype, m, w.k), kInternal, "cuda dp4a gemv: unsupported ", dtype_name(dtype),
                " m=", m, " k=", w.k);
  if (n_out == 0) return;
  const int groups = int(w.k / kQuantGroup);
  DArgs a{x,
          w.codes,
          w.scales,
          w.row_factor,
          bias,
          y,
          int(m),
          int(w.k),
          int(n_out),
          groups,
          w.format == QuantFormat::kQ4 ? groups : 2 * groups,
          0,
          0,
          1,
          0,
          epi,
          tune.skip_x ? 1 : 0,
          gemv_bias_early() ? 1 : 0,
          0,
          0,
          int64_t(w.bytes())};
  if (dtype == DType::kBF16) launch_typed<__nv_bfloat16>(a, w.format, tune, s, plan_only);
  else launch_typed<__half>(a, w.format, tune, s, plan_only);
}

}  // namespace kiln::cuda
