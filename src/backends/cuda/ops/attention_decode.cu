// The cluster decode kernel's plan, support test and launches for 16-bit caches
// (attention_decode.cuh; attention_decode_quant.cu has the int8/fp8 ones). Tested in
// tests/backends/cuda/attention_test.cpp.
#include "backends/cuda/ops/attention_decode.cuh"
#include "backends/cuda/ops/attention_decode_warp.cuh"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace kiln::cuda {

// attention_decode_quant.cu: the launches for int8 / fp8 caches.
void launch_attention_decode_cluster_quantized(const AttentionArgs& a, cudaStream_t s);

namespace {

// Thread-block clusters (the split merge) need sm_90+; asked once per device.
bool device_has_clusters() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices];  // 0: not asked, 1: no, 2: yes
  int dev = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= kMaxDevices) return false;
  if (cached[dev].load() == 0) {
    int major = 0;
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    cached[dev].store(major >= 9 ? 2 : 1);
  }
  return cached[dev].load() == 2;
}

int64_t pow2_ceil(int64_t x) {
  int64_t p = 1;
  while (p < x) p <<= 1;
  return p;
}
int64_t pow2_floor(int64_t x) {
  int64_t p = 1;
  while (p * 2 <= x) p <<= 1;
  return p;
}

// The split counts the kernel's clusters take.
bool splits_valid(long v) { return v == 1 || v == 2 || v == 4 || v == 8; }

// The head dims launch_decode_cluster_codes instantiates.
bool cluster_head_dim(int64_t d) { return d == 64 || d == 96 || d == 128 || d == 256; }

}  // namespace

bool attention_decode_cluster_from_env() {
  const char* e = std::getenv("KILN_CUDA_DECODE_ATTN");
  if (!e || !*e || std::strcmp(e, "cluster") == 0) return true;
  KILN_THROW_IF(std::strcmp(e, "old") != 0, kInvalidArgument, "KILN_CUDA_DECODE_ATTN='", e,
                "': expected 'old' (the grouped-query decode kernels), 'cluster' or unset (the cluster decode kernel)");
  return false;
}

int attention_decode_splits_from_env() {
  const char* e = std::getenv("KILN_CUDA_DECODE_SPLITS");
  if (!e || !*e) return 0;
  char* end = nullptr;
  const long v = std::strtol(e, &end, 10);
  KILN_THROW_IF(*end != '\0' || !splits_valid(v), kInvalidArgument,
                "KILN_CUDA_DECODE_SPLITS='", e, "': expected 1, 2, 4 or 8 (splits per sequence and KV head)");
  return int(v);
}

int attention_decode_warp_from_env() {
  const char* e = std::getenv("KILN_CUDA_DECODE_WARP");
  if (!e || !*e) return -1;
  KILN_THROW_IF(std::strlen(e) != 1 || e[0] < '0' || e[0] > '3', kInvalidArgument, "KILN_CUDA_DECODE_WARP='", e,
                "': expected 0 (the cluster decode kernel), 1, 2 or 3 (the warp decode kernel with that many copy "
                "stages for every decode step) or unset (planned from the batch)");
  return e[0] - '0';
}

int attention_decode_stages_from_env() {
  static const int stages = [] {
    const char* e = std::getenv("KILN_CUDA_DECODE_STAGES");
    if (!e || !*e) return 0;
    KILN_THROW_IF(std::strcmp(e, "1") != 0 && std::strcmp(e, "2") != 0, kInvalidArgument, "KILN_CUDA_DECODE_STAGES='",
                  e, "': expected 1 or 2 (the cluster decode kernel's copy stages per warp) or unset (by the grid)");
    return e[0] - '0';
  }();
  return stages;
}

bool attention_decode_cluster_supported(DType t, int64_t hq, int64_t hkv, int64_t d) {
  return (t == DType::kBF16 || t == DType::kF16) && cluster_head_dim(d) && hkv > 0 && hq % hkv == 0 &&
         hq / hkv <= kDecMaxGroup && device_has_clusters();
}

