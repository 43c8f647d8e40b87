// Internal to the CUDA backend's attention: the pipelined tensor-core prefill kernel
// (FlashAttention-2 structure; attention.h's plans with flash_width set), templated on the
// activation type T (bf16/f16), the head dim D (64/96/128/256), the cache's codes Q and the CTA's
// items W (128, 64 or 32: W / 16 warps). Included by attention_flash.cu (Q = kNone) and attention_flash_quant.cu
// (int8, fp8). Tested against the CPU backend in tests/backends/cuda/attention_test.cpp
// (forced on), and against the tile kernel in bench/cuda_attention_bench.cpp.
//
// A CTA takes W (query row, head) items of one sequence and one KV head - the GQA heads
// of a row share the KV head's tiles - as W / (16 MT) warps x 16 MT items: MT (1 or 2)
// times the M of one m16n8k16 MMA. Narrower CTAs read each K/V tile for fewer items but
// spread a small step (BERT at batch 1: 12 CTAs of 128) over more SMs; the plan picks W
// (attention_flash_pick_width). Every warp reads each K/V tile's fragments from shared
// memory once for its MT x 16 items, so MT = 2 halves the shared-memory traffic per MMA
// (the profile of MT = 1 at 8B pp2048: shared memory 76% busy, tensor pipe 38%) at the
// cost of twice the O accumulators (255 registers a thread, half the warps per SM);
// attention_flash_warp_rows picks it.
// Q is staged once in shared memory (ldmatrix A fragments per 16-dim slice; keeping it in
// registers would cost the 32 that let two CTAs share an SM). 64-key tiles of K and V
// are double-buffered: tile i+1 is requested (cp.async) right after the barrier that
// opens tile i, so its latency hides behind tile i's MMAs and the other CTA's warps; the
// block table is read once per key, a tile further ahead (slots staged in shared memory),
// so the copies never wait on it. S = Q K^T (ldmatrix for
// K's B fragments), the online softmax in the log2 domain in registers (row max and sum
// across the quad of lanes sharing a row), P (the S accumulators rounded to 16 bits,
// reused as A fragments) times V (ldmatrix.trans). Causal: a warp skips the tiles none of
// its items sees and masks only tiles that cross the diagonal of one of its items.
// Quantized caches are decoded to T while staging the next tile (synchronous loads).
// The epilogue stages each warp's output rows in its own rows of the Q buffer and stores
// them as 16-byte chunks of whole rows. With out_codes set, it rounds each output to T (as
// the plain output is stored) and writes the next Linear's one-byte codes instead: E4M3
// (FP8 Linear) or int8 with one static scale (W8A8), the codes of the T output's quantize
// pass, bit for bit.
// Rows are D + 8 elements apart in shared memory: the eight 16-byte rows an ldmatrix
// reads fall in distinct bank groups.
// Sliding windows (each item sees only its last `window` keys) and soft-capped scores
// (Gemma 2/3; Phi-3-mini's window at head dim 96), at head dims 256 and 96 only (kWin;
// the 64/128 kernels would spill the registers the bounds take, so their windowed nodes
// keep the tile kernel; at 96 only the steps with a window take the form that has
// them, 20 bytes of spills): the CTA starts at its
// first item's window start, a warp skips the 32-key steps before its first item's, and
// the mask takes each row's lower bound too; a capped score is c * tanh(s / c) of
// s = q.k times scale, applied before the softmax.
// Head dim 256 (Gemma) runs 16-row warps at 128 items per SM: its O accumulators take 128
// registers a thread, and the K/V stages ~135 KB of shared memory, one CTA an SM.
#pragma once

#include <atomic>

#include "backends/cuda/ops/attention_kernels.cuh"
#include "backends/cuda/ops/fp8_codes.cuh"
#include "backends/cuda/ops/int8_codes.cuh"
#include "backends/cuda/ops/mma_util.cuh"

