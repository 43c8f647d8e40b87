// Linear layers on the device through cuBLASLt: y[m,n] = x[m,k]·w[n,k]ᵀ (+ bias[n]) with
// f16/bf16 (or f32) operands and f32 accumulation; the bias is cuBLASLt's epilogue. The
// algorithms cublasLtMatmulAlgoGetHeuristic offers for a shape are the tactics: tune()
// times them on the device and keeps the fastest for that shape; untuned shapes take
// the heuristic's first, except at the row counts of decode steps: inside a RowTuningScope
// (a decode step being enqueued) the first GEMM of each shape at a row count not yet
// decided is timed right there on the step's own operands, and that choice is kept for
// every later step and graph capture at that row count (gemm_row_tuning.h keeps the books).
// With KILN_CUDA_SKINNY_GEMM=1, 16-bit plans of at most kSkinnyMaxRows rows also offer the
// skinny split-k GEMM's configurations (gemm_skinny.h) as tactics past the heuristic's,
// timed the same way (=force runs them untimed; off by default, see gemm.cpp).
// run_fp8 is the FP8 form: E4M3 operands with per-tensor scales
// (cuBLASLt's A/B scale pointers), f32 accumulation, bf16 bias and output. run_int8 is
// the INT8 form (IMMA): int8 operands, exact int32 accumulators as the output. Tested
// against the CPU backend in tests/backends/cuda/ops_test.cpp, fp8_test.cpp and w8a8_test.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda/ops/gemv.h"
#include "core/dtype.h"

namespace kiln::cuda {

// The current device as the tactic cache names it: "NVIDIA H200 (132 SMs), cuBLASLt 130100".
std::string gemm_tactic_device();

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
  // act (kNone or an activation, not kSwiGlu; no residual with it): where the tactic that
  // runs is the skinny GEMM's, it applies the activation in its epilogue, y = T(act(T(x·wᵀ
  // + bias))) as the activation pass after cuBLASLt would, and run returns true; otherwise
  // y is the plain product and run returns false (the caller runs the pass).
  bool run(DType dtype, const void* x, const void* w, const void* bias, void* y, int64_t m, int64_t n,
           int64_t k, cudaStream_t s, int64_t ldy = 0, const void* residual = nullptr,
           GemvEpilogue act = GemvEpilogue::kNone);

  // FP8 E4M3: x [m, k] and w [n, k] codes (k a multiple of 16, 16-byte aligned), y and
  // bias (may be null) bf16; `scales` points to device floats w_scale
  // (scales[0]) and x_scale (scales[4], on its own 16 bytes: cuBLASLt wants it so):
  // y = (w_scale * x_scale) * Σ_k w·x + bias. cuBLASLt's FP8 kernels need this "TN" layout.
  void run_fp8(const void* x, const void* w, const float* scales, const void* bias, void* y, int64_t m, int64_t n,
               int64_t k, cudaStream_t s);
  // The same writing y as E4M3 codes (no bias): y = e4m3(d_scale * (w_scale * x_scale) *
  // Σ_k w·x), cuBLASLt's D = scaleD * (alpha * scaleA * scaleB * A·B) with D in E4M3;
  // d_scale is scales[8] (448 / the output's amax, on its own 16 bytes as well).
  void run_fp8_e4m3(const void* x, const void* w, const float* scales, void* y, int64_t m, int64_t n, int64_t k,
                    cudaStream_t s);
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

  // Timing at decode row counts. While a scope is open (the backend opens one around the
  // launches of each decode step), run, run_fp8 and run_int8 time the heuristic's
  // algorithms for a (shape, m) met for the first time and not tuned at load (tune*:
  // m = 1 and 128), unless the stream is capturing a graph: a median of kRowTuneReps runs
  // each, L2 emptied before each run, on the call's own operands (y is written by every
  // run; a residual that aliases y is not timed). The heuristic's first stays unless
  // another is faster by more than kRowTuneMargin (timing noise must not move it). Each
  // distinct shape is timed once per m, not once per layer. Closing the outermost scope
  // logs, at info, the shapes timed and the time spent per new m.
  // Off with KILN_CUDA_GEMM_TUNE_M=0 (or KILN_CUDA_TUNE=0); set_row_tuning overrides.
  static constexpr int kRowTuneReps = 5;
  static constexpr float kRowTuneMargin = 0.02f;
  static bool row_tuning_from_env();  // read once
  // KILN_CUDA_GEMM_TUNE_M=all: the backend opens a scope around every step, not only
  // decode steps (prefill chunks and encoder forwards are timed at their row counts too).
  static bool row_tuning_every_step();
  void set_row_tuning(bool on);
  // Row buckets (off by default): a plan for 2 < m < 65536 rows, m not a power of two,
  // takes the algorithms of the next power of two's plan that cuBLASLt accepts for m
  // (cublasLtMatmulAlgoCheck), and that plan's choice, instead of querying the heuristic
  // for m; none accepted: the heuristic. 16-bit plans only (not int8, not FP8). For
  // servers, whose step sizes change with every arrival, finish and prefill chunk: no
  // heuristic query at each new size (a new plan's first step was seen ~4.6 ms slower
  // than its second on the H200, bench/RESULTS.md 2026-12-02 session 23; the executor's
  // warm-up makes the powers of two's plans). Plans made before the switch keep theirs.
  void set_row_buckets(bool on);
  // Tactic search (gemm_search.h): when on, every timing of a plan (tune*, and a decode
  // row count's first step) first screens cuBLASLt's configuration space beyond the
  // heuristic's list on the same operands - each algorithm and tile it accepts, then the
  // best tiles' custom options, cluster shapes and k splits - and times the kSearchKeep
  // quickest beside the heuristic's candidates. ~0.1-2 s per (shape, m) on the H200. Off by
  // default; KILN_CUDA_GEMM_SEARCH=1 turns it on. Plans already timed keep their choice.
  void set_search(bool on);
  // The tactic cache file (gemm_search.h; "" none, the default unless
  // KILN_CUDA_TACTIC_CACHE names one): a plan made afterwards whose (types, m, shape) the
  // cache holds for this device and cuBLASLt takes that configuration untimed, and each
  // timing writes its choice into it. With the search on, one run fills the cache and
  // later ones (kiln serve, which times nothing at new batch sizes) start from its choices.
  void set_tactic_cache(const std::string& path);
  class RowTuningScope {
   public:
    explicit RowTuningScope(Gemm& g);
    ~RowTuningScope();
    RowTuningScope(const RowTuningScope&) = delete;
    RowTuningScope& operator=(const RowTuningScope&) = delete;

   private:
    Gemm& g_;
  };

  // What a plan uses: its tactic (an index into the heuristic's list, then the search's
  // and the cache's), how many candidates it had, and the timings that chose it (empty when it was
  // not timed: the heuristic's first). tactic is -1 when no GEMM of that shape and m ran.
  struct Choice {
    int tactic = -1;
    int candidates = 0;
    std::vector<TacticTime> times;
    std::string algo;     // the chosen cuBLASLt configuration (GemmAlgoConfig::str), "" for a skinny tactic
    bool cached = false;  // taken from the tactic cache, untimed
  };
  Choice choice(DType in, DType out, int64_t m, int64_t n, int64_t k, bool bias, int64_t ldy = 0) const;
  // Logs a shape's timings at debug level: "cuda: <what> m=.. n=.. k=.. tactics: #i=..us".
  static void log_tactics(const char* what, int64_t m, int64_t n, int64_t k, const std::vector<TacticTime>& times);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::cuda
