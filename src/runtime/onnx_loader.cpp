// Model::load for .onnx files (see ModelOptions::onnx_import). A recognised HF export
// is rebuilt as kiln's own family graph, but only after both forms agree on a probe
// input: the op-by-op import is the faithful reference, the family graph the fast path
// (ragged batches, fused Attention, paged KV cache). Tested in tests/frontends/onnx_test.cpp.
#include <algorithm>
#include <cmath>
#include <optional>

#include "core/log.h"
#include "core/status.h"
#include "frontends/onnx/onnx_hf.h"
#include "frontends/onnx/onnx_import.h"
#include "runtime/encoder_runner.h"
#include "runtime/model.h"

namespace kiln {

namespace {

constexpr double kProbeTol = 1e-3;  // relative to max|ref|; f32 paths differ by ~1e-6

// The op-by-op graph on the probe: input_ids [1, n] = 1..n, attention_mask ones,
// token_type_ids zeros; returns the output shaped [1, n, width] (hidden or logits).
std::vector<float> run_op_by_op(const ir::Graph& g, int64_t n, int64_t width) {
  TensorMap in;
  for (ir::ValueId id : g.inputs()) {
    const ir::Value& v = g.value(id);
    if (v.dtype != DType::kI64 || v.shape.rank() != 2)
      throw_error(ErrorCode::kUnsupported, "input '", v.name, "' is not [batch, sequence] int64");
    Tensor t(DType::kI64, {1, n});
    for (int64_t i = 0; i < n; ++i)
      t.data_as<int64_t>()[i] = v.name.find("mask") != std::string::npos ? 1 : v.name.find("type") != std::string::npos ? 0 : 1 + i;
    in[v.name] = t;
  }
  auto compiled = create_backend("cpu")->compile(g, {});
  for (auto& [name, t] : compiled->run(in, StepInfo{}, nullptr))
    if (t.rank() == 3 && t.dim(0) == 1 && t.dim(1) == n && t.dim(2) == width)
      return {t.data_as<float>(), t.data_as<float>() + t.numel()};
  throw_error(ErrorCode::kUnsupported, "no output of shape [1, ", n, ", ", width, "]");
}

// kiln's family graph on the same probe: the encoder's hidden rows or the decoder's
// logits for every position (one prefill step).
std::vector<float> run_family(Model& m, int64_t n) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[size_t(i)] = int32_t(1 + i);
  if (!m.info().is_decoder) return encode(m, {EncoderInput{ids, {}}}).at(0).hidden;
  const ModelInfo& info = m.info();
  KvLayout layout{info.num_layers, (n + 15) / 16, 16, info.num_kv_heads, info.head_dim};
  auto kv = m.backend().allocate_kv(layout);
  StepInfo step;
  step.seqs.push_back({0, int32_t(n), int32_t(n), {}});
  for (int32_t b = 0; b < layout.num_blocks; ++b) step.seqs[0].block_table.push_back(b);
  Tensor tokens(DType::kI32, {n}), positions(DType::kI32, {n}), rows(DType::kI32, {n});
  for (int64_t i = 0; i < n; ++i) {
    step.slot_mapping.push_back(i);
    tokens.data_as<int32_t>()[i] = ids[size_t(i)];
    positions.data_as<int32_t>()[i] = int32_t(i);
    rows.data_as<int32_t>()[i] = int32_t(i);
  }
  Tensor logits = m.compiled().run({{"tokens", tokens}, {"positions", positions}, {"logit_rows", rows}}, step, kv.get()).at("logits");
  return {logits.data_as<float>(), logits.data_as<float>() + logits.numel()};
}

double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double err = 0, mag = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::isnan(a[i]) ? INFINITY : std::max(err, double(std::fabs(a[i] - b[i])));
    mag = std::max(mag, double(std::fabs(b[i])));
  }
  return mag > 0 ? err / mag : err;
}

}  // namespace

std::unique_ptr<Model> Model::load_onnx(const std::string& path, const ModelOptions& options) {
  const std::string& mode = options.onnx_import;
  if (mode != "auto" && mode != "graph" && mode != "family")
    throw_error(ErrorCode::kInvalidArgument, "onnx import mode '", mode, "' (expected auto, graph or family)");
  onnx::OnnxModel file = onnx::load_onnx_model(path);
  BuiltModel op_by_op;
  op_by_op.graph = onnx::import_onnx_graph(file, path);
  op_by_op.info.family = "onnx";
  op_by_op.info.model_type = "onnx";
  op_by_op.info.is_decoder = false;
  std::string why = "import mode 'graph'";
  if (mode != "graph") {
    std::string reason;
    std::optional<onnx::OnnxHfView> view;
    try {
      view = onnx::onnx_hf_view(file, path, &reason);
    } catch (const Error& e) {
      reason = e.what();
    }
    if (view) {
      try {
        auto m = from_built(build_model(view->config, *view->weights), options);
        m->path_ = path;
        m->config_ = view->config;
        const ModelInfo& info = m->info();
        const int64_t n = std::min<int64_t>(8, info.max_positions);
        const double d = rel_diff(run_family(*m, n), run_op_by_op(op_by_op.graph, n,
                                                                  info.is_decoder ? info.vocab_size : info.hidden_size));
        if (d <= kProbeTol) {
          log_info("onnx: ", path, " is a ", view->family, " export: running kiln's ", view->family,
                   " graph (agrees with the op-by-op import on a probe of ", n, " tokens: rel diff ", d, ")");
          return m;
        }
        reason = str_cat("kiln's ", view->family, " graph differs from the op-by-op import on a probe (rel diff ", d, ")");
      } catch (const Error& e) {
        reason = str_cat("it looks like ", view->family, " but ", e.what());
      }
    }
    if (mode == "family")
      throw_error(ErrorCode::kUnsupported, "onnx: '", path, "' is not a recognised HF export: ", reason,
                  " (use the op-by-op import, --onnx-import graph)");
    why = reason;
  }
  log_info("onnx: ", path, ": imported op by op (", why, "); ", op_by_op.graph.nodes().size(), " nodes");
  auto m = from_built(std::move(op_by_op), options);
  m->path_ = path;
  return m;
}

}  // namespace kiln
