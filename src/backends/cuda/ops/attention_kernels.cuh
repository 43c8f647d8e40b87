// Internal to the CUDA backend's attention: the kernel templates of attention.cu (see
// the notes there and in attention.h), templated on the activation type T, the head dim
// D and the KV cache's codes Q (KvCode: the activation type itself, int8 or E4M3 with
// per (slot, kv head) scales, dequantized as tiles are loaded), and the device pieces the
// grouped-query decode kernel (attention_gqa.cuh) shares with them: RoPE of a pair, a
// KV row's quantization, the merge of split partials. Included by attention.cu (Q =
// kNone) and attention_kv_quant.cu (int8, fp8): the instantiations are split over two
// translation units so that nvcc builds them in parallel. Tested in
// tests/backends/cuda/attention_test.cpp.
#pragma once

#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <type_traits>

#include "backends/cuda/common.cuh"
#include "backends/cuda/ops/attention.h"
#include "backends/cuda/ops/mma_util.cuh"
#include "backends/cuda/smem_attr.cuh"

namespace kiln::cuda {
namespace {

constexpr int kWarps = 4, kItemsPerWarp = 4, kTileKeys = 32;
static_assert(kWarps * kItemsPerWarp == kAttnItemsPerCta);

// The cache's element: the activation type T, or a one-byte code (int8 or E4M3) whose
// (slot, kv head) row has an f32 scale beside the pool.
template <typename T, KvCode Q>
using KvElem = std::conditional_t<Q == KvCode::kNone, T, uint8_t>;

// Codes decode to value / kv_code_unit: E4M3 goes through its f16 bit pattern (sign to
// bit 15, exponent and mantissa to bits 13..7), which reads as exactly the E4M3 value
// times 2^-8 for normals and subnormals alike (the CPU's AVX2 path does the same); the
// kernels fold the 2^8 into the row's scale (a power of two: exact). The cache holds no
// NaN codes (a non-finite row gets a NaN scale instead).
template <KvCode Q>
constexpr float kv_code_unit() {
  return Q == KvCode::kFp8 ? 256.0f : 1.0f;
}
template <KvCode Q>
__device__ __forceinline__ float kv_decode1(uint8_t c) {
  if constexpr (Q == KvCode::kInt8) {
    return float(int8_t(c));
  } else {
    return __half2float(__ushort_as_half(uint16_t(((c & 0x80u) << 8) | ((c & 0x7fu) << 7))));
  }
}
// Four codes, little-endian in w.
template <KvCode Q>
__device__ __forceinline__ void kv_decode4(uint32_t w, float* f) {
  if constexpr (Q == KvCode::kInt8) {
#pragma unroll
    for (int i = 0; i < 4; ++i) f[i] = float(int8_t(uint8_t(w >> (8 * i))));
  } else {
    // Codes 0|1 and 2|3 spread to the low bytes of two 16-bit halves, then both halves
    // rebuilt as f16 bit patterns at once.
    const uint32_t pairs[2] = {__byte_perm(w, 0u, 0x4140), __byte_perm(w, 0u, 0x4342)};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint32_t b = ((pairs[i] & 0x00800080u) << 8) | ((pairs[i] & 0x007f007fu) << 7);
      const float2 v = __half22float2(*reinterpret_cast<const __half2*>(&b));
      f[2 * i] = v.x;
      f[2 * i + 1] = v.y;
    }
  }
}
// One 16-byte vector of the cache as f32: 16 / sizeof(T) elements, or 16 codes (still to
// be multiplied by their row's scale times kv_code_unit).
template <typename T, KvCode Q>
__device__ __forceinline__ void kv_load_vec(const uint4& raw, float* f) {
  if constexpr (Q == KvCode::kNone) {
    const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < 16 / int(sizeof(T)); ++i) f[i] = to_f32(v[i]);
  } else {
    kv_decode4<Q>(raw.x, f);
    kv_decode4<Q>(raw.y, f + 4);
    kv_decode4<Q>(raw.z, f + 8);
    kv_decode4<Q>(raw.w, f + 12);
  }
}

// RoPE of the pair (x1, x2) at angle pos * inv_freq, in place: the IEEE operations of
// launch_rope, so that every path rotating q and k rounds alike.
// rope_turn: the rotation by an angle whose sine and cosine are given (rope_angle), for
// kernels that rotate several heads at one angle.
__device__ __forceinline__ void rope_angle(int pos, float inv_freq, float& sn, float& cs) {
  sincosf(__fmul_rn(float(pos), inv_freq), &sn, &cs);
}
__device__ __forceinline__ void rope_turn(float& x1, float& x2, float sn, float cs) {
  const float y1 = __fsub_rn(__fmul_rn(x1, cs), __fmul_rn(x2, sn));
  const float y2 = __fadd_rn(__fmul_rn(x2, cs), __fmul_rn(x1, sn));
  x1 = y1;
  x2 = y2;
}
__device__ __forceinline__ void rope_pair(float& x1, float& x2, int pos, float inv_freq) {
  float sn, cs;
  rope_angle(pos, inv_freq, sn, cs);
  rope_turn(x1, x2, sn, cs);
}

