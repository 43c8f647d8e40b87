// The pipelined tensor-core prefill kernel's launches for 16-bit caches (and encoders
// without a cache); attention_flash_quant.cu has the int8/fp8 ones. The kernel is in
// attention_flash.cuh. Tested in tests/backends/cuda/attention_test.cpp.
#include "backends/cuda/ops/attention_flash.cuh"

namespace kiln::cuda {

void launch_attention_flash(const AttentionArgs& a, cudaStream_t s) {
  if (a.kv_code != KvCode::kNone) {
    launch_attention_flash_quantized(a, s);
    return;
  }
  launch_flash2_codes<KvCode::kNone>(a, s);
}

}  // namespace kiln::cuda
