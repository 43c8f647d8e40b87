// Model loading: picks the frontend by path, builds the family's graph, compiles it
// for the backend (see model.h).
#include "runtime/model.h"

#include <chrono>
#include <filesystem>
#include <map>

#include "backends/communicator.h"
#include "core/log.h"
#include "core/status.h"
#include "frontends/gguf_hf.h"
#include "frontends/hf_dir.h"
#include "models/random_weights.h"
#include "parallel/tensor_parallel.h"

namespace kiln {

void Model::compile(const std::string& backend, CompileOptions options, int device) {
  compile(create_backend(backend, device), std::move(options));
}

void Model::compile(std::unique_ptr<Backend> backend, CompileOptions options) {
  if (!backend->supports_w8a8_weight_amax())
    for (const ir::Node& n : built_.graph.nodes())
      if (n.op == "Linear" && n.has_attr("weight_amax"))
        throw_error(ErrorCode::kUnsupported, "'", n.name, "' is a row-parallel W8A8 Linear whose ",
                    "int8 weight scales are the unsharded rows' (tensor parallelism with --quant ",
                    "w8a8), which the ", backend->name(),
                    " backend does not implement yet; run it ",
                    "with --backend cpu, use --quant fp8 (per-tensor scales every backend reads), ",
                    "or keep the row-parallel Linears in float (--keep o_proj,down_proj)");
  backend_ = std::move(backend);
  compile_options_ = std::move(options);
  compiled_ = backend_->compile(built_.graph, compile_options_);
  declared_max_positions_ = built_.info.max_positions;
  if (backend_->supports_sliding_window()) return;
  int64_t window = 0;
  for (const ir::Node& n : built_.graph.nodes())
    if (n.op == "Attention" && n.attr_int("window", 0) > 0)
      window = window ? std::min(window, n.attr_int("window")) : n.attr_int("window");
  if (window > 0 && window < built_.info.max_positions) {
    log_warn(built_.info.family, ": sliding-window attention of ", window, " tokens, which the ", backend_->name(),
             " backend does not implement (it attends fully): sequences are limited to ", window, " tokens (of ",
             built_.info.max_positions, ")");
    built_.info.max_positions = window;
  }
}

// After the passes: the node is the runtime's, not part of the model's faithful graph.
void Model::add_top_logits(int32_t k) {
  ir::Graph& g = built_.graph;
  const ir::ValueId logits = g.find_output("logits");
  if (k <= 0 || !built_.info.is_decoder || logits == ir::kNoValue || g.find_output(kTopIdsOutput) != ir::kNoValue)
    return;
  auto outs = g.add_node("TopKLogits", {logits}, {{"k", int64_t(k)}}, "top_logits");
  g.add_output(kTopLogitsOutput, outs[0]);
  g.add_output(kTopIdsOutput, outs[1]);
  g.add_output(kTopLogprobsOutput, outs[2]);
}

std::string kept_linear_formats(const ir::Graph& g) {
  std::map<std::string, int> kept;
  int total = 0;
  for (const ir::Node& n : g.nodes())
    if (n.op == "Linear" && n.has_attr("weight_quant")) {
      ++kept[n.attr_str("weight_quant")];
      ++total;
    }
  std::string out;
  for (const auto& [format, count] : kept) out += (out.empty() ? "" : ", ") + std::to_string(count) + " " + format;
  return total == 0 ? out : out + (total == 1 ? " Linear" : " Linears");
}

std::string auto_weight_dtype(const std::string& backend, const std::string& stored_dtype) {
  if (backend == "cpu") return stored_dtype.empty() ? "f32" : stored_dtype;
  return "bf16";
}

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// BuiltModel::stored_dtype of a checkpoint: the dtype its GEMM weights (the matrices the
// graph's Linears read) are all stored in when that is bf16 or f16 for every one of them,
// else "" (f32, quantized or mixed files). Other matrices do not count: llama.cpp's
// converter keeps BERT's position and token-type tables F32 in an F16 file.
std::string stored_matrix_dtype(const WeightSource& src, const ir::Graph& g) {
  std::optional<DType> common;
  for (const ir::Node& n : g.nodes()) {
    if (n.op != "Linear" || n.inputs.size() < 2 || !g.is_weight(n.inputs[1])) continue;
    const std::string& name = g.value(n.inputs[1]).name;
    if (!src.has(name)) continue;
    const TensorInfo i = src.info(name);
    if (!i.storage.empty() || (i.dtype != DType::kBF16 && i.dtype != DType::kF16)) return "";  // quantized, f32
    if (common && *common != i.dtype) return "";
    common = i.dtype;
  }
  return common ? dtype_name(*common) : "";
}

// ModelOptions::max_context on a built model: caps info.max_positions, or past a
// LongRoPE model's original length swaps its long-factor inverse frequencies in.
void apply_max_context(BuiltModel& built, int64_t n) {
  if (n <= 0) return;
  ModelInfo& info = built.info;
  const int64_t limit = built.long_context ? built.long_context->max_positions : info.max_positions;
  if (n > limit)
    throw_error(ErrorCode::kInvalidArgument, "--max-context ", n, " exceeds the model's ", limit, " positions (",
                info.family, ")");
  if (built.long_context && n > info.max_positions) {
    for (ir::ValueId v : built.long_context->inv_freq) built.graph.weight(v) = built.long_context->long_inv_freq.clone();
    log_info(info.family, ": --max-context ", n, " is past LongRoPE's original ", info.max_positions,
             " positions: its long factors rotate every position");
  }
  info.max_positions = n;
  built.long_context.reset();
}

}  // namespace

