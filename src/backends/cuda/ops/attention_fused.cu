// The fused decode attention's launches (attention.h launch_attention_fused_decode; the
// kernel is attention_gqa.cuh's with FUSED), its own translation unit so that nvcc
// builds it beside the others. Tested in tests/backends/cuda/attention_test.cpp.
#include <cstdlib>
#include <cstring>

#include "backends/cuda/ops/attention_gqa.cuh"

namespace kiln::cuda {

bool attention_fused_decode_supported(const AttentionArgs& a) {
  // KILN_CUDA_ATTN=old: today's kernels; =unfused: qkv_prep, the grouped decode kernel
  // and the combine as three launches.
  const char* e = std::getenv("KILN_CUDA_ATTN");
  if (e && (std::strcmp(e, "old") == 0 || std::strcmp(e, "unfused") == 0)) return false;
  // Quantized caches: head dims 64 and 128 (as the grouped kernel).
  return !a.flash && a.max_q_len == 1 && a.hkv > 0 && a.hq % a.hkv == 0 && a.hq / a.hkv <= 8 &&
         attention_supports_head_dim(a.d) && (a.kv_code == KvCode::kNone || a.d == 64 || a.d == 128);
}

void launch_attention_fused_decode(const AttentionArgs& a, cudaStream_t s) {
  KILN_THROW_IF(!attention_fused_decode_supported(a), kInternal, "cuda attention: the fused decode kernel for hq=",
                a.hq, " hkv=", a.hkv, " head_dim=", a.d, " max_q_len=", a.max_q_len);
  KILN_THROW_IF(!a.k_new || !a.v_new || !a.slot_mapping || !a.k_cache || !a.v_cache, kInternal,
                "cuda attention: the fused decode kernel without the new K/V rows, slots or cache");
  KILN_THROW_IF(a.num_combine > 0 && !a.counters, kInternal, "cuda attention: a fused split plan without counters");
  KILN_THROW_IF(a.num_partials > 0 && !a.workspace, kInternal, "cuda attention: split plan without workspace");
  KILN_THROW_IF(a.inv_freq && (!a.positions || a.rotary_dim <= 0 || a.rotary_dim % 2 || a.rotary_dim > a.d),
                kInvalidArgument, "cuda attention: rotary_dim must be even and in (0, head_dim], got ", a.rotary_dim,
                " head_dim=", a.d);
  if (a.num_work == 0) return;
  if (a.kv_code != KvCode::kNone) {
    KILN_THROW_IF(!a.k_scales || !a.v_scales, kInternal, "cuda attention: a quantized cache without scales");
    launch_attention_fused_decode_quantized(a, s);
    return;
  }
  KILN_CUDA_DISPATCH_FLOAT(a.dtype, T, {
    switch (a.d) {
      case 16: launch_gqa_typed<T, 16, KvCode::kNone, true>(a, s); break;
      case 32: launch_gqa_typed<T, 32, KvCode::kNone, true>(a, s); break;
      case 64: launch_gqa_typed<T, 64, KvCode::kNone, true>(a, s); break;
      default: launch_gqa_typed<T, 128, KvCode::kNone, true>(a, s); break;
    }
  });
}

}  // namespace kiln::cuda
