// Between int8_gemm_sm90.cpp (host dispatch, plain C++) and the translation units that
// instantiate the CUTLASS kernels, one per output dtype (int8_gemm_sm90_{bf16,f16}.cu,
// from int8_gemm_sm90.cuh): nvcc compiles the two in parallel, and no host file sees
// CUTLASS. Internal to the int8 GEMM.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "backends/cuda/ops/int8_gemm_sm90.h"

namespace kiln::cuda::int8_sm90 {

struct Problem {
  const int8_t* x = nullptr;
  const int8_t* w = nullptr;
  void* y = nullptr;
  int m = 0, n = 0, k = 0;
  Int8Epilogue e;
  int sm_count = 0;
  // Set: the codes epilogue (e.act kGeluErf): y is int8 [m, n], each code looked up in
  // this table of the reader's codes by T bits (ops/unary_lut.h's codes table).
  const int8_t* code_table = nullptr;
};

// Explicitly instantiated for DType::kBF16 and kF16 only (the output dtype, or with
// code_table the activation dtype whose rounding the codes follow); act none or gelu_erf.
template <DType kOut>
struct Ops {
  // Empty when CUTLASS's can_implement accepts the problem, else its status.
  static std::string check(Int8GemmConfig c, const Problem& p);
  static size_t workspace(Int8GemmConfig c, const Problem& p);
  static void run(Int8GemmConfig c, const Problem& p, void* workspace, cudaStream_t s);
};
extern template struct Ops<DType::kBF16>;
extern template struct Ops<DType::kF16>;

}  // namespace kiln::cuda::int8_sm90