// KvLayout::k_rotate's transform (core/hadamard.h's hadamard_transform) of a row x[0, d) that
// a warp holds as v[i] = x[lane + 32 i] (lanes past d hold anything: no butterfly pairs
// them with an element of the row): the unnormalized Walsh-Hadamard transform of blocks
// of b = d & -d values, the same IEEE butterflies in the same order, so both backends
// store the same codes. Called by all 32 lanes.
template <int N>
__device__ __forceinline__ void kv_rotate_warp(float (&v)[N], int d) {
  const int lane = threadIdx.x & 31, b = d & -d;
  for (int h = 1; h < b && h < 32; h *= 2) {  // partners in other lanes
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if (32 * i >= d) break;  // uniform: registers past the row hold nothing
      const float o = __shfl_xor_sync(0xffffffffu, v[i], h);
      v[i] = (lane & h) ? __fsub_rn(o, v[i]) : __fadd_rn(v[i], o);
    }
  }
#pragma unroll
  for (int j = 1; j < N; j *= 2) {  // h = 32 j: partners in this lane's other registers
    if (32 * j >= b) break;
#pragma unroll
    for (int i = 0; i < N; ++i)
      if ((i & j) == 0 && i + j < N) {
        const float a = v[i], c = v[i + j];
        v[i] = __fadd_rn(a, c);
        v[i + j] = __fsub_rn(a, c);
      }
  }
}

// The queries' side of KvLayout::k_rotate (the CPU's kv_rotate_queries): rows [0, nrows)
// of D values, `ld` elements apart in shared memory (f32 or 16-bit), each through
// kv_rotate_warp and divided by the block size (a power of two: exact), in place; a warp
// a row, `warps` warps. The caller synchronizes before and after.
template <int D, typename E>
__device__ __forceinline__ void kv_rotate_rows(E* rows, int nrows, int ld, int warps) {
  constexpr int N = (D + 31) / 32;
  const int lane = threadIdx.x & 31;
  const float inv_b = 1.0f / float(D & -D);
  for (int r = int(threadIdx.x >> 5); r < nrows; r += warps) {
    E* x = rows + r * ld;
    float v[N];
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = lane + 32 * i < D ? to_f32(x[lane + 32 * i]) : 0.0f;
    kv_rotate_warp<N>(v, D);
#pragma unroll
    for (int i = 0; i < N; ++i)
      if (lane + 32 * i < D) x[lane + 32 * i] = from_f32<E>(__fmul_rn(v[i], inv_b));
  }
}

// One warp quantizes a (token, kv head) row x[0, d), d <= kKvQuantMaxDim, into dst as
// KvDType says (the CPU backend's kv_quantize_row / kv_quantize_row_fp8: f32 amax, the
// factors 127.0f / amax and amax / 127.0f - or 448 - as IEEE divisions, round to nearest
// even, E4M3 through the hardware's saturating conversion) and returns the row's scale
// (every lane): 0 for a row of zeros, NaN for a non-finite row (codes 0). With `shift` (a
// key row's KvLayout::k_shift, [d]) the row quantized is x - shift, each difference
// rounded to f32; with `rotate` (KvLayout::k_rotate) that row through kv_rotate_warp.
constexpr int kKvQuantMaxDim = 256;
template <typename T, KvCode Q>
__device__ __forceinline__ float kv_quantize_row(const T* x, int d, uint8_t* dst, const float* shift = nullptr,
                                                 bool rotate = false) {
  constexpr int N = kKvQuantMaxDim / 32;
  const int lane = threadIdx.x & 31;
  float v[N];
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int c = lane + 32 * i;
    v[i] = c < d ? (shift ? __fsub_rn(to_f32(x[c]), shift[c]) : to_f32(x[c])) : 0.0f;
  }
  if (rotate) kv_rotate_warp<N>(v, d);
  float amax = 0.0f;
  bool finite = true;
#pragma unroll
  for (int i = 0; i < N; ++i)
    if (lane + 32 * i < d) {
      amax = fmaxf(amax, fabsf(v[i]));
      finite = finite && isfinite(v[i]);
    }
  amax = warp_max(amax);
  finite = __all_sync(0xffffffffu, finite);
  if (amax == 0.0f || !finite) {
    for (int c = lane; c < d; c += 32) dst[c] = 0;
    return finite ? 0.0f : __int_as_float(0x7fc00000);
  }
  constexpr float kMax = Q == KvCode::kFp8 ? 448.0f : 127.0f;
  const float inv = __fdiv_rn(kMax, amax);
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int c = lane + 32 * i;
    if (c >= d) continue;
    const float y = __fmul_rn(v[i], inv);
    if constexpr (Q == KvCode::kInt8)
      dst[c] = uint8_t(int8_t(fminf(fmaxf(rintf(y), -127.0f), 127.0f)));
    else
      dst[c] = uint8_t(__nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E4M3));
  }
  return __fdiv_rn(amax, kMax);
}

// Stages the q rows of items [item_begin, item_begin + N) of the CTA's (sequence, KV
// head) in qs as f32 times `scale`, zeros past the sequence's n_items (16-byte vectors:
// rows are D-contiguous and 16-byte aligned); with `rotate` (keys stored rotated,
// KvLayout::k_rotate) through kv_rotate_rows. Called by the whole CTA; the caller
// synchronizes before reading qs.
template <typename T, int D, int N>
__device__ __forceinline__ void attn_stage_q(float (&qs)[N][D], const T* __restrict__ q, int64_t q_stride,
                                             const AttnSeq& sq, int item_begin, int n_items, int kvh, int group,
                                             float scale, bool rotate) {
  constexpr int VEC = 16 / int(sizeof(T)), VPR = D / VEC;
  static_assert(D % VEC == 0);
  for (int e = threadIdx.x; e < N * VPR; e += kWarps * 32) {
    const int li = e / VPR, c = (e % VPR) * VEC, item = item_begin + li;
    uint4 raw = make_uint4(0, 0, 0, 0);
    if (item < n_items) {
      const int64_t row = sq.q_start + item / group, h = kvh * group + item % group;
      raw = *reinterpret_cast<const uint4*>(q + row * q_stride + h * D + c);
    }
    const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < VEC; ++i) qs[li][c + i] = to_f32(v[i]) * scale;
  }
  if (rotate) {
    __syncthreads();
    kv_rotate_rows<D>(&qs[0][0], N, D, kWarps);
  }
}