std::unique_ptr<Model> Model::from_built(BuiltModel built, const ModelOptions& options) {
  apply_max_context(built, options.max_context);
  if (!options.profile.empty())
    throw_error(ErrorCode::kInvalidArgument, "optimization profile '", options.profile,
                "' was asked for, but only engine files have profiles (build one with `kiln build --profile`)");
  if (options.tensor_parallel != 0 && options.tensor_parallel != 1)
    return from_built_sharded(std::move(built), options);
  return from_optimized(std::move(built), options, /*optimized=*/false);
}

std::unique_ptr<Backend> Model::optimize(const ModelOptions& options) {
  // Fusions the backend does not implement (or does not gain from) are skipped for it.
  passes::PassOptions po{options.opt_level, options.disabled_passes, options.precision, options.pin_precision};
  auto backend = create_backend(options.backend);
  for (auto& f : passes::fusion_pass_names())
    if (!backend->wants_fusion(f)) {
      log_debug("backend ", backend->name(), " does not implement or want ", f, ": skipping it");
      po.disabled.push_back(f);
    }
  // Quantized GEMMs keep their norm nodes: the quantization rewrites (SmoothQuant, AWQ)
  // fold scales into the norm in front of a Linear, and the q8/q4/FP8/W8A8 kernels have
  // no norm prologue.
  auto quantized = [](const std::string& p) {
    return p == "q8" || p == "q4" || p == "fp8" || p == "w8a8";
  };
  bool kept = false;  // a Linear keeps a file's q8/q4 codes (auto): a quantized GEMM too
  for (const ir::Node& n : built_.graph.nodes()) kept = kept || n.has_attr("weight_quant");
  if (options.rewrite || kept || quantized(options.weight_dtype) || quantized(options.precision)) {
    log_debug("quantized GEMMs: skipping fuse_norm_linear");
    po.disabled.push_back("fuse_norm_linear");
  }
  auto t0 = Clock::now();
  pass_report_ = passes::run_passes(built_.graph, po);
  load_times_.passes = since(t0);
  if (options.opt_level > 0) log_debug("passes:\n", passes::format_pass_report(pass_report_));
  add_top_logits(options.top_logits_k);
  if (options.rewrite) options.rewrite(built_.graph);
  return backend;
}

