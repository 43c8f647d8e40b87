// Elementwise ops on the device: Add/Mul with a same-shape or row-vector second operand,
// and the unary activations (GELU erf/tanh, SiLU, tanh), computed in f32 whatever the
// storage type. Tested against the CPU backend in tests/backends/cuda/ops_test.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace kiln::cuda {

enum class BinaryOp : uint8_t { kAdd, kMul };
enum class UnaryOp : uint8_t { kGeluErf, kGeluTanh, kSilu, kTanh };

// out[i] = a[i] op b[i % b_n]; b_n == n (same shape) or the row length (row broadcast).
void launch_binary(BinaryOp op, DType t, const void* a, const void* b, int64_t n, int64_t b_n,
                   void* out, cudaStream_t s);
void launch_unary(UnaryOp op, DType t, const void* x, int64_t n, void* out, cudaStream_t s);
// x: [rows, 2 * inter] = [gate | up] per row; out: [rows, inter] = silu(gate) * up.
void launch_swiglu(DType t, const void* x, int64_t rows, int64_t inter, void* out, cudaStream_t s);
// The same rows, out = gelu_tanh(gate) * up (GeGLU, Gemma's MLP).
void launch_geglu(DType t, const void* x, int64_t rows, int64_t inter, void* out, cudaStream_t s);

}  // namespace kiln::cuda
