// A loaded, compiled model: its graph, what the runtime needs to know about it, and
// the backend's compiled form. The public entry point the CLI and tests use to turn a
// model path (HuggingFace directory or .gguf file) into something runnable.
// Tested by the model golden tests in tests/models/.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "backends/backend.h"
#include "engine/engine.h"
#include "frontends/gguf.h"
#include "models/model_builder.h"
#include "passes/pass_manager.h"

namespace kiln {

namespace onnx {
struct OnnxModel;  // frontends/onnx/onnx_model.h
}

struct ModelOptions {
  std::string backend = "cpu";
  // GEMM weight storage: f32 | bf16 | f16 | q8 | q4, or auto: a GGUF's Q8_0 / Q5_0 /
  // Q4_0 / Q4_1 / Q4_K Linears keep their own codes (q8 / q4), its Q5_1 / Q5_K / Q6_K /
  // Q2_K / Q3_K Linears are requantized to q8 (frontends/gguf_quants.h), and the rest take
  // auto_weight_dtype: on the CPU f32, or a bf16/f16 checkpoint's own dtype; bf16 on CUDA
  // (also the activations).
  std::string weight_dtype = "f32";
  std::shared_ptr<Communicator> communicator;  // tensor-parallel rank link, or null
  // Graph optimization (src/passes): 0 runs the faithful graph as built, 1 cleans up,
  // 2 also fuses. Ignored for engine files, which are optimized when built.
  int opt_level = 2;
  std::vector<std::string> disabled_passes;  // pass names to skip
  // Per-node precision (passes/assign_precision): when set, GEMM weights take this
  // precision unless pinned; the logits GEMM and norms stay f32. `kiln build` sets it.
  std::string precision;
  std::vector<passes::PrecisionPin> pin_precision;
  // Engines: the optimization profile to run under (by name); "" takes, per step, the
  // first profile that holds the inputs' shapes.
  std::string profile;
  // Decoders get a TopKLogits node of this k after their logits (0: none), so that a
  // step whose sampling needs no more than the top k of each row fetches [R, k]
  // candidates instead of [R, vocab] logits. Engines keep the node they were built with.
  int32_t top_logits_k = 64;
  // .onnx files: "auto" runs a recognised HF export (BERT, GPT-2) through kiln's own
  // family graph (encoder/decoder runners, fused Attention, KV cache) once it agrees
  // with the op-by-op import on a probe input, else imports op by op; "graph" always
  // imports op by op; "family" requires recognition (an error says why not).
  std::string onnx_import = "auto";
  // Applied to the optimized graph before it is compiled (quantization rewrites such as
  // quant::apply_w8a8); not applied to engine files, which carry their rewrites. With
  // tensor_parallel > 1 it rewrites the unsharded optimized graph, which is then sharded
  // (parallel/tensor_parallel.h): calibration, smoothing and scales are the unsharded
  // model's on every rank.
  std::function<void(ir::Graph&)> rewrite;
  // Instrumentation of Linear nodes (calibration, per-layer error); CPU backend only.
  std::shared_ptr<const LinearObserver> linear_observer;
  // Tensor parallelism: > 1 shards a decoder over this many ranks (parallel/: heads and
  // MLP width split, AllReduce after row-parallel projections), each compiled with its
  // communicator (Backend::make_communicators: threads of this process on the CPU,
  // NCCL over one GPU per rank on CUDA) and run as one thread each by LlmRunner. A
  // tensor-parallel engine (`kiln build --tp N`) holds its ranks already sharded: it
  // runs over its own N ranks, and a value other than 0 or N is an error naming both.
  // 0: as the engine records (else 1). Not for .onnx files.
  int tensor_parallel = 0;
  // Storage of the KV cache the runners allocate for this model: "auto" (the backend's
  // activation dtype), "int8" or "fp8" (E4M3), the last two with per (token, kv head)
  // scales. See KvDType in backends/backend.h.
  std::string kv_cache_dtype = "auto";
  // Key centering of an int8/fp8 KV cache (KvLayout::k_shift, runtime/kv_calibration.h):
  // the text the key shift is measured on when the first runner is made ("default": the
  // built-in calibration set; text files, comma-separated), or "none" (keys stored as
  // they are). Unused with the auto cache.
  std::string kv_calib = "default";
  // Key rotation of an int8/fp8 KV cache (KvLayout::k_rotate): keys stored through a
  // Walsh-Hadamard transform and queries multiplied by it, which leaves every score as it
  // is but spreads the rounding of a row's few large channels over all of them. Unused
  // with the auto cache.
  bool kv_rotate = true;
  // CompileOptions::step_tuning: GEMM tactics timed at each new decode batch size's first
  // step (CUDA; KILN_CUDA_GEMM_TUNE_M=0 turns it off everywhere). `kiln serve` turns it
  // off unless --tune-batch-sizes.
  bool step_tuning = true;
  // CompileOptions::tactic_cache (--tactic-cache).
  std::string tactic_cache;
  // Which device of the backend runs the model (CUDA device index); tensor-parallel
  // rank r runs on device + r.
  int device = 0;
  // With weight_dtype q8/q4: Linear weights a GGUF stores in that very format (Q8_0 /
  // Q5_0 -> q8, Q4_0 / Q4_1 -> q4 exactly; Q4_K -> q4 with its codes and scales rounded to f16,
  // frontends/gguf_quants.h) keep the file's codes; false expands them to f32 at load
  // and quantizes them again at compile time (the path before, kept for comparison).
  bool keep_file_quant = true;
  // The rewrite leaves Linears that keep the file's codes alone (GPTQ), so they may keep
  // them under it; other rewrites (AWQ's scales, W8A8, FP8) read every weight as f32.
  bool rewrite_keeps_file_quant = false;
  // Keep no host copy of a weight the backend holds in its own form. The CPU: Linears
  // are packed into the model's graph before compiling (Backend::pack_weights, as
  // `kiln build --pack-weights` stores them), each [N, K] original freed as soon as it is
  // packed (a q8 TinyLlama GGUF: ~1 GiB less resident); CUDA: after compiling, the
  // host tensors of the weights it uploaded are released (CompiledGraph::
  // release_host_weights; the graph keeps their dtype and shape, with no data). Then
  // graph() no longer holds the [N, K] weights, so it is off by default for callers that
  // read them after loading (quantization rewrites, kiln build, kiln inspect); the
  // commands that only run a model turn it on. Not under a linear_observer. It implies
  // keep_16bit_weights.
  bool lean_host_weights = false;
  // A 16-bit checkpoint's Linear weights and token table load in their file dtype
  // (WeightSource::keep_16bit: views of the file's mapping where aligned) instead of f32:
  // the same values in half the bytes, or none, until the backend packs or uploads them.
  // For callers whose weights only reach the backends or kiln build's conversions (which
  // read any float dtype); ignored under rewrites, observers and tensor parallelism, which
  // read f32 weights.
  bool keep_16bit_weights = false;
  // The longest sequence the model is run at (tokens; 0: the model's own limit). Less
  // caps info().max_positions; more than the model's limit is an error. A LongRoPE model
  // (Phi-3.5, Phi-4-mini) runs its short factors up to original_max_position_embeddings,
  // its default limit; a context past that takes its long factors at every position (the
  // rule llama.cpp applies to a context that long; transformers switches per forward, so
  // the two agree wherever a sequence's prompt is already past that length). Engines:
  // caps only (`kiln build --max-context` stores the choice).
  int64_t max_context = 0;
};

// What weight_dtype "auto" stores the weights a file does not keep quantized in, per
// backend: on the CPU the checkpoint's own bf16/f16 when every matrix is stored in it
// (`stored_dtype`, BuiltModel::stored_dtype: the same values as f32 and half the bytes a
// decode step streams, prefill as fast - 16-bit panels are widened once per row block),
// else "f32"; "bf16" on CUDA (CUDA's activation dtype follows it: bf16 tensor cores and
// half the bytes of f32, as vLLM's dtype auto runs an f32 checkpoint in 16 bits; bf16 for
// f16 checkpoints too, whose values it holds without overflow).
std::string auto_weight_dtype(const std::string& backend, const std::string& stored_dtype = "");
// The Linears of g that keep a file's codes (weight_quant), by format: "16 q4, 105 q8
// Linears" ("1 q8 Linear"), or "" when none do (what `kiln bench` and `kiln build` report).
std::string kept_linear_formats(const ir::Graph& g);

// The graph outputs of that node (ir op TopKLogits): [R, k] values, ids, log-probs.
inline constexpr const char* kTopLogitsOutput = "top_logits";
inline constexpr const char* kTopIdsOutput = "top_ids";
inline constexpr const char* kTopLogprobsOutput = "top_logprobs";

class Model {
 public:
  // `path`: a HuggingFace model directory (config.json + safetensors), a .gguf or .onnx file, or
  // a kiln engine file (`kiln build`; recognized by its magic, weights mmap'd in place).
  static std::unique_ptr<Model> load(const std::string& path, const ModelOptions& options = {});
  // Real shapes without a checkpoint: `config` is a config.json (file, or a model
  // directory holding one); weights are random (benchmarks).
  static std::unique_ptr<Model> load_random(const std::string& config, const ModelOptions& options = {});
  // From an already built graph (tests).
  static std::unique_ptr<Model> from_built(BuiltModel built, const ModelOptions& options = {});
  // From an ONNX model already parsed (what load() does for a .onnx file after reading
  // it; tests edit a parsed file). `label` names it in messages and path().
  static std::unique_ptr<Model> from_onnx(const onnx::OnnxModel& file, const std::string& label,
                                          const ModelOptions& options = {});

