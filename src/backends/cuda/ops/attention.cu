// Paged attention kernels (see attention.h). A CTA stages Q for its 16 items and then
// 32-key tiles of K and V (gathered through the block table, widened to f32) in shared
// memory; warp w owns items 4w..4w+3. For a tile, lane j scores key j against the
// warp's 4 queries, the warp folds the tile into each item's online softmax (running
// max m, sum l, unnormalized acc with dims lane, lane+32, ...) and accumulates P·V.
// This is CUDA-core math: correct for any context length, GQA group and the head dims
// 16/32/64/128. The kernels themselves are in attention_kernels.cuh; this file holds the
// plans, the KV writes and the launches for 16/32-bit caches (attention_kv_quant.cu:
// int8/fp8 caches; attention_fused.cu: the grouped-query decode kernel).
#include "backends/cuda/ops/attention_kernels.cuh"

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <numeric>
#include <string>

namespace kiln::cuda {

// attention_flash.cu: the pipelined tensor-core prefill kernel (plans of
// AttentionPlan::flash_width-item CTAs).
void launch_attention_flash(const AttentionArgs& a, cudaStream_t s);
namespace {

template <typename T>
__global__ void kv_cache_write_kernel(const T* k, const T* v, const int64_t* slots, int64_t tokens,
                                      int64_t row, T* kc, T* vc) {
  pdl_wait();  // programmatic dependent launch: the previous kernel's writes are visible
  const int64_t n = tokens * row;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / row, e = i % row, slot = slots[t];
    if (slot < 0) continue;
    kc[slot * row + e] = k[i];
    vc[slot * row + e] = v[i];
  }
}

// One thread per (token, head of q|k|v, unit): units [0, rot/2) are the rotated pairs
// (u, u + rot/2), the rest single pass-through dims rot + (u - rot/2). A thread reads
// both elements of its pair before writing either, so rotating in place is race-free.
template <typename T>
__global__ void qkv_prep_kernel(T* qkv, int64_t tokens, int hq, int hkv, int d, int rot, const int32_t* positions,
                                const float* inv_freq, const int64_t* slots, T* kc, T* vc) {
  pdl_wait();  // programmatic dependent launch: the previous kernel's writes are visible
  const int half = inv_freq ? rot / 2 : 0, units = d - half, heads = hq + 2 * hkv;
  const int64_t width = int64_t(heads) * d, total = tokens * heads * units;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int u = int(i % units);
    const int64_t th = i / units, t = th / heads;
    const int h = int(th % heads);
    T* x = qkv + t * width + int64_t(h) * d;
    int e1 = u, e2 = -1;  // the elements this thread owns
    float y1 = 0.0f, y2 = 0.0f;
    if (u < half) {
      e2 = u + half;
      y1 = to_f32(x[e1]);
      y2 = to_f32(x[e2]);
      if (h < hq + hkv) rope_pair(y1, y2, positions[t], inv_freq[u]);  // q or k: rotate
    } else {
      e1 = half ? rot + (u - half) : u;
      y1 = to_f32(x[e1]);
    }
    if (h < hq + hkv && half) {
      x[e1] = from_f32<T>(y1);
      if (e2 >= 0) x[e2] = from_f32<T>(y2);
    }
    if (h < hq || !kc) continue;
    const int64_t slot = slots[t];
    if (slot < 0) continue;
    const bool is_k = h < hq + hkv;
    const int kvh = is_k ? h - hq : h - hq - hkv;
    T* dst = (is_k ? kc : vc) + (slot * hkv + kvh) * d;
    dst[e1] = from_f32<T>(y1);
    if (e2 >= 0) dst[e2] = from_f32<T>(y2);
  }
}

// Eight 16-bit elements: one 16-byte load or store.
template <typename T>
union Vec8 {
  uint4 u;
  T e[8];
};

// qkv_prep_kernel in 16-byte chunks, for head dims, rotary halves and pass-through widths
// that are multiples of 8 (every model kiln runs). A thread takes one token, chunk c of
// the head dim (8 elements) and G consecutive heads of q|k|v (8; 1 for steps of a few
// tokens, whose latency is one thread's chain): it loads all of
// their chunks first (the in-place rotation stores cannot then delay a later load), takes
// the chunk's 8 angles once for every rotated head (chunk c < rot / 16 rotates the pairs
// (8c + i, 8c + i + rot / 2), whose second halves' chunks have nothing of their own to
// do; chunks past rot pass through), and rounds as qkv_prep_kernel does (rope_pair's
// operations), so both write the same bits. The element kernel's 64-bit index divisions
// and per-head angles made it compute-bound: on the H200 the Attention node of a
// Llama-3.1-8B layer at 2048 tokens took 198 us with it and 170 with this one (layer
// profile; the flash kernel alone ~141; bench/RESULTS.md, 2026-12-01).
constexpr int kPrepHeads = 8, kPrepFewTokens = 64;