std::unique_ptr<Model> Model::from_optimized(BuiltModel built, const ModelOptions& options,
                                             bool optimized) {
  std::unique_ptr<Model> m(new Model());
  m->kv_dtype_ = kv_dtype_parse(options.kv_cache_dtype);
  m->kv_calib_ = options.kv_calib;
  m->kv_rotate_ = options.kv_rotate;
  m->built_ = std::move(built);
  std::unique_ptr<Backend> backend = optimized ? nullptr : m->optimize(options);
  const bool native = options.weight_dtype == "auto";
  CompileOptions co;
  // auto: Linears kept in their file's format carry it as their precision; the rest take
  // the backend's auto dtype (a 16-bit checkpoint's own dtype on the CPU, unless a rewrite
  // or an observer reads the Linears: they work on f32 weights).
  const bool stored_ok = !options.rewrite && !options.linear_observer;
  co.weight_dtype =
      native ? auto_weight_dtype(options.backend, stored_ok ? m->built_.stored_dtype : "") : options.weight_dtype;
  co.communicator = options.communicator;
  co.linear_observer = options.linear_observer;
  co.step_tuning = options.step_tuning;
  co.tactic_cache = options.tactic_cache;
  const bool lean = options.lean_host_weights && !options.linear_observer;
  auto t0 = Clock::now();
  if (lean) {
    if (!backend) backend = create_backend(options.backend);
    const size_t packed = backend->pack_weights(m->built_.graph, co);
    if (packed) log_debug("packed ", packed, " Linear weights into the graph before compiling");
    m->load_times_.pack = since(t0);
  }
  t0 = Clock::now();
  m->compile(options.backend, co, options.device);
  m->load_times_.compile = since(t0);
  if (lean) {
    size_t freed = 0;
    for (ir::ValueId v : m->compiled_->release_host_weights()) {
      Tensor& w = m->built_.graph.weight(v);
      if (w.empty()) continue;
      freed += w.nbytes();
      w = Tensor::view(nullptr, w.dtype(), w.shape());  // dtype and shape only
    }
    if (freed) log_debug("released ", freed >> 20, " MiB of host weights the device holds");
  }
  return m;
}

// Every check before any compile: an indivisible split or an unsupported backend is
// a user error that names the dimension or the backend.
std::unique_ptr<Model> Model::from_built_sharded(BuiltModel built, const ModelOptions& options) {
  const int world = options.tensor_parallel;
  if (world < 1)
    throw_error(ErrorCode::kInvalidArgument, "tensor parallelism: --tp must be at least 1, got ", world);
  if (!built.info.is_decoder)
    throw_error(ErrorCode::kUnsupported, "tensor parallelism runs decoders only; '", built.info.family,
                "' is an encoder (run it with --tp 1)");
  // A rewrite (quantization) sees the unsharded model: the passes and the rewrite run
  // once on the unsharded graph and its optimized, rewritten form is sharded, so every
  // rank keeps the unsharded model's calibration, smoothing and scales
  // (parallel/tensor_parallel.h). Without one, the faithful graph is sharded and each
  // rank runs the passes.
  const bool optimized = bool(options.rewrite);
  std::vector<passes::PassResult> pass_report;
  double passes_s = 0;
  ShardOptions so;
  if (optimized) {
    std::unique_ptr<Model> full(new Model());
    full->built_ = std::move(built);
    full->optimize(options);
    built = std::move(full->built_);
    pass_report = std::move(full->pass_report_);
    passes_s = full->load_times_.passes;
    so.weight_dtype = options.weight_dtype;
  }
  // Shards first: an indivisible split is the user's error, before any device is touched.
  std::vector<BuiltModel> shards;
  for (int r = 0; r < world; ++r) {
    shards.push_back(shard_tensor_parallel(built, r, world, so));
    shards.back().stored_dtype = built.stored_dtype;
  }
  ModelInfo unsharded_info = built.info;
  built = {};  // the unsharded weights are not needed past here
  auto comms = create_backend(options.backend, options.device)->make_communicators(world, options.device);
  KILN_CHECK(int(comms.size()) == world, "backend ", options.backend, " made ", comms.size(), " communicators for ",
             world, " ranks");
  ModelOptions ro = options;
  ro.tensor_parallel = 1;
  ro.communicator = comms[0];
  auto m = from_optimized(std::move(shards[0]), ro, optimized);
  for (int r = 1; r < world; ++r) {
    ro.communicator = comms[size_t(r)];
    ro.device = options.device + r;
    m->tp_peers_.push_back(from_optimized(std::move(shards[size_t(r)]), ro, optimized));
  }
  if (optimized) {
    m->pass_report_ = std::move(pass_report);
    m->load_times_.passes = passes_s;
  }
  m->unsharded_info_ = std::move(unsharded_info);
  m->unsharded_info_.max_positions = m->info().max_positions;  // a backend's window cap (compile)
  log_info("tensor parallel: ", world, " ranks of ", m->info().num_heads, " attention heads, ",
           m->info().num_kv_heads, " K/V heads each");
  return m;
}

