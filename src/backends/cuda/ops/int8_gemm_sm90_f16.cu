// The fused int8 GEMM's kernels with f16 outputs (int8_gemm_sm90.cuh); one translation
// unit per output dtype so that nvcc builds them in parallel. sm_90a only.
#include "backends/cuda/ops/int8_gemm_sm90.cuh"

template struct kiln::cuda::int8_sm90::Ops<kiln::DType::kF16>;