template <typename T, int G>
__global__ void qkv_prep_vec_kernel(T* __restrict__ qkv, int tokens, int hq, int hkv, int d, int rot,
                                    const int32_t* __restrict__ positions, const float* __restrict__ inv_freq,
                                    const int64_t* __restrict__ slots, T* __restrict__ kc, T* __restrict__ vc,
                                    int per_token, int tokens_per_block) {
  const int chunks = d / 8, local = int(threadIdx.x), tt = local / per_token, r = local - tt * per_token;
  const int g = r / chunks, c = r - g * chunks;
  const int t = int(blockIdx.x) * tokens_per_block + tt;
  const int heads = hq + 2 * hkv, half = inv_freq ? rot / 2 : 0;
  if (t >= tokens) return;
  const int h0 = g * G;
  const bool first_half = c * 8 < half, second_half = !first_half && c * 8 < rot && half > 0;
  pdl_wait();  // programmatic dependent launch: the previous kernel's writes are visible
  T* row = qkv + int64_t(t) * heads * d;
  Vec8<T> a[G], b[G];
#pragma unroll
  for (int j = 0; j < G; ++j) {
    const int h = h0 + j;
    if (h >= heads) break;
    const bool rotated = h < hq + hkv && half > 0;
    if (rotated && second_half) continue;
    a[j].u = *reinterpret_cast<const uint4*>(row + int64_t(h) * d + c * 8);
    if (rotated && first_half) b[j].u = *reinterpret_cast<const uint4*>(row + int64_t(h) * d + c * 8 + half);
  }
  float sn[8], cs[8];
  if (first_half) {
    const int pos = positions[t];
#pragma unroll
    for (int i = 0; i < 8; ++i) rope_angle(pos, inv_freq[c * 8 + i], sn[i], cs[i]);
  }
  const int64_t slot = kc ? slots[t] : -1;
#pragma unroll
  for (int j = 0; j < G; ++j) {
    const int h = h0 + j;
    if (h >= heads) break;
    const bool rotated = h < hq + hkv && half > 0;
    if (rotated && second_half) continue;
    if (rotated && first_half) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        float y1 = to_f32(a[j].e[i]), y2 = to_f32(b[j].e[i]);
        rope_turn(y1, y2, sn[i], cs[i]);
        a[j].e[i] = from_f32<T>(y1);
        b[j].e[i] = from_f32<T>(y2);
      }
      *reinterpret_cast<uint4*>(row + int64_t(h) * d + c * 8) = a[j].u;
      *reinterpret_cast<uint4*>(row + int64_t(h) * d + c * 8 + half) = b[j].u;
    }
    if (h < hq || slot < 0) continue;
    const bool is_k = h < hq + hkv;
    T* dst = (is_k ? kc : vc) + (slot * hkv + (is_k ? h - hq : h - hq - hkv)) * d + c * 8;
    *reinterpret_cast<uint4*>(dst) = a[j].u;
    if (rotated && first_half) *reinterpret_cast<uint4*>(dst + half) = b[j].u;
  }
}

void check_qkv_prep(const QkvPrepArgs& a) {
  KILN_THROW_IF(a.inv_freq && (a.rotary_dim <= 0 || a.rotary_dim % 2 || a.rotary_dim > a.d), kInvalidArgument,
                "qkv rope: rotary_dim must be even and in (0, head_dim], got ", a.rotary_dim, " head_dim=", a.d);
}

}  // namespace

bool qkv_prep_vectorized(const QkvPrepArgs& a) {
  static const bool elements = [] {
    const char* e = std::getenv("KILN_CUDA_QKV_PREP");
    return e && std::string(e) == "elements";
  }();
  const int64_t half = a.inv_freq ? a.rotary_dim / 2 : 0;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const int64_t heads = a.hq + 2 * a.hkv;
  const int64_t per_token = (a.tokens < kPrepFewTokens ? heads : (heads + kPrepHeads - 1) / kPrepHeads) * (a.d / 8);
  return a.d % 8 == 0 && half % 8 == 0 && per_token <= 1024 && (a.d - (a.inv_freq ? a.rotary_dim : 0)) % 8 == 0 &&
         a.tokens < (int64_t(1) << 30) && aligned(a.qkv) && aligned(a.k_cache) && aligned(a.v_cache) && !elements;
}

