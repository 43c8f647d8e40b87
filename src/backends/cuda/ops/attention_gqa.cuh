// Internal to the CUDA backend's attention: the grouped-query decode kernel (one query
// row per sequence). A CTA takes one (sequence, KV head, split) and all the GP >= group
// q heads of its GQA group, so each K/V tile is read from the cache once for the whole
// group: 16-byte cp.async copies gathered through the block table into a two-stage
// shared-memory ring (the next tile is in flight while this one is scored), q in shared
// memory as f32, scores S[group][keys] from K rows read as 16-byte vectors, an online
// softmax per head (one warp per head), and P·V with threads over (head, dim pair).
// Accumulation is f32 as in the other kernels. With the step's new K/V rows (decode steps
// with a KV cache) it also does the step's front end and back end: it rotates q and the
// new key (qkv_prep_kernel's arithmetic and rounding), takes the new token's K/V from the
// step's rows (the CTA of the split holding the last position writes them into the cache
// - quantized first, as kv_quant_write_kernel does, for an int8/fp8 cache: no CTA of this
// launch reads that slot from the cache); without them (steps without a cache) it reads
// every key from the rows in place. The last split of a (sequence, KV head) to finish
// merges the partials. Templated on the activation type T, head dim D, the padded group
// GP and the cache codes Q; instantiated in attention_fused.cu (16/32-bit caches) and
// attention_fused_quant.cu (int8/fp8). Tested in tests/backends/cuda/attention_test.cpp.
#pragma once

#include "backends/cuda/ops/attention_kernels.cuh"