namespace {

// What a backend cannot run is refused before anything compiles, naming the node.
void check_engine_graph(const std::string& path, const ir::Graph& g, Backend& backend) {
  for (auto& n : g.nodes()) {
    if (n.has_attr("weight_layout") && !backend.supports_weight_layout(n.attr_str("weight_layout")))
      throw_error(ErrorCode::kUnsupported, "engine '", path, "' stores the weights of '", n.name, "' packed for layout '",
                  n.attr_str("weight_layout"), "', which the ", backend.name(),
                  " backend does not read; rebuild it without --pack-weights (portable) or with --backend ",
                  backend.name());
    std::string f = passes::fusion_of(n);
    if (!f.empty() && !backend.supports_fusion(f))
      throw_error(ErrorCode::kUnsupported, "engine '", path, "' uses ", n.op, " from the ", f,
                  " fusion, which the ", backend.name(), " backend does not implement; rebuild it with `kiln build "
                  "--backend ", backend.name(), "` (or --disable-pass ", f, ")");
  }
}

}  // namespace

std::unique_ptr<Model> Model::load_engine_rank(const std::shared_ptr<EngineContents>& e, int rank,
                                               const ModelOptions& options, std::shared_ptr<Communicator> comm) {
  const bool tp = e->tp_world > 1;
  std::unique_ptr<Model> m(new Model());
  m->kv_dtype_ = kv_dtype_parse(options.kv_cache_dtype);
  m->kv_calib_ = options.kv_calib;
  m->kv_rotate_ = options.kv_rotate;
  m->built_.graph = std::move(tp ? e->ranks[size_t(rank)].graph : e->graph);
  m->built_.info = tp ? e->ranks[size_t(rank)].info : e->info;
  if (options.max_context > m->built_.info.max_positions)
    throw_error(ErrorCode::kInvalidArgument, "--max-context ", options.max_context, " exceeds the engine's ",
                m->built_.info.max_positions, " positions (a LongRoPE model's long factors are chosen when the engine "
                "is built: `kiln build --max-context`)");
  if (options.max_context > 0) m->built_.info.max_positions = options.max_context;
  m->config_ = e->config;
  CompileOptions co;
  // GEMM weights are stored in the engine in their final precision.
  co.weight_dtype = e->build.weight_dtype;
  co.linear_observer = options.linear_observer;
  co.communicator = std::move(comm);
  for (auto& p : e->profiles) {
    ShapeProfile sp{p.name, {}};
    for (auto& d : p.dims) sp.dims[d.dim] = {d.min, d.opt, d.max};
    co.profiles.push_back(std::move(sp));
  }
  co.profile = options.profile;
  co.step_tuning = options.step_tuning;
  co.tactic_cache = options.tactic_cache;
  auto backend = create_backend(options.backend, options.device + rank);
  const std::string device_name = backend->device_name();
  const auto& tables = tp ? e->ranks[size_t(rank)].tactic_tables : e->tactic_tables;
  for (auto& table : tables)
    if (table.device == device_name)
      for (auto& t : table.tactics) co.tactics[t.node] = t.tactic;
  if (co.tactics.empty() && !tables.empty())
    log_info("engine tactics were timed on '", tables[0].device, "', this device is '", device_name,
             "': using the backend's heuristics");
  log_info("loaded engine ", tp ? str_cat("rank ", rank, " of ", e->tp_world, ": ") : std::string(),
           m->built_.info.family, ", ", m->built_.graph.nodes().size(), " nodes, ",
           m->built_.graph.weight_bytes() >> 20, " MiB of weights (", co.weight_dtype, "), ", co.tactics.size(),
           " tuned tactics");
  m->engine_ = e;
  // The key shift measured at build serves the default --kv-calib; other text measures anew.
  if (const EngineKvKeyShift& ks = e->kv_key_shift; ks.recorded && options.kv_calib == "default") {
    const std::vector<float>& v = tp ? e->ranks[size_t(rank)].kv_key_shift : ks.values;
    m->set_kv_key_shift(v.empty() ? nullptr : std::make_shared<const std::vector<float>>(v), ks.source, ks.tokens);
    if (rank == 0 && kv_dtype_quantized(m->kv_dtype_))
      log_info("KV cache: ", kv_dtype_name(m->kv_dtype_), " keys ",
               v.empty() ? std::string("stored without a shift (the engine was built with --kv-calib none)")
                         : str_cat("stored less the engine's key shift (measured at build on ", ks.tokens,
                                   " tokens of ", ks.source, ")"),
               m->kv_rotate_ ? ", through a Walsh-Hadamard transform (--kv-rotate)" : "");
  }
  m->add_top_logits(options.top_logits_k);
  const auto t0 = Clock::now();
  m->compile(std::move(backend), co);
  m->load_times_.compile = since(t0);
  return m;
}