namespace kiln::cuda {
namespace {

constexpr int kF2Keys = 64;
// Threads of a W-item CTA: one warp per 16 MT items.
template <int W, int MT>
constexpr int flash2_threads() {
  return W / (16 * MT) * 32;
}

// The pool slot of context position p: block sizes that are powers of two (all of the
// runtime's) take a shift and a mask instead of an integer division.
__device__ __forceinline__ int64_t f2_slot(const int32_t* bt, int bs, int bs_shift, int p) {
  const int b = bs_shift >= 0 ? p >> bs_shift : p / bs;
  return int64_t(bt[b]) * bs + (p - b * bs);
}

// Eight cache codes of one key (raw), decoded and times the key's scale sc, stored as T
// at dst (16 bytes of a K or V tile row).
template <typename T, KvCode Q>
__device__ __forceinline__ void f2_store_decoded(T* dst, uint2 raw, float sc) {
  float f[8];
  kv_decode4<Q>(raw.x, f);
  kv_decode4<Q>(raw.y, f + 4);
  *reinterpret_cast<uint4*>(dst) = make_uint4(pack2<T>(f[0] * sc, f[1] * sc), pack2<T>(f[2] * sc, f[3] * sc),
                                              pack2<T>(f[4] * sc, f[5] * sc), pack2<T>(f[6] * sc, f[7] * sc));
}

template <int D, typename T, int W>
constexpr size_t flash2_smem_bytes() {
  return size_t(W + 4 * kF2Keys) * size_t(D + 8) * sizeof(T);
}

// Items resident per SM (I): 128 at head dim 256 (8 warps of at most 255 registers); else
// 256 (two 128-item CTAs, four of 64, eight of 32): 16 warps of
// at most 128 registers a thread at MT = 1, 8 of at most 255 at MT = 2; or 384 at head dim
// 64 over a 16-bit cache (24 warps of at most 80 registers, 32-key softmax steps), which
// the plan asks for when every CTA reads at most 256 keys and 256 items per SM would take
// more than one wave (AttentionPlan::flash_items_per_sm): BERT-base's 32 x 128 tokens,
// 49,152 items, then run as one wave of 132 SMs instead of 1.45.
template <typename T, int D, KvCode Q, int W, int MT, int I, bool kWin>
__global__ void __launch_bounds__(flash2_threads<W, MT>(), I / W)
    flash2_attention_kernel(const T* __restrict__ q, const KvElem<T, Q>* __restrict__ k_cache,
                            const KvElem<T, Q>* __restrict__ v_cache,
                            const float* __restrict__ k_scales, const float* __restrict__ v_scales,
                            T* __restrict__ out, uint8_t* __restrict__ out_codes, float code_inv, bool code_int8,
                            int block_size, int bs_shift, int hq, int hkv,
                            int64_t q_stride, int64_t kv_row, float scale_log2, bool causal, int window,
                            float softcap_in, float softcap_out, bool k_rotate,
                            const AttnSeq* __restrict__ seqs,
                            const int32_t* __restrict__ block_tables,
                            const AttnWork* __restrict__ works, float* __restrict__ part_o,
                            float* __restrict__ part_ml) {
  pdl_wait();  // programmatic dependent launch: the previous kernel's writes are visible
  static_assert(D == 64 || D == 96 || D == 128 || D == 256);
  static_assert(attention_flash_width_valid(W) && (MT == 1 || MT == 2));
  static_assert(D == 256 ? I == 128 && MT == 1
                         : I == 256 || (I == 384 && D == 64 && Q == KvCode::kNone && MT == 1));
  constexpr int kF2Threads = flash2_threads<W, MT>();
  // kWin: windows and soft caps (attention_flash_supports_window): always at head dim 256;
  // at 96 a second form for the steps that have them (their bounds cost 20 bytes of
  // spills there); never at 64 / 128 (16-80).
  static_assert(!kWin || D == 256 || D == 96);
  // The slot lookups below give each of a tile's keys one thread.
  static_assert(kF2Threads >= kF2Keys);
  // SK: keys per softmax step (a 32-key S leaves the registers for two CTAs per SM at
  // D = 128, for three at D = 64 and 384 items).
  constexpr int LD = D + 8, KC = D / 16, SK = D >= 96 || I > 256 ? 32 : 64,
                NT = SK / 8, DT = D / 8,
                CPR = D / 8;
  // A tile's copies: KPT passes of KSTEP keys, a thread a 16-byte chunk (c) of key j0 + i
  // KSTEP; at head dim 96 (12 chunks a row, dividing no CTA's thread count) the chunks of
  // the tile are instead dealt out in thread order, e = tid, tid + threads, ... (kRowSplit).
  constexpr bool kRowSplit = kF2Threads % CPR == 0;
  constexpr int KSTEP = kRowSplit ? kF2Threads / CPR : 1, KPT = kRowSplit ? kF2Keys / KSTEP : 1;
  static_assert(!kRowSplit || kF2Keys % KSTEP == 0);
  static_assert(kF2Keys * CPR % kF2Threads == 0, "the copy loops are uniform across the CTA");
  extern __shared__ __align__(16) unsigned char f2_smem[];
  T* qs = reinterpret_cast<T*>(f2_smem);   // [W][LD]
  T* kbuf = qs + W * LD;                   // [2][64][LD]
  T* vbuf = kbuf + 2 * kF2Keys * LD;       // [2][64][LD]

  // Work-major order: the plan lists the longest CTAs first, and all KV heads of one
  // work item start together.
  const AttnWork w = works[blockIdx.x / unsigned(hkv)];
  const int kvh = int(blockIdx.x % unsigned(hkv));
  const AttnSeq sq = seqs[w.seq];
  const int group = hq / hkv, n_items = sq.q_len * group;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int ctx0 = sq.ctx_len - sq.q_len;  // position of the sequence's first new token
  const int32_t* bt = block_tables + sq.bt_offset;
  // Keys [kv_begin, lim) are visible to an item (non-decreasing in the item).
  auto item_lim = [&](int item) {
    return min(causal ? ctx0 + item / group + 1 : sq.ctx_len, w.kv_end);
  };
  // An item's first visible key: its window's start (0 without one; non-decreasing too).
  auto item_lo = [&](int item) { return kWin ? attn_window_start(ctx0 + item / group, window) : 0; };

  const int last = min(n_items, w.item_begin + W) - 1;
  // The CTA reads keys [begin, hi): from its first item's window start (kv_begin without one).
  const int begin = kWin ? max(w.kv_begin, item_lo(w.item_begin)) : w.kv_begin;
  const int hi = last >= w.item_begin ? item_lim(last) : begin;
  const int first_w = w.item_begin + warp * 16 * MT;
  const bool warp_on = first_w < n_items;
  const int w_last = min(first_w + 16 * MT - 1, n_items - 1);
  const int w_lo = warp_on ? item_lim(first_w) : 0;  // seen by all the warp's items (up to)
  const int w_hi = warp_on ? item_lim(w_last) : 0;   // seen by some
  const int w_first = warp_on ? item_lo(first_w) : 0;  // no item of the warp sees keys before
  const int w_all = warp_on ? item_lo(w_last) : 0;     // every item sees keys from (down to)
  int lim[MT][2], lo[MT][2];  // this thread's rows g and g + 8 of each m-tile (the MMA row layout)
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int item = first_w + 16 * mt + g + 8 * h;
      lim[mt][h] = item < n_items ? item_lim(item) : 0;
      lo[mt][h] = item < n_items ? item_lo(item) : 0;
    }