  // For a tensor-parallel model: rank 0's shard (num_heads and num_kv_heads per rank).
  const ModelInfo& info() const { return built_.info; }
  // The whole model's info: info(), or for a tensor-parallel model the unsharded one.
  const ModelInfo& model_info() const { return tp_peers_.empty() ? built_.info : unsharded_info_; }
  // The model's own max_positions. info().max_positions is less where the backend has no
  // sliding-window attention (Backend::supports_sliding_window): then the smallest window
  // of the graph's Attention nodes, so that full attention computes the same. Engines
  // store this one.
  int64_t declared_max_positions() const { return declared_max_positions_; }
  // Tensor parallelism: this object is rank 0 and owns the other ranks' shards, each
  // compiled with its communicator; a step runs every rank at once (LlmRunner).
  int tp_world() const { return 1 + int(tp_peers_.size()); }
  Model& tp_rank(int rank) { return rank == 0 ? *this : *tp_peers_.at(size_t(rank - 1)); }
  const ir::Graph& graph() const { return built_.graph; }
  Backend& backend() { return *backend_; }
  CompiledGraph& compiled() { return *compiled_; }
  const std::string& path() const { return path_; }
  // The config the graph was built from (for GGUF: the HF config derived from it).
  const nlohmann::json& config() const { return config_; }
  // The GGUF file the model came from, if any (the tokenizer reads its metadata).
  std::shared_ptr<const GgufFile> gguf() const { return gguf_; }
  // The engine file the model was loaded from (null otherwise); its graph fields are
  // empty (the graphs live in the models of the ranks).
  std::shared_ptr<const EngineContents> engine() const { return engine_; }
  // The compile options the backend got (weight dtype, tactics, profile ranges).
  const CompileOptions& compile_options() const { return compile_options_; }
  // ModelOptions::kv_cache_dtype, parsed: the dtype of the KV pools runners allocate.
  KvDType kv_dtype() const { return kv_dtype_; }
  // ModelOptions::kv_calib.
  const std::string& kv_calib() const { return kv_calib_; }
  // ModelOptions::kv_rotate.
  bool kv_rotate() const { return kv_rotate_; }
  // The key shift of this rank's quantized KV pools ([layers, this rank's kv heads,
  // head_dim]; KvLayout::k_shift), null when none. kv_key_shift_measured(): whether
  // calibrate_kv_key_shift has run, or the engine recorded a shift (a null shift then
  // means none is used). kv_key_shift_source(): what it was measured on and how many
  // tokens; "none" under --kv-calib none; "" when measured as none (no tokenizer).
  std::shared_ptr<const std::vector<float>> kv_key_shift() const { return kv_key_shift_; }
  bool kv_key_shift_measured() const { return kv_key_shift_measured_; }
  const std::string& kv_key_shift_source() const { return kv_key_shift_source_; }
  uint32_t kv_key_shift_tokens() const { return kv_key_shift_tokens_; }
  void set_kv_key_shift(std::shared_ptr<const std::vector<float>> shift, std::string source, uint32_t tokens) {
    kv_key_shift_ = std::move(shift);
    kv_key_shift_source_ = std::move(source);
    kv_key_shift_tokens_ = tokens;
    kv_key_shift_measured_ = true;
  }
  // What the optimization passes did to the graph (empty at opt level 0).
  const std::vector<passes::PassResult>& pass_report() const { return pass_report_; }
  // Where the load's time went, in seconds (0 for a phase this load did not have; a
  // tensor-parallel model: rank 0's passes and compile).
  struct LoadTimes {
    double read = 0;     // the file opened and the graph built with its weights (an engine: checked and parsed)
    double passes = 0;   // graph passes
    double pack = 0;     // Linears packed into the graph before compiling (lean_host_weights, CPU)
    double compile = 0;  // the backend's compile: CPU packing, device uploads, GEMM tactic timing
  };
  const LoadTimes& load_times() const { return load_times_; }

