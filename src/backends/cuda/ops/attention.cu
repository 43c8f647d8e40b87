// Paged attention kernels (see attention.h). A CTA stages Q for its 16 items and then
// 32-key tiles of K and V (gathered through the block table, widened to f32) in shared
// memory; warp w owns items 4w..4w+3. For a tile, lane j scores key j against the
// warp's 4 queries, the warp folds the tile into each item's online softmax (running
// max m, sum l, unnormalized acc with dims lane, lane+32, ...) and accumulates P·V.
// This is CUDA-core math (no tensor cores yet): correct for any context length, GQA
// group and the head dims 16/32/64/128.
#include <algorithm>
#include <cmath>

#include "backends/cuda/common.cuh"
#include "backends/cuda/ops/attention.h"

namespace kiln::cuda {
namespace {

constexpr int kWarps = 4, kItemsPerWarp = 4, kTileKeys = 32;
static_assert(kWarps * kItemsPerWarp == kAttnItemsPerCta);

template <typename T, int D>
__global__ void __launch_bounds__(kWarps * 32)
attention_kernel(const T* __restrict__ q, const T* __restrict__ k_cache, const T* __restrict__ v_cache,
                 T* __restrict__ out, int block_size, int hq, int hkv, float scale, bool causal,
                 const AttnSeq* __restrict__ seqs, const int32_t* __restrict__ block_tables,
                 const AttnWork* __restrict__ works, float* __restrict__ part_o, float* __restrict__ part_ml) {
  constexpr int R = kItemsPerWarp, DPL = (D + 31) / 32;
  __shared__ float qs[kAttnItemsPerCta][D];
  __shared__ float ks[kTileKeys][D + 1];  // +1: lane j reads row j, column c -> distinct banks
  __shared__ float vs[kTileKeys][D];
  const AttnWork w = works[blockIdx.x];
  const AttnSeq sq = seqs[w.seq];
  const int kvh = blockIdx.y, group = hq / hkv;
  const int n_items = sq.q_len * group;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int ctx0 = sq.ctx_len - sq.q_len;  // position of the sequence's first new token

  for (int e = threadIdx.x; e < kAttnItemsPerCta * D; e += blockDim.x) {
    const int li = e / D, c = e % D, item = w.item_begin + li;
    float v = 0.0f;
    if (item < n_items) {
      const int64_t row = sq.q_start + item / group, h = kvh * group + item % group;
      v = to_f32(q[(row * hq + h) * D + c]) * scale;
    }
    qs[li][c] = v;
  }
  int lim[R];
  float m[R], l[R], acc[R][DPL];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int item = w.item_begin + warp * R + r;
    lim[r] = item < n_items ? min(causal ? ctx0 + item / group + 1 : sq.ctx_len, w.kv_end) : 0;
    m[r] = -INFINITY;
    l[r] = 0.0f;
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[r][i] = 0.0f;
  }
  const int last = min(n_items, w.item_begin + kAttnItemsPerCta) - 1;
  const int hi = min(w.kv_end, causal ? ctx0 + last / group + 1 : sq.ctx_len);
  const int32_t* bt = block_tables + sq.bt_offset;
  const int64_t kv_row = int64_t(hkv) * D;

