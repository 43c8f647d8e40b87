// Internal to the CUDA backend's attention: the cluster decode kernel (decode steps,
// 16-bit activations, head dims 64/96/128/256, GQA group <= 8, any KvCode; a sliding window
// and soft-capped scores, Gemma's, included). A CTA takes one
// (sequence, KV head, split); the splits of a (sequence, KV head) form one thread-block
// cluster and merge through distributed shared memory, so an unsplit context needs no
// merge at all and a split one no global round trip. Why it is shaped so:
// - few dependent steps: the CTA reads its sequence, then the block table, then issues
//   every K/V copy it can hold (4 warps x 2 stages x 32/16 keys: a whole short context),
//   all before the dependent-launch wait, and only then loads and rotates q; q and the
//   new key are ready while the copies fly;
// - bytes in flight: each warp streams its own tiles (tile w, w + 4, ...) through a
//   private two-stage cp.async ring, so the main loop has no CTA barrier; ~73 KB of
//   shared memory: 3 CTAs and up to ~200 KB of copies in flight per SM; a grid larger
//   than one such wave (batch decode) takes one stage a warp instead, ~38 KB CTAs, 5 an
//   SM (kDecStagesMax);
// - tensor cores: S = Q K^T and O += P V with m16n8k16 MMAs, the group's q heads as the
//   A rows (rows >= group are zero), as the prefill flash kernel does; int8/fp8 tiles are
//   decoded (scale folded in) to 16-bit tiles by the warp that owns them.
// The new token's K/V (RoPE'd, quantized for an int8/fp8 cache) is written to the cache
// and patched into the owning warp's tile, as in the fused grouped kernel. Tested in
// tests/backends/cuda/attention_test.cpp against the CPU backend.
#pragma once

#include <cooperative_groups.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <set>

#include "backends/cuda/ops/attention_kernels.cuh"

