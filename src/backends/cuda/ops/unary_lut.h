// An activation through lookup tables over the 65,536 bit patterns of a 16-bit float
// input (bf16 or f16, a GEMM's output): the tables are filled on the device by the very
// device code of the arithmetic kernels (unary_f32, the rounding to T, int8_code), so a
// pass that looks its outputs up is bit-identical to launch_unary / launch_unary_int8 by
// construction, NaN and Inf patterns included. The passes stage their table in shared
// memory (persistent grid) or read it from global memory through L1. Tested against the
// arithmetic kernels on every bit pattern in tests/backends/cuda/unary_lut_test.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backends/cuda/ops/elementwise.h"
#include "core/dtype.h"

namespace kiln::cuda {

// Entries of a table: one per 16-bit input pattern.
inline constexpr int64_t kUnaryLutEntries = 65536;

// The tables of one (op, dtype[, inv]): device memory owned by whoever filled them
// (cuda_gelu_lut.h keeps them in the CudaContext).
struct UnaryLut {
  DType dtype = DType::kBF16;        // of the input and of `values`: bf16 or f16
  const uint16_t* values = nullptr;  // [65536] the bits of T(op(x)) for each input bits x
  const int8_t* codes = nullptr;     // [65536] int8_code(T(op(x)), inv), or null
  float inv = 0.0f;                  // the codes' 1 / scale
  // cuda_gelu_lut.h's dispatch: passes over fewer elements compute instead (the kernels
  // here ignore it).
  int64_t min_elems = 0;
};

// Where a pass reads its table: staged into each block's shared memory (128 KB values,
// 64 KB codes; one to three blocks an SM, persistent), or straight from global memory
// (__ldg: the hot entries of typical activations, a few KB, stay in L1; no staging).
enum class UnaryLutRead : uint8_t { kShared, kGlobal };

// Fills values[65536] with the bits of T(op(x)) for every bits x of t (bf16 or f16). The
// passes read their table before they wait on the previous kernel (programmatic dependent
// launch), as they read weights: a table must be complete before a step that reads it is
// launched (cuda_gelu_lut.cpp waits for its fills at compile time).
void launch_unary_lut_fill(UnaryOp op, DType t, uint16_t* values, cudaStream_t s);
// Fills codes[65536] with int8_code(T(op(x)), inv) for every bits x of t.
void launch_unary_lut_fill_codes(UnaryOp op, DType t, float inv, int8_t* codes, cudaStream_t s);

// out[i] = T(op(x[i])) from lut.values: launch_unary's output bit for bit, for any n; x and
// out may be the same buffer (16-byte accesses when n % 8 == 0 and both are 16-byte
// aligned, one element a thread otherwise).
void launch_unary_lut(const UnaryLut& lut, const void* x, int64_t n, void* out, cudaStream_t s,
                      UnaryLutRead read = UnaryLutRead::kShared);

// launch_unary_int8's output from the tables, under its conditions (k % 4 == 0, x 8-byte
// and q 4-byte aligned): static (row_scale null) needs lut.codes made for this inv and
// looks the codes up; per token looks T(op(x)) up (one warp a row), takes each row's max
// and writes the codes and the row scale as launch_unary_int8 does.
void launch_unary_int8_lut(const UnaryLut& lut, const void* x, int64_t rows, int64_t k, float inv, int8_t* q,
                           float* row_scale, cudaStream_t s, UnaryLutRead read = UnaryLutRead::kShared);

}  // namespace kiln::cuda
