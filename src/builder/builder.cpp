// The engine builder (see builder.h).
#include "builder/builder.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>

#include "core/log.h"
#include "core/status.h"
#include "runtime/model.h"
#include "runtime/model_tokenizer.h"

namespace kiln {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// GEMM weights (input 1 of every Linear) converted to their stored precision; norms,
// embeddings and biases stay f32 (their kernels read f32 and they are small or
// gathered, not streamed).
void convert_gemm_weights(ir::Graph& g, const std::string& dtype) {
  // q8/q4 keep f32 in the file: the backend quantizes when it packs (exactly as when
  // loading the checkpoint directly), so the engine's numbers match --weight-dtype q8.
  // w8a8 likewise: its Linears are quantized at load from the (smoothed) f32 weights.
  if (dtype == "f32" || dtype == "q8" || dtype == "q4" || dtype == "w8a8") return;
  const DType dt = dtype == "bf16" ? DType::kBF16 : dtype == "f16" ? DType::kF16 : DType::kF32;
  if (dt == DType::kF32) throw_error(ErrorCode::kInvalidArgument, "--dtype '", dtype, "' (expected f32, bf16 or f16)");
  std::map<ir::ValueId, bool> done;
  for (const ir::Node& n : g.nodes()) {
    if (n.op != "Linear" || !g.is_weight(n.inputs[1]) || done[n.inputs[1]]) continue;
    done[n.inputs[1]] = true;
    Tensor& w = g.weight(n.inputs[1]);
    if (w.dtype() == DType::kF32) w = w.to(dt);
    g.value(n.inputs[1]).dtype = w.dtype();
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
                              co.weight_dtype, n.input(2) != ir::kNoValue ? " bias" : "",
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
  report.tactics_chosen = table.tactics.size();
  return table;
}

}  // namespace

EngineProfile parse_profile(const std::string& spec) {
  EngineProfile p{"default", "", 0, 0, 0};
  size_t colon = spec.find(':');
  std::vector<int64_t> v;
  if (colon != std::string::npos && colon > 0) {
    p.dim = spec.substr(0, colon);
    std::string rest = spec.substr(colon + 1);
    size_t pos = 0;
    while (pos <= rest.size()) {
      size_t end = rest.find(',', pos);
      if (end == std::string::npos) end = rest.size();
      char* stop = nullptr;
      std::string item = rest.substr(pos, end - pos);
      long long x = std::strtoll(item.c_str(), &stop, 10);
      if (item.empty() || *stop || x < 1) v.clear(), pos = rest.size() + 1;
      else v.push_back(x), pos = end + 1;
    }
  }
  if (v.size() != 3 || v[0] > v[1] || v[1] > v[2])
    throw_error(ErrorCode::kInvalidArgument, "--profile '", spec,
                "': expected DIM:min,opt,max with 1 <= min <= opt <= max, e.g. T:1,128,2048");
  p.min = v[0], p.opt = v[1], p.max = v[2];
  return p;
}

BuildReport build_engine(const BuildOptions& o) {
  BuildReport report;
  auto t0 = Clock::now();
  if (o.output.empty()) throw_error(ErrorCode::kInvalidArgument, "build: no output file (-o)");
  ModelOptions mo{o.backend, o.weight_dtype, nullptr, o.opt_level, o.disabled_passes};
  const bool w8a8 = o.quant.mode == "w8a8";
  if (!o.quant.mode.empty() && !w8a8)
    throw_error(ErrorCode::kInvalidArgument, "build: unknown --quant '", o.quant.mode, "' (expected w8a8)");
  if (w8a8 && o.random_weights)
    throw_error(ErrorCode::kInvalidArgument, "build: --quant needs real weights to calibrate (not --random-weights)");
  auto quant_report = std::make_shared<quant::W8A8Report>();
  if (w8a8) {
    quant::calib_method_parse(o.quant.method);
    mo = w8a8_model_options(mo, calibration_for(o.model, mo, o.quant), o.quant, quant_report);
  }
  auto model = o.random_weights ? Model::load_random(o.model, mo) : Model::load(o.model, mo);
  if (model->engine()) throw_error(ErrorCode::kInvalidArgument, "build: '", o.model, "' is already an engine");
  report.load_seconds = since(t0);
  report.passes = model->pass_report();
  report.nodes_before = report.passes.empty() ? model->graph().nodes().size() : report.passes.front().nodes_before;
  report.nodes_after = model->graph().nodes().size();

  EngineContents e;
  e.graph = model->graph();  // shares the weight buffers; conversions make new ones
  e.info = model->info();
  e.config = model->config();
  const std::string weight_dtype = w8a8 ? "w8a8" : o.weight_dtype;
  convert_gemm_weights(e.graph, weight_dtype);
  if (w8a8)
    report.quant_summary = "w8a8 (" + (o.quant.act_scale == "per-token" ? std::string("per-token") : o.quant.method) + " activation scales, smoothing alpha " + std::to_string(o.quant.smooth_alpha) +
                           "): " + std::to_string(quant_report->quantized) + " Linears int8, " +
                           std::to_string(quant_report->kept) + " kept f32";
  e.profiles = o.profiles.empty() ? std::vector<EngineProfile>{{"default", "T", 1, 128, 16384}} : o.profiles;
  for (auto& p : e.profiles) {
    bool found = false;
    for (ir::ValueId v : e.graph.inputs())
      for (auto& d : e.graph.value(v).shape.dims()) found = found || d.sym == p.dim;
    if (!found)
      throw_error(ErrorCode::kInvalidArgument, "--profile: the graph has no input with a dim named '", p.dim, "'");
  }

  auto t1 = Clock::now();
  report.device = model->backend().device_name();
  if (o.tune) {
    TimingCache cache(o.timing_cache);
    std::map<std::string, int64_t> dims;
    for (auto& p : e.profiles) dims[p.dim] = p.opt;
    e.tactic_tables.push_back(tune(model->backend(), e.graph, model->compile_options(), dims, cache, report));
    cache.save();
  }
  report.tune_seconds = since(t1);

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
  e.build.source = o.model;
  e.build.kiln_version = KILN_VERSION_STRING;
  e.build.weight_dtype = weight_dtype;
  e.build.opt_level = o.opt_level;
  e.build.disabled_passes = o.disabled_passes;
  for (auto& r : report.passes)
    if (r.changed) e.build.pass_report.push_back(r.name + ": " + r.stats);
  if (w8a8) e.build.pass_report.push_back(report.quant_summary);
  e.build.build_seconds = since(t0);
  report.bytes = engine_write(o.output, e);
  report.seconds = since(t0);
  return report;
}

}  // namespace kiln