namespace kiln::cuda {
namespace {

constexpr int kDecWarps = 4, kDecThreads = kDecWarps * 32, kDecMaxGroup = 8;
// Stages a warp's cp.async ring has: 2 (a tile computed while the next lands) where the
// grid fits one wave of the 2-stage kernel's 3 CTAs per SM (~73 KB of shared memory each);
// 1 for larger grids (batch decode: 64 sequences x 8 KV heads are 512 CTAs), whose ~38 KB
// CTAs fit 5 to an SM, so the grid runs in one wave instead of two, the other CTAs' copies
// in flight while a warp computes (launch_decode_cluster_typed picks).
constexpr int kDecStagesMax = 2;

// Shared-memory layout (bytes) of the kernel for head dim D, codes Q and ST stages a warp.
template <int D, KvCode Q, int ST>
struct DecLayout {
  static constexpr bool kQuant = Q != KvCode::kNone;
  static constexpr int KT = D == 64 ? 32 : 16;       // keys per warp tile: 4 / 4 / 8 KB of 16-bit K
  static constexpr int LD = D + 8;                   // 16-bit tile row (elements): conflict-free fragments
  static constexpr int kTileT = KT * LD * 2;         // a 16-bit K or V tile
  static constexpr int kTileC = KT * D;              // a code tile (int8 / fp8)
  // A stage: the K and V tiles as the cache holds them (+ the per-key scales).
  static constexpr int kStage = kQuant ? 2 * kTileC + 2 * KT * 4 : 2 * kTileT;
  // A warp's region: its stages, then (quantized) the decoded 16-bit K and V tiles.
  static constexpr int kWarp = ST * kStage + (kQuant ? 2 * kTileT : 0);
  // A partial (8 rows of D f32 + (m, l) per row): a warp's aliases the start of its own
  // region once its loop is done; the CTA's follows warp 0's.
  static constexpr int kPart = kDecMaxGroup * D * 4 + kDecMaxGroup * 2 * 4;
  static constexpr int kQOff = kDecWarps * kWarp;                   // q rows [8][LD]
  static constexpr int kNewOff = kQOff + kDecMaxGroup * LD * 2;     // new k, v [2][D] (16-bit)
  static constexpr int kNewCOff = kNewOff + 2 * D * 2;              // new codes [2][D]
  static constexpr int kNewScOff = kNewCOff + 2 * D;                // new scales [2] f32
  static constexpr int kBytes = kNewScOff + 16;
  static_assert(kStage % 16 == 0 && kWarp % 16 == 0 && kQOff % 16 == 0 && kNewOff % 16 == 0 &&
                kNewCOff % 16 == 0 && kNewScOff % 16 == 0);
  static_assert(2 * kPart <= kWarp, "the warp and CTA partials fit warp 0's region");
  static_assert(KT * D * 2 / 16 % 32 == 0 && KT * D / 16 % 32 == 0, "copy loops are warp-uniform");
};

template <typename T>
struct DecParams {
  const T* q = nullptr;
  int64_t q_stride = 0;
  void* k_cache = nullptr;  // T or codes
  void* v_cache = nullptr;
  float* k_scales = nullptr;
  float* v_scales = nullptr;
  const float* k_shift = nullptr;  // quantized caches: [hkv, D] or null
  bool k_rotate = false;           // quantized caches: AttentionArgs::k_rotate
  T* out = nullptr;
  int block_size = 16, hq = 0, hkv = 0, splits = 1, rot = 0;
  int64_t kv_row = 0;
  float scale_log2 = 1.0f;
  const AttnSeq* seqs = nullptr;
  const int32_t* block_tables = nullptr;
  const T* k_new = nullptr;
  const T* v_new = nullptr;
  int64_t new_stride = 0;
  const int32_t* positions = nullptr;
  const float* inv_freq = nullptr;  // null: no RoPE
  const int64_t* slots = nullptr;
  // AttentionArgs::window (> 0: the new token sees its last `window` keys) and the
  // soft-cap factors of AttentionArgs::softcap > 0: a score s becomes
  // softcap_out * tanh(s * softcap_in), s * scale capped, in s's own units (0: no cap).
  int window = 0;
  float softcap_in = 0.0f, softcap_out = 0.0f;
  // AttentionArgs::early_trigger: safe here too - the only wait on other CTAs is the
  // cluster barrier of the split merge, and a cluster's CTAs are scheduled together.
  bool early_trigger = false;
};

__device__ __forceinline__ void dec_cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cooperative_groups::this_cluster().sync();
#else
  __trap();  // launched only on sm_90+ (attention_decode_cluster_supported)
#endif
}
__device__ __forceinline__ const float* dec_rank_smem(const float* p, int rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return cooperative_groups::this_cluster().map_shared_rank(const_cast<float*>(p), rank);
#else
  __trap();
  return p;
#endif
}
__device__ __forceinline__ void dec_cp_async4(void* smem, const void* gmem, bool valid) {
  const unsigned dst = unsigned(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(gmem), "r"(valid ? 4 : 0));
}

// qkv_prep_kernel's rotation and rounding (rope_pair), pairs (u, u + rot / 2), of the
// group's q rows (LD elements apart) and, with_new, the new key row after them; thread
// `first` of `stride` takes pairs first, first + stride, ...
template <typename T>
__device__ __forceinline__ void dec_rope_rows(T* q_s, int ld, T* new_k, int group, bool with_new, int rot, int pos,
                                              const float* inv_freq, int first, int stride) {
  const int half = rot / 2;
  for (int e = first; e < (group + (with_new ? 1 : 0)) * half; e += stride) {
    const int r = e / half, u = e % half;
    T* x = r < group ? q_s + r * ld : new_k;
    float x1 = to_f32(x[u]), x2 = to_f32(x[u + half]);
    rope_pair(x1, x2, pos, inv_freq[u]);
    x[u] = from_f32<T>(x1);
    x[u + half] = from_f32<T>(x2);
  }
}


// One tile of a decode warp: S = Q K^T for KT keys (16-bit K and V tiles, rows LD
// elements apart; n-tiles of 8) with qa the A fragments of the group's q rows (row g;
// rows g + 8 are zero), soft-capped where softcap_in > 0 (DecParams), in the log2 domain
// with keys >= hi masked, the online softmax
// step, and O += P V (P, row g in 16 bits, as A fragments; V's B fragments by
// ldmatrix.trans). The tile's first key t0 < hi is visible, so the new max is finite.
template <typename T, int D, int KT, int LD>
__device__ __forceinline__ void dec_tile_attend(const T* ks, const T* vs, const uint32_t (&qa)[D / 16][2], int t0,
                                                int hi, float scale_log2, float softcap_in, float softcap_out,
                                                float (&o)[D / 8][4], float& m, float& l) {
  constexpr int NT = KT / 8, KK = KT / 16, KC = D / 16;
  const int lane = int(threadIdx.x) & 31, g = lane >> 2, t = lane & 3, mi = lane >> 3;
  float s[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
  for (int k = 0; k < KC; ++k) {
    const uint32_t a[4] = {qa[k][0], 0u, qa[k][1], 0u};
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      const T* kp = &ks[(n * 8 + g) * LD + k * 16 + 2 * t];
      mma16816<T>(s[n], a, *reinterpret_cast<const uint32_t*>(kp), *reinterpret_cast<const uint32_t*>(kp + 8));
    }
  }
  if (softcap_in > 0.0f) {
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      s[n][0] = softcap_out * tanhf(s[n][0] * softcap_in);
      s[n][1] = softcap_out * tanhf(s[n][1] * softcap_in);
    }
  }
  const float corr =
      online_softmax_step(s, 0, m, l, scale_log2, [&](int n, int e) { return t0 + n * 8 + 2 * t + e < hi; });
  online_softmax_rescale(o, 0, corr);
#pragma unroll
  for (int kk = 0; kk < KK; ++kk) {
    const uint32_t a[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]), 0u, pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                           0u};