  // The pool slot of each key of a tile (-1 past hi), looked up one tile ahead of its
  // copies: the block-table read is issued before a tile's MMAs and stored after them, so
  // no warp waits on it. (Slots fit int32: a pool of 2^31 tokens would not fit a GPU.)
  __shared__ int32_t slot_buf[2][kF2Keys];
  auto key_slot = [&](int p) {
    return p < hi ? int32_t(f2_slot(bt, block_size, bs_shift, p)) : -1;
  };

  // Tile `tile`'s K and V into buffer `stage`, through slot_buf[tile & 1]; keys past hi
  // are zeros (finite V: P is 0 there).
  auto load_tile = [&](int stage, int tile) {
    T* kd = kbuf + stage * kF2Keys * LD;
    T* vd = vbuf + stage * kF2Keys * LD;
    const int32_t* slots = slot_buf[tile & 1];
    const int c = (threadIdx.x % CPR) * 8, j0 = threadIdx.x / CPR;
    if constexpr (!kRowSplit) {
      // Head dim 96: chunk e of the tile is key e / CPR's chunk e % CPR (loads of codes
      // decoded one chunk at a time; no pairing across passes).
      for (int e = threadIdx.x; e < kF2Keys * CPR; e += kF2Threads) {
        const int j = e / CPR, ce = (e % CPR) * 8, slot = slots[j];
        const int64_t off = slot >= 0 ? int64_t(slot) * kv_row + int64_t(kvh) * D + ce : 0;
        if constexpr (Q == KvCode::kNone) {
          cp_async16(kd + j * LD + ce, k_cache + off, slot >= 0);
          cp_async16(vd + j * LD + ce, v_cache + off, slot >= 0);
        } else {
          uint2 kr = make_uint2(0, 0), vr = make_uint2(0, 0);
          float ksc = 0.0f, vsc = 0.0f;
          if (slot >= 0) {
            kr = *reinterpret_cast<const uint2*>(k_cache + off);
            vr = *reinterpret_cast<const uint2*>(v_cache + off);
            ksc = k_scales[int64_t(slot) * hkv + kvh] * kv_code_unit<Q>();
            vsc = v_scales[int64_t(slot) * hkv + kvh] * kv_code_unit<Q>();
          }
          f2_store_decoded<T, Q>(kd + j * LD + ce, kr, ksc);
          f2_store_decoded<T, Q>(vd + j * LD + ce, vr, vsc);
        }
      }
    } else if constexpr (Q == KvCode::kNone) {
#pragma unroll
      for (int i = 0; i < KPT; ++i) {
        const int j = j0 + i * KSTEP, slot = slots[j];
        const int64_t off = slot >= 0 ? int64_t(slot) * kv_row + int64_t(kvh) * D + c : 0;
        cp_async16(kd + j * LD + c, k_cache + off, slot >= 0);
        cp_async16(vd + j * LD + c, v_cache + off, slot >= 0);
      }
    } else {
      // Eight codes of one key per thread and pass, two passes at a time: their loads are
      // issued before either decodes (more would spill: the O accumulators are live).
      constexpr int G = KPT < 2 ? KPT : 2;
#pragma unroll
      for (int i0 = 0; i0 < KPT; i0 += G) {
        uint2 kr[G], vr[G];
        float ksc[G], vsc[G];
#pragma unroll
        for (int i = 0; i < G; ++i) {
          const int32_t slot = slots[j0 + (i0 + i) * KSTEP];
          kr[i] = vr[i] = make_uint2(0, 0);
          ksc[i] = vsc[i] = 0.0f;
          if (slot >= 0) {
            const int64_t off = int64_t(slot) * kv_row + int64_t(kvh) * D + c;
            kr[i] = *reinterpret_cast<const uint2*>(k_cache + off);
            vr[i] = *reinterpret_cast<const uint2*>(v_cache + off);
            ksc[i] = k_scales[int64_t(slot) * hkv + kvh] * kv_code_unit<Q>();
            vsc[i] = v_scales[int64_t(slot) * hkv + kvh] * kv_code_unit<Q>();
          }
        }
#pragma unroll
        for (int i = 0; i < G; ++i) {
          const int j = j0 + (i0 + i) * KSTEP;
          f2_store_decoded<T, Q>(kd + j * LD + c, kr[i], ksc[i]);
          f2_store_decoded<T, Q>(vd + j * LD + c, vr[i], vsc[i]);
        }
      }
    }
  };

