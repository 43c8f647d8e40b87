// Paged attention on the device: the KV-cache write (new K/V rows into the block pool
// through slot_mapping, or fused with RoPE for packed q|k|v rows) and the attention kernels:
// a tensor-core (flash) kernel for prefill in 16-bit (attention_flash.cuh: pipelined,
// CTAs of 128, 64 or 32 items, the plan's choice), a tile kernel for f32 prefill, small
// prefills and split decode, and a decode kernel whose warps split the keys when a CTA
// has at most 8 (query row, head) items and the plan is unsplit. The host plans each step
// once (attention_plan): a list of CTAs, each covering up to kAttnItemsPerCta (query row,
// head) items of one sequence and one KV head over a range of context positions; a
// sequence with few query rows and a long context is split along the context (split-KV)
// and its partial results merged by a combine kernel.
// Quantized caches (KvCode int8/fp8: one-byte codes with an f32 scale per (slot, kv
// head), KvDType in backends/backend.h) run through the same kernels, which dequantize
// as they load K/V: the decode and tile kernels into f32 registers/shared memory, the
// tensor-core kernel into its 16-bit shared-memory tiles.
// Steps whose sequences all decode one token (GQA group <= 8; int8/fp8 caches at head
// dims 64 and 128) take the grouped-query decode kernel (attention_gqa.cuh: one CTA per
// sequence, KV head and split, each K/V tile read once for the group's q heads), fused
// with RoPE, the KV write and the split merge (launch_attention_fused_decode); so do
// steps without a cache whose sequences are one token each (attention only). In 16-bit
// at head dims 64/128 on sm_90+, decode steps take the cluster decode kernel instead
// (attention_decode.cuh: tensor cores, per-warp cp.async streams, splits merged in a
// thread-block cluster; KILN_CUDA_DECODE_ATTN=old, read when a graph is compiled, keeps
// the grouped one), and batch decode over a 16-bit cache (from ~3-4 (sequence, KV head)
// pairs an SM, attention_plan_decode_cluster) the warp decode kernel (attention_decode_warp.cuh: a warp per (sequence, KV head), no barrier,
// no merge; AttentionPlan::decode_warp).
// Tested against the CPU backend in tests/backends/cuda/attention_test.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "core/dtype.h"