#pragma unroll
    for (int d2 = 0; d2 < D / 16; ++d2) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, &vs[(kk * 16 + (mi & 1) * 8 + (lane & 7)) * LD + d2 * 16 + (mi >> 1) * 8]);
      mma16816<T>(o[2 * d2], a, b[0], b[1]);
      mma16816<T>(o[2 * d2 + 1], a, b[2], b[3]);
    }
  }
}

template <typename T, int D, KvCode Q, int ST>
__global__ void __launch_bounds__(kDecThreads)
attention_decode_cluster_kernel(const DecParams<T> p) {
  using L = DecLayout<D, Q, ST>;
  static_assert(ST == 1 || ST == 2);
  using E = KvElem<T, Q>;
  constexpr bool kQuant = L::kQuant;
  constexpr int KT = L::KT, LD = L::LD, KC = D / 16, DT = D / 8;
  constexpr int ROWB = kQuant ? D : LD * 2;          // bytes per key row in a stage tile
  constexpr int TILEB = kQuant ? L::kTileC : L::kTileT;
  constexpr int CPR = D * int(sizeof(E)) / 16;        // 16-byte chunks per cache row
  constexpr int CVEC = 16 / int(sizeof(E));
  constexpr unsigned kFull = 0xffffffffu;
  static_assert(D == 64 || D == 96 || D == 128 || D == 256);
  extern __shared__ __align__(16) unsigned char smem[];

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int S = p.splits, seq = int(blockIdx.x) / S, rank = int(blockIdx.x) % S, kvh = int(blockIdx.y);
  const int group = p.hq / p.hkv;
  unsigned char* wbase = smem + warp * L::kWarp;
  T* q_s = reinterpret_cast<T*>(smem + L::kQOff);
  T* new_t = reinterpret_cast<T*>(smem + L::kNewOff);
  uint8_t* new_c = smem + L::kNewCOff;
  float* new_sc = reinterpret_cast<float*>(smem + L::kNewScOff);
  const E* kc = static_cast<const E*>(p.k_cache);
  const E* vc = static_cast<const E*>(p.v_cache);

  if (p.early_trigger) pdl_trigger();
  // Before the dependent-launch wait: the step's tables (copied in before the step's
  // first kernel, so complete before any kernel of the step starts) and the cache's
  // earlier keys and values (written by earlier steps; this step's one new row per
  // sequence is written by this kernel and never copied): the chain sequence -> block
  // table -> K/V copies overlaps the previous kernel's tail. q and the new K/V rows come
  // from the previous kernel: they are read after the wait.
  const AttnSeq sq = p.seqs[seq];
  const int ctx = sq.ctx_len;
  // The splits cut the keys the new token sees (the whole context, or its window's last
  // keys) into KT-multiple ranges; the last position (the new token) lies in the last
  // non-empty one.
  const int first = p.window > 0 ? max(0, ctx - p.window) : 0;
  const int chunk = ((ctx - first + S - 1) / S + KT - 1) / KT * KT;
  const int lo = min(ctx, first + rank * chunk), hi = min(ctx, lo + chunk);
  const int newpos = ctx - 1;
  const bool has_new = lo < hi && hi == ctx;
  const int32_t* bt = p.block_tables + sq.bt_offset;
  const int ntiles = (hi - lo + KT - 1) / KT;
  const int my_tiles = ntiles > warp ? (ntiles - warp + kDecWarps - 1) / kDecWarps : 0;

  // Lane j's key of this warp's tile i: its pool block (0 past the range).
  auto tile_block = [&](int i) -> int {
    const int pos = lo + (warp + i * kDecWarps) * KT + lane;
    return i < my_tiles && lane < KT && pos < hi ? __ldg(bt + pos / p.block_size) : 0;
  };
  // Issues tile i's copies into stage i % ST (keys past hi and the new token's: zeros);
  // always commits a group, so that a wait for "all but the newest" is tile i's.
  auto issue = [&](int i, int blk) {
    if (i < my_tiles) {
      const int t0 = lo + (warp + i * kDecWarps) * KT;
      unsigned char* st = wbase + (i % ST) * L::kStage;
#pragma unroll
      for (int e = lane; e < KT * CPR; e += 32) {
        const int j = e / CPR, c = e % CPR, pos = t0 + j;
        const int b = __shfl_sync(kFull, blk, j);
        const bool in = pos < hi && !(has_new && pos == newpos);
        const int64_t off = in ? (int64_t(b) * p.block_size + pos % p.block_size) * p.kv_row + int64_t(kvh) * D + c * CVEC : 0;
        cp_async16(st + j * ROWB + c * 16, kc + off, in);
        cp_async16(st + TILEB + j * ROWB + c * 16, vc + off, in);
      }
      if constexpr (kQuant) {
        const int pos = t0 + lane;
        if (lane < KT) {
          const bool in = pos < hi && !(has_new && pos == newpos);
          const int64_t row = in ? (int64_t(blk) * p.block_size + pos % p.block_size) * p.hkv + kvh : 0;
          float* sc = reinterpret_cast<float*>(st + 2 * L::kTileC);
          dec_cp_async4(sc + lane, p.k_scales + row, in);
          dec_cp_async4(sc + KT + lane, p.v_scales + row, in);
        }
      }
    }
    cp_async_commit();
  };

  const bool rope = p.inv_freq != nullptr;
  const int qpos = rope ? p.positions[sq.q_start] : 0;
  int blk0 = tile_block(0), blk1 = ST == 2 ? tile_block(1) : 0;
  issue(0, blk0);
  if constexpr (ST == 2) issue(1, blk1);
  int blk_next = tile_block(ST);

  pdl_wait();  // programmatic dependent launch: the previous kernel's writes are visible
  // The q rows and the new K/V rows, loads in flight together.
  constexpr int QV = 8;  // 16-bit elements per 16-byte vector
  const int qr = threadIdx.x / (D / QV), qc = (threadIdx.x % (D / QV)) * QV;
  // Rows per pass over the q rows: 16 / 10 / 8 / 4 at head dim 64 / 96 / 128 / 256
  // (kDecMaxGroup rows are written, those past the group zero).
  constexpr int QP = kDecThreads / (D / QV), QPASSES = (kDecMaxGroup + QP - 1) / QP;
  uint4 qraw[QPASSES], nraw = make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int i = 0; i < QPASSES; ++i) {
    const int r = qr + i * QP;
    qraw[i] = r < group ? *reinterpret_cast<const uint4*>(p.q + int64_t(sq.q_start) * p.q_stride +
                                                          int64_t(kvh * group + r) * D + qc)
                        : make_uint4(0, 0, 0, 0);
  }
  const bool loads_new = has_new && threadIdx.x < 2 * (D / QV);
  if (loads_new) {
    const int which = threadIdx.x / (D / QV);
    nraw = *reinterpret_cast<const uint4*>((which ? p.v_new : p.k_new) + int64_t(sq.q_start) * p.new_stride +
                                           int64_t(kvh) * D + qc);
  }