std::unique_ptr<Model> Model::load_engine(const std::string& path, const ModelOptions& options) {
  kv_dtype_parse(options.kv_cache_dtype);  // a bad value is refused before the file is read
  if (!options.pin_precision.empty())
    throw_error(ErrorCode::kInvalidArgument, "--pin-precision: '", path, "' is an engine, which keeps the precisions ",
                "it was built with; pin them with `kiln build --pin-precision`");
  const auto read0 = Clock::now();
  auto e = std::make_shared<EngineContents>(engine_load(path));
  const double read_s = since(read0);
  const int world = e->tp_world;
  // The ranks are in the file: --tp may only confirm their number.
  if (options.tensor_parallel != 0 && options.tensor_parallel != world) {
    if (world == 1)
      throw_error(ErrorCode::kInvalidArgument, "engine '", path, "' holds one unsharded graph (built without --tp), ",
                  "but --tp ", options.tensor_parallel, " was asked; omit --tp, or rebuild the engine with `kiln build ",
                  "--tp ", options.tensor_parallel, "` (or load the model's checkpoint with --tp)");
    throw_error(ErrorCode::kInvalidArgument, "engine '", path, "' was built for tensor parallelism over ", world,
                " ranks (`kiln build --tp ", world, "`), but --tp ", options.tensor_parallel, " was asked; omit --tp ",
                "(or pass --tp ", world, "), or rebuild the engine with `kiln build --tp ", options.tensor_parallel, "`");
  }
  {
    auto backend = create_backend(options.backend);
    for (const ir::Graph* g : engine_graphs(*e)) check_engine_graph(path, *g, *backend);
  }
  std::vector<std::shared_ptr<Communicator>> comms = {options.communicator};
  if (world > 1) {
    // Backend::make_communicators refuses too few devices (or no NCCL) with a message
    // naming what is needed and what is visible, before any rank compiles.
    comms = create_backend(options.backend, options.device)->make_communicators(world, options.device);
    KILN_CHECK(int(comms.size()) == world, "backend ", options.backend, " made ", comms.size(),
               " communicators for ", world, " ranks");
  }
  auto m = load_engine_rank(e, 0, options, comms[0]);
  m->load_times_.read = read_s;
  m->path_ = path;
  for (int r = 1; r < world; ++r) {
    m->tp_peers_.push_back(load_engine_rank(e, r, options, comms[size_t(r)]));
    m->tp_peers_.back()->path_ = path;
  }
  if (world > 1) {
    m->unsharded_info_ = e->info;
    m->unsharded_info_.max_positions = m->info().max_positions;  // a backend's window cap (compile)
    log_info("tensor parallel engine ", path, ": ", world, " ranks of ", m->info().num_heads, " attention heads, ",
             m->info().num_kv_heads, " K/V heads each");
  }
  return m;
}

