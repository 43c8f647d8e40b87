// The grouped-query decode attention (attention_gqa.cuh) for int8 / fp8 caches, head
// dims 64 and 128: the new token's K/V rows are quantized in the kernel before they are
// written and attended to. Its own translation unit so that nvcc builds it beside the
// others. Tested in tests/backends/cuda/attention_test.cpp.
#include "backends/cuda/ops/attention_gqa.cuh"

namespace kiln::cuda {

void launch_attention_fused_decode_quantized(const AttentionArgs& a, cudaStream_t s) {
  if (a.kv_code == KvCode::kInt8)
    launch_gqa_codes<KvCode::kInt8>(a, s);
  else
    launch_gqa_codes<KvCode::kFp8>(a, s);
}

}  // namespace kiln::cuda