  float o[MT][DT][4], m[MT][2], l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    m[mt][0] = m[mt][1] = -INFINITY;
    l[mt][0] = l[mt][1] = 0.0f;
#pragma unroll
    for (int i = 0; i < DT; ++i) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.0f;
  }
  // Tile t0 (in buffer `stage`) folded into the warp's 16 MT items: S = Q K^T, the online
  // softmax, O += P V, SK keys at a time; each K/V fragment serves all MT m-tiles.
  auto flash2_tile = [&](int t0, int stage) {
    const T* kt = kbuf + stage * kF2Keys * LD;
    const T* vt = vbuf + stage * kF2Keys * LD;
#pragma unroll
    for (int jb = 0; jb < kF2Keys; jb += SK) {
      const int k0 = t0 + jb;
      if (k0 >= w_hi) break;           // uniform across the warp
      if (kWin && k0 + SK <= w_first) continue;  // before every item's window
      float s[MT][NT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.0f;
#pragma unroll
      for (int kc = 0; kc < KC; ++kc) {
        uint32_t qa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
          ldmatrix_x4(qa[mt], qs + (warp * 16 * MT + mt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD +
                                  kc * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
          uint32_t kb[4];  // B fragments of key groups 2np and 2np + 1
          ldmatrix_x4(kb, kt + (jb + np * 16 + (lane >> 4) * 8 + (lane & 7)) * LD + kc * 16 +
                              ((lane >> 3) & 1) * 8);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma16816<T>(s[mt][2 * np], qa[mt], kb[0], kb[1]);
            mma16816<T>(s[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
          }
        }
      }

      if (kWin && softcap_in > 0.0f) {  // uniform across the grid
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[mt][nt][e] = softcap_out * tanhf(s[mt][nt][e] * softcap_in);
      }
      // Online softmax; keys visible to all the warp's items skip the mask.
      auto fold = [&](auto masked) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          float corr[2];
#pragma unroll
          for (int h = 0; h < 2; ++h)
            corr[h] = online_softmax_step(s[mt], h, m[mt][h], l[mt][h], scale_log2, [&](int nt, int e) {
              if constexpr (decltype(masked)::value) {
                const int key = k0 + nt * 8 + 2 * t + e;
                return key < lim[mt][h] && (!kWin || key >= lo[mt][h]);
              } else
                return true;
            });
          // Once the row maxima settle, most steps leave every row's scale at 1.
          if (__any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f)) {
            online_softmax_rescale(o[mt], 0, corr[0]);
            online_softmax_rescale(o[mt], 1, corr[1]);
          }
        }
      };
      if (k0 + SK <= w_lo && (!kWin || k0 >= w_all))
        fold(std::false_type{});
      else
        fold(std::true_type{});

#pragma unroll
      for (int kk = 0; kk < SK / 16; ++kk) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          a[mt][0] = pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
          a[mt][1] = pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
          a[mt][2] = pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
          a[mt][3] = pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int d2 = 0; d2 < D / 16; ++d2) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, vt + (jb + kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LD +
                                   d2 * 16 + (lane >> 4) * 8);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma16816<T>(o[mt][2 * d2], a[mt], b[0], b[1]);
            mma16816<T>(o[mt][2 * d2 + 1], a[mt], b[2], b[3]);
          }
        }
      }
    }
  };

  const int n_tiles = hi > begin ? (hi - begin + kF2Keys - 1) / kF2Keys : 0;
  if (threadIdx.x < kF2Keys) {
    slot_buf[0][threadIdx.x] = key_slot(begin + int(threadIdx.x));
    slot_buf[1][threadIdx.x] = key_slot(begin + kF2Keys + int(threadIdx.x));
  }
  // Up to here the CTA read only the step's tables (work items, sequences, block tables),
  // which the host uploads before the graph's first kernel: with dependent launch their
  // round trips overlap the previous kernel's tail. Q, K and V are its writes.
  pdl_wait();
  for (int e = threadIdx.x; e < W * CPR; e += kF2Threads) {
    const int li = e / CPR, c = (e % CPR) * 8, item = w.item_begin + li;
    const bool valid = item < n_items;
    const T* src = valid ? q + int64_t(sq.q_start + item / group) * q_stride +
                               int64_t(kvh * group + item % group) * D + c
                         : q;
    cp_async16(qs + li * LD + c, src, valid);
  }
  // Keys stored rotated (quantized caches): the q rows are rotated too, once they land
  // (below, while tile 0's copies are in flight); they go as a copy group of their own.
  const bool rotate_q = Q != KvCode::kNone && k_rotate;
  if (rotate_q) cp_async_commit();
  __syncthreads();
  if (n_tiles > 0) load_tile(0, 0);
  cp_async_commit();  // Q and tile 0 (rotate_q: tile 0 only)
  if (rotate_q) {
    cp_async_wait<1>();  // this thread's Q copies have landed...
    __syncthreads();     // ...and every thread's
    kv_rotate_rows<D>(qs, W, LD, kF2Threads / 32);  // the 16-bit rows the MMAs read; the loop's barrier orders them
  }

  for (int it = 0; it < n_tiles; ++it) {
    const int t0 = begin + it * kF2Keys, stage = it & 1;
    cp_async_wait<0>();
    // Tile it (and Q) is visible to every warp, and every warp is done with tile it - 1,
    // whose buffers (K/V stage ^ 1, slot_buf[it & 1]) are now overwritten.
    __syncthreads();
    if (it + 1 < n_tiles) load_tile(stage ^ 1, it + 1);
    cp_async_commit();
    const int32_t next_slot =
        threadIdx.x < kF2Keys ? key_slot(t0 + 2 * kF2Keys + int(threadIdx.x)) : 0;
    if (warp_on && t0 < w_hi)  // uniform across the warp: else none of its items sees these keys
      flash2_tile(t0, stage);
    if (threadIdx.x < kF2Keys) slot_buf[it & 1][threadIdx.x] = next_slot;  // tile it + 2's
  }
  cp_async_wait<0>();  // nothing in flight when the CTA exits (an empty range still staged Q)

  // A key split's partial index (-1: none), read again here and its item offset formed
  // from the thread's own indices, rather than keeping the work item's fields live through
  // the main loop (that raised the d 128 forms' spills from 12 to 28-32 bytes, -Xptxas -v).
  const int32_t partial = works[blockIdx.x / unsigned(hkv)].partial;
  if (!warp_on) return;
  // Each row's softmax denominator: the sum over the quad of lanes that share the row.
  float den[MT][2];