std::unique_ptr<Model> Model::load(const std::string& path, const ModelOptions& options) {
  namespace fs = std::filesystem;
  if (!fs::exists(path)) throw_error(ErrorCode::kNotFound, "model path '", path, "' does not exist");
  const bool engine = fs::is_regular_file(path) && (is_engine_file(path) || fs::path(path).extension() == ".kiln");
  if (options.tensor_parallel > 1 && !engine && fs::path(path).extension() == ".onnx")
    throw_error(ErrorCode::kUnsupported, "tensor parallelism (--tp ", options.tensor_parallel,
                ") is not supported for .onnx files; load the model's HuggingFace directory or .gguf file instead");
  if (engine) return load_engine(path, options);
  const auto read0 = Clock::now();
  BuiltModel built;
  nlohmann::json config;
  std::shared_ptr<const GgufFile> gguf;
  // --weight-dtype q8/q4: Linear weights the file already stores in that format (GGUF
  // Q8_0 / Q5_0 -> q8, Q4_0 / Q4_1 / Q4_K -> q4) load as their own codes instead of f32 that the
  // backend would quantize again. With auto, each Linear weight the file stores as Q8_0 /
  // Q5_0 / Q4_0 / Q4_1 / Q4_K keeps its codes in its own format (q8 or q4), as llama.cpp runs a
  // GGUF, one stored as Q5_1 / Q2_K / Q3_K / Q5_K / Q6_K is requantized to q8
  // (ggml_kept_quant_format), and the rest takes auto_weight_dtype (f32 on the CPU; bf16 weights and
  // activations on CUDA). Not under graph rewrites, observers or tensor parallelism,
  // which read Linear weights as f32 (a rewrite that leaves such Linears alone says so:
  // rewrite_keeps_file_quant).
  std::optional<QuantFormat> keep;
  const bool can_keep = options.keep_file_quant && (!options.rewrite || options.rewrite_keeps_file_quant) &&
                        !options.linear_observer && options.tensor_parallel <= 1;
  if (can_keep && (options.weight_dtype == "q8" || options.weight_dtype == "q4"))
    keep = options.weight_dtype == "q8" ? QuantFormat::kQ8 : QuantFormat::kQ4;
  const bool native = can_keep && options.weight_dtype == "auto";
  // A 16-bit checkpoint's matrices stay in their dtype until the backend packs or uploads
  // them: half the host memory of f32 (none where they are views of the file) and the same
  // values. Rewrites, observers and tensor-parallel sharding read f32 weights.
  const bool keep16 = (options.lean_host_weights || options.keep_16bit_weights) && !options.rewrite &&
                      !options.linear_observer && options.tensor_parallel <= 1;
  if (fs::is_directory(path)) {
    HfModelDir dir = HfModelDir::open(path);
    config = dir.config;
    dir.weights->keep_quantized(keep);
    dir.weights->keep_native(native);
    dir.weights->keep_16bit(keep16);
    built = build_model(config, *dir.weights);
    built.stored_dtype = stored_matrix_dtype(*dir.weights, built.graph);
  } else if (fs::path(path).extension() == ".gguf") {
    gguf = std::make_shared<const GgufFile>(GgufFile::open(path));
    config = gguf_to_hf_config(*gguf);
    GgufWeightSource weights(gguf);
    weights.keep_quantized(keep);
    weights.keep_native(native);
    weights.keep_16bit(keep16);
    built = build_model(config, weights);
    built.stored_dtype = stored_matrix_dtype(weights, built.graph);
    if (const std::string r = weights.requantized_summary(); !r.empty())
      log_info("GGUF ", r, " requantized to q8 (8.5 bits per weight; no q8/q4 image keeps their codes)");
  } else if (fs::path(path).extension() == ".onnx") {
    return load_onnx(path, options);
  } else {
    throw_error(ErrorCode::kUnsupported, "'", path,
                "' is not a model directory (config.json + *.safetensors), a .gguf or .onnx file or a kiln engine");
  }
  log_info("loaded ", built.info.family, " model from ", path, ": ", built.graph.nodes().size(),
           " nodes, ", built.graph.weight_bytes() >> 20, " MiB of weights");
  const double read_s = since(read0);
  auto m = from_built(std::move(built), options);
  m->load_times_.read = read_s;
  m->path_ = path;
  m->config_ = std::move(config);
  m->gguf_ = std::move(gguf);
  return m;
}

std::unique_ptr<Model> Model::load_random(const std::string& config_path, const ModelOptions& options) {
  namespace fs = std::filesystem;
  std::string file = fs::is_directory(config_path) ? config_path + "/config.json" : config_path;
  nlohmann::json config = read_json_file(file);
  auto m = from_built(build_model(config, RandomWeightSource()), options);
  m->path_ = file + " (random weights)";
  m->config_ = std::move(config);
  return m;
}

}  // namespace kiln
