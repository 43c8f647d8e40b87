// The fused decode attention (attention_gqa.cuh, FUSED) for int8 / fp8 caches, head dims
// 64 and 128: the new token's K/V rows are quantized in the kernel before they are
// written and attended to. Its own translation unit so that nvcc builds it beside the
// others. Tested in tests/backends/cuda/attention_test.cpp.
#include "backends/cuda/ops/attention_gqa.cuh"

namespace kiln::cuda {
namespace {

template <KvCode Q>
void launch_fused_codes(const AttentionArgs& a, cudaStream_t s) {
  KILN_CUDA_DISPATCH_FLOAT(a.dtype, T, {
    if (a.d == 64)
      launch_gqa_typed<T, 64, Q, true>(a, s);
    else
      launch_gqa_typed<T, 128, Q, true>(a, s);
  });
}

}  // namespace

void launch_attention_fused_decode_quantized(const AttentionArgs& a, cudaStream_t s) {
  KILN_THROW_IF(a.d != 64 && a.d != 128, kInternal, "cuda attention: the fused decode kernel with a quantized cache "
                "and head_dim ", a.d, " (64 and 128 only)");
  if (a.kv_code == KvCode::kInt8)
    launch_fused_codes<KvCode::kInt8>(a, s);
  else
    launch_fused_codes<KvCode::kFp8>(a, s);
}

}  // namespace kiln::cuda