#pragma unroll
  for (int mh = 0; mh < 2 * MT; ++mh) {
    float d = l[mh >> 1][mh & 1];
    d += __shfl_xor_sync(0xffffffffu, d, 1);
    den[mh >> 1][mh & 1] = d + __shfl_xor_sync(0xffffffffu, d, 2);
  }
  if (partial >= 0) {
    // A key split: the unnormalized partials for the combine kernel, m in natural-log
    // units (the tile kernels' partials; a row that saw no key keeps m = -inf, l = 0).
#pragma unroll
    for (int mh = 0; mh < 2 * MT; ++mh) {
      const int mt = mh >> 1, h = mh & 1;
      if (first_w + 16 * mt + g + 8 * h >= n_items) continue;
      const int li = warp * 16 * MT + 16 * mt + g + 8 * h;  // item - the work item's first
      const int64_t base = (int64_t(partial) * hkv + kvh) * W + li;
#pragma unroll
      for (int i = 0; i < DT; ++i)
        *reinterpret_cast<float2*>(part_o + base * D + i * 8 + 2 * t) =
            make_float2(o[mt][i][2 * h], o[mt][i][2 * h + 1]);
      if (t == 0) {
        part_ml[base * 2] = m[mt][h] * kLn2;
        part_ml[base * 2 + 1] = den[mt][h];
      }
    }
    return;
  }
  // The warp's output rows go through its own rows of the Q stage (only this warp read
  // them), then leave as 16-byte stores of whole rows: storing each lane's pairs straight
  // from the MMA layout (2-4 bytes a lane over 8 rows a store) made the W8A8 BERT-base
  // forward at batch 32 6% slower (H100, bench/RESULTS.md session 47).
  // Out: T, or the codes of the T output (the o-projection's input): int8 (a W8A8
  // Linear's static scale) or E4M3 (an FP8 Linear's). Uniform across the grid; after the
  // main loop, so it costs neither registers nor a template instantiation.
  unsigned char* st = reinterpret_cast<unsigned char*>(qs + warp * 16 * MT * LD);
  constexpr int kRowBytes = LD * int(sizeof(T));
  const int esz = out_codes ? 1 : int(sizeof(T));
