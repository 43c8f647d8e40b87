// `kiln build`: model -> engine file (src/builder). Prints what the passes fused, the
// tactic tuning summary, the profile, the ranks (--tp) and the file size. Tested by tests/tools/cli_test.sh.
#include <cstdio>

#include "builder/builder.h"
#include "commands.h"

namespace kiln::cli {

namespace {

struct BuildArgs {
  BuildOptions o;
  std::vector<std::string> profiles;
  std::vector<std::string> pins;
  std::string workspace;
  bool no_tune = false;
};

}  // namespace

Runner add_build(CLI::App& app) {
  auto a = std::make_shared<BuildArgs>();
  CLI::App* cmd = app.add_subcommand("build", "compile a model into an engine file (.kiln)");
  cmd->add_option("-m,--model", a->o.model, "a HuggingFace directory, a .gguf or an .onnx file")->required();
  cmd->add_option("-o,--output", a->o.output, "the engine file to write")->required();
  cmd->add_flag("--random-weights", a->o.random_weights, "-m is a config.json: real shapes, random weights");
  a->o.weight_dtype = "auto";
  cmd->add_option("--precision,--dtype", a->o.weight_dtype,
                  "GEMM weights: auto (as generate loads the model: a GGUF's quantized Linears stored as q8/q4 codes, "
                  "the rest in the backend's dtype - f32 on the CPU, or a 16-bit checkpoint's own dtype; bf16 on "
                  "cuda; f32 under --quant or --pin-precision), f32, bf16, f16 (stored so), q8 or q4 (stored f32, "
                  "quantized at load); "
                  "the logits GEMM, norms and softmax stay f32")
      ->check(CLI::IsMember({"auto", "f32", "bf16", "f16", "q8", "q4"}))
      ->capture_default_str();
  add_pin_option(cmd, a->pins);
  cmd->add_option("--backend", a->o.backend, "the backend to tune for")->capture_default_str();
  cmd->add_option("--tp", a->o.tensor_parallel,
                  "tensor parallelism: shard the decoder over N ranks and store every rank's optimized graph and "
                  "weights in the one engine file, which then runs sharded over N ranks (N GPUs on cuda) with no "
                  "--tp and no checkpoint; N must divide the attention heads, K/V heads and MLP width")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  add_pass_options(cmd, a->o.opt_level, a->o.disabled_passes);
  add_onnx_option(cmd, a->o.onnx_import);
  add_plugin_option(cmd);
  cmd->add_option("--profile", a->profiles,
                  "optimization profile NAME:DIM=min,opt,max[;DIM=...] (or DIM:min,opt,max, named 'default'); "
                  "repeatable, tried in order at run time; default T:1,128,16384. Tactics are timed at the first "
                  "profile's opt");
  cmd->add_option("--workspace", a->workspace,
                  "limit of the activation arena at every profile's max shapes (bytes, or 512MiB, 2GiB): a build "
                  "that needs more fails, saying what fits");
  cmd->add_flag("--pack-weights", a->o.pack_weights,
                "store GEMM weights in the backend's packed layout: loading maps them in place instead of packing, "
                "but the engine runs only on that backend");
  add_quant_options(cmd, a->o.quant, "--precision");
  cmd->add_flag("--no-tune", a->no_tune, "skip tactic timing (the backend's heuristics at run time)");
  cmd->add_option("--timing-cache", a->o.timing_cache, "JSON timing cache, read and updated (faster rebuilds)");
  add_max_context_option(cmd, a->o.max_context);
  cmd->add_option("--kv-calib", a->o.kv_calib,
                  "decoders: the text each layer's mean key is measured on for an int8/fp8 KV cache, stored in the "
                  "engine so that a load with --kv-cache-dtype int8|fp8 uses it instead of measuring: default (the "
                  "built-in calibration set), text files (comma-separated), or none (keys stay unshifted)")
      ->capture_default_str();
  return [a] {
    for (auto& p : a->profiles) a->o.profiles.push_back(parse_profile(p));
    for (auto& pin : parse_pin_options(a->pins)) a->o.pin_precision.push_back(pin);
    if (!a->workspace.empty()) a->o.workspace_bytes = parse_bytes(a->workspace);
    a->o.tune = !a->no_tune;
    BuildReport r = build_engine(a->o);
    std::printf("built %s from %s in %.2f s (load + passes %.2f s, tuning %.2f s)\n", a->o.output.c_str(),
                a->o.model.c_str(), r.seconds, r.load_seconds, r.tune_seconds);
    std::printf("graph       %zu -> %zu nodes (opt level %d)%s\n", r.nodes_before, r.nodes_after, a->o.opt_level,
                r.tp_world > 1 ? " per rank" : "");
    if (r.tp_world > 1) {
      std::string sizes;
      for (uint64_t b : r.rank_weight_bytes) sizes += str_cat(sizes.empty() ? "" : ", ", format_bytes(b));
      std::printf("tensor par  %d ranks, one graph each; weights per rank: %s\n", r.tp_world, sizes.c_str());
    }
    for (auto& p : r.passes)
      if (p.changed) std::printf("  %-24s %s\n", p.name.c_str(), p.stats.c_str());
    if (a->o.tune)
      std::printf("tactics     %zu GEMMs on '%s': %zu shapes timed, %zu from the timing cache\n", r.tactics_chosen,
                  r.device.c_str(), r.shapes_timed, r.cache_hits);
    for (auto& p : r.profiles) {
      std::string dims;
      for (auto& d : p.dims)
        dims += str_cat(dims.empty() ? "" : ", ", d.dim, " in [", d.min, ", ", d.max, "] opt ", d.opt);
      std::printf("profile     %s: %s; activation arena %s in %u slots at max shapes\n", p.name.c_str(), dims.c_str(),
                  format_bytes(p.activation_bytes).c_str(), p.activation_slots);
    }
    if (r.packed_gemms) std::printf("weights     %zu GEMMs stored packed for the %s backend\n", r.packed_gemms, a->o.backend.c_str());
    if (a->o.workspace_bytes) std::printf("workspace   %s limit: every profile fits\n", format_bytes(a->o.workspace_bytes).c_str());
    if (!r.quant_summary.empty()) std::printf("quant       %s\n", r.quant_summary.c_str());
    if (r.kv_key_shift == "none")
      std::printf("kv shift    none (--kv-calib none): an int8/fp8 KV cache stores keys unshifted\n");
    else if (!r.kv_key_shift.empty())
      std::printf("kv shift    %s (%.2f s), for an int8/fp8 KV cache\n", r.kv_key_shift.c_str(), r.kv_calib_seconds);
    std::printf("engine      %.1f MiB, GEMM weights %s\n", double(r.bytes) / (1 << 20), r.weights.c_str());
    return 0;
  };
}

}  // namespace kiln::cli
