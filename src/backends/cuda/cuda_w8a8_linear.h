// The CUDA backend's W8A8 INT8 Linear (attrs quant="w8a8", act_amax[, act_dynamic]; see
// quant/w8a8.h, whose SmoothQuant divisors are already folded into the graph's weights,
// norms or Mul nodes): weights uploaded once as per-output-channel int8 codes with f32
// scales (core/int8.h, the CPU backend's exact rule); each step quantizes the input rows
// to int8 (static scale act_amax / 127, or per token), then runs the int8 GEMV (<= 4
// rows), or the int8 GEMM with the dequantize fused in its epilogue (ops/int8_gemm_sm90.h:
// Hopper, built with CUTLASS; KILN_CUDA_W8A8_GEMM=cublaslt turns it off), or else
// cuBLASLt's int8 GEMM (exact int32 sums) in row tiles whose sums stay in L2, each
// followed by the dequantize kernel (scales, bias, activation or SwiGLU). Internal to the
// CUDA backend; tested against the CPU backend in tests/backends/cuda/w8a8_test.cpp.
#pragma once

#include <string>

#include "backends/cuda/cuda_ops.h"

namespace kiln::cuda {

// Whether this quant="w8a8" Linear can run here; when not, `why` says what is missing.
bool w8a8_linear_supported(const ir::Node& n, const ir::Graph& g, std::string* why);
OpRun prepare_w8a8_linear(const ir::Node& n, const ir::Graph& g, PrepareContext& pc);

}  // namespace kiln::cuda
