// KILN_CUDA_GELU_LUT: the erf GELU passes after GEMMs (the bf16/f16 Linear's GELU after
// cuBLASLt, the W8A8 FFN up's pass to T or to the down projection's int8 codes, a
// standalone Gelu node) look their outputs up in tables over the 65,536 16-bit inputs
// (ops/unary_lut.h) instead of computing them, bit-identical by construction.
// KILN_CUDA_GELU_LUT=auto (the default) takes the tables for the passes that write int8
// codes only: measured on the H200 (bench/RESULTS.md, 2026-11-30 session 10), the static
// codes pass over [4096, 3072] takes 11.9 us through L1 against 25.7 computing, while the
// T-out pass gains nothing (21.5 vs 21.7 us), and passes under 4 M elements compute
// (a small pass loses to the table's L1 misses); =1 takes the tables for every erf GELU
// pass of any size, =0 for none. The tables are built while a graph is compiled and
// kept in the CudaContext. Tested in tests/backends/cuda/unary_lut_test.cpp (the switch
// without a GPU) and gelu_lut_models_test.cpp (models with it on and off, bit for bit).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>

#include "backends/cuda/cuda_context.h"
#include "backends/cuda/ops/elementwise.h"
#include "backends/cuda/ops/unary_lut.h"
#include "core/dtype.h"

namespace kiln::cuda {

// Which passes take the tables.
enum class GeluLutMode : uint8_t { kOff, kCodes, kAll };

// The switch as the environment sets it now (compile time reads it): unset, empty or
// "auto" kCodes, "0" kOff, "1" kAll; anything else is a kInvalidArgument error naming the
// variable.
GeluLutMode gelu_lut_mode();
// What a pass writes: T values, or int8 codes (static or per token).
enum class GeluPass : uint8_t { kValues, kCodes };

// The tables for an op pass of kind `pass` on activations in t, on cx's device: values
// always, codes for *inv when given (a static codes pass); built on the first request (on
// cx's stream, waited for: compile time, never inside a step) and reused after. None when
// the mode leaves this pass out, op is not kGeluErf or t is not bf16/f16: the callers keep
// the arithmetic then.
std::optional<UnaryLut> gelu_lut(CudaContext& cx, UnaryOp op, DType t, GeluPass pass,
                                 std::optional<float> inv = std::nullopt);

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
