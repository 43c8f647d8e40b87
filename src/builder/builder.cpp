// The engine builder (see builder.h).
#include "builder/builder.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "core/log.h"
#include "backends/memory_plan.h"
#include "core/status.h"
#include "runtime/model.h"
#include "runtime/kv_calibration.h"
#include "runtime/model_tokenizer.h"

namespace kiln {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// GEMM weights (input 1 of every Linear) converted to their stored precision: the
// node's `precision` (assign_precision, which may pin some layers) or else `dtype`.
// Norms, embeddings and biases stay f32 (their kernels read f32 and they are small or
// gathered, not streamed). q8/q4 keep f32 in the file: the backend quantizes when it
// packs (exactly as when loading the checkpoint directly). A weight read by GEMMs of
// different precisions (or also by a non-GEMM, like a tied LM head and its embedding)
// gets its own converted copy per precision; f32 readers keep the original. A weight a
// 16-bit checkpoint kept in its dtype (ModelOptions::keep_16bit_weights) stays so for
// every reader but a GEMM stored in the other 16-bit dtype: f32, q8 and q4 GEMMs and the
// other kernels widen its values exactly.
void convert_gemm_weights(ir::Graph& g, const std::string& dtype) {
  auto wanted = [&](const ir::Node& n, size_t input) {
    if (n.op != "Linear" || input != 1) return DType::kF32;
    const std::string p = n.attr_str("precision", dtype);
    return p == "bf16" ? DType::kBF16 : p == "f16" ? DType::kF16 : DType::kF32;
  };
  std::map<ir::ValueId, std::set<DType>> readers;  // weight -> the dtypes its readers want
  for (const ir::Node& n : g.nodes())
    for (size_t i = 0; i < n.inputs.size(); ++i)
      if (n.inputs[i] != ir::kNoValue && g.is_weight(n.inputs[i])) readers[n.inputs[i]].insert(wanted(n, i));
  std::map<std::pair<ir::ValueId, DType>, ir::ValueId> copies;
  for (auto& [w, dts] : readers) {
    // The dtypes its readers want that the stored one does not serve: f32 readers take
    // f32 or 16-bit weights as they are (16-bit values widen exactly).
    const DType src = g.weight(w).dtype();
    if (src != DType::kF32 && src != DType::kBF16 && src != DType::kF16) continue;
    std::set<DType> convert;
    for (DType dt : dts)
      if (dt != src && dt != DType::kF32) convert.insert(dt);
    if (convert.empty()) continue;
    if (dts.size() == 1) {  // the common case: converted in place
      Tensor& t = g.weight(w);
      t = t.to(*dts.begin());
      g.value(w).dtype = t.dtype();
      continue;
    }
    for (DType dt : convert) copies[{w, dt}] = g.add_weight(g.value(w).name + "." + dtype_name(dt), g.weight(w).to(dt));
  }
  for (ir::Node& n : g.nodes())
    if (n.op == "Linear") {
      auto it = copies.find({n.inputs[1], wanted(n, 1)});
      if (it != copies.end()) n.inputs[1] = it->second;
    }
}

// The timing cache: device -> shape key -> (tactic, seconds). Shapes, not node
// names, so all layers of one shape share an entry and rebuilds of other models of
// the same shapes hit it too.
class TimingCache {
 public:
  explicit TimingCache(std::string path) : path_(std::move(path)) {
    if (path_.empty() || !std::filesystem::exists(path_)) return;
    try {
      j_ = nlohmann::json::parse(read_text_file(path_));
      if (!j_.is_object() || j_.value("version", 0) != 1) j_ = nlohmann::json::object();
    } catch (const nlohmann::json::exception& e) {
      log_warn("timing cache '", path_, "' is unreadable (", e.what(), "); starting a new one");
      j_ = nlohmann::json::object();
    }
  }
  bool find(const std::string& device, const std::string& key, EngineTactic& out) const {
    auto d = j_.find("devices");
    if (d == j_.end() || !d->contains(device) || !(*d)[device].contains(key)) return false;
    const auto& e = (*d)[device][key];
    if (!e.is_object() || !e.contains("tactic") || !e["tactic"].is_string()) return false;
    out.tactic = e["tactic"].get<std::string>();
    out.seconds = e.value("seconds", 0.0);
    return true;
  }
  void put(const std::string& device, const std::string& key, const EngineTactic& t) {
    j_["version"] = 1;
    j_["devices"][device][key] = {{"tactic", t.tactic}, {"seconds", t.seconds}};
  }
  void save() const {
    if (path_.empty()) return;
    std::ofstream(path_) << j_.dump(1) << "\n";
  }