namespace kiln::cuda {

// What a KV cache stores: the activation dtype (kNone), or int8 / FP8 E4M3 codes with
// per (slot, kv head) f32 scales [blocks * block_size, hkv] beside them.
enum class KvCode : uint8_t { kNone, kInt8, kFp8 };

// The codes a tensor-core plan may write in place of its output (AttentionArgs::out_codes).
enum class AttnOutCode : uint8_t { kFp8, kInt8 };

// (query row, head) items one CTA handles: 4 warps × 4 items.
constexpr int kAttnItemsPerCta = 16;
// Items of a tensor-core (flash) CTA (attention_flash.cuh): warps × 16, one MMA's rows each.
// The plan takes the widest whose grid still gives every SM a CTA (AttentionPlan::flash_width).
constexpr int kFlashCtaWidths[] = {128, 64, 32};
constexpr int kFlashMaxItemsPerCta = kFlashCtaWidths[0];
// CTAs reading at most this many keys are short: their time is the loads' latency more
// than their MMAs, so how many waves the grid takes decides (AttentionPlan::flash_items_per_sm).
constexpr int64_t kFlashShortKeys = 256;
// The shortest key chunk a tensor-core CTA takes when a short grid splits its keys (two
// 64-key tiles: a split's partial, D floats an item, costs about what a tile's K/V does).
constexpr int64_t kFlashMinSplitKeys = 128;
constexpr bool attention_flash_width_valid(int width) {
  for (int w : kFlashCtaWidths)
    if (w == width) return true;
  return false;
}

// One sequence of the step as the kernels read it (int32s, see StepSequence).
struct AttnSeq {
  int32_t q_start, q_len, ctx_len, bt_offset;  // bt_offset: into the flat block tables
};
// One CTA's work (times the KV heads): items [item_begin, +16) of seq, keys
// [kv_begin, kv_end); partial >= 0 writes an unnormalized partial for the combine.
// combine: the index of the sequence's AttnCombine when partial >= 0 (the fused decode
// kernel's last split to finish merges them), else -1.
struct AttnWork {
  int32_t seq, item_begin, kv_begin, kv_end, partial;
  int32_t combine = -1;
};
// The splits of one work item's items: partials [partial_begin, + num_splits), each
// holding the items from item_begin on (16 a partial for the tile kernels' splits of a
// decode-like sequence, flash_width for a tensor-core plan's key splits).
struct AttnCombine {
  int32_t seq, partial_begin, num_splits;
  int32_t item_begin = 0;
};
struct AttentionPlan {
  std::vector<AttnWork> work;
  std::vector<AttnCombine> combine;
  int32_t num_partials = 0;
  // > 0: a plan of the tensor-core kernel whose CTAs take this many (query row, head)
  // items each (one of kFlashCtaWidths); 0: the tile / decode kernels'. Its CTAs may each
  // take a chunk of their items' keys (partial >= 0), merged per work item by the combine
  // kernel (see attention_plan).
  int32_t flash_width = 0;
  // Items resident per SM the tensor-core kernel is built for: 256, or 384 where every
  // CTA reads at most kFlashShortKeys keys and 256 would take more than one wave (the
  // kernel has a 384 form at head dim 64 over a 16-bit cache; elsewhere 256 runs).
  int32_t flash_items_per_sm = 256;
  // > 0: a plan of the cluster decode kernel (attention_plan_decode_cluster): this many
  // splits per (sequence, KV head), no work items, no partials in global memory.
  int32_t decode_splits = 0;
  // > 0 (with decode_splits 1): over a 16-bit cache, the warp decode kernel
  // (attention_decode_warp.cuh) with this many copy stages a warp takes the step instead.
  int32_t decode_warp = 0;
};

// Head dims 16, 32, 64 and 128 on every kernel; 256 (Gemma) and 96 (Phi-3-mini /
// Phi-3.5-mini) on the tile, tensor-core and cluster decode kernels (the grouped and warp
// decode kernels take 16-128 in powers of two; the tensor-core kernel takes 64 and up).
bool attention_supports_head_dim(int64_t d);
// Those head dims, as error messages name them.
inline constexpr const char* kAttentionHeadDims = "16, 32, 64, 96, 128, 256";
// Whether the tensor-core prefill kernel takes this activation dtype and head dim (any
// KvCode: quantized tiles are decoded to the activation dtype).
bool attention_flash_supported(DType t, int64_t d);
// Whether the tensor-core kernel also takes sliding windows and soft-capped scores at head
// dim d (256 and 96: at 64 / 128 the bounds' registers would cost the kernel spills, and
// such nodes keep the tile kernel).
bool attention_flash_supports_window(int64_t d);
// split_chunk: keys per split; 0 picks one so that the grid fills about 2 waves of
// `num_sms` multiprocessors, < 0 never splits. A tensor-core plan splits too: with 0,
// where its grid leaves half the SMs idle (a prompt of a few hundred tokens over one KV
// head, Gemma 3 1B's: the last CTA reads every key, 64 at a time, while most SMs idle),
// each CTA's keys are cut into chunks of at least kFlashMinSplitKeys, as many as one wave
// of resident CTAs holds; with > 0, into chunks of that many keys (tests). flash (only where
// attention_flash_supported): 0 never plans the tensor-core kernel, > 0 always, < 0
// when a sequence fills 64 items or the 128-item tensor-core CTAs fill the GPU (prefill;
// decode steps keep the split plans); its CTAs are listed with the most keys first.
// flash_width: the tensor-core CTAs' items, 0 picked per step (attention_flash_pick_width),
// else one of kFlashCtaWidths (tests, measurements; anything else is an error).
AttentionPlan attention_plan(const std::vector<AttnSeq>& seqs, int64_t hq, int64_t hkv, bool causal,
                             int num_sms, int64_t split_chunk = 0, int flash = 0, int flash_width = 0);
// The width of a tensor-core plan: the widest of kFlashCtaWidths whose grid (CTAs x KV
// heads) reaches num_sms, else the narrowest (a small step - BERT-base at batch 1, 12
// heads: 12 CTAs of 128 items, 48 of 32 - would leave most SMs idle; a large one keeps
// 128, whose K/V tiles serve the most items).
int attention_flash_pick_width(const std::vector<AttnSeq>& seqs, int64_t hq, int64_t hkv, int num_sms);
// KILN_CUDA_FLASH_WIDTH, read once when a graph is compiled: unset or empty 0 (picked per
// step), else 128, 64 or 32 (tests, measurements); another value is an error naming it.
int attention_flash_width_from_env();
// KILN_CUDA_FLASH_WARP_ROWS, read once when a graph is compiled: unset or empty 0
// (attention_flash_warp_rows picks), else 16 or 32 (tests, measurements); another value
// is an error naming it.
int attention_flash_warp_rows_from_env();
// The plan of a pure decode step (one query row per sequence) with a fixed number of
// splits per sequence that depends only on the batch and head shapes, not on the
// context lengths: the grid stays the same from step to step, so a captured CUDA graph
// can replay it (splits past the end of a short context are empty CTAs).
AttentionPlan attention_plan_decode(const std::vector<AttnSeq>& seqs, int64_t hq, int64_t hkv, int num_sms);
// The cluster decode kernel (attention_decode.cuh; launch_attention_decode_cluster):
// whether it takes decode steps of these shapes on the current device (16-bit
// activations, head dims 64/128, GQA group <= 8, an sm_90+ device for its clusters), and
// its plan: splits per (sequence, KV head), a power of two up to 8 picked from the batch
// (fill ~2 CTAs per SM) and the longest context (~one CTA's keys in flight per split);
// the grid changes only when that power does. forced_splits > 0 (1, 2, 4 or 8) fixes it.
// An unsplit plan of batch decode takes the warp decode kernel (AttentionPlan::
// decode_warp) from 3 (sequence, KV head) items an SM at head dim 128 and from 4 at head
// dim 64: 2 copy stages a warp at 128 (3 CTAs an SM, one wave up to 12 items an SM), 3
// beyond that wave, and 1 stage at 64. Measured on the H200 (cuda_decode_attention_bench,
// bench/RESULTS.md session 26): Llama-3.1-8B shapes (8 KV heads, d128) at batch 32 / 64 /
// 128 / 256 and contexts 160-1024, Llama-3.2-1B (d64) at 64 and 256. forced_warp >= 0
// fixes it: 0 never, 1-3 always, with that many stages and 1 split.
constexpr int64_t kDecodeWarpMinItemsPerSm128 = 3, kDecodeWarpMinItemsPerSm64 = 4, kDecodeWarpStages3ItemsPerSm = 12;
bool attention_decode_cluster_supported(DType t, int64_t hq, int64_t hkv, int64_t d);
AttentionPlan attention_plan_decode_cluster(const std::vector<AttnSeq>& seqs, int64_t hq, int64_t hkv, int64_t d,
                                            int num_sms, int forced_splits = 0, int forced_warp = -1);
// The switches of decode attention, read once when a graph is compiled (a mistyped value
// is an error naming the variable): KILN_CUDA_DECODE_ATTN "old" keeps the grouped-query
// kernels (false), unset or "cluster" takes the cluster kernel where it is supported
// (true); KILN_CUDA_DECODE_SPLITS 1|2|4|8 forces the cluster kernel's splits (tests,
// measurements), unset: 0 (planned per step).
bool attention_decode_cluster_from_env();
int attention_decode_splits_from_env();
// KILN_CUDA_DECODE_STAGES, read once per process: unset or empty 0 (the cluster decode
// kernel's launch picks 1 or 2 copy stages per warp from its grid: attention_decode.cuh),
// 1 or 2 forces them (measurements); another value is an error naming it.
int attention_decode_stages_from_env();
// KILN_CUDA_DECODE_WARP, read when a graph is compiled: unset or empty -1 (planned: the
// warp decode kernel for batch decode over a 16-bit cache), 0 the cluster kernel only,
// 1-3 the warp kernel with that many copy stages a warp for every decode step (tests,
// measurements; attention_plan_decode_cluster's forced_warp); another value is an error
// naming it.
int attention_decode_warp_from_env();
// Floats of workspace the plan's partials need.
size_t attention_workspace_floats(const AttentionPlan& plan, int64_t hkv, int64_t d);
// Split counters (int32, zero between launches) the fused decode kernel needs for the plan.
size_t attention_counters(const AttentionPlan& plan, int64_t hkv);

struct AttentionArgs {
  DType dtype = DType::kBF16;       // of q, out and (kv_code kNone) the caches
  const void* q = nullptr;          // [T, hq, d], rows q_stride elements apart
  const void* k_cache = nullptr;    // [blocks, block_size, hkv, d], slots kv_stride elements apart
  const void* v_cache = nullptr;
  KvCode kv_code = KvCode::kNone;   // int8/fp8: the caches hold codes, with these scales
  const float* k_scales = nullptr;  // [blocks * block_size, hkv]
  const float* v_scales = nullptr;
  // Quantized caches: the layer's key shift [hkv, d] (KvLayout::k_shift) that the kernels
  // writing new keys subtract before quantizing them; null: none.
  const float* k_shift = nullptr;
  // Quantized caches: keys stored rotated (KvLayout::k_rotate). The kernels writing new
  // keys rotate them (after the shift) before quantizing them, and every kernel reading a
  // quantized cache rotates its queries (kv_rotate_rows: H q / b).
  bool k_rotate = false;
  int64_t q_stride = 0, kv_stride = 0;  // 0: hq * d and hkv * d (dense)
  int64_t max_q_len = 0;  // the step's longest q_len; with its GQA group <= 8, the decode kernel runs
  void* out = nullptr;              // [T, hq, d]
  // Tensor-core (flash) plans only, when set: the output as one-byte codes of out's T
  // values times out_code_inv, out unused: E4M3 (fp8_codes.cuh; the FP8 o-projection's
  // input) or int8 (int8_codes.cuh; a W8A8 o-projection's, one static scale).
  uint8_t* out_codes = nullptr;
  float out_code_inv = 1.0f;
  AttnOutCode out_code = AttnOutCode::kFp8;
  int64_t block_size = 16, hq = 0, hkv = 0, d = 0;
  float scale = 1.0f;
  bool causal = true;
  // > 0 (causal only): a sliding window, the query at position p sees keys (p - window, p].
  // The tile kernels, the cluster decode kernel and, at head dim 256, the tensor-core
  // kernel implement it (attention_flash_supports_window); the grouped and warp decode
  // kernels do not, and refuse it.
  int32_t window = 0;
  // > 0: each score s (q.k times scale) becomes softcap * tanh(s / softcap) before the
  // softmax (Gemma 2); the same kernels as window.
  float softcap = 0.0f;
  const AttnSeq* seqs = nullptr;    // device
  const int32_t* block_tables = nullptr;
  const AttnWork* work = nullptr;
  int32_t num_work = 0;
  const AttnCombine* combine = nullptr;
  int32_t num_combine = 0;
  int32_t num_partials = 0;
  float* workspace = nullptr;       // attention_workspace_floats()
  int32_t flash_width = 0;          // > 0: the plan is a tensor-core one (AttentionPlan::flash_width)
  int32_t flash_items_per_sm = 256;  // AttentionPlan::flash_items_per_sm
  // Query items a tensor-core warp takes (attention_flash_warp_rows): 0 picked, 16 or 32
  // (32 only in 128-item CTAs; a forced 32 in narrower ones takes 16).
  int32_t flash_warp_rows = 0;
  // The fused decode kernel (launch_attention_fused_decode) only: the step's new K/V
  // rows (one per sequence, row q_start, new_stride elements apart; k not yet rotated),
  // RoPE (inv_freq null: none), the cache write through slot_mapping, and the split
  // counters (attention_counters ints, zero on entry and on exit).
  const void* k_new = nullptr;
  const void* v_new = nullptr;
  int64_t new_stride = 0;
  const int32_t* positions = nullptr;
  const float* inv_freq = nullptr;
  int64_t rotary_dim = 0;
  const int64_t* slot_mapping = nullptr;
  int32_t* counters = nullptr;
  // A cluster decode plan (AttentionPlan::decode_splits > 0) over num_seqs sequences;
  // AttentionPlan::decode_warp.
  int32_t decode_splits = 0;
  int32_t decode_warp = 0;
  int32_t num_seqs = 0;
  // Trigger the dependent launch at the kernel's start rather than after its main loop
  // (decode steps of a few rows, where the next kernel is a weight-streaming GEMV that
  // fetches its weights while this kernel runs). Safe: the trigger takes effect only once
  // every CTA of the grid is resident, and no CTA waits on one that may not be (the fused
  // grouped kernel's last split takes a ticket; the cluster kernel's splits meet at a
  // cluster barrier, and a cluster is scheduled as a whole).
  bool early_trigger = false;
};

// The items a warp of a tensor-core plan takes: 16 in CTAs narrower than 128 items, else
// a.flash_warp_rows when set (16 or 32; anything else is an error), else 32 for head dim
// 128 over a 16-bit cache and 16 otherwise.
int attention_flash_warp_rows(const AttentionArgs& a);

void launch_attention(const AttentionArgs& a, cudaStream_t s);

// Decode steps (every sequence one query row, GQA group <= 8; int8/fp8 caches at head
// dims 64 and 128) in one kernel: each CTA (sequence, KV head, split) rotates its q heads
// and the new key, takes the new token's K/V from the step's rows (the CTA holding the
// last position also writes them - quantized, for an int8/fp8 cache - into the cache),
// attends over its split, and the last split of a (sequence, KV head) to finish merges
// the partials (atomic counter, reset for the next launch and CUDA-graph replay).
// Replaces launch_qkv_prep / launch_kv_cache_write / launch_kv_quant_write and
// launch_attention for such steps. Without new rows (k_new null: a step without a cache,
// whose keys are the rows themselves) it only attends: launch_attention takes it so.
bool attention_fused_decode_supported(const AttentionArgs& a);
void launch_attention_fused_decode(const AttentionArgs& a, cudaStream_t s);
// The same step (the fused kernel's arguments: new K/V rows, RoPE, slots) through the
// cluster decode kernel, for a plan with decode_splits > 0: one kernel, no combine.
void launch_attention_decode_cluster(const AttentionArgs& a, cudaStream_t s);

// k, v: [t, hkv*d] rows; slot_mapping[i] = block * block_size + row, -1 skips the token.
void launch_kv_cache_write(DType t, const void* k, const void* v, const int64_t* slot_mapping,
                           int64_t tokens, int64_t row_elems, void* k_cache, void* v_cache,
                           cudaStream_t s);

// The quantized cache write (code int8 or fp8): k, v rows of `tokens` tokens, each
// [hkv, d], `row_stride` elements apart (hkv * d dense; the packed q|k|v width when they
// are views into packed rows); every (token, kv head) row is quantized as KvDType says
// (backends/backend.h: the same codes and scales as the CPU backend) into codes
// [slots, hkv, d] and scales [slots, hkv] at slot_mapping[i]; -1 skips the token. Key rows
// less k_shift [hkv, d] when it is not null, then rotated when k_rotate (the CPU's
// kv_cache_write_int8/fp8). d <= 256.
void launch_kv_quant_write(DType t, KvCode code, const void* k, const void* v, int64_t row_stride,
                           const int64_t* slot_mapping, int64_t tokens, int64_t hkv, int64_t d, uint8_t* k_codes,
                           float* k_scales, uint8_t* v_codes, float* v_scales, cudaStream_t s,
                           const float* k_shift = nullptr, bool k_rotate = false);

// Packed attention's front end (pass fuse_qkv_attention): qkv [t, (hq + 2 hkv) * d] rows
// from the merged Q/K/V projection. Rotates q and k in place (RoPE over the first
// rotary_dim dims of each head, when inv_freq is set; same rounding as launch_rope) and
// writes k and v through slot_mapping into the caches (when k_cache is set), in one
// kernel. The attention then reads q from the packed rows (q_stride = row width). With a
// quantized cache, k_cache is null here (rotation only) and launch_kv_quant_write
// stores the rotated rows.
struct QkvPrepArgs {
  DType dtype = DType::kBF16;
  void* qkv = nullptr;
  int64_t tokens = 0, hq = 0, hkv = 0, d = 0, rotary_dim = 0;
  const int32_t* positions = nullptr;  // [t], with inv_freq
  const float* inv_freq = nullptr;     // [rotary_dim / 2] or null: no RoPE
  const int64_t* slot_mapping = nullptr;
  void* k_cache = nullptr;
  void* v_cache = nullptr;
};
void launch_qkv_prep(const QkvPrepArgs& a, cudaStream_t s);
// Whether launch_qkv_prep takes its 16-byte-chunk kernel for a (bf16/f16 aside): head dim,
// rotary half and pass-through width multiples of 8, 16-byte aligned rows and caches.
// KILN_CUDA_QKV_PREP=elements keeps the one-thread-per-element kernel (for comparison);
// both write the same bits.
bool qkv_prep_vectorized(const QkvPrepArgs& a);
// The one-thread-per-element kernel, whatever a is (tests, comparisons).
void launch_qkv_prep_elements(const QkvPrepArgs& a, cudaStream_t s);

}  // namespace kiln::cuda
