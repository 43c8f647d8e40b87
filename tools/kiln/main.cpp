// kiln: compile and run Transformer models. Subcommands live in cmd_*.cpp.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "commands.h"
#include "core/status.h"
#include "ir/plugin.h"
#include "passes/pass.h"

namespace kiln::cli {

std::vector<std::string>& plugin_paths() {
  static std::vector<std::string> paths;
  return paths;
}

void add_plugin_option(CLI::App* cmd) {
  cmd->add_option("--plugin", plugin_paths(),
                  "a plugin library with custom ops (repeatable; also KILN_PLUGINS=a.so:b.so): ONNX nodes of its ops "
                  "import, and engines built with it load (docs/plugins.md)");
}

void add_model_options(CLI::App* cmd, ModelArgs& args) {
  cmd->add_option("-m,--model", args.model,
                  "model: a HuggingFace directory (config.json + *.safetensors), a .gguf or .onnx file or a .kiln engine")
      ->required();
  cmd->add_option("--backend", args.backend, "where to run: cpu")->capture_default_str();
  cmd->add_option("--weight-dtype", args.weight_dtype,
                  "storage of GEMM weights: auto (a GGUF's Q8_0/Q5_0/Q4_0/Q4_1/Q4_K Linears keep their own codes, as q8/q4, "
                  "its Q5_1/Q5_K/Q6_K/Q2_K/Q3_K ones are requantized to q8, and the rest is f32 on the CPU - a bf16/f16 checkpoint's own dtype when every matrix is stored in it -, "
                  "bf16 on CUDA), f32 (exact), bf16/f16 (half the memory traffic), "
                  "q8/q4 (weight-only int8/int4, groups of 32)")
      ->check(CLI::IsMember({"auto", "f32", "bf16", "f16", "q8", "q4"}))
      ->capture_default_str();
  cmd->add_flag("--gguf-requantize", args.gguf_requantize,
                "with --weight-dtype q8/q4: expand a GGUF's Q8_0/Q4_0/Q4_1/Q4_K weights to f32 and quantize them again "
                "instead of keeping the file's codes (the old path, for comparison)");
  add_pass_options(cmd, args.opt_level, args.disabled_passes);
  cmd->add_option("--engine-profile", args.profile,
                  "engines: run under this optimization profile (default: per step, the first that fits)");
  add_onnx_option(cmd, args.onnx_import);
  add_quant_options(cmd, args.quant, "--weight-dtype");
  add_pin_option(cmd, args.pins);
  add_tp_option(cmd, args.tp);
  add_plugin_option(cmd);
  add_tactic_cache_option(cmd, args.tactic_cache);
  add_max_context_option(cmd, args.max_context);
}

void add_max_context_option(CLI::App* cmd, int64_t& tokens) {
  cmd->add_option("--max-context", tokens,
                  "the longest sequence in tokens (default: the model's limit; a LongRoPE model's is its original "
                  "length, and a context past it takes the long factors at every position, up to "
                  "max_position_embeddings)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 40));
}

void add_tactic_cache_option(CLI::App* cmd, std::string& path) {
  cmd->add_option("--tactic-cache", path,
                  "cuda: a JSON file of the GEMM algorithms timed on this GPU and cuBLASLt, read at load (those "
                  "choices are taken untimed) and updated by every timing, e.g. filled by `kiln bench -b 64` for "
                  "`kiln serve`, which times nothing at new batch sizes (also KILN_CUDA_TACTIC_CACHE)");
}

CLI::Option* add_kv_fraction_option(CLI::App* cmd, double& fraction) {
  return cmd
      ->add_option("--kv-cache-fraction", fraction,
                   "size the KV cache pool as this fraction (0, 1] of the device memory free once the weights and "
                   "the activation arena are resident (default: a fixed size in tokens)")
      ->check(CLI::Range(0.0, 1.0) & CLI::PositiveNumber);
}

void add_kv_dtype_option(CLI::App* cmd, std::string& dtype, std::string& calib, std::string& rotate) {
  cmd->add_option("--kv-cache-dtype", dtype,
                  "KV cache storage: auto (the backend's activation dtype), int8 or fp8 (E4M3; vLLM's fp8_e4m3 too): one byte per "
                  "element plus one scale per token and K/V head (about a quarter of the f32 bytes, a half of bf16)")
      ->check(CLI::IsMember({"auto", "int8", "fp8", "fp8_e4m3"}))
      ->capture_default_str();
  cmd->add_option("--kv-calib", calib,
                  "int8/fp8 KV cache: the text each layer's mean key is measured on at load (keys are stored less "
                  "it, which the softmax does not see, so less of them is rounded away): default (the built-in "
                  "calibration set, 3,968 tokens at most; an engine's shift measured at build when it has one), text "
                  "files (comma-separated), or none")
      ->capture_default_str();
  cmd->add_option("--kv-rotate", rotate,
                  "int8/fp8 KV cache: store keys through a Walsh-Hadamard transform (queries take it too, so "
                  "scores are unchanged), which spreads the rounding of a key's few large channels over all of "
                  "them: on or off")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
}

void add_pin_option(CLI::App* cmd, std::vector<std::string>& pins) {
  cmd->add_option("--pin-precision", pins,
                  "GEMMs pinned to a precision: NODE_GLOB=PRECISION[,...], e.g. 'lm_head=bf16,layers.0.*=f32' "
                  "(node names as in `kiln inspect --graph`; repeatable, the last match wins); the other GEMMs take "
                  "the weight precision (--weight-dtype; build: --precision), the logits GEMM f32 unless pinned");
}

std::vector<passes::PrecisionPin> parse_pin_options(const std::vector<std::string>& pins) {
  std::vector<passes::PrecisionPin> out;
  for (const std::string& p : pins)
    for (auto& pin : passes::parse_precision_pins(p)) out.push_back(pin);
  return out;
}

void add_tp_option(CLI::App* cmd, int& tp) {
  cmd->add_option("--tp", tp,
                  "tensor parallelism: shard the decoder's heads and MLP over N ranks, one thread each (cpu backend: "
                  "in-process all-reduce; cuda: GPU r for rank r, joined by NCCL); N must divide the attention heads, "
                  "K/V heads and MLP width. An engine built with `kiln build --tp N` runs over its N ranks: omit "
                  "--tp or give that N (default: the engine's, else 1)")
      ->check(CLI::Range(1, 64));
}

void add_onnx_option(CLI::App* cmd, std::string& mode) {
  cmd->add_option("--onnx-import", mode,
                  ".onnx models: auto (a recognised BERT/GPT-2/Llama export runs as kiln's own "
                  "family graph once it agrees with the op-by-op import on a probe), graph "
                  "(always op by op), family (must be recognised)")
      ->check(CLI::IsMember({"auto", "graph", "family"}))
      ->capture_default_str();
}

void add_quant_options(CLI::App* cmd, QuantOptions& q, const std::string& q8_option) {
  cmd->add_option("--quant", q.mode,
                  "post-training quantization: w8a8 (int8 weights and activations), fp8 (E4M3 weights and "
                  "activations, per-tensor scales), or awq (weight-only q4, or q8 with " + q8_option + " q8, with "
                  "activation-aware per-channel scales searched on the calibration text), gptq (weight-only q4/q8, each "
                  "column's rounding error spread over the columns not yet quantized, weighted by the calibration "
                  "inputs' Hessian) or awq-gptq (both), all calibrated; awq/gptq keep the logits GEMM f32")
      ->check(CLI::IsMember({"w8a8", "fp8", "awq", "gptq", "awq-gptq"}));
  cmd->add_option("--calib", q.calib,
                  "calibration set: 'default' (the project's docs), text files (comma-separated), or a calibration "
                  "cache .json")
      ->capture_default_str();
  cmd->add_option("--calib-method", q.method, "activation clip: kl (TensorRT entropy), mse, max or percentile (99.99)")
      ->check(CLI::IsMember({"kl", "mse", "max", "percentile"}))
      ->capture_default_str();
  cmd->add_option("--calib-cache", q.cache, "calibration cache: read when it exists, else written after calibrating");
  cmd->add_option("--keep", q.keep, "Linears kept f32 (node or weight name substrings, comma-separated), e.g. lm_head")
      ->delimiter(',');
  cmd->add_option("--hadamard", q.hadamard,
                  "w8a8: Linears (node name substrings, comma-separated, e.g. down_proj) whose inputs go through a "
                  "Walsh-Hadamard transform before int8 rounding (the weights take it too, so the product is "
                  "unchanged), spreading a row's few huge channels; not smoothed")
      ->delimiter(',');
  cmd->add_option("--smooth-alpha", q.smooth_alpha, "SmoothQuant migration strength in [0, 1]; negative: none")
      ->capture_default_str();
  cmd->add_option("--act-scale", q.act_scale,
                  "activation scales: static (per tensor, from calibration) or per-token (each row's max at run "
                  "time; w8a8 only)")
      ->check(CLI::IsMember({"static", "per-token"}))
      ->capture_default_str();
  cmd->add_flag("--fp8-gate-up-out", q.fp8_gate_up_out,
                "fp8: round the merged gate|up Linear's output to E4M3 (per-tensor scale from its calibrated max) "
                "before SwiGLU, as the GPU's E4M3-output GEMM computes it");
  cmd->add_option("--calib-seqs", q.max_sequences, "calibration sequences at most")->capture_default_str();
  cmd->add_option("--awq-grid", q.awq_grid, "awq: steps of the alpha search over [0, 1]")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  cmd->add_option("--gptq-damp", q.gptq_damp, "gptq: added to the input Hessian's diagonal, times its mean")
      ->check(CLI::Range(0.0, 10.0))
      ->capture_default_str();
  cmd->add_flag("--gptq-act-order,!--gptq-column-order", q.gptq_act_order,
               "gptq: quantize each weight's columns by decreasing input energy (the Hessian's diagonal; the "
               "default), each group's scale and min then taken from the unmodified weights; or in column order, "
               "each group's grid from the updated weights");
  cmd->add_flag("--gptq-sequential", q.gptq_sequential,
               "gptq: calibrate one layer at a time, each on the activations of the model whose earlier layers are "
               "already quantized (one calibration pass per layer)");
  cmd->add_option("--effective-bits", q.effective_bits,
                  "awq/gptq q4: promote to q8 the Linears whose q4 error moves the model's output most (each "
                  "measured alone on the calibration text) until the quantized Linears average this many bits per "
                  "weight (q4 = 5, q8 = 8.5 with their scales)")
      ->check(CLI::Range(kQ4BitsPerWeight, kQ8BitsPerWeight));
  cmd->add_option("--mix-tokens", q.mix_tokens,
                  "--effective-bits on a decoder: calibration tokens each Linear's sensitivity is measured on")
      ->check(CLI::Range(int64_t(16), int64_t(1) << 20))
      ->capture_default_str();
  cmd->add_option("--awq-rows", q.awq_rows, "awq: calibration rows per Linear input the output error is measured on")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20))
      ->capture_default_str();
}