// The first key a query row at position `pos` sees: its sliding window's start (0 without one).
__device__ __forceinline__ int attn_window_start(int pos, int window) { return window > 0 ? max(0, pos + 1 - window) : 0; }

// The online-softmax state of items first .. first + R - 1: the keys each sees ([lo, lim):
// causal, up to its own position, from its sliding window's start; lim 0 past the
// sequence's n_items), running max m, sum l and unnormalized acc (dims lane, lane + 32, ...).
template <int R, int DPL>
__device__ __forceinline__ void attn_init_items(int (&lo)[R], int (&lim)[R], float (&m)[R], float (&l)[R],
                                                float (&acc)[R][DPL], int first, int n_items, int group, int ctx0,
                                                const AttnSeq& sq, const AttnWork& w, bool causal, int window) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int item = first + r;
    lim[r] = item < n_items ? min(causal ? ctx0 + item / group + 1 : sq.ctx_len, w.kv_end) : 0;
    lo[r] = attn_window_start(ctx0 + item / group, window);
    m[r] = -INFINITY;
    l[r] = 0.0f;
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[r][i] = 0.0f;
  }
}

// A score s (q.k times scale) soft-capped: softcap * tanh(s / softcap) (Gemma 2); 0: as is.
__device__ __forceinline__ float attn_softcap(float s, float softcap) {
  return softcap > 0.0f ? softcap * tanhf(s / softcap) : s;
}

// The tile kernel's shared memory: q rows [16][D], a key tile [32][D + 1] (+1: lane j reads
// row j, column c -> distinct banks) and its value tile [32][D], in floats. Static up to
// head dim 128 (41 KiB); at 256 (82 KiB) past the 48 KiB of static shared memory, so
// dynamic (kTileSmemDynamic, opted in at launch by smem_kernel_ready).
template <int D>
constexpr int kTileSmemFloats = kAttnItemsPerCta * D + kTileKeys * (D + 1) + kTileKeys * D;
template <int D>
constexpr bool kTileSmemDynamic = D > 128;

