// The FP8 Linear's gate|up GEMM with SwiGLU and the next Linear's E4M3 quantize fused into
// its epilogue (Hopper, sm_90a): E4M3 x [m, k] times the E4M3 [gate; up] weights whose
// rows are interleaved in blocks of kFp8SwigluBlock (gate rows 0-63, up rows 0-63, gate
// rows 64-127, ...: fp8_swiglu_interleave_rows), f32 accumulators, and per output (r, j)
// the code that the unfused path writes from the same sums: g, u = bf16(scale · acc),
// silu(g) rounded to bf16, times u, rounded to bf16, e4m3(· inv) - where the unfused path
// (cuBLASLt's FP8 GEMM writing bf16 [gate | up], then the E4M3 SwiGLU pass) moves the
// [m, 2I] bf16 tensor through memory twice. Built from CUTLASS 3 when the int8 GEMM is
// (int8_gemm_sm90.h: headers found, an sm_90a target); the tile configurations are the
// tactics. Tested in tests/backends/cuda/fp8_swiglu_gemm_test.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kiln::cuda {

// Rows of gate (then of up) per interleaved block of the weights; the output columns of a
// 128-row block pair are 64 consecutive columns.
constexpr int64_t kFp8SwigluBlock = 64;

enum class Fp8SwigluConfig : uint8_t {
  kCooperative128x128,          // 128x128x128, both warpgroups on one tile
  kCooperative128x128Cluster2,  // the same in 2x1 clusters (B tiles multicast)
  kPingpong64x128,              // 64x128x128, ping-pong warpgroups (few rows)
};
constexpr int kFp8SwigluConfigs = 3;
const char* fp8_swiglu_config_name(Fp8SwigluConfig c);

// Whether this build and the current device run the kernel (int8_gemm_sm90_available's
// conditions); when not, `why` says which.
bool fp8_swiglu_gemm_available(std::string* why = nullptr);

// Whether the kernel handles this problem (n = 2 x the output columns, a multiple of 128;
// k % 16 == 0; x, w, y 16-byte aligned; m, n, k < 2^31): empty when it does, else what
// is wrong. Does not check fp8_swiglu_gemm_available.
std::string fp8_swiglu_gemm_check(const uint8_t* x, const uint8_t* w, const uint8_t* y, int64_t m, int64_t n,
                                  int64_t k);
size_t fp8_swiglu_gemm_workspace(Fp8SwigluConfig c, int64_t m, int64_t n, int64_t k);

// y [m, n / 2] (E4M3 codes, row stride n / 2) from x [m, k] and the interleaved w [n, k]
// with scale = x_scale * w_scale and inv = 1 / the reader's input scale. The problem must
// pass fp8_swiglu_gemm_check; workspace holds fp8_swiglu_gemm_workspace bytes.
void launch_fp8_swiglu_gemm(Fp8SwigluConfig c, const uint8_t* x, const uint8_t* w, int64_t m, int64_t n, int64_t k,
                            float scale, float inv, uint8_t* y, void* workspace, size_t workspace_bytes,
                            int sm_count, cudaStream_t s);

// The rows of [gate (inter rows); up (inter rows)], k bytes each, interleaved in blocks of
// kFp8SwigluBlock: dst row 128 b + i = gate row 64 b + i, dst row 128 b + 64 + i = up row
// 64 b + i. inter % kFp8SwigluBlock == 0.
void fp8_swiglu_interleave_rows(const uint8_t* src, uint8_t* dst, int64_t inter, int64_t k);

// The configuration for m rows when nothing was timed: 64x128 ping-pong up to 256 rows,
// else 128x128 cooperative.
Fp8SwigluConfig fp8_swiglu_gemm_default(int64_t m);
// Per row-count bucket, the configuration to run (int8_gemm_sm90.h's buckets: m <= 362
// takes the one timed at 128 rows, <= 2048 at 1024, else at 4096).
struct Fp8SwigluPlan {
  std::array<Fp8SwigluConfig, 3> by_bucket{Fp8SwigluConfig::kPingpong64x128, Fp8SwigluConfig::kCooperative128x128,
                                           Fp8SwigluConfig::kCooperative128x128};
  Fp8SwigluConfig pick(int64_t m) const { return by_bucket[m <= 362 ? 0 : m <= 2048 ? 1 : 2]; }
};
constexpr std::array<int64_t, 3> kFp8SwigluTuneRows = {128, 1024, 4096};
struct Fp8SwigluTiming {
  int64_t m = 0;
  Fp8SwigluConfig config{};
  float ms = 0;  // median of the timed runs
};
// Times every configuration at each kFp8SwigluTuneRows row count on random codes with the
// real weights w [n, k], keeping the fastest per bucket; `timings` (optional) receives
// every measurement. Allocates its own buffers and synchronizes s. Cached per device and
// shape (the layers of a model share one).
Fp8SwigluPlan fp8_swiglu_gemm_tune(const uint8_t* w, int64_t n, int64_t k, int sm_count, cudaStream_t s,
                                   std::vector<Fp8SwigluTiming>* timings = nullptr);

}  // namespace kiln::cuda
