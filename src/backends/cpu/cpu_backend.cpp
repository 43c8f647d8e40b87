// CPU backend: compiles a graph into a list of prepared op runners plus an activation
// plan, where values whose lifetimes do not overlap share a buffer (greedy interval
// assignment by last use). Buffers grow to the largest shape seen, so steady-state
// decoding allocates nothing.
#include "backends/cpu/cpu_backend.h"
#include "backends/memory_plan.h"
#include "backends/shape_profile.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include "backends/communicator.h"
#include "backends/cpu/cpu_ops.h"
#include "core/env_switch.h"
#include "core/log.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "ir/plugin.h"

namespace kiln {

namespace {

class CpuCompiledGraph final : public CompiledGraph {
 public:
  CpuCompiledGraph(const ir::Graph& g, const CompileOptions& opt)
      : graph_(g), profiles_(opt.profiles), profile_(opt.profile) {
    ir::verify(g);
    // KILN_CPU_PROFILE: unset or 0 off, 1 on, anything else an error naming it.
    const char* prof = std::getenv("KILN_CPU_PROFILE");
    op_profile_ = prof && *prof && env_switch_value("KILN_CPU_PROFILE", prof, "times every node", "no per-node timing");
    shape_profile_check_name(profiles_, profile_);
    for (const ir::Node& n : g.nodes()) {
      const cpu::OpPrepare* prep = cpu::find_cpu_op(n.op);
      if (!prep) throw_error(ErrorCode::kUnsupported, "cpu backend has no kernel for op '", n.op, "'");
      runners_.push_back((*prep)(n, g, opt));
    }
    for (const ir::Node& n : g.nodes())
      if (n.op == "Linear") {
        const Tensor& w = g.weight(n.inputs[1]);
        if (n.has_attr("weight_layout")) {  // packed by the builder: the bytes as stored
          weight_bytes_ += w.nbytes();
          continue;
        }
        // Bytes of the stored form (per node: assign_precision may pin some layers;
        // w8a8 Linears hold int8, fp8 ones their decoded codes as bf16): codes plus
        // f16 scales (q4: and mins) and an exponent per group of 32 for q8/q4 (the panels).
        const std::string st = cpu::linear_weight_storage(n, opt);
        const std::string quant = n.attr_str("quant", "");
        const double bits = quant == "w8a8"                               ? 8
                            : quant == "fp8"                              ? 16
                            : st == "f32" || st == "w8a8" || st == "fp8" ? 32
                            : st == "q8"                  ? 8.75
                            : st == "q4"                  ? 5.25
                                                          : 16;
        // A weight kept quantized (weight_quant) is [N, row image bytes]: count N * K values.
        const double values = n.has_attr("weight_quant") ? double(w.dim(0)) * double(n.attr_int("weight_k", 0))
                                                          : double(w.numel());
        weight_bytes_ += size_t(values * bits / 8);
      }
    plan_memory();
    if (op_profile_)
      for (const ir::Node& n : g.nodes()) {
        std::string key = n.op;
        if (n.op == "Linear") {
          // N x K (a packed weight is bytes with its weight_n / weight_k; a weight kept
          // quantized is [N, row image bytes]: its K and format).
          const Tensor& w = g.weight(n.inputs[1]);
          const bool packed = n.has_attr("weight_layout");
          const int64_t rows = packed ? n.attr_int("weight_n") : w.dim(0),
                        k = packed || n.has_attr("weight_quant") ? n.attr_int("weight_k", 0) : w.dim(1);
          key += str_cat(" ", rows, "x", k);
          if (n.has_attr("weight_quant")) key += " " + n.attr_str("weight_quant");
        }
        prof_keys_.push_back(std::move(key));
      }
  }

  ~CpuCompiledGraph() override {
    if (op_profile_) log_profile();
  }