template <typename T, int D, KvCode Q>
__global__ void __launch_bounds__(kWarps * 32)
attention_kernel(const T* __restrict__ q, const KvElem<T, Q>* __restrict__ k_cache,
                 const KvElem<T, Q>* __restrict__ v_cache, const float* __restrict__ k_scales,
                 const float* __restrict__ v_scales, T* __restrict__ out, int block_size, int hq, int hkv, int64_t q_stride, int64_t kv_row,
                 float scale, bool causal, int window, float softcap, bool k_rotate,
                 const AttnSeq* __restrict__ seqs, const int32_t* __restrict__ block_tables,
                 const AttnWork* __restrict__ works, float* __restrict__ part_o, float* __restrict__ part_ml) {
  pdl_wait();  // programmatic dependent launch: the previous kernel's writes are visible
  constexpr int R = kItemsPerWarp, DPL = (D + 31) / 32;
  float* smem;
  if constexpr (kTileSmemDynamic<D>) {
    extern __shared__ float4 attn_tile_dyn[];
    smem = reinterpret_cast<float*>(attn_tile_dyn);
  } else {
    __shared__ float4 attn_tile_static[kTileSmemFloats<D> / 4];
    smem = reinterpret_cast<float*>(attn_tile_static);
  }
  static_assert(kTileSmemFloats<D> % 4 == 0 && (kAttnItemsPerCta * D + kTileKeys * (D + 1)) % 4 == 0);
  auto& qs = *reinterpret_cast<float(*)[kAttnItemsPerCta][D]>(smem);
  auto& ks = *reinterpret_cast<float(*)[kTileKeys][D + 1]>(smem + kAttnItemsPerCta * D);
  auto& vs = *reinterpret_cast<float(*)[kTileKeys][D]>(smem + kAttnItemsPerCta * D + kTileKeys * (D + 1));
  const AttnWork w = works[blockIdx.x];
  if (w.partial >= 0 && w.kv_begin >= w.kv_end && w.kv_begin > 0) return;  // an empty split: never combined
  const AttnSeq sq = seqs[w.seq];
  const int kvh = blockIdx.y, group = hq / hkv;
  const int n_items = sq.q_len * group;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int ctx0 = sq.ctx_len - sq.q_len;  // position of the sequence's first new token

  // Loads move 16-byte vectors (CVEC elements of the cache): rows are D-contiguous and
  // 16-byte aligned.
  constexpr int kThreads = kWarps * 32;
  constexpr int CVEC = 16 / int(sizeof(KvElem<T, Q>)), CVPR = D / CVEC;
  static_assert(D % CVEC == 0);
  attn_stage_q<T, D, kAttnItemsPerCta>(qs, q, q_stride, sq, w.item_begin, n_items, kvh, group, scale,
                                       Q != KvCode::kNone && k_rotate);
  int lo[R], lim[R];
  float m[R], l[R], acc[R][DPL];
  attn_init_items<R, DPL>(lo, lim, m, l, acc, w.item_begin + warp * R, n_items, group, ctx0, sq, w, causal, window);
  const int last = min(n_items, w.item_begin + kAttnItemsPerCta) - 1;
  const int hi = min(w.kv_end, causal ? ctx0 + last / group + 1 : sq.ctx_len);
  const int32_t* bt = block_tables + sq.bt_offset;
  // The CTA's first item sees the earliest keys: no key before its window start is read.
  const int begin = max(w.kv_begin, attn_window_start(ctx0 + w.item_begin / group, window));

  constexpr int NV = (kTileKeys * CVPR + kThreads - 1) / kThreads;  // vectors per thread per tile
  for (int t0 = begin; t0 < hi; t0 += kTileKeys) {
    // Every load of the tile is issued before the barrier, so their latencies overlap
    // with each other and with the wait for the previous tile's readers.
    uint4 kr[NV], vr[NV];
    float ksc[NV], vsc[NV];  // quantized caches: the rows' scales (times kv_code_unit)
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int e = threadIdx.x + i * kThreads, j = e / CVPR, c = (e % CVPR) * CVEC, p = t0 + j;
      kr[i] = vr[i] = make_uint4(0, 0, 0, 0);
      ksc[i] = vsc[i] = 0.0f;
      if (e < kTileKeys * CVPR && p < hi) {
        const int64_t slot = int64_t(bt[p / block_size]) * block_size + p % block_size;
        const int64_t off = slot * kv_row + int64_t(kvh) * D + c;
        kr[i] = *reinterpret_cast<const uint4*>(k_cache + off);
        vr[i] = *reinterpret_cast<const uint4*>(v_cache + off);
        if constexpr (Q != KvCode::kNone) {
          ksc[i] = k_scales[slot * hkv + kvh] * kv_code_unit<Q>();
          vsc[i] = v_scales[slot * hkv + kvh] * kv_code_unit<Q>();
        }
      }
    }
    __syncthreads();  // the previous tile is consumed (and qs written, on the first pass)
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int e = threadIdx.x + i * kThreads, j = e / CVPR, c = (e % CVPR) * CVEC;
      if (e >= kTileKeys * CVPR) continue;
      float kf[CVEC], vf[CVEC];
      kv_load_vec<T, Q>(kr[i], kf);
      kv_load_vec<T, Q>(vr[i], vf);
#pragma unroll
      for (int u = 0; u < CVEC; ++u) {
        if constexpr (Q == KvCode::kNone) {
          ks[j][c + u] = kf[u];
          vs[j][c + u] = vf[u];
        } else {
          ks[j][c + u] = kf[u] * ksc[i];
          vs[j][c + u] = vf[u] * vsc[i];
        }
      }
    }
    __syncthreads();
    float s[R];
#pragma unroll
    for (int r = 0; r < R; ++r) s[r] = 0.0f;
#pragma unroll 8
    for (int c = 0; c < D; ++c) {
      const float kc = ks[lane][c];
#pragma unroll
      for (int r = 0; r < R; ++r) s[r] += qs[warp * R + r][c] * kc;
    }
    const int p = t0 + lane;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      // Uniform across the warp: no key of this tile is visible.
      if (max(t0, lo[r]) >= min(t0 + kTileKeys, lim[r])) continue;
      const float sv = p < lim[r] && p >= lo[r] ? attn_softcap(s[r], softcap) : -INFINITY;
      const float m_new = fmaxf(m[r], warp_max(sv));  // finite: some key of the tile is visible
      const float corr = expf(m[r] - m_new);
      const float pr = expf(sv - m_new);
      l[r] = l[r] * corr + warp_sum(pr);
#pragma unroll
      for (int i = 0; i < DPL; ++i) acc[r][i] *= corr;
#pragma unroll 4
      for (int j = 0; j < kTileKeys; ++j) {
        const float pj = __shfl_sync(0xffffffffu, pr, j);
#pragma unroll
        for (int i = 0; i < DPL; ++i) {
          const int c = lane + 32 * i;
          if (D % 32 == 0 || c < D) acc[r][i] += pj * vs[j][c];
        }
      }
      m[r] = m_new;
    }
  }

#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int li = warp * R + r, item = w.item_begin + li;
    if (item >= n_items) continue;
    if (w.partial < 0) {
      const int64_t row = sq.q_start + item / group, h = kvh * group + item % group;
      const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
#pragma unroll
      for (int i = 0; i < DPL; ++i) {
        const int c = lane + 32 * i;
        if (D % 32 == 0 || c < D) out[(row * hq + h) * D + c] = from_f32<T>(acc[r][i] * inv);
      }
    } else {
      const int64_t base = (int64_t(w.partial) * hkv + kvh) * kAttnItemsPerCta + li;
#pragma unroll
      for (int i = 0; i < DPL; ++i) {
        const int c = lane + 32 * i;
        if (D % 32 == 0 || c < D) part_o[base * D + c] = acc[r][i];
      }
      if (lane == 0) {
        part_ml[base * 2] = m[r];
        part_ml[base * 2 + 1] = l[r];
      }
    }
  }
}

