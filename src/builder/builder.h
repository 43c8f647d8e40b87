// The engine builder (`kiln build`): loads a model, runs the optimization passes
// (with assign_precision: per-GEMM weight precision and pins), optionally shards it for
// tensor parallelism (one graph per rank, all in the one file), converts GEMM weights
// to their stored precision, plans the activation arena of every optimization profile
// at its max shapes (checked against a --workspace limit), times the backend's tactics
// for every GEMM shape at the first profile's opt shape (a timing cache file makes
// rebuilds fast), optionally packs GEMM weights into the backend's layout, embeds
// config, tokenizer and profiles, and writes the engine file.
// Tested in tests/engine/builder_test.cpp, tests/engine/profile_test.cpp,
// tests/engine/tp_engine_test.cpp and by tests/tools/cli_test.sh.
#pragma once

#include <string>
#include <vector>

#include "engine/engine.h"
#include "passes/pass_manager.h"
#include "runtime/quantize.h"

namespace kiln {

struct BuildOptions {
  std::string model;           // HF directory, .gguf, .onnx, or (random_weights) a config.json
  bool random_weights = false;
  std::string output;          // the engine file to write
  std::string backend = "cpu";
  // GEMM weights: f32 | bf16 | f16 (as stored) | q8 | q4, or auto (as Model::load: a GGUF's
  // quantized Linears as q8/q4 codes, the rest in the backend's auto dtype; f32 under --quant or
  // pins).
  std::string weight_dtype = "f32";
  // Layers pinned to another precision (passes/assign_precision; `--pin-precision`).
  std::vector<passes::PrecisionPin> pin_precision;
  int opt_level = 2;
  std::vector<std::string> disabled_passes;
  std::string onnx_import = "auto";  // .onnx: auto | graph | family (ModelOptions)
  // Optimization profiles (min/opt/max per dynamic dim), tried in this order by an
  // execution context; empty: one profile "default" with T in [1, 16384], opt 128.
  // Tactics are timed at the first profile's opt shapes.
  std::vector<EngineProfile> profiles;
  // The most bytes the activation arena may take at any profile's max shapes (0: no
  // limit): a plan above it fails the build, saying what fits (`--workspace`).
  uint64_t workspace_bytes = 0;
  bool tune = true;            // time tactics (else the backend's heuristics at run time)
  // Store GEMM weights in the backend's run-time layout (the CPU's packed panels), so
  // a load maps them in place instead of packing; the engine then runs only on that
  // backend. Off: portable [N, K] weights, packed at load.
  bool pack_weights = false;
  std::string timing_cache;    // JSON file read before and written after tuning; "" = none
  // Post-training quantization (mode "w8a8": calibrated int8 Linears, the rest f32;
  // "fp8": calibrated E4M3 Linears, stored as E4M3 codes in the engine).
  QuantOptions quant;
  // Tensor parallelism (`--tp N`, decoders): N > 1 shards the model as `--tp N` loads do
  // (parallel/tensor_parallel.h), runs the passes, converts, plans, times tactics and
  // packs every rank's graph, and writes them all into the one engine file, which then
  // loads sharded over N ranks without the checkpoint.
  int tensor_parallel = 1;
  // ModelOptions::max_context (`--max-context`): a LongRoPE model built past its original
  // length stores its long factors.
  int64_t max_context = 0;
  // The int8/fp8 KV cache's key shift (runtime/kv_calibration.h), measured on a decoder
  // and stored in the engine, so that a quantized cache loads it instead of measuring:
  // "default" (the built-in calibration text), "none" (record that keys stay unshifted),
  // or comma-separated text files (`--kv-calib`).
  std::string kv_calib = "default";
};

struct BuildReport {
  size_t bytes = 0;
  double seconds = 0, load_seconds = 0, tune_seconds = 0;
  std::vector<passes::PassResult> passes;
  size_t nodes_before = 0, nodes_after = 0;
  size_t tactics_chosen = 0, shapes_timed = 0, cache_hits = 0;
  size_t packed_gemms = 0;  // GEMMs stored in the backend's layout (pack_weights)
  std::string device;
  std::vector<EngineProfile> profiles;  // with their planned activation arenas (per rank: the largest)
  int tp_world = 1;
  std::vector<uint64_t> rank_weight_bytes;  // tensor parallelism: each rank's weights (replicated ones counted per rank)
  std::string quant_summary;  // what the quantization rewrite did, or empty
  // The engine's GEMM weights: the dtype it records, and under auto the Linears that
  // keep a file's codes, e.g. "f32 (16 q4, 105 q8 Linears kept from the file)".
  std::string weights;
  // The KV key shift the engine records ("" when none: an encoder, or no tokenizer).
  std::string kv_key_shift;
  double kv_calib_seconds = 0;
};

BuildReport build_engine(const BuildOptions& options);

// "small:T=1,16,64;B=1,1,8" -> a named profile; "T:1,128,512" -> one named "default".
// Throws kInvalidArgument naming the problem.
EngineProfile parse_profile(const std::string& spec);
// "512MiB", "2GiB", "1048576" -> bytes (throws kInvalidArgument).
uint64_t parse_bytes(const std::string& spec);
// 1536 -> "1.5 KiB".
std::string format_bytes(uint64_t bytes);

}  // namespace kiln