  using CompiledGraph::run;
  TensorMap run(const TensorMap& inputs, const StepInfo& step, KvStorage* kv,
                const std::vector<std::string>& wanted) override {
    auto needed_it = needed_.find(wanted);
    if (needed_it == needed_.end()) needed_it = needed_.emplace(wanted, nodes_needed_for(graph_, wanted)).first;
    const std::vector<bool>& needed = needed_it->second;
    std::vector<const Tensor*> vals(graph_.num_values(), nullptr);
    for (ir::ValueId id : graph_.inputs()) {
      const ir::Value& v = graph_.value(id);
      auto it = inputs.find(v.name);
      if (it == inputs.end())
        throw_error(ErrorCode::kInvalidArgument, "missing graph input '", v.name, "'");
      const Tensor& t = it->second;
      if (t.dtype() != v.dtype || size_t(t.rank()) != v.shape.rank())
        throw_error(ErrorCode::kInvalidArgument, "input '", v.name, "' must be ",
                    dtype_name(v.dtype), v.shape.str(), ", got ", dtype_name(t.dtype()),
                    t.shape_str());
      for (size_t d = 0; d < v.shape.rank(); ++d) {
        if (v.shape[d].is_concrete() && v.shape[d].value != t.dim(int(d)))
          throw_error(ErrorCode::kInvalidArgument, "input '", v.name, "' dim ", d, " must be ",
                      v.shape[d].value, ", got ", t.shape_str());
      }
      vals[size_t(id)] = &t;
    }
    shape_profile_select(profiles_, profile_, graph_, inputs);
    for (auto& [id, t] : weights_view()) vals[size_t(id)] = t;

    auto* cpu_kv = dynamic_cast<cpu::CpuKv*>(kv);
    if (kv && !cpu_kv) throw_error(ErrorCode::kInvalidArgument, "KV storage is not a CPU pool");
    const auto& nodes = graph_.nodes();
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (!needed[i]) continue;
      const ir::Node& n = nodes[i];
      cpu::OpContext ctx;
      ctx.step = &step;
      ctx.kv = cpu_kv;
      for (ir::ValueId in : n.inputs) ctx.inputs.push_back(in == ir::kNoValue ? nullptr : vals[size_t(in)]);
      ctx.alloc = [&, i](size_t o, std::vector<int64_t> shape, DType dtype) -> Tensor& {
        ir::ValueId out = nodes[i].outputs.at(o);
        Slot& slot = slots_[size_t(slot_of_[size_t(out)])];
        int64_t numel = 1;
        for (auto d : shape) numel *= d;
        size_t bytes = size_t(numel) * dtype_size(dtype);
        if (bytes > slot.capacity) {
          slot.buffer = Tensor(DType::kU8, {int64_t(bytes)});
          slot.capacity = bytes;
        }
        results_[size_t(out)] = Tensor::view(slot.buffer.data(), dtype, std::move(shape));
        vals[size_t(out)] = &results_[size_t(out)];
        return results_[size_t(out)];
      };
      if (!op_profile_) {
        runners_[i](ctx);
        continue;
      }
      const auto t0 = std::chrono::steady_clock::now();
      runners_[i](ctx);
      auto& e = prof_[prof_keys_[i]];
      e.first += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      ++e.second;
    }
    if (op_profile_) ++prof_runs_;
    TensorMap out;
    for (auto& [name, id] : graph_.outputs())
      if (wanted.empty() || std::find(wanted.begin(), wanted.end(), name) != wanted.end())
        out[name] = *vals[size_t(id)];
    return out;
  }

  size_t weight_bytes() const override { return weight_bytes_; }
  size_t activation_bytes() const override {
    size_t b = 0;
    for (auto& s : slots_) b += s.capacity;
    return b;
  }

 private:
  struct Slot {
    Tensor buffer;
    size_t capacity = 0;
  };

  const std::vector<std::pair<ir::ValueId, const Tensor*>>& weights_view() {
    if (weight_ptrs_.empty())
      for (size_t v = 0; v < graph_.num_values(); ++v)
        if (graph_.is_weight(ir::ValueId(v)))
          weight_ptrs_.emplace_back(ir::ValueId(v), &graph_.weight(ir::ValueId(v)));
    return weight_ptrs_;
  }

  void plan_memory() {
    MemoryPlan plan = plan_activation_slots(graph_);
    slot_of_ = std::move(plan.slot_of);
    slots_.resize(size_t(plan.num_slots));
    results_.resize(graph_.num_values());
    log_debug("cpu: ", graph_.nodes().size(), " nodes share ", slots_.size(), " activation buffers");
  }