std::unique_ptr<Model> load_model(const ModelArgs& a) { return kiln::load_model(a.model, model_options(a), a.quant); }

void add_pass_options(CLI::App* cmd, int& opt_level, std::vector<std::string>& disabled) {
  cmd->add_option("--opt-level", opt_level,
                  "graph optimization: 0 none, 1 cleanup (dce, cse), 2 + fusions (ignored for engines)")
      ->check(CLI::Range(0, 2))
      ->capture_default_str();
  cmd->add_option("--disable-pass", disabled, "skip a pass by name (repeatable; see kiln inspect)");
}

ModelOptions model_options(const ModelArgs& a) {
  ModelOptions o{a.backend, a.weight_dtype, nullptr, a.opt_level, a.disabled_passes};
  o.keep_file_quant = !a.gguf_requantize;
  o.profile = a.profile;
  o.onnx_import = a.onnx_import;
  o.tensor_parallel = a.tp;
  o.kv_cache_dtype = a.kv_cache_dtype;
  o.kv_calib = a.kv_calib;
  o.kv_rotate = a.kv_rotate == "on";
  o.tactic_cache = a.tactic_cache;
  o.max_context = a.max_context;
  o.lean_host_weights = true;  // the commands run the model; kiln inspect shows the graph unpacked
  // Pins run the precision pass, with the weight dtype as every other GEMM's precision
  // (what `kiln build --precision D --pin-precision ...` stores); engines refuse them.
  o.pin_precision = parse_pin_options(a.pins);
  if (!o.pin_precision.empty()) {
    if (a.weight_dtype == "auto")
      throw_error(ErrorCode::kInvalidArgument, "--pin-precision needs --weight-dtype f32, bf16, f16, q8 or q4 (the "
                  "precision of the GEMMs not pinned), not auto");
    o.precision = a.weight_dtype;
  }
  return o;
}

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t end = s.find_first_of(", ", pos);
    if (end == std::string::npos) end = s.size();
    std::string item = s.substr(pos, end - pos);
    if (!item.empty()) {
      char* rest = nullptr;
      long v = std::strtol(item.c_str(), &rest, 10);
      if (*rest || v < 0 || v > INT32_MAX)
        throw_error(ErrorCode::kInvalidArgument, "--ids: '", item, "' is not a token id");
      ids.push_back(int32_t(v));
    }
    pos = end + 1;
  }
  return ids;
}

}  // namespace kiln::cli

