// The CUDA backend's W8A8 INT8 Linear (attrs quant="w8a8", act_amax[, act_dynamic]; see
// quant/w8a8.h, whose SmoothQuant divisors are already folded into the graph's weights,
// norms or Mul nodes): weights uploaded once as per-output-channel int8 codes with f32
// scales (core/int8.h, the CPU backend's exact rule); each step quantizes the input rows
// to int8 (static scale act_amax / 127, or per token), then runs the int8 GEMV (<= 4
// rows), or the int8 GEMM with the dequantize fused in its epilogue (ops/int8_gemm_sm90.h:
// Hopper, built with CUTLASS; KILN_CUDA_W8A8_GEMM=cublaslt turns it off), or else
// cuBLASLt's int8 GEMM (exact int32 sums) in row tiles whose sums stay in L2, each
// followed by the dequantize kernel (scales, bias, activation or SwiGLU).
// A gelu_erf / gelu_tanh / silu activation on the CUTLASS path runs in one vectorized pass
// after a GEMM without it (in the epilogue, GELU's erfc stalled the kernel: BERT-base's
// FFN up GEMM 46 us against 17 us for the same work without it), rounded to the output
// type as launch_unary stores it; where only W8A8 Linears read the output, that pass
// writes their int8 codes (cuda_int8_fuse.h). Internal to the CUDA backend; tested against
// the CPU backend in tests/backends/cuda/w8a8_test.cpp, the fused codes in
// int8_fuse_test.cpp.
#pragma once

#include <string>

#include "backends/cuda/cuda_ops.h"

namespace kiln::cuda {

// Whether this quant="w8a8" Linear can run here; when not, `why` says what is missing.
bool w8a8_linear_supported(const ir::Node& n, const ir::Graph& g, std::string* why);
// KILN_CUDA_W8A8_ACT_EPILOGUE, read when a graph is prepared: unset or 0 applies a
// gelu_erf/gelu_tanh/silu activation in a pass after the CUTLASS GEMM; 1 keeps it in the
// GEMM's epilogue (gelu_erf only: gelu_tanh and silu then take cuBLASLt) and the output in
// the activation dtype, for comparison. Any other value is a kInvalidArgument error.
bool w8a8_act_in_epilogue();
OpRun prepare_w8a8_linear(const ir::Node& n, const ir::Graph& g, PrepareContext& pc);
// Whether g has Linears and every one is W8A8 through the fused CUTLASS GEMM (built, on an
// sm_90 device, KILN_CUDA_W8A8_GEMM not cublaslt): its GEMMs then take part in dependent
// launch (ops/cutlass_launch.cuh), so the backend may use it in every step (convert.h).
bool w8a8_graph_gemms_are_cutlass(const ir::Graph& g);

}  // namespace kiln::cuda
