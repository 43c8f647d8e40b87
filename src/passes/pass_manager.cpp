// The pass lists per optimization level (see pass_manager.h).
#include "passes/pass_manager.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <sstream>

#include "core/log.h"
#include "core/status.h"
#include "passes/pass.h"

namespace kiln::passes {

namespace {

struct Entry {
  int min_level;
  std::function<std::unique_ptr<Pass>(const PassOptions&)> make;
};

template <std::unique_ptr<Pass> (*Make)()>
std::unique_ptr<Pass> plain(const PassOptions&) {
  return Make();
}

// Why this order:
// - constant_folding first: it turns imported shape arithmetic into constants and
//   attributes, after which cse/dce see the real graph (a no-op for built models).
// - cse and dce first, so duplicated or dead nodes do not hide single-use patterns
//   from the fusions (a fusion only fires when the intermediate it removes has no
//   other reader).
// - the *_pattern fusions (op-by-op LayerNorm / GELU of imported graphs) before the
//   others, which look for LayerNorm and Gelu nodes (fuse_add_norm takes the residual
//   Add in front of a LayerNorm only once it is one node).
// - fuse_attention_pattern after constant_folding (its scale must be a constant, which
//   an export often computes as Sqrt(Cast(Shape...))) and cse (a shared scale or mask
//   duplicated per layer must not look like extra readers); it only touches
//   MatMul/Softmax nodes of imported graphs, so its place among the fusions is free.
// - fuse_qkv_attention before anything touches the Q/K/V Linears (an epilogue or a
//   later merge would no longer look like three plain projections of one input).
// - fuse_swiglu before fuse_linear_activation: otherwise Silu(gate_proj) would be
//   absorbed as an epilogue and the gate/up pair would no longer match.
// - fuse_embedding_norm before fuse_add_norm: BERT's embedding LayerNorm reads an Add
//   (word + position, + token type) that fuse_add_norm would otherwise take as a
//   residual Add, leaving two gathers and an add unfused.
// - fuse_add_norm is independent of the GEMM fusions; it runs after them only so the
//   report reads in data-flow order of a block.
// - fuse_norm_linear after fuse_add_norm (it folds the AddRMSNorm/AddLayerNorm nodes
//   that one made) and after every pass that merges or rewrites Linears (qkv, swiglu,
//   activation epilogues), so it sees the Linears the engine runs.
// - dce last removes what the fusions left unreferenced (old weights included).
// - assign_precision after everything that renames or merges GEMMs, so pins name the
//   nodes the engine runs (layers.0.qkv_proj, not layers.0.q_proj); it runs at every
//   level, but only when a precision is asked for.
const std::vector<std::pair<std::string, Entry>>& registry() {
  static const std::vector<std::pair<std::string, Entry>> r = {
      {"constant_folding", {1, plain<make_constant_folding_pass>}},
      {"cse", {1, plain<make_cse_pass>}},
      {"dce", {1, plain<make_dce_pass>}},
      {"fuse_layer_norm_pattern", {2, plain<make_fuse_layer_norm_pattern_pass>}},
      {"fuse_gelu_pattern", {2, plain<make_fuse_gelu_pattern_pass>}},
      {"fuse_attention_pattern", {2, plain<make_fuse_attention_pattern_pass>}},
      {"fuse_qkv_attention", {2, plain<make_fuse_qkv_attention_pass>}},
      {"fuse_swiglu", {2, plain<make_fuse_swiglu_pass>}},
      {"fuse_linear_activation", {2, plain<make_fuse_linear_activation_pass>}},
      {"fuse_embedding_norm", {2, plain<make_fuse_embedding_norm_pass>}},
      {"fuse_add_norm", {2, plain<make_fuse_add_norm_pass>}},
      {"fuse_norm_linear", {2, plain<make_fuse_norm_linear_pass>}},
      {"assign_precision", {0, [](const PassOptions& o) { return make_assign_precision_pass(o.precision, o.pins); }}},
  };
  return r;
}

void check_options(const PassOptions& o) {
  if (o.opt_level < 0 || o.opt_level > kMaxOptLevel)
    throw_error(ErrorCode::kInvalidArgument, "optimization level ", o.opt_level, " is not in [0, ",
                kMaxOptLevel, "]");
  auto names = pass_names();
  for (auto& d : o.disabled)
    if (std::find(names.begin(), names.end(), d) == names.end()) {
      std::string known;
      for (auto& n : names) known += (known.empty() ? "" : ", ") + n;
      throw_error(ErrorCode::kInvalidArgument, "--disable-pass: no pass named '", d, "' (passes: ", known, ")");
    }
}

}  // namespace

std::vector<std::string> pass_names() {
  std::vector<std::string> v;
  for (auto& [name, e] : registry()) v.push_back(name);
  return v;
}

std::vector<std::string> pass_list(const PassOptions& o) {
  check_options(o);
  std::vector<std::string> v;
  for (auto& [name, e] : registry()) {
    if (name == "assign_precision") continue;
    if (e.min_level <= o.opt_level && std::find(o.disabled.begin(), o.disabled.end(), name) == o.disabled.end())
      v.push_back(name);
  }
  // A final dce sweeps what the fusions orphaned.
  if (o.opt_level >= 2 && std::find(v.begin(), v.end(), "dce") != v.end()) v.push_back("dce");
  if (!o.precision.empty() &&
      std::find(o.disabled.begin(), o.disabled.end(), "assign_precision") == o.disabled.end())
    v.push_back("assign_precision");
  return v;
}

std::vector<PassResult> run_passes(ir::Graph& g, const PassOptions& o) {
  std::vector<PassResult> results;
  for (const std::string& name : pass_list(o)) {
    auto it = std::find_if(registry().begin(), registry().end(), [&](auto& e) { return e.first == name; });
    std::unique_ptr<Pass> pass = it->second.make(o);
    PassResult r;
    r.name = name;
    r.nodes_before = g.nodes().size();
    auto t0 = std::chrono::steady_clock::now();
    r.changed = pass->run(g);
    r.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    r.nodes_after = g.nodes().size();
    r.stats = pass->stats();
    log_debug("pass ", name, ": ", r.stats.empty() ? "no change" : r.stats, " (", r.nodes_before, " -> ",
              r.nodes_after, " nodes)");
    results.push_back(std::move(r));
  }
  return results;
}

std::string fusion_of(const ir::Node& n) {
  if (n.op == "Linear" && (n.has_attr("norm") || n.input(3) != ir::kNoValue)) return "fuse_norm_linear";
  if (n.op == "AddRMSNorm" || n.op == "AddLayerNorm") return "fuse_add_norm";
  if (n.op == "SwiGLU" || n.op == "GeGLU") return "fuse_swiglu";
  if (n.op == "ScaledDotProductAttention") return "fuse_attention_pattern";
  if (n.op == "EmbeddingLayerNorm") return "fuse_embedding_norm";
  if (n.op == "Attention" && n.attr_int("packed_qkv", 0)) return "fuse_qkv_attention";
  if (n.op == "Linear" && n.has_attr("activation")) return "fuse_linear_activation";
  return "";
}

std::vector<std::string> fusion_pass_names() {
  std::vector<std::string> v;
  for (auto& [name, e] : registry())
    if (name.rfind("fuse_", 0) == 0) v.push_back(name);
  return v;
}

std::string format_pass_report(const std::vector<PassResult>& results) {
  std::ostringstream os;
  for (auto& r : results) {
    char ms[32];
    std::snprintf(ms, sizeof ms, "%.1f", r.ms);
    os << r.name << ": " << (r.changed ? r.stats : std::string("no change")) << " (" << r.nodes_before
       << " -> " << r.nodes_after << " nodes, " << ms << " ms)\n";
  }
  return os.str();
}

}  // namespace kiln::passes
