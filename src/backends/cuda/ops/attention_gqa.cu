// The grouped-query decode kernel's launches for 16/32-bit caches (attention_gqa.cuh);
// attention_gqa_quant.cu has the int8/fp8 ones. Tested in
// tests/backends/cuda/attention_test.cpp.
#include "backends/cuda/ops/attention_gqa.cuh"

#include <cstdlib>
#include <cstring>

namespace kiln::cuda {

bool attention_gqa_decode_applies(const AttentionArgs& a) {
  // KILN_CUDA_ATTN=old keeps the decode / tile kernels (one comparison round).
  const char* e = std::getenv("KILN_CUDA_ATTN");
  if (e && std::strcmp(e, "old") == 0) return false;
  if (a.flash || a.max_q_len != 1 || a.hkv <= 0 || a.hq % a.hkv != 0 || a.hq / a.hkv > 8) return false;
  // Quantized caches: head dims 64 and 128 only (the others keep the older kernels).
  return a.kv_code == KvCode::kNone || a.d == 64 || a.d == 128;
}

void launch_attention_gqa_decode(const AttentionArgs& a, cudaStream_t s) {
  if (a.kv_code != KvCode::kNone) {
    launch_attention_gqa_decode_quantized(a, s);
    return;
  }
  KILN_CUDA_DISPATCH_FLOAT(a.dtype, T, {
    switch (a.d) {
      case 16: launch_gqa_typed<T, 16, KvCode::kNone>(a, s); break;
      case 32: launch_gqa_typed<T, 32, KvCode::kNone>(a, s); break;
      case 64: launch_gqa_typed<T, 64, KvCode::kNone>(a, s); break;
      default: launch_gqa_typed<T, 128, KvCode::kNone>(a, s); break;
    }
  });
}

}  // namespace kiln::cuda