void launch_qkv_prep(const QkvPrepArgs& a, cudaStream_t s) {
  if (a.tokens == 0) return;
  check_qkv_prep(a);
  if ((a.dtype == DType::kBF16 || a.dtype == DType::kF16) && qkv_prep_vectorized(a)) {
    const bool few = a.tokens < kPrepFewTokens;
    const int64_t heads = a.hq + 2 * a.hkv, g = few ? 1 : kPrepHeads;
    const int per_token = int((heads + g - 1) / g * (a.d / 8));
    const int tpb = std::max(1, 256 / per_token);
    const unsigned blocks = unsigned((a.tokens + tpb - 1) / tpb);
    auto run = [&]<typename T, int G>() {
      launch_k(qkv_prep_vec_kernel<T, G>, dim3(blocks), dim3(unsigned(tpb * per_token)), 0, s,
               static_cast<T*>(a.qkv), int(a.tokens), int(a.hq), int(a.hkv), int(a.d), int(a.rotary_dim),
               a.positions, a.inv_freq, a.slot_mapping, static_cast<T*>(a.k_cache), static_cast<T*>(a.v_cache),
               per_token, tpb);
    };
    if (a.dtype == DType::kBF16)
      few ? run.template operator()<__nv_bfloat16, 1>() : run.template operator()<__nv_bfloat16, kPrepHeads>();
    else
      few ? run.template operator()<__half, 1>() : run.template operator()<__half, kPrepHeads>();
    KILN_CUDA_CHECK_LAUNCH();
    return;
  }
  launch_qkv_prep_elements(a, s);
}

void launch_qkv_prep_elements(const QkvPrepArgs& a, cudaStream_t s) {
  if (a.tokens == 0) return;
  check_qkv_prep(a);
  const int64_t half = a.inv_freq ? a.rotary_dim / 2 : 0;
  const int64_t total = a.tokens * (a.hq + 2 * a.hkv) * (a.d - half);
  KILN_CUDA_DISPATCH_FLOAT(a.dtype, T, {
    launch_k(qkv_prep_kernel<T>, grid_for(total, 256), 256, 0, s,
        static_cast<T*>(a.qkv), a.tokens, int(a.hq), int(a.hkv), int(a.d), int(a.rotary_dim), a.positions,
        a.inv_freq, a.slot_mapping, static_cast<T*>(a.k_cache), static_cast<T*>(a.v_cache));
  });
  KILN_CUDA_CHECK_LAUNCH();
}

bool attention_supports_head_dim(int64_t d) {
  return d == 16 || d == 32 || d == 64 || d == 96 || d == 128 || d == 256;
}

bool attention_flash_supported(DType t, int64_t d) {
  return (t == DType::kBF16 || t == DType::kF16) && (d == 64 || d == 96 || d == 128 || d == 256);
}

bool attention_flash_supports_window(int64_t d) { return d == 256 || d == 96; }

int attention_flash_pick_width(const std::vector<AttnSeq>& seqs, int64_t hq, int64_t hkv, int num_sms) {
  const int64_t group = hq / hkv;
  for (int width : kFlashCtaWidths) {
    int64_t ctas = 0;
    for (const AttnSeq& s : seqs) ctas += (int64_t(s.q_len) * group + width - 1) / width;
    if (ctas * hkv >= num_sms) return width;
  }
  return kFlashCtaWidths[std::size(kFlashCtaWidths) - 1];
}

int attention_flash_width_from_env() {
  const char* e = std::getenv("KILN_CUDA_FLASH_WIDTH");
  if (!e || !*e) return 0;
  char* end = nullptr;
  const long v = std::strtol(e, &end, 10);
  KILN_THROW_IF(*end != '\0' || v > 1024 || !attention_flash_width_valid(int(v)), kInvalidArgument,
                "KILN_CUDA_FLASH_WIDTH='", e,
                "': expected 128, 64 or 32 (items per tensor-core attention CTA) or unset (picked per step)");
  return int(v);
}

