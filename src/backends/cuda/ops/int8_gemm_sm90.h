// The W8A8 Linear's int8 GEMM with its dequantize fused (Hopper, sm_90a): int8 x [m, k]
// (row-major activations) times int8 w [n, k] (K-major weights, row j = output channel
// j: a "TN" GEMM) on wgmma tensor cores with exact int32 sums, whose epilogue applies
// int8.h's Int8Epilogue (y = act(float(acc) * (xs * w_scale[j]) + bias[j]), per-token
// or static xs, f32 bias, one rounding) and writes bf16/f16 straight to y: no int32 sums
// in memory. Built from CUTLASS 3 (collective builders + an epilogue visitor tree) when
// CMake found its headers (KILN_CUTLASS_DIR, scripts/fetch_cutlass.sh) and targets
// sm_90a; otherwise int8_gemm_sm90_available() says why and the Linear keeps cuBLASLt.
// The tile configurations are the tactics. Tested against an exact host reference in
// tests/backends/cuda/int8_gemm_sm90_test.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/cuda/ops/int8.h"
#include "core/dtype.h"

namespace kiln::cuda {

// Tile configurations (CTA tile M x N x K, schedule, cluster).
enum class Int8GemmConfig : uint8_t {
  kPingpong128x128,     // 128x128x128, ping-pong warpgroups, 2x1 cluster (large M)
  kCooperative128x128,  // 128x128x128, both warpgroups on one tile, no cluster
  kPingpong64x128,      // 64x128x128, ping-pong, no cluster (few rows, or few tiles)
  kCooperative128x192,  // 128x192x128, both warpgroups on one tile: N = 768 (BERT-base's o and
                        // down projections) in 4 tiles, 4096 rows in one wave of 128 CTAs
};
constexpr int kInt8GemmConfigs = 4;
const char* int8_gemm_config_name(Int8GemmConfig c);

// Whether this build and the current device run the kernel: compiled in (CUTLASS headers
// and an sm_90a target at configure time) and a compute capability 9.0 device. When not,
// `why` (if given) says which.
bool int8_gemm_sm90_available(std::string* why = nullptr);

// Whether the kernel handles this problem (out bf16/f16, act none or gelu_erf, k % 16 ==
// 0, n % 8 == 0, x/w/y and the scale vectors 16-byte aligned, m, n, k < 2^31); an empty
// string when it does, else what is wrong. Does not check int8_gemm_sm90_available.
// `codes` asks for the codes epilogue (below): act gelu_erf, n % 16 == 0.
std::string int8_gemm_sm90_check(DType out, const int8_t* x, const int8_t* w, const void* y,
                                 int64_t m, int64_t n, int64_t k, const Int8Epilogue& e,
                                 bool codes = false);

// Device workspace the configuration needs for this shape (often 0).
size_t int8_gemm_sm90_workspace(Int8GemmConfig c, DType out, int64_t m, int64_t n, int64_t k,
                                GemvEpilogue act, bool codes = false);

// y [m, n] (row stride n) = epilogue(x · wᵀ) through configuration c; w has at least n
// rows. The problem must pass int8_gemm_sm90_check; `workspace` holds at least
// int8_gemm_sm90_workspace bytes (may be null when that is 0). sm_count: the device's
// SMs (the persistent grid's size). Throws kInternal when CUTLASS refuses or the launch fails.
// The codes epilogue (code_table set, e.act gelu_erf): y is int8 [m, n] instead, the codes
// int8_code(T(gelu(T(v))), inv) that the T output (`out` = T) followed by the
// GELU-to-static-codes pass would write, bit for bit: code_table is the reader's codes
// table for T and inv (launch_unary_lut_fill_codes: kUnaryLutEntries codes by T bits),
// read by the kernel while it runs.
void launch_int8_gemm_sm90(Int8GemmConfig c, DType out, const int8_t* x, const int8_t* w, int64_t m,
                           int64_t n, int64_t k, const Int8Epilogue& e, void* y, void* workspace,
                           size_t workspace_bytes, int sm_count, cudaStream_t s,
                           const int8_t* code_table = nullptr);

// The configuration for m rows when nothing was timed: 64x128 ping-pong for few rows or
// few 128x128 tiles (under two waves on sm_count SMs), else 128x128 ping-pong.
Int8GemmConfig int8_gemm_sm90_default(int64_t m, int64_t n, int sm_count);

// Per row-count bucket, the configuration to run: kInt8GemmTuneRows are the row counts
// timed at prepare time (KILN_CUDA_TUNE), a call with m rows takes the bucket whose row
// count is nearest in ratio (m <= 362 -> 128, <= 2048 -> 1024, else 4096).
constexpr std::array<int64_t, 3> kInt8GemmTuneRows = {128, 1024, 4096};
struct Int8GemmPlan {
  std::array<Int8GemmConfig, 3> by_bucket{};
  bool tuned = false;
  Int8GemmConfig pick(int64_t m) const { return by_bucket[m <= 362 ? 0 : m <= 2048 ? 1 : 2]; }
};
struct Int8GemmTiming {
  int64_t m = 0;
  Int8GemmConfig config{};
  float ms = 0;  // median of the timed runs
};
// Times every configuration at each kInt8GemmTuneRows row count on random int8 inputs,
// the real weights w [>= n, k] and epilogue e (with per_token, random per-token scales in
// place of e.row_scale), keeping the fastest per bucket; `timings` (optional) receives
// every measurement. Allocates its own buffers (row counts whose output passes 256 MiB
// keep the default, untimed, except the first) and synchronizes s. Cached per device and
// shape: the layers of a model share a few shapes. code_table set times the codes
// epilogue (e.act kGeluErf) with that table, the kernel such a Linear runs: its
// configuration can differ from the plain GEMM's (cached apart).
// KILN_CUDA_INT8_CONFIG=NxK=NAME[,NxK=NAME...] overrides the timed choice for every row
// bucket of the Linears of that shape (n output channels, k inputs), NAME one of pp2x1,
// coop128, pp64, coop192 (the Int8GemmConfig order): a tool for measuring configurations
// inside a model's forward (bench/ab.py), where a kernel timed alone can rank them otherwise
// (bench/RESULTS.md, session 49).
Int8GemmPlan int8_gemm_sm90_tune(DType out, const int8_t* w, int64_t n, int64_t k,
                                 const Int8Epilogue& e, bool per_token, int sm_count,
                                 cudaStream_t s, std::vector<Int8GemmTiming>* timings = nullptr,
                                 const int8_t* code_table = nullptr);

// KILN_CUDA_INT8_CONFIG's value parsed: {n, k, configuration} per entry; empty or null: none.
// A malformed entry or an unknown name throws kInvalidArgument naming it.
struct Int8ConfigOverride {
  int64_t n = 0, k = 0;
  Int8GemmConfig config{};
};
std::vector<Int8ConfigOverride> parse_int8_config_overrides(const char* value);

}  // namespace kiln::cuda