#pragma unroll
  for (int i = 0; i < QPASSES; ++i)
    if (qr + i * QP < kDecMaxGroup) *reinterpret_cast<uint4*>(&q_s[(qr + i * QP) * LD + qc]) = qraw[i];
  if (loads_new) *reinterpret_cast<uint4*>(&new_t[threadIdx.x / (D / QV) * D + qc]) = nraw;
  __syncthreads();
  if (rope) {
    dec_rope_rows(q_s, LD, new_t, group, has_new, p.rot, qpos, p.inv_freq, int(threadIdx.x), kDecThreads);
    __syncthreads();
  }
  if constexpr (kQuant) {
    // Keys stored rotated: so are the q rows (as 16-bit values, the MMAs' A operand).
    if (p.k_rotate) kv_rotate_rows<D>(q_s, group, LD, kDecWarps);
    // Warp 0 quantizes the new K row, warp 1 the V row: kv_quant_write_kernel's codes
    // and scales (the CPU backend's).
    if (has_new && warp < 2) {
      const float* shift = warp == 0 && p.k_shift ? p.k_shift + kvh * D : nullptr;  // keys only
      const float sc = kv_quantize_row<T, Q>(new_t + warp * D, D, new_c + warp * D, shift, warp == 0 && p.k_rotate);
      if (lane == 0) new_sc[warp] = sc;
    }
    __syncthreads();
  }
  if (has_new) {
    const int64_t slot = p.slots[sq.q_start];
    if (slot >= 0) {
      const int64_t at = slot * p.kv_row + int64_t(kvh) * D;
      if (threadIdx.x < 2 * CPR) {
        const int which = threadIdx.x / CPR, c = (threadIdx.x % CPR) * 16;  // bytes
        const unsigned char* src =
            kQuant ? new_c + which * D + c : reinterpret_cast<const unsigned char*>(new_t + which * D) + c;
        auto* dst = reinterpret_cast<unsigned char*>(static_cast<E*>(which ? p.v_cache : p.k_cache) + at) + c;
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
      }
      if constexpr (kQuant) {
        if (threadIdx.x < 2) (threadIdx.x ? p.v_scales : p.k_scales)[slot * p.hkv + kvh] = new_sc[threadIdx.x];
      }
    }
  }

  // This thread's A fragments of Q: row g (head g of the group), rows g + 8 are zero.
  uint32_t qa[KC][2];