int attention_flash_warp_rows_from_env() {
  const char* e = std::getenv("KILN_CUDA_FLASH_WARP_ROWS");
  if (!e || !*e) return 0;
  const std::string v = e;
  KILN_THROW_IF(v != "16" && v != "32", kInvalidArgument, "KILN_CUDA_FLASH_WARP_ROWS='", v,
                "': expected 16 or 32 (query items per tensor-core attention warp) or unset (picked per step)");
  return std::stoi(v);
}

int attention_flash_warp_rows(const AttentionArgs& a) {
  KILN_THROW_IF(a.flash_warp_rows != 0 && a.flash_warp_rows != 16 && a.flash_warp_rows != 32, kInternal,
                "cuda attention: ", a.flash_warp_rows, " items per tensor-core warp (expected 0: picked, 16 or 32)");
  if (a.flash_width != 128) return 16;
  if (a.flash_warp_rows != 0) return a.flash_warp_rows;
  // Measured (cuda_attention_bench, H200): 32 rows gain 4-6% at head dim 128 over a
  // 16-bit cache (8B pp2048 / pp8192), lose 14% with an fp8 cache (fewer threads decode
  // each tile) and 18% on BERT-base's head dim 64 at 32 x 128 tokens.
  return a.d == 128 && a.kv_code == KvCode::kNone ? 32 : 16;
}

namespace {

// A tensor-core plan's key splits (see attention_plan): keys[i] is the number of keys work
// item i reads. Chunk c of an item reads keys [c * chunk, (c + 1) * chunk) into its own
// partial, the last one up to the item's kv_end; the pieces are listed with the most keys
// they read first, as the plan's CTAs are.
void split_flash_keys(AttentionPlan& plan, const std::vector<int64_t>& keys, int64_t hkv, int num_sms,
                      int64_t split_chunk) {
  if (split_chunk < 0 || plan.work.empty()) return;
  int64_t chunk = split_chunk;
  if (chunk == 0) {
    // Only a grid that leaves half the SMs idle: measured on the H100 (cuda_attention_bench,
    // bench/RESULTS.md session 37), Gemma 3 1B's pp512 (64 CTAs of 32 items) ran in 27.8 us
    // split against 45.7, while Qwen3-0.6B's and Llama-3.2-1B's (256 CTAs, up to 512 keys
    // each) lost 15-20% to the partials and the combine.
    const int64_t ctas = int64_t(plan.work.size()) * hkv;
    if (2 * ctas > int64_t(num_sms)) return;
    const int64_t resident = int64_t(std::max(num_sms, 1)) * (plan.flash_items_per_sm / plan.flash_width);
    const int64_t per_cta = resident / ctas;  // chunks one wave holds per CTA
    if (per_cta < 2) return;
    const int64_t max_keys = *std::max_element(keys.begin(), keys.end());
    chunk = std::max<int64_t>(kFlashMinSplitKeys, ((max_keys + per_cta - 1) / per_cta + 63) / 64 * 64);
  }
  std::vector<AttnWork> work;
  std::vector<int64_t> len;
  for (size_t i = 0; i < plan.work.size(); ++i) {
    const AttnWork& w = plan.work[i];
    const int64_t n = (keys[i] + chunk - 1) / chunk;
    if (n <= 1) {
      work.push_back(w);
      len.push_back(keys[i]);
      continue;
    }
    const auto cb = int32_t(plan.combine.size());
    plan.combine.push_back({w.seq, plan.num_partials, int32_t(n), w.item_begin});
    for (int64_t c = 0; c < n; ++c) {
      // The last chunk ends where the work item did: a bidirectional node planned as
      // causal (the backend plans every node of a key alike) still reads every key.
      const int64_t b = c * chunk, e = c + 1 < n ? b + chunk : int64_t(w.kv_end);
      work.push_back({w.seq, w.item_begin, int32_t(b), int32_t(e), int32_t(plan.num_partials + c), cb});
      len.push_back(std::min(keys[i], e) - b);
    }
    plan.num_partials += int32_t(n);
  }
  std::vector<size_t> order(work.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return len[x] > len[y]; });
  plan.work.clear();
  for (size_t i : order) plan.work.push_back(work[i]);
}

}  // namespace