// Decode attention (a CTA's items are at most 8, e.g. one query row times a GQA group
// of <= 8): the CTA tile kernel above would keep one or two of its four warps busy. Here
// each warp takes its own 32-key tiles (warp w: tiles w, w + 4, ...) for all R items:
// lane j reads key j's K row straight from the cache (16-byte vectors, all in flight),
// scores it against the items' q (shared memory, broadcast reads), the warp folds the
// tile into each item's online softmax, and accumulates P·V with V rows read per key
// (lanes over dims, coalesced). The four warps' (m, l, acc) then merge in shared memory.
template <typename T, int D, int R, KvCode Q>
__global__ void __launch_bounds__(kWarps * 32)
attention_decode_kernel(const T* __restrict__ q, const KvElem<T, Q>* __restrict__ k_cache,
                        const KvElem<T, Q>* __restrict__ v_cache, const float* __restrict__ k_scales,
                        const float* __restrict__ v_scales, T* __restrict__ out, int block_size, int hq, int hkv, int64_t q_stride, int64_t kv_row,
                        float scale, bool causal, int window, float softcap, bool k_rotate,
                        const AttnSeq* __restrict__ seqs,
                        const int32_t* __restrict__ block_tables, const AttnWork* __restrict__ works,
                        float* __restrict__ part_o, float* __restrict__ part_ml) {
  pdl_wait();  // programmatic dependent launch: the previous kernel's writes are visible
  constexpr int DPL = (D + 31) / 32;
  constexpr int CVEC = 16 / int(sizeof(KvElem<T, Q>)), CVPR = D / CVEC;  // the cache's 16-byte vectors
  __shared__ float qs[R][D];
  __shared__ float red_ml[kWarps][R][2];
  __shared__ float red_o[kWarps][R][D];
  const AttnWork w = works[blockIdx.x];
  if (w.partial >= 0 && w.kv_begin >= w.kv_end && w.kv_begin > 0) return;  // an empty split: never combined
  const AttnSeq sq = seqs[w.seq];
  const int kvh = blockIdx.y, group = hq / hkv, n_items = sq.q_len * group;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int ctx0 = sq.ctx_len - sq.q_len;
  attn_stage_q<T, D, R>(qs, q, q_stride, sq, w.item_begin, n_items, kvh, group, scale, Q != KvCode::kNone && k_rotate);
  int lo[R], lim[R];
  float m[R], l[R], acc[R][DPL];
  attn_init_items<R, DPL>(lo, lim, m, l, acc, w.item_begin, n_items, group, ctx0, sq, w, causal, window);
  const int last = min(n_items, w.item_begin + R) - 1;
  const int hi = min(w.kv_end, causal ? ctx0 + last / group + 1 : sq.ctx_len);
  const int32_t* bt = block_tables + sq.bt_offset;
  // The first item sees the earliest keys: no key before its window start is read.
  const int begin = max(w.kv_begin, attn_window_start(ctx0 + w.item_begin / group, window));
  __syncthreads();  // qs written

  for (int t0 = begin + warp * 32; t0 < hi; t0 += kWarps * 32) {
    const int p = t0 + lane;
    int64_t off = 0;
    float s[R];
    float vsc = 0.0f;  // quantized caches: this lane's key's V scale (times kv_code_unit)
#pragma unroll
    for (int r = 0; r < R; ++r) s[r] = 0.0f;
    if (p < hi) {
      const int64_t slot = int64_t(bt[p / block_size]) * block_size + p % block_size;
      off = slot * kv_row + int64_t(kvh) * D;
      const uint4* kp = reinterpret_cast<const uint4*>(k_cache + off);
      // Vectors in flight per group (registers): at most 8, a divisor of the row's (12 at
      // head dim 96 in 16 bits: 6).
      constexpr int KG = CVPR <= 8 ? CVPR : CVPR % 8 == 0 ? 8 : CVPR % 6 == 0 ? 6 : 4;
      static_assert(CVPR % KG == 0);
#pragma unroll
      for (int c0 = 0; c0 < CVPR; c0 += KG) {
        uint4 kr[KG];
#pragma unroll
        for (int c = 0; c < KG; ++c) kr[c] = kp[c0 + c];
#pragma unroll
        for (int c = 0; c < KG; ++c) {
          float kf[CVEC];
          kv_load_vec<T, Q>(kr[c], kf);
#pragma unroll
          for (int u = 0; u < CVEC; ++u)
#pragma unroll
            for (int r = 0; r < R; ++r) s[r] += qs[r][(c0 + c) * CVEC + u] * kf[u];
        }
      }
      if constexpr (Q != KvCode::kNone) {
        // q . (s c) = s (q . c): the K scale once per key; the V scale rides on the
        // key's probability below.
        const float ksc = k_scales[slot * hkv + kvh] * kv_code_unit<Q>();
#pragma unroll
        for (int r = 0; r < R; ++r) s[r] *= ksc;
        vsc = v_scales[slot * hkv + kvh] * kv_code_unit<Q>();
      }
    }
    float pr[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      pr[r] = 0.0f;
      // Uniform across the warp: no key of this tile is visible.
      if (max(t0, lo[r]) >= min(t0 + 32, lim[r])) continue;
      const float sv = p < lim[r] && p >= lo[r] ? attn_softcap(s[r], softcap) : -INFINITY;
      const float m_new = fmaxf(m[r], warp_max(sv));  // finite: some key of the tile is visible
      const float corr = expf(m[r] - m_new);
      pr[r] = expf(sv - m_new);
      l[r] = l[r] * corr + warp_sum(pr[r]);
#pragma unroll
      for (int i = 0; i < DPL; ++i) acc[r][i] *= corr;
      m[r] = m_new;
    }
    if constexpr (Q != KvCode::kNone) {
#pragma unroll
      for (int r = 0; r < R; ++r) pr[r] *= vsc;  // the weight of V's codes; l keeps the plain sum
    }
    const int nk = min(32, hi - t0);
#pragma unroll 8
    for (int j = 0; j < nk; ++j) {
      const int64_t oj = __shfl_sync(0xffffffffu, off, j);
      float vv[DPL];
#pragma unroll
      for (int i = 0; i < DPL; ++i) {
        const int c = lane + 32 * i;
        if constexpr (Q == KvCode::kNone)
          vv[i] = (D % 32 == 0 || c < D) ? to_f32(v_cache[oj + c]) : 0.0f;
        else
          vv[i] = (D % 32 == 0 || c < D) ? kv_decode1<Q>(v_cache[oj + c]) : 0.0f;
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float pj = __shfl_sync(0xffffffffu, pr[r], j);
#pragma unroll
        for (int i = 0; i < DPL; ++i) acc[r][i] += pj * vv[i];
      }
    }
  }

  pdl_trigger();  // the keys and values are read: the next kernel may launch
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (lane == 0) {
      red_ml[warp][r][0] = m[r];
      red_ml[warp][r][1] = l[r];
    }
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
      const int c = lane + 32 * i;
      if (D % 32 == 0 || c < D) red_o[warp][r][c] = acc[r][i];
    }
  }
  __syncthreads();
  for (int r = warp; r < R; r += kWarps) {
    const int item = w.item_begin + r;
    if (item >= n_items) continue;
    float mx = -INFINITY;
#pragma unroll
    for (int ww = 0; ww < kWarps; ++ww) mx = fmaxf(mx, red_ml[ww][r][0]);
    float den = 0.0f, o[DPL];
#pragma unroll
    for (int i = 0; i < DPL; ++i) o[i] = 0.0f;
#pragma unroll
    for (int ww = 0; ww < kWarps; ++ww) {
      const float mw = red_ml[ww][r][0];
      if (mw == -INFINITY) continue;  // that warp saw no visible key
      const float f = expf(mw - mx);
      den += f * red_ml[ww][r][1];
#pragma unroll
      for (int i = 0; i < DPL; ++i) {
        const int c = lane + 32 * i;
        if (D % 32 == 0 || c < D) o[i] += f * red_o[ww][r][c];
      }
    }
    if (w.partial < 0) {
      const int64_t row = sq.q_start + item / group, h = kvh * group + item % group;
      const float inv = den > 0.0f ? 1.0f / den : 0.0f;
#pragma unroll
      for (int i = 0; i < DPL; ++i) {
        const int c = lane + 32 * i;
        if (D % 32 == 0 || c < D) out[(row * hq + h) * D + c] = from_f32<T>(o[i] * inv);
      }
    } else {
      const int64_t base = (int64_t(w.partial) * hkv + kvh) * kAttnItemsPerCta + r;
#pragma unroll
      for (int i = 0; i < DPL; ++i) {
        const int c = lane + 32 * i;
        if (D % 32 == 0 || c < D) part_o[base * D + c] = o[i];
      }
      if (lane == 0) {
        part_ml[base * 2] = mx;
        part_ml[base * 2 + 1] = den;
      }
    }
  }
}