 private:
  std::string path_;
  nlohmann::json j_ = nlohmann::json::object();
};

// Times every tactic the backend offers for each Linear at the opt shape; returns
// the per-node winners.
EngineTacticTable tune(Backend& backend, const ir::Graph& g, const CompileOptions& co,
                       const std::map<std::string, int64_t>& dims, TimingCache& cache, BuildReport& report) {
  EngineTacticTable table{backend.device_name(), {}};
  std::map<std::string, EngineTactic> by_shape;
  size_t linears = 0;
  for (const ir::Node& n : g.nodes()) linears += n.op == "Linear";
  Progress progress("tuning GEMM tactics", int64_t(linears));
  size_t done = 0;
  for (const ir::Node& n : g.nodes()) {
    if (n.op != "Linear") continue;
    progress.update(int64_t(++done));
    auto tactics = backend.node_tactics(n, g);
    if (tactics.empty()) continue;
    const ir::Value& x = g.value(n.inputs[0]);
    const Tensor& w = g.weight(n.inputs[1]);
    const Dim& rows = x.shape[0];
    int64_t t = rows.is_concrete() ? rows.value : (dims.count(rows.sym) ? dims.at(rows.sym) : 1);
    std::string key = str_cat("Linear ", rows.str(), "=", t, " N=", w.dim(0), " K=", w.dim(1), " ",
                              n.attr_str("precision", co.weight_dtype), n.input(2) != ir::kNoValue ? " bias" : "",
                              n.has_attr("activation") ? " " + n.attr_str("activation") : "");
    auto it = by_shape.find(key);
    if (it == by_shape.end()) {
      EngineTactic best;
      if (cache.find(table.device, key, best)) {
        ++report.cache_hits;
      } else {
        best.seconds = 1e30;
        for (const std::string& tac : tactics) {
          std::map<std::string, int64_t> d = dims;
          if (!rows.is_concrete()) d[rows.sym] = t;
          double s = backend.time_tactic(n, g, tac, d, co);
          log_debug("tactic ", key, " [", tac, "]: ", s * 1e3, " ms");
          if (s >= 0 && s < best.seconds) best = {"", tac, s};
        }
        if (best.tactic.empty()) continue;  // the backend cannot time this storage
        ++report.shapes_timed;
        cache.put(table.device, key, best);
      }
      it = by_shape.emplace(key, best).first;
      log_debug("tactic ", key, ": ", best.tactic, " (", best.seconds * 1e3, " ms)");
    }
    table.tactics.push_back({n.name, it->second.tactic, it->second.seconds});
  }
  report.tactics_chosen += table.tactics.size();
  return table;
}

}  // namespace

namespace {

// "1,128,2048" -> {min, opt, max}; false when malformed.
bool parse_range(const std::string& s, EngineProfileDim& d) {
  std::vector<int64_t> v;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t end = s.find(',', pos);
    if (end == std::string::npos) end = s.size();
    char* stop = nullptr;
    std::string item = s.substr(pos, end - pos);
    long long x = std::strtoll(item.c_str(), &stop, 10);
    if (item.empty() || *stop || x < 1 || x > (int64_t(1) << 40)) return false;
    v.push_back(x);
    pos = end + 1;
  }
  if (v.size() != 3 || v[0] > v[1] || v[1] > v[2]) return false;
  d.min = v[0], d.opt = v[1], d.max = v[2];
  return true;
}

}  // namespace

EngineProfile parse_profile(const std::string& spec) {
  auto fail = [&] {
    throw_error(ErrorCode::kInvalidArgument, "--profile '", spec,
                "': expected NAME:DIM=min,opt,max[;DIM=min,opt,max...] (e.g. small:T=1,16,64) or DIM:min,opt,max "
                "(a profile named 'default', e.g. T:1,128,2048), with 1 <= min <= opt <= max");
  };
  const size_t colon = spec.find(':');
  if (colon == std::string::npos || colon == 0) fail();
  const std::string head = spec.substr(0, colon), rest = spec.substr(colon + 1);
  EngineProfile p;
  if (rest.find('=') == std::string::npos) {  // DIM:min,opt,max
    EngineProfileDim d{head};
    if (!parse_range(rest, d)) fail();
    return {"default", {d}};
  }
  p.name = head;
  size_t pos = 0;
  while (pos <= rest.size()) {
    size_t end = rest.find(';', pos);
    if (end == std::string::npos) end = rest.size();
    std::string item = rest.substr(pos, end - pos);
    pos = end + 1;
    if (item.empty() && pos > rest.size()) break;  // a trailing ';'
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) fail();
    EngineProfileDim d{item.substr(0, eq)};
    if (!parse_range(item.substr(eq + 1), d)) fail();
    for (auto& other : p.dims)
      if (other.dim == d.dim)
        throw_error(ErrorCode::kInvalidArgument, "--profile '", spec, "': dim ", d.dim, " is given twice");
    p.dims.push_back(d);
  }
  if (p.dims.empty()) fail();
  return p;
}

