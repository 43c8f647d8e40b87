// KILN_CUDA_GELU_LUT: the erf GELU passes after GEMMs (the bf16/f16 Linear's GELU after
// cuBLASLt, the W8A8 FFN up's pass to T or to the down projection's int8 codes, a
// standalone Gelu node) look their outputs up in tables over the 65,536 16-bit inputs
// (ops/unary_lut.h) instead of computing them, bit-identical by construction. Off by
// default until measured on the H200. The tables are built while a graph is compiled and
// kept in the CudaContext. Tested in tests/backends/cuda/unary_lut_test.cpp (the switch
// without a GPU) and w8a8_models_test.cpp (models with it on and off, bit for bit).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>

#include "backends/cuda/cuda_context.h"
#include "backends/cuda/ops/elementwise.h"
#include "backends/cuda/ops/unary_lut.h"
#include "core/dtype.h"

namespace kiln::cuda {

// The switch as the environment sets it now (compile time reads it); a value other than
// 0 or 1 is a kInvalidArgument error naming the variable.
bool gelu_lut_enabled();

// The tables for op's passes on activations in t, on cx's device: values always, codes
// for *inv when given; built on the first request (on cx's stream, waited for: compile
// time, never inside a step) and reused after. None when the switch is off, op is not
// kGeluErf or t is not bf16/f16: the callers keep the arithmetic then.
std::optional<UnaryLut> gelu_lut(CudaContext& cx, UnaryOp op, DType t, std::optional<float> inv = std::nullopt);

// Tables built so far in this process (tests: compiling with the switch on built some).
int64_t gelu_lut_tables_built();

// launch_unary, through lut's values when there is a table for t.
void launch_unary_or_lut(const std::optional<UnaryLut>& lut, UnaryOp op, DType t, const void* x, int64_t n,
                         void* out, cudaStream_t s);
// launch_unary_int8, through lut when there is a table for t (static: lut's codes must be
// made for inv, an internal error otherwise).
void launch_unary_int8_or_lut(const std::optional<UnaryLut>& lut, UnaryOp op, DType t, const void* x, int64_t rows,
                              int64_t k, float inv, int8_t* q, float* row_scale, cudaStream_t s);

}  // namespace kiln::cuda
