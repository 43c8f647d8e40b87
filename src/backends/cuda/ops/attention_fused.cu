// The grouped-query decode attention's entry points (attention.h
// launch_attention_fused_decode; the kernel is attention_gqa.cuh's) and its 16/32-bit
// cache instantiations; attention_fused_quant.cu has the int8/fp8 ones, in a translation
// unit of their own so that nvcc builds them beside these. Tested in
// tests/backends/cuda/attention_test.cpp.
#include "backends/cuda/ops/attention_gqa.cuh"

namespace kiln::cuda {

bool attention_fused_decode_supported(const AttentionArgs& a) {
  // Quantized caches: head dims 64 and 128 (the others take the decode / tile kernels).
  const bool dims = a.d == 16 || a.d == 32 || a.d == 64 || a.d == 128;  // attention_dispatch's
  return a.flash_width == 0 && a.window == 0 && a.softcap == 0.0f && dims && a.max_q_len == 1 && a.hkv > 0 &&
         a.hq % a.hkv == 0 && a.hq / a.hkv <= 8 && (a.kv_code == KvCode::kNone || a.d == 64 || a.d == 128);
}

void launch_attention_fused_decode(const AttentionArgs& a, cudaStream_t s) {
  KILN_THROW_IF(!attention_fused_decode_supported(a), kInternal, "cuda attention: the grouped decode kernel for hq=",
                a.hq, " hkv=", a.hkv, " head_dim=", a.d, " max_q_len=", a.max_q_len);
  KILN_THROW_IF(!a.k_cache || !a.v_cache, kInternal, "cuda attention: the grouped decode kernel without K/V");
  KILN_THROW_IF(a.k_new && (!a.v_new || !a.slot_mapping), kInternal,
                "cuda attention: the grouped decode kernel with new K rows but no V rows or slots");
  KILN_THROW_IF(a.inv_freq && !a.k_new, kInternal, "cuda attention: RoPE in the grouped decode kernel without the new K/V rows");
  KILN_THROW_IF(a.num_combine > 0 && !a.counters, kInternal, "cuda attention: a grouped split plan without counters");
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
  launch_gqa_codes<KvCode::kNone>(a, s);
}

}  // namespace kiln::cuda