namespace kiln::cuda {
namespace {

constexpr int kGqaThreads = 128;

// Keys per tile: about 8 KiB of K (and as much of V) per stage.
template <int D, int ElemBytes>
constexpr int gqa_tile_keys() {
  constexpr int k = 8192 / (D * ElemBytes);
  return k > 64 ? 64 : (k < 16 ? 16 : k);
}

// 4 bytes global -> shared (the per-key scales of a quantized cache), zero-filled when !valid.
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, bool valid) {
  const unsigned dst = unsigned(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(gmem), "r"(valid ? 4 : 0));
}

// Two consecutive cache elements (dims c, c + 1 of one V row in shared memory) as f32;
// codes still to be multiplied by their row's scale.
template <typename T, KvCode Q>
__device__ __forceinline__ float2 gqa_load2(const KvElem<T, Q>* p) {
  if constexpr (Q != KvCode::kNone) {
    return make_float2(kv_decode1<Q>(p[0]), kv_decode1<Q>(p[1]));
  } else if constexpr (std::is_same_v<T, float>) {
    return *reinterpret_cast<const float2*>(p);
  } else {
    return make_float2(to_f32(p[0]), to_f32(p[1]));
  }
}

// The front end's and the merge's arguments (see AttentionArgs); k_new null: no new rows.
template <typename T>
struct GqaFused {
  const T* k_new = nullptr;
  const T* v_new = nullptr;
  int64_t new_stride = 0;
  const int32_t* positions = nullptr;
  const float* inv_freq = nullptr;  // null: no RoPE
  int rot = 0;
  const int64_t* slots = nullptr;
  void* k_cache = nullptr;  // writable views of the caches (elements of T, or codes)
  void* v_cache = nullptr;
  float* k_scales = nullptr;  // quantized caches
  float* v_scales = nullptr;
  const float* k_shift = nullptr;  // quantized caches: [hkv, D] or null
  bool k_rotate = false;           // quantized caches: AttentionArgs::k_rotate
  int32_t* counters = nullptr;
  const AttnCombine* combine = nullptr;
  bool early_trigger = false;  // AttentionArgs::early_trigger
};

template <typename T, int D, int GP, KvCode Q>
__global__ void __launch_bounds__(kGqaThreads)
attention_gqa_decode_kernel(const T* __restrict__ q, const KvElem<T, Q>* __restrict__ k_cache,
                            const KvElem<T, Q>* __restrict__ v_cache, const float* __restrict__ k_scales,
                            const float* __restrict__ v_scales, T* __restrict__ out, int block_size, int hq, int hkv,
                            int64_t q_stride, int64_t kv_row, float scale, const AttnSeq* __restrict__ seqs,
                            const int32_t* __restrict__ block_tables, const AttnWork* __restrict__ works,
                            float* __restrict__ part_o, float* __restrict__ part_ml, GqaFused<T> f) {
  using E = KvElem<T, Q>;
  constexpr int kThreads = kGqaThreads, kWarpsG = kThreads / 32;
  constexpr int EB = int(sizeof(E)), KEYS = gqa_tile_keys<D, EB>();
  constexpr int CVEC = 16 / EB, CVPR = D / CVEC;  // the cache's 16-byte vectors per row
  constexpr int LD = D + CVEC;                    // +16 bytes: 8 rows' 16-byte reads hit distinct banks
  constexpr int VEC = 16 / int(sizeof(T)), VPR = D / VEC;
  constexpr bool kQuant = Q != KvCode::kNone;
  static_assert(D % CVEC == 0 && D % VEC == 0 && GP <= kAttnItemsPerCta);
  __shared__ __align__(16) E kv_s[2][2][KEYS * LD];  // [stage][K, V][key * LD + dim]
  __shared__ float sc_s[2][2][kQuant ? KEYS : 1];    // [stage][K, V][key]: quantized caches' scales
  __shared__ __align__(16) float qs[GP][D];
  __shared__ float ps[GP][KEYS];
  __shared__ float corr_s[GP], m_s[GP], l_s[GP];
  __shared__ __align__(16) T new_s[2][D];  // the new token's (rotated) k and v
  // With a quantized cache: the new rows' codes and scales.
  __shared__ __align__(16) uint8_t newc_s[2][kQuant ? D : 16];
  __shared__ float newsc_s[2];
  __shared__ int last_s;

  if (f.early_trigger) pdl_trigger();  // see AttentionArgs::early_trigger
  pdl_wait();  // programmatic dependent launch: the previous kernel's writes are visible
  const AttnWork w = works[blockIdx.x];
  if (w.partial >= 0 && w.kv_begin >= w.kv_end && w.kv_begin > 0) return;  // an empty split: never combined
  const AttnSeq sq = seqs[w.seq];
  const int kvh = blockIdx.y, group = hq / hkv;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // The sequence's one query row is its last position: it sees every key of the context.
  const int lo = w.kv_begin, hi = min(sq.ctx_len, w.kv_end);
  const int32_t* bt = block_tables + sq.bt_offset;
  // With new rows: the split holding the last position (the new token) takes its K/V
  // from the step's rows and writes them into the cache.
  const int newpos = sq.ctx_len - 1;
  const bool has_new = f.k_new && lo < hi && hi == sq.ctx_len;

  // Issues the copies of keys [t0, t0 + KEYS) into stage st (keys past hi: zeros). The
  // first tile's copies go out before q is loaded (and rotated), so that they overlap.
  auto load_tile = [&](int t0, int st) {
    for (int e = threadIdx.x; e < KEYS * CVPR; e += kThreads) {
      const int j = e / CVPR, c = (e % CVPR) * CVEC, p = t0 + j;
      if (has_new && p == newpos) continue;  // not in the cache yet: stored from new_s below
      const bool in = p < hi;
      const int64_t slot = in ? int64_t(bt[p / block_size]) * block_size + p % block_size : 0;
      const int64_t off = slot * kv_row + int64_t(kvh) * D + c;
      cp_async16(&kv_s[st][0][j * LD + c], k_cache + off, in);
      cp_async16(&kv_s[st][1][j * LD + c], v_cache + off, in);
      if constexpr (kQuant) {
        if (c == 0) {
          cp_async4(&sc_s[st][0][j], k_scales + slot * hkv + kvh, in);
          cp_async4(&sc_s[st][1][j], v_scales + slot * hkv + kvh, in);
        }
      }
    }
    cp_async_commit();
  };

  const int ntiles = hi > lo ? (hi - lo + KEYS - 1) / KEYS : 0;
  if (ntiles > 0) load_tile(lo, 0);

  const bool rope = f.inv_freq != nullptr;
  for (int e = threadIdx.x; e < GP * VPR; e += kThreads) {
    const int r = e / VPR, c = (e % VPR) * VEC;
    uint4 raw = make_uint4(0, 0, 0, 0);
    if (r < group)
      raw = *reinterpret_cast<const uint4*>(q + int64_t(sq.q_start) * q_stride + int64_t(kvh * group + r) * D + c);
    const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < VEC; ++i) qs[r][c + i] = rope ? to_f32(v[i]) : to_f32(v[i]) * scale;
  }
  if (has_new)
    for (int e = threadIdx.x; e < 2 * VPR; e += kThreads) {
      const int which = e / VPR, c = (e % VPR) * VEC;
      const T* src = (which ? f.v_new : f.k_new) + int64_t(sq.q_start) * f.new_stride + int64_t(kvh) * D + c;
      *reinterpret_cast<uint4*>(&new_s[which][c]) = *reinterpret_cast<const uint4*>(src);
    }
  if (rope) {
    __syncthreads();
    // Rotated values round to T (as qkv_prep_kernel stores them), then q takes the scale.
    const int half = f.rot / 2, pos = f.positions[sq.q_start];
    for (int e = threadIdx.x; e < GP * half; e += kThreads) {
      const int r = e / half, u = e % half;
      float x1 = qs[r][u], x2 = qs[r][u + half];
      rope_pair(x1, x2, pos, f.inv_freq[u]);
      qs[r][u] = to_f32(from_f32<T>(x1)) * scale;
      qs[r][u + half] = to_f32(from_f32<T>(x2)) * scale;
    }
    for (int e = threadIdx.x; e < GP * (D - f.rot); e += kThreads) qs[e / (D - f.rot)][f.rot + e % (D - f.rot)] *= scale;
    if (has_new)
      for (int u = threadIdx.x; u < half; u += kThreads) {
        float x1 = to_f32(new_s[0][u]), x2 = to_f32(new_s[0][u + half]);
        rope_pair(x1, x2, pos, f.inv_freq[u]);
        new_s[0][u] = from_f32<T>(x1);
        new_s[0][u + half] = from_f32<T>(x2);
      }
  }
  __syncthreads();  // new_s is final before a tile copies it
  if constexpr (kQuant) {
    // Keys stored rotated: so are the queries (after their scale).
    if (f.k_rotate) kv_rotate_rows<D>(&qs[0][0], GP, D, kWarpsG);
    // Warp 0 quantizes the new K row, warp 1 the V row: the codes and scales of
    // kv_quant_write_kernel and the CPU backend.
    if (has_new && warp < 2) {
      const float* shift = warp == 0 && f.k_shift ? f.k_shift + kvh * D : nullptr;  // keys only
      const float sc = kv_quantize_row<T, Q>(new_s[warp], D, newc_s[warp], shift, warp == 0 && f.k_rotate);
      if (lane == 0) newsc_s[warp] = sc;
    }
    __syncthreads();
  }
  const int64_t slot = has_new && f.k_cache ? f.slots[sq.q_start] : -1;
  if (slot >= 0) {
    for (int e = threadIdx.x; e < 2 * CVPR; e += kThreads) {
      const int which = e / CVPR, c = (e % CVPR) * CVEC;
      E* dst = static_cast<E*>(which ? f.v_cache : f.k_cache) + slot * kv_row + int64_t(kvh) * D + c;
      if constexpr (kQuant)
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(&newc_s[which][c]);
      else
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(&new_s[which][c]);
    }
    if constexpr (kQuant) {
      if (threadIdx.x < 2) (threadIdx.x ? f.v_scales : f.k_scales)[slot * hkv + kvh] = newsc_s[threadIdx.x];
    }
  }