 private:
  BuiltModel built_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<CompiledGraph> compiled_;
  std::string path_;
  nlohmann::json config_;
  std::shared_ptr<const GgufFile> gguf_;
  std::vector<passes::PassResult> pass_report_;
  LoadTimes load_times_;
  std::shared_ptr<const EngineContents> engine_;
  CompileOptions compile_options_;
  KvDType kv_dtype_ = KvDType::kAuto;
  std::string kv_calib_ = "default";
  bool kv_rotate_ = true;
  std::shared_ptr<const std::vector<float>> kv_key_shift_;
  bool kv_key_shift_measured_ = false;
  std::string kv_key_shift_source_;
  uint32_t kv_key_shift_tokens_ = 0;
  std::vector<std::unique_ptr<Model>> tp_peers_;  // ranks 1..N-1
  ModelInfo unsharded_info_;                      // tensor parallelism: before sharding
  int64_t declared_max_positions_ = 0;

  static std::unique_ptr<Model> from_built_sharded(BuiltModel built, const ModelOptions& options);
  // from_built's halves: the passes, the top-logits node and options.rewrite on built_;
  // then compiling it (a tensor-parallel rank of a rewritten model is optimized unsharded
  // and compiled sharded).
  // Returns the backend it asked which fusions to run (from_optimized packs weights with it).
  std::unique_ptr<Backend> optimize(const ModelOptions& options);
  static std::unique_ptr<Model> from_optimized(BuiltModel built, const ModelOptions& options,
                                               bool optimized);
  static std::unique_ptr<Model> load_engine(const std::string& path, const ModelOptions& options);
  // One rank of a loaded engine (its whole graph for tp_world 1), compiled with `comm`.
  static std::unique_ptr<Model> load_engine_rank(const std::shared_ptr<EngineContents>& e, int rank,
                                                 const ModelOptions& options, std::shared_ptr<Communicator> comm);
  void add_top_logits(int32_t k);
  static std::unique_ptr<Model> load_onnx(const std::string& path, const ModelOptions& options);  // onnx_loader.cpp
  void compile(const std::string& backend, CompileOptions options, int device);
  void compile(std::unique_ptr<Backend> backend, CompileOptions options);
};

}  // namespace kiln