  // KILN_CPU_PROFILE=1: host time per op and Linear shape over every run, logged (info)
  // when the graph is destroyed, the largest first.
  void log_profile() const {
    if (prof_runs_ == 0) return;
    double total = 0;
    std::vector<std::pair<double, std::string>> rows;
    for (auto& [key, e] : prof_) {
      total += e.first;
      rows.push_back({e.first, key});
    }
    std::sort(rows.rbegin(), rows.rend());
    std::string table = str_cat("cpu profile of ", prof_runs_, " runs (ms per run; nodes per run):");
    for (auto& [ms, key] : rows)
      table += str_cat("\n  ", key, ": ", ms / double(prof_runs_), " ms (", prof_.at(key).second / prof_runs_,
                       " nodes, ", 100.0 * ms / total, "%)");
    table += str_cat("\n  total: ", total / double(prof_runs_), " ms");
    log_info(table);
  }

  const ir::Graph& graph_;
  bool op_profile_ = false;
  std::vector<std::string> prof_keys_;                        // per node
  std::map<std::string, std::pair<double, int64_t>> prof_;   // ms, nodes
  int64_t prof_runs_ = 0;
  std::vector<ShapeProfile> profiles_;
  std::string profile_;
  std::vector<cpu::OpRun> runners_;
  std::vector<int> slot_of_;
  std::vector<Slot> slots_;
  std::vector<Tensor> results_;
  std::vector<std::pair<ir::ValueId, const Tensor*>> weight_ptrs_;
  std::map<std::vector<std::string>, std::vector<bool>> needed_;  // by wanted outputs
  size_t weight_bytes_ = 0;
};

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  bool supports(const ir::Node& node, const ir::Graph&) const override {
    if (node.op == ir::kPluginOp) {  // when its plugin is loaded and has a CPU callback
      const ir::PluginOp* op = ir::plugin_find_op(node.attr_str(ir::kPluginDomainAttr, ""),
                                                  node.attr_str(ir::kPluginOpAttr, ""));
      return op && op->table.execute_cpu;
    }
    return cpu::find_cpu_op(node.op) != nullptr;
  }
  std::unique_ptr<CompiledGraph> compile(const ir::Graph& graph, const CompileOptions& opt) override {
    return std::make_unique<CpuCompiledGraph>(graph, opt);
  }
  std::unique_ptr<KvStorage> allocate_kv(const KvLayout& layout) override {
    return std::make_unique<cpu::CpuKv>(layout);
  }
  size_t kv_block_bytes(const KvLayout& layout) const override { return cpu::CpuKv::block_bytes_of(layout); }
  DeviceMemory memory_info() override {
    std::ifstream f("/proc/meminfo");
    std::stringstream text;
    text << f.rdbuf();
    DeviceMemory m = cpu_meminfo_parse(text.str());
    if (m.total_bytes == 0) {  // no /proc (not Linux): the C library's page counts
      const long page = sysconf(_SC_PAGESIZE), avail = sysconf(_SC_AVPHYS_PAGES);
      const long total = sysconf(_SC_PHYS_PAGES);
      if (page > 0 && avail > 0 && total > 0) {
        m.free_bytes = size_t(avail) * size_t(page);
        m.total_bytes = size_t(total) * size_t(page);
      }
    }
    return m;
  }

  // GEMM tactics: microkernel rows (4 or 6), K blocking (heuristic or 256) and the
  // thread split (N panels or T rows); threads stay automatic so an engine tuned on
  // one core count still uses every core elsewhere.
  std::vector<std::string> node_tactics(const ir::Node& node, const ir::Graph&) const override {
    if (node.op != "Linear" || node.has_attr("quant")) return {};
    std::vector<std::string> v;
    for (int mr : {6, 4})
      for (int64_t kc : {int64_t(0), int64_t(256)})
        for (auto split : {cpu::LinearSplit::kPanels, cpu::LinearSplit::kRows})
          v.push_back(cpu::linear_tactic_str({mr, kc, split, 0}));
    return v;
  }