#pragma unroll
  for (int k = 0; k < KC; ++k) {
    qa[k][0] = *reinterpret_cast<const uint32_t*>(&q_s[g * LD + k * 16 + 2 * t]);
    qa[k][1] = *reinterpret_cast<const uint32_t*>(&q_s[g * LD + k * 16 + 8 + 2 * t]);
  }
  float o[DT][4], m = -INFINITY, l = 0.0f;
#pragma unroll
  for (int i = 0; i < DT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;

  for (int i = 0; i < my_tiles; ++i) {
    cp_async_wait<ST - 1>();  // tile i has landed (this lane's copies)...
    __syncwarp();                      // ...and every lane's
    const int t0 = lo + (warp + i * kDecWarps) * KT;
    unsigned char* st = wbase + (i % ST) * L::kStage;
    if (has_new && newpos >= t0 && newpos < t0 + KT) {  // the new token's row, from shared memory
      const int jn = newpos - t0;
      constexpr int RC = D * int(sizeof(E)) / 16;
      for (int e = lane; e < 2 * RC; e += 32) {  // one pass up to head dim 128 in 16 bits
        const int which = e / RC, c = (e % RC) * 16;
        const unsigned char* src =
            kQuant ? new_c + which * D + c : reinterpret_cast<const unsigned char*>(new_t + which * D) + c;
        *reinterpret_cast<uint4*>(st + which * TILEB + jn * ROWB + c) = *reinterpret_cast<const uint4*>(src);
      }
      if constexpr (kQuant) {
        if (lane < 2) reinterpret_cast<float*>(st + 2 * L::kTileC)[lane * KT + jn] = new_sc[lane];
      }
      __syncwarp();
    }
    const T* ks;
    const T* vs;
    if constexpr (kQuant) {
      // Codes to 16-bit values with the row's scale folded in (as the flash kernel's tiles).
      T* kt = reinterpret_cast<T*>(wbase + ST * L::kStage);
      T* vt = kt + KT * LD;
      const float* sc = reinterpret_cast<const float*>(st + 2 * L::kTileC);
#pragma unroll
      for (int e = lane; e < 2 * KT * (D / 8); e += 32) {
        const int which = e / (KT * (D / 8)), r = e % (KT * (D / 8)), j = r / (D / 8), c = (r % (D / 8)) * 8;
        const uint2 raw = *reinterpret_cast<const uint2*>(st + which * L::kTileC + j * D + c);
        const float s = sc[which * KT + j] * kv_code_unit<Q>();
        float f[8];
        kv_decode4<Q>(raw.x, f);
        kv_decode4<Q>(raw.y, f + 4);
        *reinterpret_cast<uint4*>(&(which ? vt : kt)[j * LD + c]) =
            make_uint4(pack2<T>(f[0] * s, f[1] * s), pack2<T>(f[2] * s, f[3] * s), pack2<T>(f[4] * s, f[5] * s),
                       pack2<T>(f[6] * s, f[7] * s));
      }
      __syncwarp();
      ks = kt;
      vs = vt;
    } else {
      ks = reinterpret_cast<const T*>(st);
      vs = reinterpret_cast<const T*>(st + L::kTileT);
    }

    dec_tile_attend<T, D, KT, LD>(ks, vs, qa, t0, hi, p.scale_log2, p.softcap_in, p.softcap_out, o, m, l);
    __syncwarp();  // every lane is done with this stage before it is refilled
    issue(i + ST, blk_next);
    blk_next = tile_block(i + ST + 1);
  }
  cp_async_wait<0>();
  pdl_trigger();  // the keys and values are read: the next kernel may launch

  // The warps' partials (m, l, unnormalized O of rows < group) -> their own regions.
  l += __shfl_xor_sync(kFull, l, 1);
  l += __shfl_xor_sync(kFull, l, 2);
  __syncwarp();
  {
    float* po = reinterpret_cast<float*>(wbase);
    if (g < group) {
#pragma unroll
      for (int i = 0; i < DT; ++i)
        *reinterpret_cast<float2*>(&po[g * D + i * 8 + 2 * t]) = make_float2(o[i][0], o[i][1]);
      if (t == 0) {
        po[kDecMaxGroup * D + 2 * g] = m;
        po[kDecMaxGroup * D + 2 * g + 1] = l;
      }
    }
  }
  __syncthreads();
  // Merge the warps: each thread takes dim pairs (r, c..c+1); unsplit: the output.
  const int pairs = group * (D / 2);
  float* cpo = reinterpret_cast<float*>(smem + L::kPart);  // the CTA's partial, in warp 0's region
  T* out_base = p.out + (int64_t(sq.q_start) * p.hq + int64_t(kvh) * group) * D;
  for (int e = threadIdx.x; e < pairs; e += kDecThreads) {
    const int r = e / (D / 2), c = (e % (D / 2)) * 2;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kDecWarps; ++w)
      mx = fmaxf(mx, reinterpret_cast<const float*>(smem + w * L::kWarp)[kDecMaxGroup * D + 2 * r]);
    float den = 0.0f, n0 = 0.0f, n1 = 0.0f;
#pragma unroll
    for (int w = 0; w < kDecWarps; ++w) {
      const float* po = reinterpret_cast<const float*>(smem + w * L::kWarp);
      const float mw = po[kDecMaxGroup * D + 2 * r];
      if (mw == -INFINITY) continue;  // that warp saw no key
      const float f = exp2f(mw - mx);
      den += f * po[kDecMaxGroup * D + 2 * r + 1];
      const float2 v = *reinterpret_cast<const float2*>(&po[r * D + c]);
      n0 += f * v.x;
      n1 += f * v.y;
    }
    if (S == 1) {
      const float inv = den > 0.0f ? 1.0f / den : 0.0f;
      *reinterpret_cast<uint32_t*>(out_base + r * D + c) = pack2<T>(n0 * inv, n1 * inv);
    } else {
      *reinterpret_cast<float2*>(&cpo[r * D + c]) = make_float2(n0, n1);
      if (c == 0) {
        cpo[kDecMaxGroup * D + 2 * r] = mx;
        cpo[kDecMaxGroup * D + 2 * r + 1] = den;
      }
    }
  }
  if (S == 1) return;
  // Split: the cluster's CTAs merge their partials, each a share of the pairs, reading
  // the others' shared memory; the second sync keeps every CTA's memory alive until then.
  dec_cluster_sync();
  const int per = (pairs + S - 1) / S, end = min(pairs, (rank + 1) * per);
  for (int e = rank * per + int(threadIdx.x); e < end; e += kDecThreads) {
    const int r = e / (D / 2), c = (e % (D / 2)) * 2;
    float mx = -INFINITY;
    for (int k = 0; k < S; ++k) mx = fmaxf(mx, dec_rank_smem(cpo, k)[kDecMaxGroup * D + 2 * r]);
    float den = 0.0f, n0 = 0.0f, n1 = 0.0f;
    for (int k = 0; k < S; ++k) {
      const float* po = dec_rank_smem(cpo, k);
      const float mk = po[kDecMaxGroup * D + 2 * r];
      if (mk == -INFINITY) continue;  // an empty split
      const float f = exp2f(mk - mx);
      den += f * po[kDecMaxGroup * D + 2 * r + 1];
      const float2 v = *reinterpret_cast<const float2*>(&po[r * D + c]);
      n0 += f * v.x;
      n1 += f * v.y;
    }
    const float inv = den > 0.0f ? 1.0f / den : 0.0f;
    *reinterpret_cast<uint32_t*>(out_base + r * D + c) = pack2<T>(n0 * inv, n1 * inv);
  }
  dec_cluster_sync();
}