#pragma unroll
  for (int mh = 0; mh < 2 * MT; ++mh) {
    const int mt = mh >> 1, h = mh & 1;
    const float inv = den[mt][h] > 0.0f ? 1.0f / den[mt][h] : 0.0f;
    unsigned char* r = st + (16 * mt + g + 8 * h) * kRowBytes;
#pragma unroll
    for (int i = 0; i < DT; ++i) {
      const float x0 = o[mt][i][2 * h] * inv, x1 = o[mt][i][2 * h + 1] * inv;
      const int col = i * 8 + 2 * t;
      if (!out_codes) {
        *reinterpret_cast<uint32_t*>(r + col * 2) = pack2<T>(x0, x1);
      } else if (code_int8) {
        // The pair rounded to T as the plain output stores it (one packed conversion),
        // then its two codes (int8_code_pair: no float-to-int conversions).
        const uint32_t p = pack2<T>(x0, x1);
        *reinterpret_cast<uint16_t*>(r + col) =
            uint16_t(int8_code_pair(low_as_f32<T>(p), high_as_f32<T>(p), code_inv));
      } else {
        *reinterpret_cast<uint16_t*>(r + col) =
            uint16_t(fp8_code_via<T>(x0, code_inv) | uint16_t(fp8_code_via<T>(x1, code_inv)) << 8);
      }
    }
  }
  __syncwarp();
  const int chunks = D * esz / 16;  // 16-byte chunks of a row
  unsigned char* dst = out_codes ? out_codes : reinterpret_cast<unsigned char*>(out);
  for (int e = lane; e < 16 * MT * chunks; e += 32) {
    const int lr = e / chunks, c = e % chunks, item = first_w + lr;
    if (item >= n_items) continue;
    const int64_t row = sq.q_start + item / group, head = kvh * group + item % group;
    *reinterpret_cast<uint4*>(dst + (row * hq + head) * D * esz + c * 16) =
        *reinterpret_cast<const uint4*>(st + lr * kRowBytes + c * 16);
  }
}

