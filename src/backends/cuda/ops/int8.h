// INT8 kernels of the CUDA backend's W8A8 Linear (quant/w8a8.h; codes as core/int8.h
// defines them): quantizing activation rows to int8 (a static per-tensor scale, or per
// token from each row's max), the dequantize epilogue of cuBLASLt's int32 GEMM
// (scales, f32 bias, activation or SwiGLU, one rounding to the output dtype), and for a
// handful of token rows (decode) an int8 GEMV (dp4a, exact int32 sums) with the same
// epilogue fused. Every float step is the CPU kernel's (backends/cpu/kernels/
// linear_int8.cpp), unfused and in the same order, so both backends compute the same
// f32 value before the output rounding. Tested against the CPU backend in
// tests/backends/cuda/w8a8_test.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backends/cuda/ops/gemv.h"
#include "core/dtype.h"

namespace kiln::cuda {

// What turns int32 sums into outputs: y = act(float(acc) * (xs * w_scale[j]) + bias[j]),
// xs = row_scale[r] when row_scale is set (per token), else x_scale. bias (f32) may be
// null. With kSwiGlu the sums hold [gate | up] (w_scale and bias too) and y = silu(gate) * up.
struct Int8Epilogue {
  float x_scale = 1.0f;
  const float* row_scale = nullptr;  // [t], device
  const float* w_scale = nullptr;    // [n], device
  const float* bias = nullptr;       // [n], device, may be null
  GemvEpilogue act = GemvEpilogue::kNone;
};

// Quantizes rows of x [t, k] (f32, f16 or bf16; k % 4 == 0, rows 8-byte aligned) into q
// [t, k]: q = int8(x * inv). With row_scale set, each row's own scale max|x[r,:]| / 127
// (1 for an all-zero row) is written to row_scale[r] and used in place of inv.
void launch_int8_quantize(DType dtype, const void* x, int64_t t, int64_t k, float inv, int8_t* q, float* row_scale,
                          cudaStream_t s);
// The same of each row of x through core/hadamard.h's transform in blocks of b (a power of
// two dividing k; the host's f32 butterflies in the host's pass order, so the codes and
// row scales are the host's hadamard_transform + int8_quantize of the same f32 values, bit
// for bit): a W8A8 Linear built with --hadamard (quant/w8a8.h, attr act_hadamard = b).
// The row is held in shared memory: k up to kInt8HadamardMaxK (else kUnsupported, naming k).
constexpr int64_t kInt8HadamardMaxK = 51200;
void launch_int8_quantize_hadamard(DType dtype, const void* x, int64_t t, int64_t k, int64_t b, float inv, int8_t* q,
                                   float* row_scale, cudaStream_t s);

// y [t, n_out] in `dtype` from the sums acc [t, ld] (ld >= n_out, >= 2 * n_out with
// kSwiGlu: gate j at column j, up at n_out + j; columns past those are padding).
void launch_int8_dequant(DType dtype, const int32_t* acc, int64_t t, int64_t ld, int64_t n_out, const Int8Epilogue& e,
                         void* y, cudaStream_t s);

// Rows per int8 GEMM call for t rows of n outputs: all t, or near-equal tiles of a
// multiple of 256 rows (keeps each tile's pointers 256-byte aligned, as cuBLASLt's plans
// assume) whose int32 sums fit in KILN_CUDA_W8A8_TILE_MB MiB (default 24; 0: no tiling).
// Why: the dequantize epilogue reads the sums right after the GEMM wrote them; a tile
// this small stays in the H100/H200's 50 MB L2 instead of a round trip through HBM (4
// bytes per output, twice what the bf16 GEMM stores).
int64_t int8_tile_rows(int64_t t, int64_t n);

// Whether launch_int8_gemv handles this shape (m <= kGemvMaxRows, k % 16 == 0).
bool int8_gemv_supports(int64_t m, int64_t k);
// y [m, n_out] = epilogue(Σ_k x[m, k] w[j, k]) for int8 x [m, k] and w [>= n_out, k]
// (16-byte aligned rows); with kSwiGlu w holds gate rows [0, n_out) and up rows
// [n_out, 2 n_out).
void launch_int8_gemv(DType dtype, const int8_t* x, const int8_t* w, int64_t m, int64_t n_out, int64_t k,
                      const Int8Epilogue& e, void* y, cudaStream_t s);

}  // namespace kiln::cuda