// Merges one item's split partials into its output row o (one warp; base_of(sp): the
// item's index in split sp's partials): out = Σ e^(m_s - M) acc_s / Σ e^(m_s - M) l_s.
// The lanes read the splits' (m, l) in parallel for the max and the denominator, then
// sum the D dims of acc over the splits, several splits' loads in flight at once. kL2:
// loads through L2 only (partials other CTAs of the same launch wrote).
template <typename T, int D, bool kL2, typename BaseOf>
__device__ __forceinline__ void merge_partials(T* o, int splits, const BaseOf& base_of,
                                               const float* __restrict__ part_o, const float* __restrict__ part_ml) {
  constexpr int DPL = (D + 31) / 32;
  auto ld = [](const float* p) {
    if constexpr (kL2) return __ldcg(p);
    else return *p;
  };
  const int lane = threadIdx.x & 31;
  float mx = -INFINITY;
  for (int sp = lane; sp < splits; sp += 32) mx = fmaxf(mx, ld(part_ml + base_of(sp) * 2));
  mx = warp_max(mx);
  float den = 0.0f;
  for (int sp = lane; sp < splits; sp += 32) {
    const float ms = ld(part_ml + base_of(sp) * 2);
    if (ms != -INFINITY) den += expf(ms - mx) * ld(part_ml + base_of(sp) * 2 + 1);  // no visible key: weight 0
  }
  den = warp_sum(den);
  float num[DPL];
#pragma unroll
  for (int i = 0; i < DPL; ++i) num[i] = 0.0f;
#pragma unroll 4
  for (int sp = 0; sp < splits; ++sp) {
    const float ms = ld(part_ml + base_of(sp) * 2);  // the same address across the warp: one load
    const float fs = ms == -INFINITY ? 0.0f : expf(ms - mx);
    const float* p = part_o + base_of(sp) * D;
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
      const int c = lane + 32 * i;
      if (D % 32 == 0 || c < D) num[i] += fs * ld(p + c);
    }
  }
  const float inv = den > 0.0f ? 1.0f / den : 0.0f;