// Launches a tensor-core plan of W-item CTAs of MT m-tiles a warp for activations T,
// head dim D and cache codes Q: one CTA per (work item, KV head), work-major.
template <typename T, int D, KvCode Q, int W, int MT, int I, bool kWin>
void launch_flash2_form(const AttentionArgs& a, cudaStream_t s) {
  constexpr size_t smem = flash2_smem_bytes<D, T, W>();
  // Over 48 KiB of dynamic shared memory needs the opt-in, once per device.
  auto* kernel = smem_kernel_ready<flash2_attention_kernel<T, D, Q, W, MT, I, kWin>, smem>();
  const int bs = int(a.block_size);
  const int bs_shift = bs > 0 && (bs & (bs - 1)) == 0 ? __builtin_ctz(unsigned(bs)) : -1;
  const int64_t qs = a.q_stride ? a.q_stride : a.hq * D,
                kvs = a.kv_stride ? a.kv_stride : a.hkv * D;
  // Key splits (a short grid): the partials, W items each, then their (m, l) pairs.
  float* part_o = a.num_partials > 0 ? a.workspace : nullptr;
  float* part_ml = part_o ? part_o + size_t(a.num_partials) * size_t(a.hkv) * W * D : nullptr;
  launch_k(kernel, dim3(unsigned(int64_t(a.num_work) * a.hkv)), dim3(flash2_threads<W, MT>()), smem, s,
           static_cast<const T*>(a.q), static_cast<const KvElem<T, Q>*>(a.k_cache),
           static_cast<const KvElem<T, Q>*>(a.v_cache), a.k_scales, a.v_scales,
           static_cast<T*>(a.out), a.out_codes, a.out_code_inv, a.out_code == AttnOutCode::kInt8, bs, bs_shift, int(a.hq), int(a.hkv), qs, kvs,
           a.scale * kLog2e, a.causal, int(a.window), a.softcap > 0.0f ? a.scale / a.softcap : 0.0f,
           a.softcap > 0.0f ? a.softcap / a.scale : 0.0f, a.k_rotate, a.seqs, a.block_tables, a.work, part_o, part_ml);
  KILN_CUDA_CHECK_LAUNCH();
  if (a.num_combine > 0) {
    launch_k(attention_combine_kernel<T, D>, dim3(unsigned(a.num_combine), unsigned(a.hkv), unsigned(W / 4)), 128, 0, s,
             static_cast<T*>(a.out), int(a.hq), int(a.hkv), a.seqs, a.combine, part_o, part_ml, W);
    KILN_CUDA_CHECK_LAUNCH();
  }
}