AttentionPlan attention_plan(const std::vector<AttnSeq>& seqs, int64_t hq, int64_t hkv, bool causal,
                             int num_sms, int64_t split_chunk, int flash, int flash_width) {
  KILN_THROW_IF(flash_width != 0 && !attention_flash_width_valid(flash_width), kInvalidArgument,
                "cuda attention plan: tensor-core CTA width ", flash_width, " (expected 0: picked, 128, 64 or 32)");
  const int64_t group = hq / hkv;
  AttentionPlan plan;
  if (flash != 0) {
    // Automatic: when some sequence fills 64 items (a prefill chunk; BERT-base at one
    // sequence of 128 tokens: 24 CTAs, 0.57 vs 0.69 ms per forward with the tile kernel's
    // 96) or the 128-item CTAs fill the GPU.
    constexpr int64_t kFullItems = 64;
    int64_t ctas = 0;
    bool full_cta = false;
    for (const AttnSeq& s : seqs) {
      ctas += (int64_t(s.q_len) * group + kFlashMaxItemsPerCta - 1) / kFlashMaxItemsPerCta;
      full_cta = full_cta || int64_t(s.q_len) * group >= kFullItems;
    }
    if (flash > 0 || full_cta || ctas * hkv >= num_sms) {
      const int64_t width = flash_width > 0 ? flash_width : attention_flash_pick_width(seqs, hq, hkv, num_sms);
      plan.flash_width = int32_t(width);
      // Causal: a sequence's later rows see more keys; their CTAs go first.
      std::vector<int64_t> keys;  // keys each CTA reads: the longest start first
      for (size_t i = 0; i < seqs.size(); ++i) {
        const AttnSeq& s = seqs[i];
        const int64_t n_items = int64_t(s.q_len) * group, tiles = (n_items + width - 1) / width;
        for (int64_t t = tiles - 1; t >= 0; --t) {
          const int64_t begin = (causal ? t : tiles - 1 - t) * width;
          const int64_t last_row = (std::min(begin + width, n_items) - 1) / group;
          plan.work.push_back({int32_t(i), int32_t(begin), 0, s.ctx_len, -1});
          keys.push_back(causal ? s.ctx_len - s.q_len + last_row + 1 : s.ctx_len);
        }
      }
      std::vector<size_t> order(plan.work.size());
      std::iota(order.begin(), order.end(), size_t(0));
      std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return keys[x] > keys[y]; });
      std::vector<AttnWork> sorted;
      sorted.reserve(order.size());
      for (size_t i : order) sorted.push_back(plan.work[i]);
      plan.work = std::move(sorted);
      // Measured (cuda_attention_bench, H200): 384 items per SM run BERT-base's 32 x 128
      // tokens in 15.9 us against 17.7 (one wave instead of 1.45), but lose 8-20% where
      // each CTA reads long key ranges (Llama-3.2-1B prompts) or the grid is one wave
      // anyway (BERT-base at 1 and 8 sequences).
      const int64_t max_keys = keys.empty() ? 0 : *std::max_element(keys.begin(), keys.end());
      const int64_t items = int64_t(plan.work.size()) * hkv * width;
      plan.flash_items_per_sm = max_keys <= kFlashShortKeys && items > int64_t(num_sms) * 256 ? 384 : 256;
      std::vector<int64_t> sorted_keys;
      sorted_keys.reserve(order.size());
      for (size_t i : order) sorted_keys.push_back(keys[i]);
      split_flash_keys(plan, sorted_keys, hkv, num_sms, split_chunk);
      return plan;
    }
  }
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
    const auto cb = int32_t(plan.combine.size());
    plan.combine.push_back({int32_t(i), plan.num_partials, int32_t(splits)});
    for (int64_t sp = 0; sp < splits; ++sp)
      plan.work.push_back({int32_t(i), 0, int32_t(sp * chunk), int32_t(std::min<int64_t>(s.ctx_len, (sp + 1) * chunk)),
                           int32_t(plan.num_partials + sp), cb});
    plan.num_partials += int32_t(splits);
  }
  return plan;
}