#pragma unroll
  for (int i = 0; i < DPL; ++i) {
    const int c = lane + 32 * i;
    if (D % 32 == 0 || c < D) o[c] = from_f32<T>(num[i] * inv);
  }
}

// Merges each combine's partials (merge_partials): a partial holds `per_partial` items
// (kAttnItemsPerCta for the tile kernels, the CTA width for tensor-core key splits) from
// the combine's item_begin on; warp w of grid slice z merges items z * 4 + w, then every
// 4 * gridDim.z on (the tensor-core splits launch a warp per item: each merge is a few
// dependent L2 round trips, too many in a row for one warp).
template <typename T, int D>
__global__ void attention_combine_kernel(T* __restrict__ out, int hq, int hkv, const AttnSeq* __restrict__ seqs,
                                         const AttnCombine* __restrict__ combines,
                                         const float* __restrict__ part_o, const float* __restrict__ part_ml,
                                         int per_partial) {
  pdl_wait();  // programmatic dependent launch: the previous kernel's writes are visible
  const AttnCombine cb = combines[blockIdx.x];
  const AttnSeq sq = seqs[cb.seq];
  const int kvh = blockIdx.y, group = hq / hkv, n = min(per_partial, sq.q_len * group - cb.item_begin);
  const int warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int li = int(blockIdx.z) * warps + warp; li < n; li += warps * int(gridDim.z)) {
    auto base_of = [&](int sp) { return (int64_t(cb.partial_begin + sp) * hkv + kvh) * per_partial + li; };
    const int item = cb.item_begin + li;
    const int64_t row = sq.q_start + item / group, h = kvh * group + item % group;
    merge_partials<T, D, false>(out + (row * hq + h) * D, cb.num_splits, base_of, part_o, part_ml);
  }
}

// Tensor-core pieces shared by the flash prefill kernel (attention_flash.cuh) and the
// cluster decode kernel (attention_decode.cuh): m16n8k16 MMAs on 16-bit fragments, cp.async
// copies, ldmatrix, and the online softmax on S fragments in the log2 domain (the scale
// times kLog2e, exp2 for the weights: one MUFU op each).
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;  // a log2-domain maximum times this: natural-log units

template <typename T> __device__ __forceinline__ uint32_t pack2(float a, float b);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float a, float b) {
  __nv_bfloat162 v = __floats2bfloat162_rn(a, b);  // .x (a) in the low half: the lower column
  return *reinterpret_cast<uint32_t*>(&v);
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float a, float b) {
  __half2 v = __floats2half2_rn(a, b);
  return *reinterpret_cast<uint32_t*>(&v);
}
// The low (a) and high (b) value of a pack2 as f32.
template <typename T>
__device__ __forceinline__ float low_as_f32(uint32_t p) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __uint_as_float(p << 16);
  else return __half2float(__ushort_as_half(uint16_t(p & 0xffffu)));
}
template <typename T>
__device__ __forceinline__ float high_as_f32(uint32_t p) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __uint_as_float(p & 0xffff0000u);
  else return __half2float(__ushort_as_half(uint16_t(p >> 16)));
}


// One step of the online softmax for row half h of an m16n8 S fragment per n-tile (the
// MMA's C layout: this thread holds row g's columns 2t, 2t + 1 of each 8-key n-tile in
// elements 0, 1 and row g + 8's in 2, 3; the quad of lanes sharing a row holds its keys).
// The logits are scaled into the log2 domain (visible(nt, e) false: -inf, a masked key),
// the row max taken across the quad; m moves to the new max, s becomes the weights
// exp2(s - m) (all 0 while the row has no visible key), l takes this lane's share of the
// row sum. Returns the correction exp2(m_old - m_new) for the row's accumulators
// (online_softmax_rescale), already applied to l.
template <int NT, typename Visible>
__device__ __forceinline__ float online_softmax_step(float (&s)[NT][4], int h, float& m, float& l, float scale_log2,
                                                     const Visible& visible) {
  float mx = -INFINITY;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float& v = s[nt][2 * h + e];
      v = visible(nt, e) ? v * scale_log2 : -INFINITY;
      mx = fmaxf(mx, v);
    }
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  const float m_new = fmaxf(m, mx);
  const float base = m_new == -INFINITY ? 0.0f : m_new;  // no visible key yet: all weights 0
  const float corr = exp2f(m - base);
  float sum = 0.0f;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float& v = s[nt][2 * h + e];
      v = exp2f(v - base);
      sum += v;
    }
  l = l * corr + sum;  // this lane's share; the quad's shares add up at the end
  m = m_new;
  return corr;
}

// Row half h of the O accumulators (DT m16n8 fragments of 8 dims each) times corr.
template <int DT>
__device__ __forceinline__ void online_softmax_rescale(float (&o)[DT][4], int h, float corr) {
#pragma unroll
  for (int i = 0; i < DT; ++i) {
    o[i][2 * h] *= corr;
    o[i][2 * h + 1] *= corr;
  }
}