int main(int argc, char** argv) {
  CLI::App app{
      "kiln: a Transformer inference compiler and runtime.\n"
      "Examples:\n"
      "  kiln generate -m SmolLM2-135M-Instruct.Q4_1.gguf -p \"The capital of France is\"\n"
      "  kiln chat -m SmolLM2-135M-Instruct.Q4_1.gguf\n"
      "  kiln embed -m all-MiniLM-L6-v2/ -t \"a sentence to embed\"\n"
      "  kiln bench --random-weights bench/configs/gpt2-small.json\n"
      "  kiln build -m all-MiniLM-L6-v2/ -o minilm.kiln && kiln embed -m minilm.kiln -t \"hi\"\n"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "help for every subcommand");
  int threads = 0;
  app.add_option("--threads", threads, "CPU threads (default: all cores)");
  std::vector<kiln::cli::Runner> runners = {
      kiln::cli::add_generate(app), kiln::cli::add_chat(app), kiln::cli::add_embed(app), kiln::cli::add_classify(app), kiln::cli::add_rerank(app),
      kiln::cli::add_tokenize(app), kiln::cli::add_inspect(app), kiln::cli::add_bench(app), kiln::cli::add_eval(app),
      kiln::cli::add_serve(app), kiln::cli::add_build(app)};
  CLI11_PARSE(app, argc, argv);
  if (threads > 0) setenv("KILN_NUM_THREADS", std::to_string(threads).c_str(), 1);
  try {
    kiln::ir::plugin_load_all(kiln::cli::plugin_paths());
    for (size_t i = 0; i < app.get_subcommands().size(); ++i) {
      CLI::App* sub = app.get_subcommands()[i];
      const auto& all = app.get_subcommands({});
      for (size_t j = 0; j < all.size(); ++j)
        if (all[j] == sub) return runners[j]();
    }
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "kiln: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