  // Scores: thread -> key kj, heads sset, sset + SSETS, ...
  constexpr int SSETS = kThreads / KEYS, SRR = (GP + SSETS - 1) / SSETS;
  const int kj = threadIdx.x % KEYS, sset = threadIdx.x / KEYS;
  // Softmax: warp -> heads warp, warp + 4, ...
  constexpr int SR = (GP + kWarpsG - 1) / kWarpsG;
  float m[SR], l[SR];
#pragma unroll
  for (int i = 0; i < SR; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
  }
  // P·V: thread -> dims (2 c2, 2 c2 + 1) of heads set, set + SETS, ...
  constexpr int PAIRS = D / 2, SETS = kThreads / PAIRS, AR = (GP + SETS - 1) / SETS;
  static_assert(kThreads % PAIRS == 0);
  const int c2 = threadIdx.x % PAIRS, set = threadIdx.x / PAIRS;
  float acc[AR][2];
#pragma unroll
  for (int i = 0; i < AR; ++i) acc[i][0] = acc[i][1] = 0.0f;

  for (int it = 0; it < ntiles; ++it) {
    const int t0 = lo + it * KEYS, st = it & 1;
    __syncthreads();  // the other stage's tile is consumed (and qs written, on the first pass)
    if (it + 1 < ntiles) {
      load_tile(t0 + KEYS, st ^ 1);
      cp_async_wait<1>();  // this tile has landed; the next one stays in flight
    } else {
      cp_async_wait<0>();
    }
    // The new key's row of this tile (the copies skipped it): from new_s, final since the
    // barrier after the rotation.
    if (has_new && newpos >= t0 && newpos < t0 + KEYS) {
      const int jn = newpos - t0;
      for (int e = threadIdx.x; e < 2 * CVPR; e += kThreads) {
        const int which = e / CVPR, c = (e % CVPR) * CVEC;
        uint4* dst = reinterpret_cast<uint4*>(&kv_s[st][which][jn * LD + c]);
        if constexpr (kQuant)
          *dst = *reinterpret_cast<const uint4*>(&newc_s[which][c]);
        else
          *dst = *reinterpret_cast<const uint4*>(&new_s[which][c]);
      }
      if constexpr (kQuant) {
        if (threadIdx.x < 2) sc_s[st][threadIdx.x][jn] = newsc_s[threadIdx.x];
      }
    }
    __syncthreads();
    const E* ks = kv_s[st][0];
    const E* vs = kv_s[st][1];
    {
      float s[SRR];
#pragma unroll
      for (int i = 0; i < SRR; ++i) s[i] = 0.0f;
      const E* kr = ks + kj * LD;
#pragma unroll
      for (int c = 0; c < D; c += CVEC) {
        float kf[CVEC];
        kv_load_vec<T, Q>(*reinterpret_cast<const uint4*>(kr + c), kf);
#pragma unroll
        for (int i = 0; i < SRR; ++i) {
          const int r = sset + i * SSETS;
          if (r < GP) {
#pragma unroll
            for (int u = 0; u < CVEC; ++u) s[i] += qs[r][c + u] * kf[u];
          }
        }
      }
      float ksc = 1.0f;
      if constexpr (kQuant) ksc = sc_s[st][0][kj] * kv_code_unit<Q>();  // q . (s c) = s (q . c)
      const bool vis = t0 + kj < hi;
#pragma unroll
      for (int i = 0; i < SRR; ++i) {
        const int r = sset + i * SSETS;
        if (r < GP) ps[r][kj] = vis ? s[i] * ksc : -INFINITY;
      }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < SR; ++i) {
      const int r = warp + i * kWarpsG;
      if (r >= group) continue;  // uniform across the warp
      const float v0 = lane < KEYS ? ps[r][lane] : -INFINITY;
      const float v1 = KEYS > 32 ? ps[r][(lane + 32) % KEYS] : -INFINITY;
      const float m_new = fmaxf(m[i], warp_max(fmaxf(v0, v1)));  // finite: key t0 is visible
      const float corr = expf(m[i] - m_new);
      const float p0 = expf(v0 - m_new), p1 = expf(v1 - m_new);
      l[i] = l[i] * corr + warp_sum(p0 + p1);
      if (lane < KEYS) ps[r][lane] = p0;
      if (KEYS > 32) ps[r][lane + 32] = p1;
      if (lane == 0) corr_s[r] = corr;
      m[i] = m_new;
    }
    if constexpr (kQuant) {
      // The weight of V's codes: p times the key's V scale (l keeps the plain sum).
      __syncthreads();
      for (int e = threadIdx.x; e < GP * KEYS; e += kThreads) {
        const int r = e / KEYS, j = e % KEYS;
        if (r < group) ps[r][j] *= sc_s[st][1][j] * kv_code_unit<Q>();
      }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < AR; ++i) {
      const int r = set + i * SETS;
      if (r < group) {
        const float corr = corr_s[r];
        acc[i][0] *= corr;
        acc[i][1] *= corr;
      }
    }
    const int nk = min(KEYS, hi - t0);
#pragma unroll 4
    for (int j = 0; j < nk; ++j) {
      const float2 vv = gqa_load2<T, Q>(vs + j * LD + 2 * c2);
#pragma unroll
      for (int i = 0; i < AR; ++i) {
        const int r = set + i * SETS;
        if (r < group) {
          const float pj = ps[r][j];
          acc[i][0] += pj * vv.x;
          acc[i][1] += pj * vv.y;
        }
      }
    }
  }