// The decode kernels' parameters of a launch's arguments (head dim D).
template <typename T, int D>
DecParams<T> dec_params_of(const AttentionArgs& a) {
  DecParams<T> p;
  p.q = static_cast<const T*>(a.q);
  p.q_stride = a.q_stride ? a.q_stride : a.hq * D;
  p.k_cache = const_cast<void*>(a.k_cache);
  p.v_cache = const_cast<void*>(a.v_cache);
  p.k_scales = const_cast<float*>(a.k_scales);
  p.v_scales = const_cast<float*>(a.v_scales);
  p.k_shift = a.k_shift;
  p.k_rotate = a.k_rotate;
  p.out = static_cast<T*>(a.out);
  p.block_size = int(a.block_size);
  p.hq = int(a.hq);
  p.hkv = int(a.hkv);
  p.splits = a.decode_splits;
  p.rot = int(a.rotary_dim);
  p.kv_row = a.kv_stride ? a.kv_stride : a.hkv * D;
  p.scale_log2 = a.scale * kLog2e;
  p.seqs = a.seqs;
  p.block_tables = a.block_tables;
  p.k_new = static_cast<const T*>(a.k_new);
  p.v_new = static_cast<const T*>(a.v_new);
  p.new_stride = a.new_stride;
  p.positions = a.positions;
  p.inv_freq = a.inv_freq;
  p.slots = a.slot_mapping;
  p.early_trigger = a.early_trigger;
  p.window = int(a.window);
  if (a.softcap > 0.0f) {
    // s * scale capped, in units of s: (softcap / scale) * tanh(s * (scale / softcap)).
    p.softcap_in = a.scale / a.softcap;
    p.softcap_out = a.softcap / a.scale;
  }
  return p;
}

