// The `kiln` command line: one binary, trtexec-like subcommands. Each subcommand
// registers its options and returns its runner. Tested by tests/tools/cli_test.sh.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

#include "runtime/model.h"
#include "runtime/quantize.h"

namespace kiln::cli {

using Runner = std::function<int()>;

Runner add_generate(CLI::App& app);
Runner add_chat(CLI::App& app);
Runner add_embed(CLI::App& app);
Runner add_classify(CLI::App& app);
Runner add_rerank(CLI::App& app);
Runner add_tokenize(CLI::App& app);
Runner add_inspect(CLI::App& app);
Runner add_bench(CLI::App& app);
Runner add_eval(CLI::App& app);
Runner add_serve(CLI::App& app);
Runner add_build(CLI::App& app);

// A nested subcommand and its runner (run it when app->parsed()).
struct SubRunner {
  CLI::App* app = nullptr;
  Runner run;
};
// The serving load generator, as `kiln serve bench` and `kiln bench serve`.
SubRunner add_serve_bench(CLI::App* parent);

// Options every model-loading subcommand shares.
struct ModelArgs {
  std::string model;
  std::string backend = "cpu";
  std::string weight_dtype = "auto";
  int opt_level = 2;
  std::vector<std::string> disabled_passes;
  std::string profile;  // engines: the optimization profile to run under ("" = first that fits)
  std::string onnx_import = "auto";
  QuantOptions quant;  // --quant w8a8|fp8 --calib ...
  int tp = 0;  // tensor-parallel ranks (ModelOptions::tensor_parallel; 0: not given)
  std::string kv_cache_dtype = "auto";  // ModelOptions::kv_cache_dtype (add_kv_dtype_option)
  std::string kv_calib = "default";     // ModelOptions::kv_calib (add_kv_dtype_option)
  std::string kv_rotate = "on";         // ModelOptions::kv_rotate: on | off (add_kv_dtype_option)
  bool gguf_requantize = false;  // ModelOptions::keep_file_quant = false
  std::vector<std::string> pins;  // --pin-precision: ModelOptions::precision + pin_precision
  std::string tactic_cache;       // --tactic-cache: ModelOptions::tactic_cache
  int64_t max_context = 0;        // --max-context: ModelOptions::max_context
};
// --max-context N (ModelOptions::max_context), for the commands that load a model.
void add_max_context_option(CLI::App* cmd, int64_t& tokens);
// --tactic-cache FILE (ModelOptions::tactic_cache), for the commands that load a model.
void add_tactic_cache_option(CLI::App* cmd, std::string& path);
// --pin-precision NODE_GLOB=PRECISION[,...] (kiln build, and the model-loading commands).
void add_pin_option(CLI::App* cmd, std::vector<std::string>& pins);
// The pins of those options, parsed (a malformed one is an error naming it).
std::vector<passes::PrecisionPin> parse_pin_options(const std::vector<std::string>& pins);
// --tp N (ModelOptions::tensor_parallel).
void add_tp_option(CLI::App* cmd, int& tp);
// --kv-cache-fraction F (LlmRunnerOptions / ExecutorOptions::kv_cache_fraction; 0 = not
// given). Returns the option, so a command can ask whether it was given.
CLI::Option* add_kv_fraction_option(CLI::App* cmd, double& fraction);
// --kv-cache-dtype auto|int8|fp8 (ModelOptions::kv_cache_dtype), for the commands that run
// a decoder with a KV cache.
// --kv-cache-dtype, --kv-calib and --kv-rotate (ModelOptions::kv_cache_dtype, kv_calib, kv_rotate).
void add_kv_dtype_option(CLI::App* cmd, std::string& dtype, std::string& calib, std::string& rotate);
// --onnx-import auto|graph|family (ModelOptions::onnx_import).
void add_onnx_option(CLI::App* cmd, std::string& mode);
void add_model_options(CLI::App* cmd, ModelArgs& args);
// --opt-level and --disable-pass (shared by the model-loading commands and build).
void add_pass_options(CLI::App* cmd, int& opt_level, std::vector<std::string>& disabled);
ModelOptions model_options(const ModelArgs& args);
// --quant, --calib, --calib-method, --calib-cache, --keep, --smooth-alpha, --calib-seqs.
// q8_option: the flag that selects q8 weights for awq/gptq in this command (its help text).
void add_quant_options(CLI::App* cmd, QuantOptions& q, const std::string& q8_option);
// Model::load, quantized when --quant asks for it.
std::unique_ptr<Model> load_model(const ModelArgs& args);

// --plugin FILE (repeatable): plugin libraries with custom ops (docs/plugins.md). The
// paths of whichever subcommand ran; main loads them, then KILN_PLUGINS', before it runs.
void add_plugin_option(CLI::App* cmd);
std::vector<std::string>& plugin_paths();

// "1,2,3" -> ids; throws kiln::Error naming the bad entry.
std::vector<int32_t> parse_ids(const std::string& s);

}  // namespace kiln::cli
