// `kiln inspect`: what a model is (family, shapes, weights, memory) and, with --graph,
// its IR one node per line.
#include <cstdio>

#include "commands.h"
#include "runtime/model.h"

namespace kiln::cli {

Runner add_inspect(CLI::App& app) {
  auto a = std::make_shared<ModelArgs>();
  auto graph = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("inspect", "describe a model: family, shapes, memory, graph");
  add_model_options(cmd, *a);
  cmd->add_flag("--graph", *graph, "print the IR graph");
  return [a, graph] {
    auto m = Model::load(a->model, {a->backend, a->weight_dtype});
    const ModelInfo& i = m->info();
    std::printf("model       %s\n", m->path().c_str());
    std::printf("family      %s (model_type %s), %s\n", i.family.c_str(), i.model_type.c_str(),
                i.is_decoder ? "decoder" : "encoder");
    std::printf("shape       %lld layers, hidden %lld, heads %lld (kv %lld) x %lld, vocab %lld, "
                "max positions %lld\n",
                (long long)i.num_layers, (long long)i.hidden_size, (long long)i.num_heads,
                (long long)i.num_kv_heads, (long long)i.head_dim, (long long)i.vocab_size,
                (long long)i.max_positions);
    if (i.num_labels) std::printf("labels      %lld\n", (long long)i.num_labels);
    std::printf("graph       %zu nodes, %.1f MiB of f32 weights\n", m->graph().nodes().size(),
                double(m->graph().weight_bytes()) / (1 << 20));
    std::printf("backend     %s, GEMM weights %s: %.1f MiB\n", m->backend().name().c_str(),
                a->weight_dtype.c_str(), double(m->compiled().weight_bytes()) / (1 << 20));
    std::printf("KV cache    %lld bytes per token\n",
                (long long)(2 * i.num_layers * i.num_kv_heads * i.head_dim * 4));
    if (*graph) std::printf("\n%s", m->graph().dump().c_str());
    return 0;
  };
}

}  // namespace kiln::cli
