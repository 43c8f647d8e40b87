// `kiln inspect`: what a model or engine is (family, shapes, weights, memory), its
// layers after fusion (op counts and what each pass did), and for engines the build
// options, profiles and tactics; with --graph, its IR one node per line.
#include <cstdio>
#include <map>

#include "commands.h"
#include "runtime/model.h"

namespace kiln::cli {

namespace {

void print_engine(const EngineContents& e, const std::string& device) {
  const EngineBuildInfo& b = e.build;
  std::printf("engine      built by kiln %s from %s in %.1f s: GEMM weights %s, opt level %d\n",
              b.kiln_version.c_str(), b.source.c_str(), b.build_seconds, b.weight_dtype.c_str(), b.opt_level);
  for (auto& line : b.pass_report) std::printf("  pass      %s\n", line.c_str());
  for (auto& p : e.profiles)
    std::printf("profile     %s: %s in [%lld, %lld], opt %lld\n", p.name.c_str(), p.dim.c_str(), (long long)p.min,
                (long long)p.max, (long long)p.opt);
  for (auto& t : e.tactic_tables) {
    std::map<std::string, int> count;
    for (auto& x : t.tactics) ++count[x.tactic];
    std::printf("tactics     %zu nodes timed on '%s'%s\n", t.tactics.size(), t.device.c_str(),
                t.device == device ? " (this device)" : " (another device: heuristics used here)");
    for (auto& [tac, n] : count) std::printf("  %3d x %s\n", n, tac.c_str());
  }
  std::printf("tokenizer   %s\n", e.tokenizer.kind.empty() ? "none" : e.tokenizer.kind.c_str());
}

}  // namespace

Runner add_inspect(CLI::App& app) {
  auto a = std::make_shared<ModelArgs>();
  auto graph = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("inspect", "describe a model or engine: family, shapes, layers, memory, graph");
  add_model_options(cmd, *a);
  cmd->add_flag("--graph", *graph, "print the IR graph");
  return [a, graph] {
    auto m = Model::load(a->model, model_options(*a));
    const ModelInfo& i = m->info();
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
    std::printf("graph       %zu nodes, %.1f MiB of weights\n", m->graph().nodes().size(),
                double(m->graph().weight_bytes()) / (1 << 20));
    std::map<std::string, int> ops;
    for (auto& n : m->graph().nodes()) ++ops[n.op + (n.attr_int("packed_qkv", 0) ? "(packed qkv)" : "") +
                                             (n.has_attr("activation") ? "+" + n.attr_str("activation") : "")];
    std::printf("layers     ");
    for (auto& [op, n] : ops) std::printf(" %s x%d", op.c_str(), n);
    std::printf("\n");
    for (auto& p : m->pass_report())
      if (p.changed) std::printf("  pass      %s: %s\n", p.name.c_str(), p.stats.c_str());
    if (m->engine()) print_engine(*m->engine(), m->backend().device_name());
    std::printf("backend     %s, GEMM weights %s: %.1f MiB\n", m->backend().name().c_str(),
                m->compile_options().weight_dtype.c_str(), double(m->compiled().weight_bytes()) / (1 << 20));
    if (i.is_decoder)
      std::printf("KV cache    %lld bytes per token\n",
                  (long long)(2 * i.num_layers * i.num_kv_heads * i.head_dim * 4));
    if (*graph) std::printf("\n%s", m->graph().dump().c_str());
    return 0;
  };
}

}  // namespace kiln::cli
