// The pipelined tensor-core prefill kernel (attention_flash.cuh) for int8 / fp8 caches:
// their own translation unit so that nvcc builds them beside the 16-bit ones. Tested in
// tests/backends/cuda/attention_test.cpp.
#include "backends/cuda/ops/attention_flash.cuh"

namespace kiln::cuda {

void launch_attention_flash_quantized(const AttentionArgs& a, cudaStream_t s) {
  if (a.kv_code == KvCode::kInt8)
    launch_flash2_codes<KvCode::kInt8>(a, s);
  else
    launch_flash2_codes<KvCode::kFp8>(a, s);
}

}  // namespace kiln::cuda