  for (int t0 = w.kv_begin; t0 < hi; t0 += kTileKeys) {
    __syncthreads();  // the previous tile is consumed (and qs written, on the first pass)
    for (int e = threadIdx.x; e < kTileKeys * D; e += blockDim.x) {
      const int j = e / D, c = e % D, p = t0 + j;
      float kv = 0.0f, vv = 0.0f;
      if (p < hi) {
        const int64_t slot = int64_t(bt[p / block_size]) * block_size + p % block_size;
        const int64_t off = slot * kv_row + int64_t(kvh) * D + c;
        kv = to_f32(k_cache[off]);
        vv = to_f32(v_cache[off]);
      }
      ks[j][c] = kv;
      vs[j][c] = vv;
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
      if (t0 >= lim[r]) continue;  // uniform across the warp: no key of this tile is visible
      const float sv = p < lim[r] ? s[r] : -INFINITY;
      const float m_new = fmaxf(m[r], warp_max(sv));  // finite: key t0 is visible
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

// Merges a split sequence's partials: out = Σ e^(m_s - M) acc_s / Σ e^(m_s - M) l_s.
template <typename T, int D>
__global__ void attention_combine_kernel(T* __restrict__ out, int hq, int hkv, const AttnSeq* __restrict__ seqs,
                                         const AttnCombine* __restrict__ combines,
                                         const float* __restrict__ part_o, const float* __restrict__ part_ml) {
  const AttnCombine cb = combines[blockIdx.x];
  const AttnSeq sq = seqs[cb.seq];
  const int kvh = blockIdx.y, group = hq / hkv, n_items = sq.q_len * group;
  for (int e = threadIdx.x; e < n_items * D; e += blockDim.x) {
    const int li = e / D, c = e % D;
    float mx = -INFINITY;
    for (int sp = 0; sp < cb.num_splits; ++sp) {
      const int64_t base = (int64_t(cb.partial_begin + sp) * hkv + kvh) * kAttnItemsPerCta + li;
      mx = fmaxf(mx, part_ml[base * 2]);
    }
    float num = 0.0f, den = 0.0f;
    for (int sp = 0; sp < cb.num_splits; ++sp) {
      const int64_t base = (int64_t(cb.partial_begin + sp) * hkv + kvh) * kAttnItemsPerCta + li;
      const float ms = part_ml[base * 2];
      if (ms == -INFINITY) continue;  // this split saw no visible key of the item
      const float f = expf(ms - mx);
      den += f * part_ml[base * 2 + 1];
      num += f * part_o[base * D + c];
    }
    const int64_t row = sq.q_start + li / group, h = kvh * group + li % group;
    out[(row * hq + h) * D + c] = from_f32<T>(den > 0.0f ? num / den : 0.0f);
  }
}

template <typename T, int D>
void launch_typed(const AttentionArgs& a, cudaStream_t s) {
  const size_t per = size_t(a.num_partials) * size_t(a.hkv) * kAttnItemsPerCta;
  float* part_o = a.workspace;
  float* part_ml = a.workspace ? a.workspace + per * size_t(D) : nullptr;
  const dim3 grid(unsigned(a.num_work), unsigned(a.hkv));
  attention_kernel<T, D><<<grid, kWarps * 32, 0, s>>>(
      static_cast<const T*>(a.q), static_cast<const T*>(a.k_cache), static_cast<const T*>(a.v_cache),
      static_cast<T*>(a.out), int(a.block_size), int(a.hq), int(a.hkv), a.scale, a.causal, a.seqs,
      a.block_tables, a.work, part_o, part_ml);
  KILN_CUDA_CHECK_LAUNCH();
  if (a.num_combine > 0) {
    attention_combine_kernel<T, D><<<dim3(unsigned(a.num_combine), unsigned(a.hkv)), 128, 0, s>>>(
        static_cast<T*>(a.out), int(a.hq), int(a.hkv), a.seqs, a.combine, part_o, part_ml);
    KILN_CUDA_CHECK_LAUNCH();
  }
}

template <typename T>
__global__ void kv_cache_write_kernel(const T* k, const T* v, const int64_t* slots, int64_t tokens,
                                      int64_t row, T* kc, T* vc) {
  const int64_t n = tokens * row;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / row, e = i % row, slot = slots[t];
    if (slot < 0) continue;
    kc[slot * row + e] = k[i];
    vc[slot * row + e] = v[i];
  }
}

}  // namespace

bool attention_supports_head_dim(int64_t d) { return d == 16 || d == 32 || d == 64 || d == 128; }

AttentionPlan attention_plan(const std::vector<AttnSeq>& seqs, int64_t hq, int64_t hkv, bool causal,
                             int num_sms, int64_t split_chunk) {
  (void)causal;
  const int64_t group = hq / hkv;
  AttentionPlan plan;
  int64_t base_ctas = 0;
  for (const AttnSeq& s : seqs) base_ctas += (int64_t(s.q_len) * group + kAttnItemsPerCta - 1) / kAttnItemsPerCta;
  base_ctas *= hkv;
  const int64_t target = 2 * int64_t(std::max(num_sms, 1));
  for (size_t i = 0; i < seqs.size(); ++i) {
    const AttnSeq& s = seqs[i];
    const int64_t n_items = int64_t(s.q_len) * group;
    if (n_items == 0) continue;
    const int64_t tiles = (n_items + kAttnItemsPerCta - 1) / kAttnItemsPerCta;
    int64_t splits = 1, chunk = s.ctx_len;
    if (tiles == 1 && split_chunk >= 0) {
      if (split_chunk > 0) {
        chunk = split_chunk;
      } else if (base_ctas < target) {
        // Spread the missing CTAs over the decode-like sequences, at least 128 keys each.
        const int64_t want = (target + base_ctas - 1) / std::max<int64_t>(base_ctas, 1);
        const int64_t by_len = (s.ctx_len + 127) / 128;
        const int64_t n = std::max<int64_t>(1, std::min(want, by_len));
        chunk = ((s.ctx_len + n - 1) / n + 31) / 32 * 32;
      }
      splits = (s.ctx_len + chunk - 1) / chunk;
    }
    if (splits <= 1) {
      for (int64_t t = 0; t < tiles; ++t)
        plan.work.push_back({int32_t(i), int32_t(t * kAttnItemsPerCta), 0, s.ctx_len, -1});
      continue;
    }
    plan.combine.push_back({int32_t(i), plan.num_partials, int32_t(splits)});
    for (int64_t sp = 0; sp < splits; ++sp)
      plan.work.push_back({int32_t(i), 0, int32_t(sp * chunk), int32_t(std::min<int64_t>(s.ctx_len, (sp + 1) * chunk)),
                           int32_t(plan.num_partials + sp)});
    plan.num_partials += int32_t(splits);
  }
  return plan;
}

AttentionPlan attention_plan_decode(const std::vector<AttnSeq>& seqs, int64_t hq, int64_t hkv, int num_sms) {
  // One 32-key tile per split at short contexts: a decode CTA's time is a chain of
  // dependent tile loads, so more, shorter splits finish sooner (the combine is cheap).
  constexpr int64_t kMaxSplits = 64, kMinChunk = 32;
  const int64_t group = hq / hkv, tiles = (group + kAttnItemsPerCta - 1) / kAttnItemsPerCta;
  const int64_t base = std::max<int64_t>(int64_t(seqs.size()) * tiles * hkv, 1);
  const int64_t target = 2 * int64_t(std::max(num_sms, 1));
  const int64_t splits = tiles > 1 ? 1 : std::clamp<int64_t>((target + base - 1) / base, 1, kMaxSplits);
  AttentionPlan plan;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const AttnSeq& s = seqs[i];
    if (splits == 1) {
      for (int64_t t = 0; t < tiles; ++t)
        plan.work.push_back({int32_t(i), int32_t(t * kAttnItemsPerCta), 0, s.ctx_len, -1});
      continue;
    }
    // At least kMinChunk keys per split: short contexts leave the trailing splits empty.
    const int64_t chunk = std::max<int64_t>(kMinChunk, ((s.ctx_len + splits - 1) / splits + 31) / 32 * 32);
    plan.combine.push_back({int32_t(i), plan.num_partials, int32_t(splits)});
    for (int64_t sp = 0; sp < splits; ++sp) {
      const int64_t b = std::min<int64_t>(s.ctx_len, sp * chunk), e = std::min<int64_t>(s.ctx_len, (sp + 1) * chunk);
      plan.work.push_back({int32_t(i), 0, int32_t(b), int32_t(e), int32_t(plan.num_partials + sp)});
    }
    plan.num_partials += int32_t(splits);
  }
  return plan;
}

size_t attention_workspace_floats(const AttentionPlan& plan, int64_t hkv, int64_t d) {
  return size_t(plan.num_partials) * size_t(hkv) * kAttnItemsPerCta * size_t(d + 2);
}

void launch_attention(const AttentionArgs& a, cudaStream_t s) {
  if (a.num_work == 0) return;
  KILN_THROW_IF(!attention_supports_head_dim(a.d), kUnsupported, "cuda attention: head_dim ", a.d,
                " (supported: 16, 32, 64, 128)");
  KILN_THROW_IF(a.num_partials > 0 && !a.workspace, kInternal, "cuda attention: split plan without workspace");
  KILN_CUDA_DISPATCH_FLOAT(a.dtype, T, {
    switch (a.d) {
      case 16: launch_typed<T, 16>(a, s); break;
      case 32: launch_typed<T, 32>(a, s); break;
      case 64: launch_typed<T, 64>(a, s); break;
      default: launch_typed<T, 128>(a, s); break;
    }
  });
}

void launch_kv_cache_write(DType t, const void* k, const void* v, const int64_t* slot_mapping,
                           int64_t tokens, int64_t row_elems, void* k_cache, void* v_cache,
                           cudaStream_t s) {
  if (tokens == 0) return;
  KILN_CUDA_DISPATCH_FLOAT(t, T, {
    kv_cache_write_kernel<T><<<grid_for(tokens * row_elems, 256), 256, 0, s>>>(
        static_cast<const T*>(k), static_cast<const T*>(v), slot_mapping, tokens, row_elems,
        static_cast<T*>(k_cache), static_cast<T*>(v_cache));
  });
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
