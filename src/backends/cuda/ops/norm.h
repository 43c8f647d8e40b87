// LayerNorm and RMSNorm over the last dim on the device; statistics in f32, gamma/beta
// kept in f32. Tested against the CPU backend in tests/backends/cuda/ops_test.cpp; the
// E4M3 and int8 outputs (and the dual T + int8 one) against the T output quantized, in
// fp8_fuse_test.cpp and int8_fuse_test.cpp; the short-row kernel against the CPU in
// norm_short_test.cpp; timed by bench/cuda_norm_bench.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>

#include "core/dtype.h"

namespace kiln::cuda {

// beta may be null. y may alias x.
void launch_layer_norm(DType t, const void* x, const float* gamma, const float* beta, float eps,
                       int64_t rows, int64_t dim, void* y, cudaStream_t s);
void launch_rms_norm(DType t, const void* x, const float* w, float eps, int64_t rows, int64_t dim,
                     void* y, cudaStream_t s);
// HeadRMSNorm (Qwen3's per-head q/k norm): rows of `width` values; the first `groups`
// groups of d values each normalized and scaled by w + g * w_stride (0: one weight for
// every group); the rest of each row copied. y may alias x.
void launch_head_rms_norm(DType t, const void* x, const float* w, int64_t w_stride, float eps, int64_t rows,
                          int64_t width, int64_t groups, int64_t d, void* y, cudaStream_t s);
// Fused residual add (AddLayerNorm / AddRMSNorm): sum = x + res (in T), y = norm(sum).
// sum and y must not alias x or res. sum may be null with res set: the sum is then not
// stored (a post-norm block's, which no node reads), y the same.
void launch_add_layer_norm(DType t, const void* x, const void* res, const float* gamma, const float* beta,
                           float eps, int64_t rows, int64_t dim, void* sum, void* y, cudaStream_t s);
void launch_add_rms_norm(DType t, const void* x, const void* res, const float* w, float eps, int64_t rows,
                         int64_t dim, void* sum, void* y, cudaStream_t s);
// The same norms (res and sum null: no residual) writing y as E4M3 codes for an FP8
// Linear (the CUDA backend's fused quantize): y = e4m3(float(bf16(norm)) * inv), bit for
// bit the codes launch_fp8_quantize makes of the launchers' bf16 y above. t must be bf16,
// the FP8 Linears' activation dtype.
void launch_add_layer_norm_fp8(DType t, const void* x, const void* res, const float* gamma, const float* beta,
                               float eps, int64_t rows, int64_t dim, void* sum, uint8_t* y, float inv,
                               cudaStream_t s);
void launch_add_rms_norm_fp8(DType t, const void* x, const void* res, const float* w, float eps, int64_t rows,
                             int64_t dim, void* sum, uint8_t* y, float inv, cudaStream_t s);
// The same norms writing y as the int8 codes of a W8A8 Linear's input (the CUDA backend's
// fused quantize), bit for bit what launch_int8_quantize makes of the launchers' T output
// y: static (row_scale null) q = int8(float(T(norm)) * inv); per token (row_scale set)
// each row's scale max|T(norm)| / 127 (1 for a row of zeros) goes to row_scale[r] and the
// row is quantized with its inverse. t must be bf16 or f16.
void launch_add_layer_norm_int8(DType t, const void* x, const void* res, const float* gamma, const float* beta,
                                float eps, int64_t rows, int64_t dim, void* sum, int8_t* q, float inv,
                                float* row_scale, cudaStream_t s);
void launch_add_rms_norm_int8(DType t, const void* x, const void* res, const float* w, float eps, int64_t rows,
                              int64_t dim, void* sum, int8_t* q, float inv, float* row_scale, cudaStream_t s);
// The dual output (a norm read by W8A8 Linears and by other nodes, cuda_int8_fuse.h): y
// in T, bit for bit launch_add_layer_norm's, and in the same pass q (and row_scale) as
// the *_int8 launchers above write them, from the same kernel (norm_kernel_for). q must
// not alias y; t must be bf16 or f16.
void launch_add_layer_norm_dual(DType t, const void* x, const void* res, const float* gamma, const float* beta,
                                float eps, int64_t rows, int64_t dim, void* sum, void* y, int8_t* q, float inv,
                                float* row_scale, cudaStream_t s);
void launch_add_rms_norm_dual(DType t, const void* x, const void* res, const float* w, float eps, int64_t rows,
                              int64_t dim, void* sum, void* y, int8_t* q, float inv, float* row_scale,
                              cudaStream_t s);

// Which kernel takes rows of at most 1024 elements in whole 16-byte vectors (at most 128
// vectors: 1024 bf16/f16, 512 f32): kBlock, a block per row (the register-held kernel);
// kWarp, a warp per row with several rows in flight per warp and no block barriers; kAuto
// (the default), the warp kernel from kNormWarpMinRows rows on. Measured on the H200
// (cuda_norm_bench, 2026-11-30): at [4096, 768] the warp kernel streams 1.5-2.3x the
// block kernel's GB/s (BERT-base b32 forward 2.31 -> 1.95 ms); at [128, 768] the two are
// within 4-14% either way and BERT-base b1 is 0.51 ms with the block kernel, 0.55 with
// the warp one. KILN_CUDA_NORM_SHORT=auto|block|warp; longer rows never take the warp
// kernel.
enum class NormShort { kBlock, kWarp, kAuto };
inline constexpr int64_t kNormWarpMinRows = 1024;
// The value of KILN_CUDA_NORM_SHORT (null or empty: kAuto); anything else is a
// kInvalidArgument error naming the variable.
NormShort norm_short_from_value(const char* v);
// The mode the launchers use: set_norm_short_mode's when set, else the environment's
// (read once; a bad value throws at every norm launch).
NormShort norm_short_mode();
// Overrides the environment for this process (tests, the bench); nullopt: back to it.
void set_norm_short_mode(std::optional<NormShort> mode);

// The norm kernels: a warp per row (short rows, NormShort::kWarp), the register-held
// block per row, the multi-pass block per row (rows not in whole 16-byte vectors, longer
// than 4096 vectors, or misaligned operands).
enum class NormKernel { kWarp, kRegs, kRows };
// The kernel every launcher above (all outputs alike) picks for `rows` rows of `dim`
// elements of t with 16-byte aligned operands under `mode`.
NormKernel norm_kernel_for(DType t, int64_t dim, NormShort mode, int64_t rows = kNormWarpMinRows);

// For the norm bench's launch-shape sweep (and its test): the T-output norm with the
// kernel and its shape forced. `vectors` > 0: the register-held kernel with `vectors`
// 16-byte vectors per thread (1, 2 or 4) and `rows_per_block` rows per block. Else
// `warps` > 0: the warp-per-row kernel with `warps` warps per block (1 to 8), each warp
// taking `rows_per_warp` rows (0: the default, 2). Returns false, launching nothing, when
// the row does not take that kernel or shape (not whole vectors, a block kernel over 1024
// threads, a warp kernel row over 128 vectors, misaligned operands).
struct NormShape {
  int vectors = 0;
  int rows_per_block = 1;
  int warps = 0;
  int rows_per_warp = 0;
};
bool launch_add_norm_shaped(DType t, bool rms, const void* x, const void* res, const float* gamma, const float* beta,
                            float eps, int64_t rows, int64_t dim, void* sum, void* y, NormShape shape,
                            cudaStream_t s);

}  // namespace kiln::cuda