  pdl_trigger();  // the keys and values are read: the next kernel may launch
#pragma unroll
  for (int i = 0; i < SR; ++i) {
    const int r = warp + i * kWarpsG;
    if (r < group && lane == 0) {
      m_s[r] = m[i];
      l_s[r] = l[i];
    }
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < AR; ++i) {
    const int r = set + i * SETS;
    if (r >= group) continue;
    if (w.partial < 0) {
      const float inv = l_s[r] > 0.0f ? 1.0f / l_s[r] : 0.0f;
      T* o = out + (int64_t(sq.q_start) * hq + kvh * group + r) * D + 2 * c2;
      o[0] = from_f32<T>(acc[i][0] * inv);
      o[1] = from_f32<T>(acc[i][1] * inv);
    } else {
      const int64_t base = (int64_t(w.partial) * hkv + kvh) * kAttnItemsPerCta + r;
      part_o[base * D + 2 * c2] = acc[i][0];
      part_o[base * D + 2 * c2 + 1] = acc[i][1];
      if (c2 == 0) {
        part_ml[base * 2] = m_s[r];
        part_ml[base * 2 + 1] = l_s[r];
      }
    }
  }
  if (w.partial < 0) return;
  // The last split of (sequence, KV head) to get here merges: every split's partial is
  // written and fenced before its ticket; the counter goes back to zero.
  __threadfence();
  __syncthreads();
  const AttnCombine cb = f.combine[w.combine];
  if (threadIdx.x == 0) {
    int32_t* ctr = f.counters + int64_t(w.combine) * hkv + kvh;
    const int ticket = atomicAdd(ctr, 1);
    last_s = ticket == cb.num_splits - 1;
    if (last_s) *ctr = 0;
  }
  __syncthreads();
  if (!last_s) return;
  __threadfence();
  for (int r = warp; r < group; r += kWarpsG) {
    auto base_of = [&](int sp) { return (int64_t(cb.partial_begin + sp) * hkv + kvh) * kAttnItemsPerCta + r; };
    merge_partials<T, D, true>(out + (int64_t(sq.q_start) * hq + kvh * group + r) * D, cb.num_splits, base_of,
                               part_o, part_ml);
  }
}