// The kernel of T, D, Q, ST, ready to launch (smem_kernel_ready).
template <typename T, int D, KvCode Q, int ST>
auto decode_cluster_kernel_ready() {
  return smem_kernel_ready<attention_decode_cluster_kernel<T, D, Q, ST>, DecLayout<D, Q, ST>::kBytes>();
}

// Launches the kernel for T, D, Q, ST over (sequences x splits, KV heads), clusters of
// `splits`.
template <typename T, int D, KvCode Q, int ST>
void launch_decode_cluster_staged(const AttentionArgs& a, cudaStream_t s) {
  using L = DecLayout<D, Q, ST>;
  auto* kernel = decode_cluster_kernel_ready<T, D, Q, ST>();
  const DecParams<T> p = dec_params_of<T, D>(a);
  const dim3 grid(unsigned(a.num_seqs) * unsigned(a.decode_splits), unsigned(a.hkv));
  launch_k_cluster(kernel, grid, dim3(kDecThreads), size_t(L::kBytes), s, dim3(unsigned(a.decode_splits), 1, 1), p);
  KILN_CUDA_CHECK_LAUNCH();
}

// The stages (see kDecStagesMax): 1 when the grid exceeds one wave of the 2-stage
// kernel (its resident CTAs per SM as the occupancy calculator counts them, asked once per
// device) unless KILN_CUDA_DECODE_STAGES forces them. The grid depends only on the batch
// and head shapes, so a captured graph replays the kernel it captured.
template <typename T, int D, KvCode Q>
void launch_decode_cluster_typed(const AttentionArgs& a, cudaStream_t s) {
  int st = attention_decode_stages_from_env();
  if (st == 0) {
    constexpr int kMaxDevices = 64;
    static std::atomic<int64_t> wave[kMaxDevices];  // CTAs of one 2-stage wave; 0: not asked
    int dev = 0;
    KILN_CUDA_CHECK(cudaGetDevice(&dev));
    int64_t w = dev >= 0 && dev < kMaxDevices ? wave[dev].load() : 0;
    if (w == 0) {
      int per_sm = 0, sms = 0;
      KILN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
          &per_sm, decode_cluster_kernel_ready<T, D, Q, 2>(), kDecThreads, DecLayout<D, Q, 2>::kBytes));
      KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
      w = std::max<int64_t>(1, int64_t(per_sm) * sms);
      if (dev >= 0 && dev < kMaxDevices) wave[dev].store(w);
    }
    st = a.num_seqs * a.decode_splits * a.hkv > w ? 1 : 2;
  }
  if (st == 1)
    launch_decode_cluster_staged<T, D, Q, 1>(a, s);
  else
    launch_decode_cluster_staged<T, D, Q, 2>(a, s);
}

template <KvCode Q>
void launch_decode_cluster_codes(const AttentionArgs& a, cudaStream_t s) {
  if (a.dtype == DType::kBF16) {
    if (a.d == 64)
      launch_decode_cluster_typed<__nv_bfloat16, 64, Q>(a, s);
    else if (a.d == 96)
      launch_decode_cluster_typed<__nv_bfloat16, 96, Q>(a, s);
    else if (a.d == 128)
      launch_decode_cluster_typed<__nv_bfloat16, 128, Q>(a, s);
    else
      launch_decode_cluster_typed<__nv_bfloat16, 256, Q>(a, s);
  } else {
    if (a.d == 64)
      launch_decode_cluster_typed<__half, 64, Q>(a, s);
    else if (a.d == 96)
      launch_decode_cluster_typed<__half, 96, Q>(a, s);
    else if (a.d == 128)
      launch_decode_cluster_typed<__half, 128, Q>(a, s);
    else
      launch_decode_cluster_typed<__half, 256, Q>(a, s);
  }
}

}  // namespace
}  // namespace kiln::cuda
