// The engine builder (`kiln build`): loads a model, runs the optimization passes,
// converts GEMM weights to their stored precision, times the backend's tactics for
// every GEMM shape at the profile's opt shape (a timing cache file makes rebuilds
// fast), embeds config, tokenizer and profiles, and writes the engine file.
// Tested in tests/engine/builder_test.cpp and by tests/tools/cli_test.sh.
#pragma once

#include <string>
#include <vector>

#include "engine/engine.h"
#include "passes/pass_manager.h"
#include "runtime/quantize.h"

namespace kiln {

struct BuildOptions {
  std::string model;           // HF directory, .gguf, or (random_weights) a config.json
  bool random_weights = false;
  std::string output;          // the engine file to write
  std::string backend = "cpu";
  std::string weight_dtype = "f32";  // GEMM weights: f32 | bf16 | f16 (as stored) | q8 | q4
  int opt_level = 2;
  std::vector<std::string> disabled_passes;
  // Dynamic-shape profile of the token axis; empty: T in [1, 16384], opt 128.
  std::vector<EngineProfile> profiles;
  bool tune = true;            // time tactics (else the backend's heuristics at run time)
  std::string timing_cache;    // JSON file read before and written after tuning; "" = none
  // Post-training quantization (mode "w8a8": calibrated int8 Linears, the rest f32).
  QuantOptions quant;
};

struct BuildReport {
  size_t bytes = 0;
  double seconds = 0, load_seconds = 0, tune_seconds = 0;
  std::vector<passes::PassResult> passes;
  size_t nodes_before = 0, nodes_after = 0;
  size_t tactics_chosen = 0, shapes_timed = 0, cache_hits = 0;
  std::string device;
  std::string quant_summary;  // what the quantization rewrite did, or empty
};

BuildReport build_engine(const BuildOptions& options);

// "T:1,128,512" -> a profile named "default" (throws kInvalidArgument naming the problem).
EngineProfile parse_profile(const std::string& spec);

}  // namespace kiln