// launch_flash2_form with the window / soft-cap bounds where the step has them (head dim
// 96: a form each), always at 256, never at 64 / 128.
template <typename T, int D, KvCode Q, int W, int MT, int I = 256>
void launch_flash2_typed(const AttentionArgs& a, cudaStream_t s) {
  if constexpr (D == 96) {
    if (a.window > 0 || a.softcap > 0.0f) return launch_flash2_form<T, D, Q, W, MT, I, true>(a, s);
  }
  launch_flash2_form<T, D, Q, W, MT, I, D == 256>(a, s);
}

// launch_flash2_typed of 16-row warps at the plan's items per SM: 384 where the kernel
// has that form (head dim 64, 16-bit cache) and the plan asks for it.
template <typename T, int D, KvCode Q, int W>
void launch_flash2_rows16(const AttentionArgs& a, cudaStream_t s) {
  if constexpr (D == 256) {
    launch_flash2_typed<T, D, Q, W, 1, 128>(a, s);
  } else {
    if constexpr (D == 64 && Q == KvCode::kNone)
      if (a.flash_items_per_sm == 384) return launch_flash2_typed<T, D, Q, W, 1, 384>(a, s);
    launch_flash2_typed<T, D, Q, W, 1>(a, s);
  }
}

// launch_flash2_typed for the plan's CTA width (AttentionArgs::flash_width) and the
// rows a warp takes (attention_flash_warp_rows: 32 only in 128-item CTAs).
template <typename T, int D, KvCode Q>
void launch_flash2_width(const AttentionArgs& a, cudaStream_t s) {
  const int rows = attention_flash_warp_rows(a);
  switch (a.flash_width) {
    case 128:
      if constexpr (D == 64 || D == 128) {
        if (rows == 32) {
          launch_flash2_typed<T, D, Q, 128, 2>(a, s);
          break;
        }
      }
      launch_flash2_rows16<T, D, Q, 128>(a, s);
      break;
    case 64:
      launch_flash2_rows16<T, D, Q, 64>(a, s);
      break;
    case 32:
      launch_flash2_rows16<T, D, Q, 32>(a, s);
      break;
    default:
      throw_error(ErrorCode::kInternal, "cuda flash attention: CTAs of ", a.flash_width,
                  " items (expected 128, 64 or 32)");
  }
}

// launch_flash2_width for bf16 / f16 and head dims 64 / 128 / 256, with cache codes Q.
template <KvCode Q>
void launch_flash2_codes(const AttentionArgs& a, cudaStream_t s) {
  KILN_THROW_IF(a.d != 64 && a.d != 96 && a.d != 128 && a.d != 256, kInternal, "cuda flash attention: head_dim ",
                a.d, " (64, 96, 128 or 256)");
  switch (a.dtype) {
    case DType::kBF16:
      if (a.d == 64)
        launch_flash2_width<__nv_bfloat16, 64, Q>(a, s);
      else if (a.d == 96)
        launch_flash2_width<__nv_bfloat16, 96, Q>(a, s);
      else if (a.d == 128)
        launch_flash2_width<__nv_bfloat16, 128, Q>(a, s);
      else
        launch_flash2_width<__nv_bfloat16, 256, Q>(a, s);
      break;
    case DType::kF16:
      if (a.d == 64)
        launch_flash2_width<__half, 64, Q>(a, s);
      else if (a.d == 96)
        launch_flash2_width<__half, 96, Q>(a, s);
      else if (a.d == 128)
        launch_flash2_width<__half, 128, Q>(a, s);
      else
        launch_flash2_width<__half, 256, Q>(a, s);
      break;
    default:
      throw_error(ErrorCode::kInternal, "cuda flash attention: dtype ", dtype_name(a.dtype),
                  " (bf16 or f16)");
  }
}

}  // namespace

// attention_flash_quant.cu: launch_attention_flash for int8 / fp8 caches.
void launch_attention_flash_quantized(const AttentionArgs& a, cudaStream_t s);

}  // namespace kiln::cuda
