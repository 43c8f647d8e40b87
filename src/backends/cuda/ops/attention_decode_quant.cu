// The cluster decode kernel (attention_decode.cuh) for int8 / fp8 caches: its own
// translation unit so that nvcc builds it beside the 16-bit one. Tested in
// tests/backends/cuda/attention_test.cpp.
#include "backends/cuda/ops/attention_decode.cuh"

namespace kiln::cuda {

void launch_attention_decode_cluster_quantized(const AttentionArgs& a, cudaStream_t s) {
  if (a.kv_code == KvCode::kInt8)
    launch_decode_cluster_codes<KvCode::kInt8>(a, s);
  else
    launch_decode_cluster_codes<KvCode::kFp8>(a, s);
}

}  // namespace kiln::cuda
