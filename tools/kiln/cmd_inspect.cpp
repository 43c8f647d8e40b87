// `kiln inspect`: what a model or engine is (family, shapes, weights, memory), its
// layers after fusion (op counts and what each pass did), and for engines the build
// options, profiles and tactics; with --graph, its IR one node per line.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <utility>

#include "commands.h"
#include "core/host_memory.h"
#include "ir/plugin.h"
#include "runtime/model.h"

namespace kiln::cli {

namespace {

std::string bytes_str(uint64_t b) {
  char buf[64];
  if (b >= (uint64_t(1) << 20)) std::snprintf(buf, sizeof buf, "%.2f MiB", double(b) / double(1 << 20));
  else std::snprintf(buf, sizeof buf, "%.1f KiB", double(b) / 1024);
  return buf;
}

void print_engine(const EngineContents& e, const std::string& device) {
  const EngineBuildInfo& b = e.build;
  std::printf("engine      schema %u.%u, built by kiln %s from %s in %.1f s: GEMM weights %s, opt level %d\n",
              kEngineSchemaVersion, e.schema_minor, b.kiln_version.c_str(), b.source.c_str(), b.build_seconds,
              b.weight_dtype.c_str(), b.opt_level);
  if (e.tp_world > 1)
    std::printf("  ranks     %d (tensor parallel: one sharded graph per rank; runs over %d ranks, no --tp needed)\n",
                e.tp_world, e.tp_world);
  for (auto& line : b.pass_report) std::printf("  pass      %s\n", line.c_str());
  for (auto& pin : b.pin_precision) std::printf("  pinned    %s\n", pin.c_str());
  if (const EngineKvKeyShift& k = e.kv_key_shift; k.recorded) {
    if (k.source == "none") {
      std::printf("kv shift    none (built with --kv-calib none): an int8/fp8 KV cache stores keys unshifted\n");
    } else {
      float largest = 0;
      for (float v : k.values) largest = std::max(largest, std::fabs(v));
      for (auto& r : e.ranks)
        for (float v : r.kv_key_shift) largest = std::max(largest, std::fabs(v));
      std::printf("kv shift    measured at build on %u tokens of %s (largest |shift| %.3g), for an int8/fp8 KV cache\n",
                  k.tokens, k.source.c_str(), double(largest));
    }
  } else if (e.info.is_decoder) {
    std::printf("kv shift    not recorded: an int8/fp8 KV cache measures it at load\n");
  }
  for (auto& p : e.profiles) {
    std::string dims;
    for (auto& d : p.dims)
      dims += str_cat(dims.empty() ? "" : ", ", d.dim, " in [", d.min, ", ", d.max, "], opt ", d.opt);
    std::printf("profile     %s: %s\n", p.name.c_str(), dims.c_str());
    if (p.activation_slots)
      std::printf("  memory    activation arena %s (%llu bytes) in %u slots at the max shapes%s\n",
                  bytes_str(p.activation_bytes).c_str(), (unsigned long long)p.activation_bytes, p.activation_slots,
                  e.tp_world > 1 ? ", per rank" : "");
    else
      std::printf("  memory    not recorded (engine schema %u.%u; rebuild to plan it)\n", kEngineSchemaVersion,
                  e.schema_minor);
  }
  if (b.workspace_bytes)
    std::printf("workspace   %s (%llu bytes) limit at build time\n", bytes_str(b.workspace_bytes).c_str(),
                (unsigned long long)b.workspace_bytes);
  std::vector<std::pair<std::string, const EngineTacticTable*>> tables;  // (label, table)
  for (auto& t : e.tactic_tables) tables.emplace_back("tactics     ", &t);
  for (size_t r = 0; r < e.ranks.size(); ++r)
    for (auto& t : e.ranks[r].tactic_tables) tables.emplace_back(str_cat("tactics     rank ", r, ": "), &t);
  for (auto& [label, table] : tables) {
    const EngineTacticTable& t = *table;
    std::map<std::string, int> count;
    for (auto& x : t.tactics) ++count[x.tactic];
    std::printf("%s%zu nodes timed on '%s'%s\n", label.c_str(), t.tactics.size(), t.device.c_str(),
                t.device == device ? " (this device)" : " (another device: heuristics used here)");
    for (auto& [tac, n] : count) std::printf("  %3d x %s\n", n, tac.c_str());
  }
  std::printf("tokenizer   %s\n", e.tokenizer.kind.empty() ? "none" : e.tokenizer.kind.c_str());
}

// GEMM weight precision per node (assign_precision's attribute, else the model-wide
// dtype): counts, and the GEMMs outside the most common precision by name.
void print_precision(const ir::Graph& g, const std::string& fallback) {
  std::map<std::string, std::vector<std::string>> gemms;
  size_t kept_f32 = 0;
  for (auto& n : g.nodes()) {
    if (n.op == "Linear") gemms[n.attr_str("precision", fallback)].push_back(n.name);
    else if (n.attr_str("precision", "") == "f32") ++kept_f32;
  }
  std::string common;
  for (auto& [p, names] : gemms)
    if (common.empty() || names.size() > gemms[common].size()) common = p;
  std::printf("precision   GEMM weights:");
  const char* sep = " ";
  for (auto& [p, names] : gemms) std::printf("%s%zu %s", std::exchange(sep, ", "), names.size(), p.c_str());
  if (kept_f32) std::printf("; %zu norm/softmax/pool nodes kept f32", kept_f32);
  std::printf("\n");
  for (auto& [p, names] : gemms) {
    if (p == common) continue;
    std::string list;
    for (auto& n : names) list += (list.empty() ? "" : ", ") + n;
    std::printf("  %-9s %s\n", p.c_str(), list.c_str());
  }
}

// The plugin libraries the graph's Plugin nodes call: as recorded in an engine (and
// where this run loaded them from), or as loaded for an imported model.
void print_plugins(const Model& m) {
  const std::vector<EnginePlugin> plugins = m.engine() ? m.engine()->plugins : engine_plugins_of(m.graph());
  for (const EnginePlugin& p : plugins) {
    std::string ops, loaded;
    for (auto& op : p.ops) ops += (ops.empty() ? "" : ", ") + op;
    for (const ir::PluginLibrary* lib : ir::plugin_libraries())
      if (lib->name == p.name) loaded = str_cat("; loaded ", lib->version, " from ", lib->path);
    std::printf("plugin      '%s' %s (%s): %s%s\n", p.name.c_str(), p.version.c_str(), p.library.c_str(), ops.c_str(),
                loaded.c_str());
  }
}

int64_t kv_bytes_per_token(const ModelInfo& i) { return 2 * i.num_layers * i.num_kv_heads * i.head_dim * 4; }

// Tensor parallelism: each rank's share of the heads and its sizes.
void print_ranks(Model& m) {
  const ModelInfo& all = m.model_info();
  std::printf("tensor par  %d ranks%s: %lld of %lld attention heads, %lld of %lld K/V heads each\n", m.tp_world(),
              m.engine() ? " (recorded in the engine)" : "", (long long)m.info().num_heads, (long long)all.num_heads,
              (long long)m.info().num_kv_heads, (long long)all.num_kv_heads);
  for (int r = 0; r < m.tp_world(); ++r) {
    Model& rank = m.tp_rank(r);
    std::printf("  rank %-4d %zu nodes, %s of weights (%s as compiled), KV cache %lld bytes per token\n", r,
                rank.graph().nodes().size(), bytes_str(rank.graph().weight_bytes()).c_str(),
                bytes_str(rank.compiled().weight_bytes()).c_str(), (long long)kv_bytes_per_token(rank.info()));
  }
}

}  // namespace

Runner add_inspect(CLI::App& app) {
  auto a = std::make_shared<ModelArgs>();
  auto graph = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("inspect", "describe a model or engine: family, shapes, layers, memory, graph");
  add_model_options(cmd, *a);
  cmd->add_flag("--graph", *graph, "print the IR graph");
  return [a, graph] {
    ModelOptions mo = model_options(*a);
    mo.lean_host_weights = false;  // the graph as built: [N, K] Linear weights
    auto m = Model::load(a->model, mo);
    const ModelInfo& i = m->model_info();  // unsharded (tensor parallelism: rank 0's share below)
    std::printf("model       %s\n", m->path().c_str());
    std::printf("family      %s (model_type %s), %s\n", i.family.c_str(), i.model_type.c_str(),
                i.family == "onnx" ? "op-by-op graph" : i.is_decoder ? "decoder" : "encoder");
    const ir::Graph& g = m->graph();
    if (i.family == "onnx") {
      // An imported graph runs op by op with its own named inputs and outputs.
      if (g.meta.count("onnx_opset"))
        std::printf("onnx        opset %lld, produced by %s\n", (long long)g.meta_int("onnx_opset"),
                    std::get<std::string>(g.meta.at("onnx_producer")).c_str());
      for (ir::ValueId v : g.inputs())
        std::printf("input       %s %s%s\n", g.value(v).name.c_str(), dtype_name(g.value(v).dtype),
                    g.value(v).shape.str().c_str());
      for (auto& [name, v] : g.outputs())
        std::printf("output      %s %s%s\n", name.c_str(), dtype_name(g.value(v).dtype), g.value(v).shape.str().c_str());
    } else {
      std::printf("shape       %lld layers, hidden %lld, heads %lld (kv %lld) x %lld, vocab %lld, "
                  "max positions %lld\n",
                  (long long)i.num_layers, (long long)i.hidden_size, (long long)i.num_heads,
                  (long long)i.num_kv_heads, (long long)i.head_dim, (long long)i.vocab_size,
                  (long long)i.max_positions);
    }
    if (i.num_labels) std::printf("labels      %lld\n", (long long)i.num_labels);
    if (!i.pooling.empty() && i.family != "onnx")
      std::printf("pooling     %s (sentence embeddings%s)\n", i.pooling.c_str(), i.is_decoder ? ": an embedding model" : "");
    std::printf("graph       %zu nodes, %.1f MiB of weights%s\n", m->graph().nodes().size(),
                double(m->graph().weight_bytes()) / (1 << 20), m->tp_world() > 1 ? " (rank 0)" : "");
    std::map<std::string, int> ops;
    for (auto& n : m->graph().nodes()) {
      if (n.op == ir::kPluginOp) {  // by the custom op it calls
        const std::string domain = n.attr_str(ir::kPluginDomainAttr, "");
        ++ops[str_cat("Plugin(", domain.empty() ? "" : domain + "::", n.attr_str(ir::kPluginOpAttr), ")")];
        continue;
      }
      ++ops[n.op + (n.attr_int("packed_qkv", 0) ? "(packed qkv)" : "") +
            (n.has_attr("activation") ? "+" + n.attr_str("activation") : "")];
    }
    std::printf("layers     ");
    for (auto& [op, n] : ops) std::printf(" %s x%d", op.c_str(), n);
    std::printf("\n");
    for (auto& p : m->pass_report())
      if (p.changed) std::printf("  pass      %s: %s\n", p.name.c_str(), p.stats.c_str());
    if (m->engine()) print_engine(*m->engine(), m->backend().device_name());
    print_plugins(*m);
    print_precision(m->graph(), m->compile_options().weight_dtype);
    std::printf("backend     %s, GEMM weights %s: %.1f MiB\n", m->backend().name().c_str(),
                m->compile_options().weight_dtype.c_str(), double(m->compiled().weight_bytes()) / (1 << 20));
    if (m->tp_world() > 1) print_ranks(*m);
    if (i.is_decoder) {
      int64_t kv = 0;  // every rank's (replicated K/V heads count once per rank)
      for (int r = 0; r < m->tp_world(); ++r) kv += kv_bytes_per_token(m->tp_rank(r).info());
      std::printf("KV cache    %lld bytes per token%s\n", (long long)kv, m->tp_world() > 1 ? ", all ranks" : "");
    }
    const Model::LoadTimes& t = m->load_times();
    std::printf("load        read %.2f s, passes %.2f s, compile %.2f s", t.read, t.passes, t.compile);
    if (const HostMemory mem = host_memory(); mem.anon >= 0 && mem.file >= 0)
      std::printf("; host memory %.1f MiB anonymous + %.1f MiB of mapped files resident", double(mem.anon) / (1 << 20),
                  double(mem.file) / (1 << 20));
    std::printf("\n");
    if (*graph) std::printf("\n%s", m->graph().dump().c_str());
    return 0;
  };
}

}  // namespace kiln::cli
