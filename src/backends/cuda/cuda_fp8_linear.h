// The CUDA backend's FP8 Linear (attrs quant="fp8", act_amax[, weight_scale]; see
// quant/fp8.h): weights uploaded once as E4M3 codes with their per-tensor scale (an
// engine's stored codes, or f32 weights quantized here with core/fp8.h, the CPU
// backend's exact rule); each step quantizes the bf16 input to E4M3 with the static
// scale act_amax / 448, then runs the FP8 GEMV (<= 4 rows) or cuBLASLt's FP8 GEMM,
// with bias and activation epilogues as the bf16 Linear has them. Internal to the CUDA
// backend; tested against the CPU backend in tests/backends/cuda/fp8_test.cpp.
#pragma once

#include <string>

#include "backends/cuda/cuda_ops.h"

namespace kiln::cuda {

// Whether this quant="fp8" Linear can run here; when not, `why` says what is missing.
bool fp8_linear_supported(const ir::Node& n, const ir::Graph& g, std::string* why);
OpRun prepare_fp8_linear(const ir::Node& n, const ir::Graph& g, PrepareContext& pc);

}  // namespace kiln::cuda
