// `kiln build`: model -> engine file (src/builder). Prints what the passes fused, the
// tactic tuning summary, the profile and the file size. Tested by tests/tools/cli_test.sh.
#include <cstdio>

#include "builder/builder.h"
#include "commands.h"

namespace kiln::cli {

namespace {

struct BuildArgs {
  BuildOptions o;
  std::vector<std::string> profiles;
  bool no_tune = false;
};

}  // namespace

Runner add_build(CLI::App& app) {
  auto a = std::make_shared<BuildArgs>();
  CLI::App* cmd = app.add_subcommand("build", "compile a model into an engine file (.kiln)");
  cmd->add_option("-m,--model", a->o.model, "a HuggingFace directory or a .gguf file")->required();
  cmd->add_option("-o,--output", a->o.output, "the engine file to write")->required();
  cmd->add_flag("--random-weights", a->o.random_weights, "-m is a config.json: real shapes, random weights");
  cmd->add_option("--dtype", a->o.weight_dtype,
                  "GEMM weights: f32, bf16, f16 (stored so), q8 or q4 (stored f32, quantized at load)")
      ->check(CLI::IsMember({"f32", "bf16", "f16", "q8", "q4"}))
      ->capture_default_str();
  cmd->add_option("--backend", a->o.backend, "the backend to tune for")->capture_default_str();
  add_pass_options(cmd, a->o.opt_level, a->o.disabled_passes);
  cmd->add_option("--profile", a->profiles,
                  "dynamic-shape profile DIM:min,opt,max (default T:1,128,16384); tactics are timed at opt");
  add_quant_options(cmd, a->o.quant);
  cmd->add_flag("--no-tune", a->no_tune, "skip tactic timing (the backend's heuristics at run time)");
  cmd->add_option("--timing-cache", a->o.timing_cache, "JSON timing cache, read and updated (faster rebuilds)");
  return [a] {
    for (auto& p : a->profiles) a->o.profiles.push_back(parse_profile(p));
    a->o.tune = !a->no_tune;
    BuildReport r = build_engine(a->o);
    std::printf("built %s from %s in %.2f s (load + passes %.2f s, tuning %.2f s)\n", a->o.output.c_str(),
                a->o.model.c_str(), r.seconds, r.load_seconds, r.tune_seconds);
    std::printf("graph       %zu -> %zu nodes (opt level %d)\n", r.nodes_before, r.nodes_after, a->o.opt_level);
    for (auto& p : r.passes)
      if (p.changed) std::printf("  %-24s %s\n", p.name.c_str(), p.stats.c_str());
    if (a->o.tune)
      std::printf("tactics     %zu GEMMs on '%s': %zu shapes timed, %zu from the timing cache\n", r.tactics_chosen,
                  r.device.c_str(), r.shapes_timed, r.cache_hits);
    if (!r.quant_summary.empty()) std::printf("quant       %s\n", r.quant_summary.c_str());
    std::printf("engine      %.1f MiB, GEMM weights %s\n", double(r.bytes) / (1 << 20),
                a->o.quant.mode.empty() ? a->o.weight_dtype.c_str() : a->o.quant.mode.c_str());
    return 0;
  };
}

}  // namespace kiln::cli