uint64_t parse_bytes(const std::string& spec) {
  char* stop = nullptr;
  const double x = std::strtod(spec.c_str(), &stop);
  const std::string unit = stop ? std::string(stop) : "";
  double scale = 0;
  if (unit.empty() || unit == "B") scale = 1;
  else if (unit == "KiB" || unit == "K") scale = 1024.0;
  else if (unit == "MiB" || unit == "M") scale = 1024.0 * 1024;
  else if (unit == "GiB" || unit == "G") scale = 1024.0 * 1024 * 1024;
  if (spec.empty() || stop == spec.c_str() || scale == 0 || !(x > 0) || x * scale > 1e18)
    throw_error(ErrorCode::kInvalidArgument, "--workspace '", spec,
                "': expected a positive size in bytes, KiB, MiB or GiB (e.g. 512MiB)");
  return uint64_t(x * scale);
}

std::string format_bytes(uint64_t b) {
  char buf[64];
  if (b >= (uint64_t(1) << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", double(b) / double(1 << 30));
  else if (b >= (uint64_t(1) << 20)) std::snprintf(buf, sizeof buf, "%.2f MiB", double(b) / double(1 << 20));
  else if (b >= 1024) std::snprintf(buf, sizeof buf, "%.1f KiB", double(b) / 1024);
  else std::snprintf(buf, sizeof buf, "%llu B", (unsigned long long)b);
  return buf;
}

namespace {

std::map<std::string, int64_t> profile_dims(const EngineProfile& p, bool opt) {
  std::map<std::string, int64_t> dims;
  for (auto& d : p.dims) dims[d.dim] = opt ? d.opt : d.max;
  return dims;
}

// Plans the activation arena of every profile at its max shapes; with a workspace
// limit, a profile that does not fit fails the build, saying what it needs, what is
// allowed and (for a one-dim profile) the largest max that would fit.
void plan_memory(const ir::Graph& g, std::vector<EngineProfile>& profiles, uint64_t workspace) {
  const MemoryPlan plan = plan_activation_slots(g);
  for (auto& p : profiles) {
    MemoryPlanSize size = memory_plan_size(g, plan, profile_dims(p, false));
    p.activation_bytes = size.peak_bytes;
    p.activation_slots = uint32_t(plan.num_slots);
    log_info("profile '", p.name, "': activation arena ", format_bytes(size.peak_bytes), " in ", plan.num_slots,
             " slots at its max shapes");
    if (!workspace || size.peak_bytes <= workspace) continue;
    std::string dims, hint;
    for (auto& d : p.dims) dims += str_cat(dims.empty() ? "" : ", ", d.dim, " = ", d.max);
    if (p.dims.size() == 1) {
      EngineProfileDim d = p.dims[0];
      auto fits = [&](int64_t m) { return memory_plan_size(g, plan, {{d.dim, m}}).peak_bytes <= workspace; };
      if (!fits(d.min)) {
        hint = str_cat("even ", d.dim, " = ", d.min, " (the profile's min) needs ",
                       format_bytes(memory_plan_size(g, plan, {{d.dim, d.min}}).peak_bytes));
      } else {
        int64_t lo = d.min, hi = d.max;  // fits(lo), !fits(hi)
        while (hi - lo > 1) {
          const int64_t mid = lo + (hi - lo) / 2;
          (fits(mid) ? lo : hi) = mid;
        }
        hint = str_cat(d.dim, " up to ", lo, " fits: --profile ", p.name, ":", d.dim, "=", d.min, ",",
                       std::min(d.opt, lo), ",", lo);
      }
    }
    throw_error(ErrorCode::kOutOfMemory, "profile '", p.name, "' needs a ", format_bytes(size.peak_bytes),
                " activation arena (", plan.num_slots, " slots) at its max shapes (", dims, "), more than --workspace ",
                format_bytes(workspace), " allows", hint.empty() ? "" : "; " + hint,
                "; or raise --workspace");
  }
}

}  // namespace

BuildReport build_engine(const BuildOptions& o) {
  BuildReport report;
  auto t0 = Clock::now();
  if (o.output.empty()) throw_error(ErrorCode::kInvalidArgument, "build: no output file (-o)");
  const bool gptq = gptq_mode(o.quant.mode);
  const bool awq = o.quant.mode == "awq" || gptq;
  // AWQ stores plain q4/q8 weights (scaled): the precision pass assigns that format. GPTQ
  // stores its own q4/q8 row images (kept-quantized Linears).
  const bool quantized = !o.quant.mode.empty();
  // auto (as `generate` loads a checkpoint): each Linear a GGUF stores quantized keeps (or is
  // requantized to) q8/q4 and the rest take the backend's auto dtype; the engine records the
  // resolved dtype. Under --quant the calibrated rewrites choose the formats, and with
  // --pin-precision the precision pass needs one dtype for the GEMMs not pinned: auto is f32.
  const bool native = o.weight_dtype == "auto" && !quantized && o.pin_precision.empty();
  const std::string base_dtype = o.weight_dtype == "auto" && !native ? "f32" : o.weight_dtype;
  const std::string gemm_dtype = awq ? quant_format_name(awq_weight_format(base_dtype)) : base_dtype;
  ModelOptions mo{o.backend, gemm_dtype, nullptr, o.opt_level, o.disabled_passes, native ? "" : gemm_dtype,
                  o.pin_precision};
  mo.onnx_import = o.onnx_import;
  mo.max_context = o.max_context;
  // The conversions below read a 16-bit checkpoint's own dtype (not under --quant, whose
  // calibration and rewrites read f32 weights).
  mo.keep_16bit_weights = !quantized;
  if (o.tensor_parallel < 1 || o.tensor_parallel > kEngineMaxTensorParallel)
    throw_error(ErrorCode::kInvalidArgument, "build: --tp must be in [1, ", kEngineMaxTensorParallel, "], got ",
                o.tensor_parallel);
  mo.tensor_parallel = o.tensor_parallel;
  mo.kv_calib = o.kv_calib;
  check_effective_bits(o.quant);
  check_hadamard_has_quant(o.quant);
  if (quantized && o.random_weights)
    throw_error(ErrorCode::kInvalidArgument, "build: --quant needs real weights to calibrate (not --random-weights)");
  auto w8a8_report = std::make_shared<quant::W8A8Report>();
  auto fp8_report = std::make_shared<quant::Fp8Report>();
  auto awq_report = std::make_shared<quant::AwqReport>();
  auto gptq_report = std::make_shared<quant::GptqReport>();
  size_t planned_q8 = 0;  // Linears a --effective-bits plan promoted
  if (quantized) {
    quant_mode_check(o.quant);
    const quant::CalibrationTable table = calibration_for(o.model, mo, o.quant);
    planned_q8 = table.precision_plan.size();
    mo = gptq                      ? gptq_model_options(mo, table, o.quant, gptq_report)
         : awq                     ? awq_model_options(mo, table, o.quant, awq_report)
         : o.quant.mode == "fp8" ? fp8_model_options(mo, table, o.quant, fp8_report)
                                 : w8a8_model_options(mo, table, o.quant, w8a8_report);
  }
  if (!o.random_weights && std::filesystem::is_regular_file(o.model) && is_engine_file(o.model))
    throw_error(ErrorCode::kInvalidArgument, "build: '", o.model, "' is already an engine");
  auto model = o.random_weights ? Model::load_random(o.model, mo) : Model::load(o.model, mo);
  if (model->engine()) throw_error(ErrorCode::kInvalidArgument, "build: '", o.model, "' is already an engine");
  report.load_seconds = since(t0);
  report.passes = model->pass_report();
  report.nodes_before = report.passes.empty() ? model->graph().nodes().size() : report.passes.front().nodes_before;
  report.nodes_after = model->graph().nodes().size();
  // A decoder's KV key shift, measured on the model as built (its quantized GEMMs too).
  if (model->model_info().is_decoder) {
    const auto tc = Clock::now();
    calibrate_kv_key_shift(*model);
    report.kv_calib_seconds = since(tc);
  }

  // One graph, or (tensor parallelism) every rank's: each gets the same treatment below.
  const int world = model->tp_world();
  EngineContents e;
  e.tp_world = world;
  e.info = model->model_info();
  e.info.max_positions = model->declared_max_positions();
  e.config = model->config();
  std::vector<ir::Graph*> graphs;
  if (world == 1) {
    e.graph = model->graph();  // shares the weight buffers; conversions make new ones
    graphs.push_back(&e.graph);
  } else {
    e.ranks.resize(size_t(world));
    for (int r = 0; r < world; ++r) {
      e.ranks[size_t(r)].info = model->tp_rank(r).info();
      e.ranks[size_t(r)].info.max_positions = model->tp_rank(r).declared_max_positions();
      e.ranks[size_t(r)].graph = model->tp_rank(r).graph();
      graphs.push_back(&e.ranks[size_t(r)].graph);
    }
  }
  const std::string weight_dtype = awq         ? gemm_dtype
                                   : quantized ? o.quant.mode
                                   : native    ? model->compile_options().weight_dtype
                                               : o.weight_dtype;
  for (ir::Graph* g : graphs) convert_gemm_weights(*g, weight_dtype);
  if (o.quant.mode == "w8a8")
    report.quant_summary = "w8a8 (" + (o.quant.act_scale == "per-token" ? std::string("per-token") : o.quant.method) + " activation scales, smoothing alpha " + std::to_string(o.quant.smooth_alpha) +
                           "): " + std::to_string(w8a8_report->quantized) + " Linears int8, " +
                           std::to_string(w8a8_report->kept) + " kept f32";
  if (gptq)
    report.quant_summary = str_cat(o.quant.mode, " (", gemm_dtype, ", damping ", o.quant.gptq_damp, "): ",
                                   gptq_report->quantized, " Linears, output error on the calibration text ",
                                   gptq_report->error_rtn > 0 ? gptq_report->error / gptq_report->error_rtn : 1.0,
                                   " of plain rounding; ", gptq_report->kept, " kept f32");
  else if (awq)
    report.quant_summary = str_cat("awq (", gemm_dtype, ", alpha grid ", o.quant.awq_grid, "): ", awq_report->scaled,
                                   " Linears scaled; 1/s folded into ", awq_report->folded_into_norm, " norms, ",
                                   awq_report->folded_into_v, " V and ", awq_report->folded_into_up,
                                   " up projections, ", awq_report->muls, " Mul nodes");
  if (o.quant.effective_bits > 0)
    report.quant_summary += str_cat("; --effective-bits ", o.quant.effective_bits, ": ", planned_q8,
                                    " Linears promoted to q8 (see the pinned list of `kiln inspect`)");
  if (o.quant.mode == "fp8") {
    for (ir::Graph* g : graphs) quant::store_fp8_weights(*g);  // E4M3 codes in the file, one byte per weight
    report.quant_summary = str_cat("fp8 (", o.quant.method, " activation clips, smoothing alpha ", o.quant.smooth_alpha,
                                   "): ", fp8_report->quantized, " Linears E4M3, ",
                                   fp8_report->kept + fp8_report->kept_shape, " kept f32");
  }
  // The ranks' graphs have the same inputs: profiles are checked against rank 0's.
  const ir::Graph& first = *graphs[0];
  e.profiles = o.profiles;
  if (e.profiles.empty()) {
    // Built models have one token axis T; an imported ONNX graph has its own symbolic
    // input dims ("batch", "sequence"), each allowed [1, 16384] and tuned at 16.
    std::set<std::string> dims;
    for (ir::ValueId v : first.inputs())
      for (auto& d : first.value(v).shape.dims())
        if (!d.is_concrete() && d.sym != "?") dims.insert(d.sym);
    EngineProfile p{"default", {}};
    if (dims.empty() || dims.count("T")) p.dims.push_back({"T", 1, 128, 16384});
    else
      for (auto& d : dims) p.dims.push_back({d, 1, 16, 16384});
    e.profiles = {p};
  }
  for (size_t i = 0; i < e.profiles.size(); ++i) {
    const EngineProfile& p = e.profiles[i];
    for (size_t j = 0; j < i; ++j)
      if (e.profiles[j].name == p.name)
        throw_error(ErrorCode::kInvalidArgument, "--profile: two profiles are named '", p.name,
                    "'; name them (NAME:DIM=min,opt,max)");
    for (auto& pd : p.dims) {
      bool found = false;
      for (ir::ValueId v : first.inputs())
        for (auto& d : first.value(v).shape.dims()) found = found || d.sym == pd.dim;
      if (!found)
        throw_error(ErrorCode::kInvalidArgument, "--profile ", p.name, ": the graph has no input with a dim named '",
                    pd.dim, "'");
    }
  }
  // Every rank gets an arena of the largest rank's plan (they differ by a bias at most).
  std::vector<EngineProfile> planned = e.profiles;
  for (ir::Graph* g : graphs) {
    std::vector<EngineProfile> p = e.profiles;
    plan_memory(*g, p, o.workspace_bytes);
    for (size_t i = 0; i < p.size(); ++i) {
      planned[i].activation_bytes = std::max(planned[i].activation_bytes, p[i].activation_bytes);
      planned[i].activation_slots = std::max(planned[i].activation_slots, p[i].activation_slots);
    }
  }
  e.profiles = planned;
  report.profiles = e.profiles;

  auto t1 = Clock::now();
  report.device = model->backend().device_name();
  if (o.tune) {
    TimingCache cache(o.timing_cache);
    // Tactics are timed at the first profile's opt shapes (one table per device), on
    // each rank's own device; the ranks' GEMMs share shapes, so ranks after the first
    // mostly hit the cache.
    std::map<std::string, int64_t> dims = profile_dims(e.profiles[0], true);
    for (int r = 0; r < world; ++r) {
      Model& rank = model->tp_rank(r);
      EngineTacticTable table = tune(rank.backend(), *graphs[size_t(r)], rank.compile_options(), dims, cache, report);
      (world == 1 ? e.tactic_tables : e.ranks[size_t(r)].tactic_tables).push_back(std::move(table));
    }
    cache.save();
  }
  report.tune_seconds = since(t1);
  if (o.pack_weights) {
    for (int r = 0; r < world; ++r)
      report.packed_gemms += model->tp_rank(r).backend().pack_weights(*graphs[size_t(r)],
                                                                       model->tp_rank(r).compile_options());
    if (!report.packed_gemms)
      throw_error(ErrorCode::kUnsupported, "--pack-weights: the ", o.backend,
                  " backend has no packed weight layout to store");
  }
  report.tp_world = world;
  if (world > 1)
    for (ir::Graph* g : graphs) report.rank_weight_bytes.push_back(g->weight_bytes());

  if (model->gguf()) {
    if (model->gguf()->has_key("tokenizer.ggml.tokens")) {
      e.tokenizer.kind = "gguf";
      e.tokenizer.files.emplace_back("gguf_tokenizer.json",
                                     gguf_tokenizer_to_json(gguf_tokenizer_data(*model->gguf())).dump());
    }
  } else if (!o.random_weights && std::filesystem::is_directory(o.model)) {
    e.tokenizer.files = hf_tokenizer_files(o.model);
    if (!e.tokenizer.files.empty()) e.tokenizer.kind = "hf";
  }
  if (const std::string& src = model->kv_key_shift_source(); !src.empty()) {
    e.kv_key_shift.recorded = true;
    e.kv_key_shift.source = src;
    e.kv_key_shift.tokens = model->kv_key_shift_tokens();
    for (int r = 0; r < world; ++r)
      if (auto shift = model->tp_rank(r).kv_key_shift())
        (world == 1 ? e.kv_key_shift.values : e.ranks[size_t(r)].kv_key_shift) = *shift;
    report.kv_key_shift = src == "none" ? src : str_cat("measured on ", e.kv_key_shift.tokens, " tokens of ", src);
  }
  e.build.source = o.model;
  e.build.kiln_version = KILN_VERSION_STRING;
  e.build.weight_dtype = weight_dtype;
  report.weights = weight_dtype;
  if (const std::string kept = native ? kept_linear_formats(*graphs.front()) : ""; !kept.empty())
    report.weights += " (" + kept + " kept from the file)";
  e.build.opt_level = o.opt_level;
  e.build.disabled_passes = o.disabled_passes;
  // The pins the model was loaded with: the user's and a --effective-bits plan's.
  for (auto& pin : mo.pin_precision) e.build.pin_precision.push_back(pin.pattern + "=" + pin.precision);
  e.build.workspace_bytes = o.workspace_bytes;
  for (auto& r : report.passes)
    if (r.changed) e.build.pass_report.push_back(r.name + ": " + r.stats);
  if (quantized) e.build.pass_report.push_back(report.quant_summary);
  e.build.build_seconds = since(t0);
  report.bytes = engine_write(o.output, e);
  report.seconds = since(t0);
  return report;
}

}  // namespace kiln