// The typed view of a launch's arguments that every attention kernel takes: the
// workspace's partials (acc, then (m, l)), the grid (work x KV heads), strides, pointers.
template <typename T, int D, KvCode Q>
struct TypedAttention {
  float* part_o;
  float* part_ml;
  dim3 grid;
  int64_t q_stride, kv_row;
  const T* q;
  const KvElem<T, Q>* k_cache;
  const KvElem<T, Q>* v_cache;
  T* out;
  explicit TypedAttention(const AttentionArgs& a)
      : part_o(a.workspace),
        part_ml(a.workspace ? a.workspace + size_t(a.num_partials) * size_t(a.hkv) * kAttnItemsPerCta * size_t(D)
                            : nullptr),
        grid(unsigned(a.num_work), unsigned(a.hkv)),
        q_stride(a.q_stride ? a.q_stride : a.hq * D),
        kv_row(a.kv_stride ? a.kv_stride : a.hkv * D),
        q(static_cast<const T*>(a.q)),
        k_cache(static_cast<const KvElem<T, Q>*>(a.k_cache)),
        v_cache(static_cast<const KvElem<T, Q>*>(a.v_cache)),
        out(static_cast<T*>(a.out)) {}
};

// fn(std::type_identity<T>{}, std::integral_constant<int, D>{}) for the activation dtype
// t and head dim d: 16, 32, 64 or 128 (kWideOnly: 64 and 128 only); any other is an error.
template <bool kWideOnly = false, typename Fn>
void attention_dispatch(DType t, int64_t d, Fn&& fn) {
  KILN_CUDA_DISPATCH_FLOAT(t, T, {
    const std::type_identity<T> ty;
    switch (d) {
      case 64: fn(ty, std::integral_constant<int, 64>{}); break;
      case 128: fn(ty, std::integral_constant<int, 128>{}); break;
      default:
        if constexpr (kWideOnly) {
          throw_error(ErrorCode::kInternal, "cuda attention: head_dim ", d, " here (64 and 128 only)");
        } else if (d == 16) {
          fn(ty, std::integral_constant<int, 16>{});
        } else if (d == 32) {
          fn(ty, std::integral_constant<int, 32>{});
        } else {
          throw_error(ErrorCode::kInternal, "cuda attention: head_dim ", d, " here (16, 32, 64 and 128 only)");
        }
    }
  });
}

// Launches the plan's kernels for activations T, head dim D and cache codes Q.
template <typename T, int D, KvCode Q>
void launch_typed(const AttentionArgs& a, cudaStream_t s) {
  KILN_CHECK(a.flash_width == 0, "cuda attention: a tensor-core plan reached the tile kernels");
  const TypedAttention<T, D, Q> ta(a);
  // Every CTA's items fit a warp's registers and the plan did not split the context
  // (a batch large enough to fill the GPU): the decode kernel, whose warps split the keys
  // (measured on Llama-3.2-1B: attention -35% at batch 64 and 256). Split plans keep the
  // tile kernel: each split is a short key range, and its four warps share it by items.
  auto go = [&](auto kernel, size_t smem) {
    launch_k(kernel, ta.grid, kWarps * 32, smem, s, ta.q, ta.k_cache, ta.v_cache, a.k_scales, a.v_scales, ta.out,
        int(a.block_size), int(a.hq), int(a.hkv), ta.q_stride, ta.kv_row, a.scale, a.causal, int(a.window), a.softcap,
        a.k_rotate, a.seqs, a.block_tables, a.work, ta.part_o, ta.part_ml);
  };
  const int64_t items = a.max_q_len * (a.hq / a.hkv);
  const bool decode = a.max_q_len > 0 && a.num_partials == 0;
  if (decode && items <= 4) {
    go(attention_decode_kernel<T, D, 4, Q>, 0);
  } else if (decode && items <= 8) {
    go(attention_decode_kernel<T, D, 8, Q>, 0);
  } else if constexpr (kTileSmemDynamic<D>) {
    constexpr int bytes = kTileSmemFloats<D> * int(sizeof(float));
    go(smem_kernel_ready<attention_kernel<T, D, Q>, bytes>(), size_t(bytes));
  } else {
    go(attention_kernel<T, D, Q>, 0);
  }
  KILN_CUDA_CHECK_LAUNCH();
  if (a.num_combine > 0) {
    launch_k(attention_combine_kernel<T, D>, dim3(unsigned(a.num_combine), unsigned(a.hkv)), 128, 0, s, ta.out,
        int(a.hq), int(a.hkv), a.seqs, a.combine, ta.part_o, ta.part_ml, kAttnItemsPerCta);
    KILN_CUDA_CHECK_LAUNCH();
  }
}

// launch_typed for every activation dtype and head dim, with cache codes Q. Head dims 96
// and 256 are dispatched here only (attention_dispatch's other users stop at 128).
template <KvCode Q>
void launch_attention_codes(const AttentionArgs& a, cudaStream_t s) {
  if (a.d == 256) {
    KILN_CUDA_DISPATCH_FLOAT(a.dtype, T, { launch_typed<T, 256, Q>(a, s); });
    return;
  }
  if (a.d == 96) {
    KILN_CUDA_DISPATCH_FLOAT(a.dtype, T, { launch_typed<T, 96, Q>(a, s); });
    return;
  }
  attention_dispatch(a.dtype, a.d, [&](auto t, auto d) {
    launch_typed<typename decltype(t)::type, decltype(d)::value, Q>(a, s);
  });
}

}  // namespace

// attention_kv_quant.cu: launch_attention for the int8 and fp8 caches.
void launch_attention_quantized(const AttentionArgs& a, cudaStream_t s);
// attention_fused_quant.cu: the grouped-query decode kernel (launch_attention_fused_decode)
// for int8 / fp8 caches.
void launch_attention_fused_decode_quantized(const AttentionArgs& a, cudaStream_t s);

}  // namespace kiln::cuda