AttentionPlan attention_plan_decode_cluster(const std::vector<AttnSeq>& seqs, int64_t hq, int64_t hkv, int64_t d,
                                            int num_sms, int forced_splits, int forced_warp) {
  (void)hq;
  // Keys one CTA has in flight at once (every warp's two stages).
  const int64_t per_cta = int64_t(kDecWarps) * kDecStagesMax * (d == 64 ? 32 : 16);
  int64_t max_ctx = 1;
  for (const AttnSeq& s : seqs) max_ctx = std::max<int64_t>(max_ctx, s.ctx_len);
  const int64_t by_len = pow2_ceil((max_ctx + per_cta - 1) / per_cta);
  const int64_t units = std::max<int64_t>(1, int64_t(seqs.size()) * hkv);
  const int64_t by_fill = pow2_floor(std::max<int64_t>(1, 2 * int64_t(std::max(num_sms, 1)) / units));
  AttentionPlan plan;
  plan.decode_splits = int32_t(std::min<int64_t>({8, by_len, by_fill}));
  if (forced_splits != 0) {
    KILN_THROW_IF(!splits_valid(forced_splits), kInternal,
                  "cuda attention: ", forced_splits, " forced cluster decode splits (1, 2, 4 or 8)");
    plan.decode_splits = int32_t(forced_splits);
  }
  KILN_THROW_IF(forced_warp > 3, kInternal, "cuda attention: ", forced_warp, " forced warp decode stages (1 to 3)");
  // The warp decode kernel has head dims 64 and 128 (and no window or soft cap: the
  // backend asks such nodes' plans with forced_warp 0); 96 and 256 keep to the cluster kernel.
  if (d != 64 && d != 128) return plan;
  if (forced_warp > 0) {
    plan.decode_splits = 1;
    plan.decode_warp = int32_t(forced_warp);
  } else if (forced_warp < 0 && plan.decode_splits == 1) {
    const int64_t sms = std::max(num_sms, 1);
    if (d == 128 && units >= kDecodeWarpMinItemsPerSm128 * sms)
      plan.decode_warp = units > kDecodeWarpStages3ItemsPerSm * sms ? 3 : 2;
    else if (d == 64 && units >= kDecodeWarpMinItemsPerSm64 * sms)
      plan.decode_warp = 1;
  }
  return plan;
}

void launch_attention_decode_cluster(const AttentionArgs& a, cudaStream_t s) {
  KILN_THROW_IF(a.decode_splits < 1 || a.decode_splits > 8, kInternal, "cuda attention: cluster decode with ",
                a.decode_splits, " splits (1 to 8)");
  KILN_THROW_IF((a.dtype != DType::kBF16 && a.dtype != DType::kF16) || !cluster_head_dim(a.d) || a.hkv <= 0 ||
                    a.hq % a.hkv != 0 || a.hq / a.hkv > kDecMaxGroup || a.max_q_len != 1,
                kInternal, "cuda attention: the cluster decode kernel for ", dtype_name(a.dtype), " hq=", a.hq,
                " hkv=", a.hkv, " head_dim=", a.d, " max_q_len=", a.max_q_len);
  KILN_THROW_IF(!a.k_new || !a.v_new || !a.slot_mapping || !a.k_cache || !a.v_cache || !a.seqs || !a.block_tables,
                kInternal, "cuda attention: the cluster decode kernel without the new K/V rows, slots, cache or step");
  KILN_THROW_IF(a.inv_freq && (!a.positions || a.rotary_dim <= 0 || a.rotary_dim % 2 || a.rotary_dim > a.d),
                kInvalidArgument, "cuda attention: rotary_dim must be even and in (0, head_dim], got ", a.rotary_dim,
                " head_dim=", a.d);
  if (a.num_seqs == 0) return;
  if (a.kv_code != KvCode::kNone) {
    KILN_THROW_IF(!a.k_scales || !a.v_scales, kInternal, "cuda attention: a quantized cache without scales");
    launch_attention_decode_cluster_quantized(a, s);
    return;
  }
  if (a.decode_warp > 0) {
    KILN_THROW_IF(a.decode_splits != 1 || a.decode_warp > 3 || (a.d != 64 && a.d != 128) || a.window > 0 ||
                      a.softcap > 0.0f,
                  kInternal, "cuda attention: the warp decode kernel with ", a.decode_splits, " splits and ",
                  a.decode_warp, " stages, head_dim ", a.d, ", window ", a.window, ", softcap ", a.softcap,
                  " (1 split, 1 to 3 stages, head dims 64/128, no window or soft cap)");
    launch_decode_warp(a, a.decode_warp, s);
    return;
  }
  launch_decode_cluster_codes<KvCode::kNone>(a, s);
}

}  // namespace kiln::cuda