// The grouped-query decode kernel for T, D and Q, the padded group picked from hq / hkv
// (<= 8).
template <typename T, int D, KvCode Q>
void launch_gqa_typed(const AttentionArgs& a, cudaStream_t s) {
  const TypedAttention<T, D, Q> ta(a);
  GqaFused<T> f;
  f.k_new = static_cast<const T*>(a.k_new);
  f.v_new = static_cast<const T*>(a.v_new);
  f.new_stride = a.new_stride;
  f.positions = a.positions;
  f.inv_freq = a.inv_freq;
  f.rot = int(a.rotary_dim);
  f.slots = a.slot_mapping;
  f.k_cache = const_cast<void*>(a.k_cache);
  f.v_cache = const_cast<void*>(a.v_cache);
  f.k_scales = const_cast<float*>(a.k_scales);
  f.v_scales = const_cast<float*>(a.v_scales);
  f.k_shift = a.k_shift;
  f.k_rotate = a.k_rotate;
  f.counters = a.counters;
  f.combine = a.combine;
  f.early_trigger = a.early_trigger;
  auto go = [&](auto kernel) {
    launch_k(kernel, ta.grid, kGqaThreads, 0, s, ta.q, ta.k_cache, ta.v_cache, a.k_scales, a.v_scales, ta.out,
        int(a.block_size), int(a.hq), int(a.hkv), ta.q_stride, ta.kv_row, a.scale, a.seqs, a.block_tables, a.work,
        ta.part_o, ta.part_ml, f);
  };
  const int64_t group = a.hq / a.hkv;
  if (group == 1)
    go(attention_gqa_decode_kernel<T, D, 1, Q>);
  else if (group == 2)
    go(attention_gqa_decode_kernel<T, D, 2, Q>);
  else if (group <= 4)
    go(attention_gqa_decode_kernel<T, D, 4, Q>);
  else
    go(attention_gqa_decode_kernel<T, D, 8, Q>);
  KILN_CUDA_CHECK_LAUNCH();
}

// launch_gqa_typed for every activation dtype and head dim the grouped kernel takes with
// cache codes Q (quantized: 64 and 128).
template <KvCode Q>
void launch_gqa_codes(const AttentionArgs& a, cudaStream_t s) {
  attention_dispatch<Q != KvCode::kNone>(a.dtype, a.d, [&](auto t, auto d) {
    launch_gqa_typed<typename decltype(t)::type, decltype(d)::value, Q>(a, s);
  });
}

}  // namespace
}  // namespace kiln::cuda
