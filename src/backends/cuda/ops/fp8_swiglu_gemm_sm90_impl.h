// Between fp8_swiglu_gemm_sm90.cpp (host side, plain C++) and fp8_swiglu_gemm_sm90.cu (the
// CUTLASS kernels, compiled only with KILN_HAVE_CUTLASS for sm_90a). Internal.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "backends/cuda/ops/fp8_swiglu_gemm_sm90.h"

namespace kiln::cuda::fp8_swiglu_sm90 {

struct Problem {
  const uint8_t* x = nullptr;  // E4M3 [m, k]
  const uint8_t* w = nullptr;  // E4M3 [n, k], rows interleaved (fp8_swiglu_interleave_rows)
  uint8_t* y = nullptr;        // E4M3 [m, n / 2]
  int m = 0, n = 0, k = 0;
  float scale = 1.0f, inv = 1.0f;
  int sm_count = 0;
};

// Empty when CUTLASS's can_implement accepts the problem, else its status.
std::string check(Fp8SwigluConfig c, const Problem& p);
size_t workspace(Fp8SwigluConfig c, const Problem& p);
void run(Fp8SwigluConfig c, const Problem& p, void* workspace, cudaStream_t s);

}  // namespace kiln::cuda::fp8_swiglu_sm90