  double time_tactic(const ir::Node& node, const ir::Graph& g, const std::string& tactic,
                     const std::map<std::string, int64_t>& dims, const CompileOptions& opt) override {
    if (node.op != "Linear" || node.has_attr("quant") || node.has_attr("weight_quant")) return -1;  // int8: one tactic
    const std::string storage = cpu::linear_weight_storage(node, opt);
    if (storage != "f32" && storage != "bf16" && storage != "f16" && storage != "w8a8" && storage != "fp8") return -1;
    const Dim& rows = g.value(node.inputs[0]).shape[0];
    const int64_t t = rows.is_concrete() ? rows.value : (dims.count(rows.sym) ? dims.at(rows.sym) : 1);
    // Pack once per weight: the builder times every tactic of a node in a row.
    const Tensor& w = g.weight(node.inputs[1]);
    if (packed_src_ != w.data() || packed_dtype_ != storage) {
      Tensor wf = w.dtype() == DType::kF32 ? w : w.to(DType::kF32);
      cpu::WeightStorage st = storage == "bf16"  ? cpu::WeightStorage::kBF16
                              : storage == "f16" ? cpu::WeightStorage::kF16
                                                 : cpu::WeightStorage::kF32;
      packed_ = cpu::pack_weight(wf.data_as<float>(), wf.dim(0), wf.dim(1), st);
      packed_src_ = w.data();
      packed_dtype_ = storage;
    }
    Tensor x(DType::kF32, {t, packed_.k}), y(DType::kF32, {t, packed_.n});
    for (int64_t i = 0; i < x.numel(); ++i) x.data_as<float>()[i] = float((i * 7919) % 200 - 100) * 0.01f;
    cpu::LinearTactic tac = cpu::linear_tactic_parse(tactic);
    auto once = [&] {
      auto t0 = std::chrono::steady_clock::now();
      cpu::linear(x.data_as<float>(), t, packed_.k, packed_, nullptr, y.data_as<float>(), tac);
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    once();  // warm-up (caches, page faults)
    std::vector<double> times;
    double total = 0;
    // At least 3 runs, more for short ones, about 50 ms per tactic in all.
    while (times.size() < 3 || (total < 0.05 && times.size() < 50)) total += times.emplace_back(once());
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
  }

  bool supports_fusion(const std::string&) const override { return true; }  // all of them
  bool supports_sliding_window() const override { return true; }
  bool supports_w8a8_weight_amax() const override { return true; }
  // Norm prologues and residual epilogues save the CPU nothing (its Linear runs the norm
  // and the add as separate loops anyway): its graphs keep their norm nodes.
  bool wants_fusion(const std::string& pass) const override { return pass != "fuse_norm_linear"; }
  // Ranks are threads of this process (LocalCommunicator); every rank uses all cores.
  std::vector<std::shared_ptr<Communicator>> make_communicators(int world_size, int) override {
    return make_local_communicators(world_size);
  }

  size_t pack_weights(ir::Graph& graph, const CompileOptions& opt) override {
    return cpu::pack_linear_weights(graph, opt);
  }
  bool supports_weight_layout(const std::string& layout) const override {
    // v1 / v2: packed_weight_view decides by storage
    return layout == cpu::kCpuPackedLayout || layout == cpu::kCpuPackedLayoutV2 || layout == cpu::kCpuPackedLayoutV1;
  }

  std::string device_name() const override {
    return str_cat("cpu ", cpu::cpu_isa_name(cpu::cpu_isa()), " ", ThreadPool::global().num_threads(), " threads");
  }

 private:
  const void* packed_src_ = nullptr;
  std::string packed_dtype_;
  cpu::PackedWeight packed_;
};

}  // namespace

DeviceMemory cpu_meminfo_parse(const std::string& text) {
  DeviceMemory m;
  m.device = "cpu";
  std::istringstream in(text);
  std::string key;
  size_t kb = 0;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    if (!(ls >> key >> kb)) continue;
    if (key == "MemAvailable:") m.free_bytes = kb * 1024;
    if (key == "MemTotal:") m.total_bytes = kb * 1024;
  }
  return m;
}

std::unique_ptr<Backend> create_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace kiln