AttentionPlan attention_plan_decode(const std::vector<AttnSeq>& seqs, int64_t hq, int64_t hkv, int num_sms) {
  // One 32-key tile per split at short contexts: a decode CTA's time is a chain of
  // dependent tile loads, so more, shorter splits finish sooner (the combine is cheap).
  constexpr int64_t kMaxSplits = 64;
  const int64_t group = hq / hkv, tiles = (group + kAttnItemsPerCta - 1) / kAttnItemsPerCta;
  constexpr int64_t kMinChunk = 32;
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
    // The combine reads only the non-empty splits (per-step data: the graph stays valid).
    const int64_t chunk = std::max<int64_t>(kMinChunk, ((s.ctx_len + splits - 1) / splits + 31) / 32 * 32);
    const int64_t used = std::max<int64_t>(1, std::min<int64_t>(splits, (s.ctx_len + chunk - 1) / chunk));
    const auto cb = int32_t(plan.combine.size());
    plan.combine.push_back({int32_t(i), plan.num_partials, int32_t(used)});
    for (int64_t sp = 0; sp < splits; ++sp) {
      const int64_t b = std::min<int64_t>(s.ctx_len, sp * chunk), e = std::min<int64_t>(s.ctx_len, (sp + 1) * chunk);
      plan.work.push_back({int32_t(i), 0, int32_t(b), int32_t(e), int32_t(plan.num_partials + sp), cb});
    }
    plan.num_partials += int32_t(splits);
  }
  return plan;
}

size_t attention_workspace_floats(const AttentionPlan& plan, int64_t hkv, int64_t d) {
  const size_t items = plan.flash_width > 0 ? size_t(plan.flash_width) : size_t(kAttnItemsPerCta);
  return size_t(plan.num_partials) * size_t(hkv) * items * size_t(d + 2);
}

size_t attention_counters(const AttentionPlan& plan, int64_t hkv) { return plan.combine.size() * size_t(hkv); }

void launch_attention(const AttentionArgs& a, cudaStream_t s) {
  KILN_THROW_IF(a.decode_splits > 0, kInternal, "cuda attention: a cluster decode plan reached the generic kernels");
  if (a.num_work == 0) return;
  KILN_THROW_IF(!attention_supports_head_dim(a.d), kUnsupported, "cuda attention: head_dim ", a.d,
                " (supported: ", kAttentionHeadDims, ")");
  KILN_THROW_IF(a.num_partials > 0 && !a.workspace, kInternal, "cuda attention: split plan without workspace");
  if (a.kv_code != KvCode::kNone)
    KILN_THROW_IF(!a.k_scales || !a.v_scales, kInternal, "cuda attention: a quantized cache without scales");
  KILN_THROW_IF(a.out_codes && (a.flash_width == 0 || a.num_partials > 0), kInternal,
                "cuda attention: output codes need a tensor-core plan without key splits");
  const bool flash_window = a.flash_width == 0 || attention_flash_supports_window(a.d);
  KILN_THROW_IF(a.window < 0 || (a.window > 0 && (!a.causal || !flash_window)), kInternal,
                "cuda attention: a sliding window of ", a.window, " keys needs causal attention and, at head_dim ", a.d,
                ", the tile kernels");
  KILN_THROW_IF(a.softcap < 0.0f || (a.softcap > 0.0f && !flash_window), kInternal, "cuda attention: softcap ",
                a.softcap, " at head_dim ", a.d, " needs the tile kernels");
  if (a.flash_width != 0) {
    KILN_THROW_IF(!attention_flash_width_valid(a.flash_width), kInternal, "cuda attention: a tensor-core plan of ",
                  a.flash_width, "-item CTAs (expected 128, 64 or 32)");
    KILN_THROW_IF(!attention_flash_supported(a.dtype, a.d), kInternal, "cuda attention: a tensor-core plan for ",
                  dtype_name(a.dtype), " head_dim ", a.d);
    launch_attention_flash(a, s);
    return;
  }
  if (attention_fused_decode_supported(a)) {
    // One query row per sequence without new rows to take (a step without a KV cache:
    // the keys are the rows themselves): the grouped-query kernel, attention only.
    launch_attention_fused_decode(a, s);
    return;
  }
  if (a.kv_code == KvCode::kNone) {
    launch_attention_codes<KvCode::kNone>(a, s);
  } else {
    launch_attention_quantized(a, s);
  }
}

void launch_kv_cache_write(DType t, const void* k, const void* v, const int64_t* slot_mapping,
                           int64_t tokens, int64_t row_elems, void* k_cache, void* v_cache,
                           cudaStream_t s) {
  if (tokens == 0) return;
  KILN_CUDA_DISPATCH_FLOAT(t, T, {
    launch_k(kv_cache_write_kernel<T>, grid_for(tokens * row_elems, 256), 256, 0, s,
        static_cast<const T*>(k), static_cast<const T*>(v), slot_mapping, tokens, row_elems,
        static_cast<T*>(k_cache), static_cast<T*>(v_cache));
  });
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
