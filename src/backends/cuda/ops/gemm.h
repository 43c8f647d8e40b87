// Linear layers on the device through cuBLASLt: y[m,n] = x[m,k]·w[n,k]ᵀ (+ bias[n]) with
// f16/bf16 (or f32) operands and f32 accumulation; the bias is cuBLASLt's epilogue. The
// algorithms cublasLtMatmulAlgoGetHeuristic offers for a shape are the tactics: tune()
// times them on the device and keeps the fastest for that shape; untuned shapes take
// the heuristic's first. run_fp8 is the FP8 form: E4M3 operands with per-tensor scales
// (cuBLASLt's A/B scale pointers), f32 accumulation, bf16 bias and output. run_int8 is
// the INT8 form (IMMA): int8 operands, exact int32 accumulators as the output. Tested
// against the CPU backend in tests/backends/cuda/ops_test.cpp, fp8_test.cpp and w8a8_test.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "core/dtype.h"

namespace kiln::cuda {

class Gemm {
 public:
  explicit Gemm(size_t workspace_bytes = size_t(32) << 20);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // bias may be null; all pointers hold `dtype` elements. ldy: elements between rows of
  // y (0: n); a larger one writes a column slice of a wider y (the tiles of a weight
  // dequantized in parts), whose pointer must keep cuBLASLt's 256-byte alignment.
  // residual (null: none) is [m, n] laid out like y: y = x·wᵀ + bias + residual, added in
  // f32 before the one rounding (cuBLASLt's C with beta = 1; pass fuse_norm_linear).
  void run(DType dtype, const void* x, const void* w, const void* bias, void* y, int64_t m, int64_t n,
           int64_t k, cudaStream_t s, int64_t ldy = 0, const void* residual = nullptr);

  // FP8 E4M3: x [m, k] and w [n, k] codes (k a multiple of 16, 16-byte aligned), y and
  // bias (may be null) bf16; `scales` points to device floats w_scale
  // (scales[0]) and x_scale (scales[4], on its own 16 bytes: cuBLASLt wants it so):
  // y = (w_scale * x_scale) * Σ_k w·x + bias. cuBLASLt's FP8 kernels need this "TN" layout.
  void run_fp8(const void* x, const void* w, const float* scales, const void* bias, void* y, int64_t m, int64_t n,
               int64_t k, cudaStream_t s);
  // FP8 plans made from now on accumulate with Hopper's fast FP8 accumulation (no periodic
  // promotion of the tensor cores' partial sums to f32) or the precise one. Default:
  // precise, unless the environment sets KILN_CUDA_FP8_FAST_ACCUM=1. On the H200 the fast
  // form made the 8B-shape Linears 1.10x faster at 2048 rows but moved their outputs by
  // 9-27% of max|y| (cuda_fp8_gemm_bench): too much to be the default.
  void set_fp8_fast_accum(bool on);

  // INT8: x [m, k] and w [n, k] int8, y [m, n] int32 = Σ_k x·w exactly (no scaling: the
  // caller's epilogue applies the scales). cuBLASLt's IMMA kernels in the regular (not
  // COL32) ordering need this "TN" layout, n and k multiples of 4, and (as every plan
  // here assumes) 256-byte aligned pointers.
  void run_int8(const void* x, const void* w, int32_t* y, int64_t m, int64_t n, int64_t k, cudaStream_t s);

  struct TacticTime {
    int tactic;  // index into the heuristic's list
    float ms;    // median of the timed runs
  };
  // Times every tactic for this shape on the given buffers (x: m·k, y: m·n elements,
  // any contents but not all zeros) and keeps the fastest. Synchronizes the stream.
  std::vector<TacticTime> tune(DType dtype, const void* x, const void* w, const void* bias, void* y,
                               int64_t m, int64_t n, int64_t k, cudaStream_t s, int reps = 5);
  // The same for run_fp8's shape.
  std::vector<TacticTime> tune_fp8(const void* x, const void* w, const float* scales, const void* bias, void* y,
                                   int64_t m, int64_t n, int64_t k, cudaStream_t s, int reps = 5);
  // The same for run_int8's shape.
  std::vector<TacticTime> tune_int8(const void* x, const void* w, int32_t* y, int64_t m, int64_t n, int64_t k,
                                    cudaStream_t s, int reps = 5);
  // Whether compiles time tactics (KILN_CUDA_TUNE=0 skips it: faster loads, the
  // heuristic's first algorithm).
  static bool tuning_enabled();
  // Logs a shape's timings at debug level: "cuda: <what> m=.. n=.. k=.. tactics: #i=..us".
  static void log_tactics(const char* what, int64_t m, int64_t n, int64_t k, const std::vector<TacticTime>& times);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::cuda
