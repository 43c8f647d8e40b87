// Model::load for .onnx files (see ModelOptions::onnx_import). A recognised HF export
// is rebuilt as kiln's own family graph, but only after both forms agree on a probe
// input: the op-by-op import is the faithful reference, the family graph the fast path
// (ragged batches, fused Attention, paged KV cache). A decoder exported with
// past_key_values is probed on a prompt and then one step on the presents the prompt
// returned, so its past/present tensors are shown to be exactly what kiln's paged KV
// cache holds before the cache takes their place. Tested in tests/frontends/onnx_test.cpp.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>

#include "core/log.h"
#include "core/status.h"
#include "frontends/hf_dir.h"
#include "frontends/onnx/onnx_hf.h"
#include "frontends/onnx/onnx_import.h"
#include "frontends/onnx/onnx_kv.h"
#include "runtime/encoder_runner.h"
#include "runtime/model.h"

namespace kiln {

namespace {

constexpr double kProbeTol = 1e-3;  // relative to max|ref|; f32 paths differ by ~1e-6

// Probe token ids: 1, 2, ... (inside any vocabulary of more than a few tokens).
int32_t probe_id(int64_t i, int64_t vocab) { return int32_t(1 + i % std::max<int64_t>(1, vocab - 1)); }

std::string shape_of(const Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.rank(); ++i) s += (i ? ", " : "") + std::to_string(t.dim(i));
  return s + "]";
}

// The op-by-op graph's inputs for the probe: token ids `ids` [1, s] following a past
// of `past_len` tokens. Inputs named in `past` (the KV-cache inputs) take those
// tensors; of the [batch, sequence] int64 inputs, a mask is ones over past + new
// tokens, position ids count on from the past, token types are zeros, the rest ids.
TensorMap probe_inputs(const ir::Graph& g, const std::vector<int32_t>& ids, int64_t past_len, const TensorMap& past) {
  const int64_t s = int64_t(ids.size());
  TensorMap in;
  for (ir::ValueId id : g.inputs()) {
    const ir::Value& v = g.value(id);
    if (auto p = past.find(v.name); p != past.end()) {
      in[v.name] = p->second;
      continue;
    }
    if (v.dtype != DType::kI64 || v.shape.rank() != 2)
      throw_error(ErrorCode::kUnsupported, "input '", v.name, "' is not [batch, sequence] int64");
    const bool mask = v.name.find("mask") != std::string::npos, pos = v.name.find("position") != std::string::npos,
               type = v.name.find("type") != std::string::npos;
    Tensor t(DType::kI64, {1, mask ? past_len + s : s});
    for (int64_t i = 0; i < t.dim(1); ++i)
      t.data_as<int64_t>()[i] = mask ? 1 : pos ? past_len + i : type ? 0 : ids[size_t(i)];
    in[v.name] = t;
  }
  return in;
}

// Runs the op-by-op graph and copies its outputs out (the next run reuses the buffers).
TensorMap run_graph(CompiledGraph& c, const TensorMap& in) {
  TensorMap out;
  for (auto& [name, t] : c.run(in, StepInfo{}, nullptr)) out[name] = t.clone();
  return out;
}

// The output shaped [1, s, width] (hidden or logits) among `out`.
std::vector<float> output_rows(const TensorMap& out, int64_t s, int64_t width) {
  for (auto& [name, t] : out)
    if (t.dtype() == DType::kF32 && t.rank() == 3 && t.dim(0) == 1 && t.dim(1) == s && t.dim(2) == width)
      return {t.data_as<float>(), t.data_as<float>() + t.numel()};
  throw_error(ErrorCode::kUnsupported, "no output of shape [1, ", s, ", ", width, "]");
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

// kiln's decoder on the probe through a paged KV cache of small blocks (so that the
// probe spans several): one prefill step over `ids` (logits for every position), then,
// when `next` >= 0, one decode step of token `next` reading the cached K/V.
std::pair<std::vector<float>, std::vector<float>> run_family_decoder(Model& m, const std::vector<int32_t>& ids,
                                                                     int32_t next) {
  const ModelInfo& info = m.info();
  const int64_t n = int64_t(ids.size()), block = 4;
  KvLayout layout{info.num_layers, (n + 1 + block - 1) / block, block, info.num_kv_heads, info.head_dim};
  auto kv = m.backend().allocate_kv(layout);
  std::vector<int32_t> table;
  for (int32_t b = 0; b < layout.num_blocks; ++b) table.push_back(b);
  auto step = [&](const std::vector<int32_t>& toks, int64_t past) {
    const int64_t q = int64_t(toks.size());
    StepInfo info_step;
    info_step.seqs.push_back({0, int32_t(q), int32_t(past + q), table});
    Tensor tokens(DType::kI32, {q}), positions(DType::kI32, {q}), rows(DType::kI32, {q});
    for (int64_t i = 0; i < q; ++i) {
      info_step.slot_mapping.push_back(past + i);
      tokens.data_as<int32_t>()[i] = toks[size_t(i)];
      positions.data_as<int32_t>()[i] = int32_t(past + i);
      rows.data_as<int32_t>()[i] = int32_t(i);
    }
    Tensor logits = m.compiled()
                        .run({{"tokens", tokens}, {"positions", positions}, {"logit_rows", rows}}, info_step, kv.get())
                        .at("logits");
    return std::vector<float>(logits.data_as<float>(), logits.data_as<float>() + logits.numel());
  };
  auto prefill = step(ids, 0);
  return {prefill, next >= 0 ? step({next}, n) : std::vector<float>{}};
}

// Probe of a family graph against the op-by-op import: the largest relative logits
// difference over the probe's steps; `what` says what was compared.
struct Probe {
  double diff = 0;
  std::string what;
};

// An encoder's hidden rows or a decoder's logits over one sequence of n tokens.
Probe probe_plain(Model& m, const ir::Graph& g, int64_t n) {
  const ModelInfo& info = m.info();
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(probe_id(i, info.is_decoder ? info.vocab_size : 1 << 30));
  auto compiled = create_backend("cpu")->compile(g, {});
  std::vector<float> ref = output_rows(run_graph(*compiled, probe_inputs(g, ids, 0, {})), n,
                                       info.is_decoder ? info.vocab_size : info.hidden_size);
  std::vector<float> got =
      info.is_decoder ? run_family_decoder(m, ids, -1).first : encode(m, {EncoderInput{ids, {}}}).at(0).hidden;
  return {rel_diff(got, ref), str_cat(n, " tokens")};
}

// A decoder exported with a KV cache: the op-by-op import runs a prompt of n tokens
// on an empty past, then one token on the presents it returned; kiln's decoder runs
// the same two steps through its paged KV cache. The presents must be [1, kv_heads,
// past + new, head_dim] and extend the past they were given unchanged: that is what
// lets kiln's cache stand in for both.
Probe probe_with_past(Model& m, const ir::Graph& g, const onnx::OnnxKvCache& kv, int64_t n) {
  const ModelInfo& info = m.info();
  const int64_t v = info.vocab_size, h = info.num_kv_heads, d = info.head_dim;
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(probe_id(i, v));
  const int32_t next = probe_id(n, v);
  auto compiled = create_backend("cpu")->compile(g, {});
  const bool has_past = !kv.layers[0].past_key.empty();
  TensorMap past;
  if (has_past)
    for (auto& l : kv.layers) past[l.past_key] = past[l.past_value] = Tensor(DType::kF32, {1, h, 0, d});
  TensorMap a = run_graph(*compiled, probe_inputs(g, ids, 0, past));
  auto check_present = [&](const TensorMap& out, const std::string& name, int64_t len) -> const Tensor& {
    const Tensor& t = out.at(name);
    if (t.rank() != 4 || t.dim(0) != 1 || t.dim(1) != h || t.dim(2) != len || t.dim(3) != d)
      throw_error(ErrorCode::kUnsupported, "output '", name, "' is ", shape_of(t), " after ", len,
                  " tokens, expected [1, ", h, ", ", len, ", ", d, "] (batch, kv_heads, past + new tokens, head_dim)");
    return t;
  };
  for (auto& l : kv.layers) check_present(a, l.present_key, n), check_present(a, l.present_value, n);
  auto family = run_family_decoder(m, ids, has_past ? next : -1);
  Probe p{rel_diff(family.first, output_rows(a, n, v)), str_cat(n, " tokens")};
  if (!has_past) return p;
  for (auto& l : kv.layers) past[l.past_key] = a.at(l.present_key), past[l.past_value] = a.at(l.present_value);
  TensorMap b = run_graph(*compiled, probe_inputs(g, {next}, n, past));
  for (auto& l : kv.layers)
    for (const std::string* name : {&l.present_key, &l.present_value}) {
      const Tensor& before = a.at(*name);
      const Tensor& after = check_present(b, *name, n + 1);
      // [1, h, n + 1, d]: head k's first n rows must be the past as it was given.
      for (int64_t k = 0; k < h; ++k)
        if (std::memcmp(after.data_as<float>() + k * (n + 1) * d, before.data_as<float>() + k * n * d,
                        size_t(n * d) * sizeof(float)) != 0)
          throw_error(ErrorCode::kUnsupported, "output '", *name, "' does not begin with the past it was given "
                      "(a present that rewrites the past cannot be a KV cache)");
    }
  p.diff = std::max(p.diff, rel_diff(family.second, output_rows(b, 1, v)));
  p.what = str_cat(n, " tokens, then 1 token on its past_key_values");
  return p;
}

// A Llama export holds no context length or special token ids (its RoPE is computed
// for any position); optimum writes the model's config.json beside it. Those keys are
// taken from there when its shape is the graph's; else kiln's llama defaults hold
// (max_position_embeddings 2048, no BOS/EOS). A Qwen2's sliding window is read there too:
// its mask in the graph is not (the probe sees only a window shorter than its 8 tokens).
void take_config_beside(nlohmann::json& config, const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path file = fs::path(path).parent_path() / "config.json";
  if (!fs::exists(file)) return;
  const nlohmann::json c = read_json_file(file.string());
  if (!c.is_object()) return;
  for (const char* key : {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"})
    if (!c.contains(key) || c[key] != config.at(key)) {
      log_info("onnx: ", file.string(), " is not this export's config (its ", key, " is ",
               c.contains(key) ? c[key].dump() : std::string("absent"), ", the graph's ",
               config.at(key).dump(), "): not read");
      return;
    }
  for (const char* key : {"max_position_embeddings", "bos_token_id", "eos_token_id"})
    if (c.contains(key)) config[key] = c[key];
  if (config.at("model_type") != "qwen2") return;
  // Each of a Qwen2's window keys is taken only with the JSON type transformers writes, so
  // the llama builder never meets another (a null window: none).
  auto strings = [](const nlohmann::json& v) {
    if (!v.is_array()) return false;
    for (const auto& e : v)
      if (!e.is_string()) return false;
    return true;
  };
  struct Typed {
    const char* key;
    bool (*ok)(const nlohmann::json&);
    const char* expected;
  };
  const Typed typed[] = {
      {"use_sliding_window", [](const nlohmann::json& v) { return v.is_boolean(); }, "a boolean"},
      {"sliding_window",
       [](const nlohmann::json& v) { return v.is_number_integer() || v.is_null(); },
       "an integer or null"},
      {"max_window_layers", [](const nlohmann::json& v) { return v.is_number_integer(); },
       "an integer"},
      {"layer_types", +strings, "an array of strings"}};
  for (const auto& [key, ok, expected] : typed) {
    if (!c.contains(key)) continue;
    if (!ok(c[key]))
      throw_error(ErrorCode::kInvalidFile, "onnx: ", file.string(), ": '", key, "' is ",
                  c[key].dump(), ", expected ", expected, " (as a Qwen2 config gives it)");
    config[key] = c[key];
  }
}

}  // namespace

std::unique_ptr<Model> Model::load_onnx(const std::string& path, const ModelOptions& options) {
  return from_onnx(onnx::load_onnx_model(path), path, options);
}

std::unique_ptr<Model> Model::from_onnx(const onnx::OnnxModel& file, const std::string& path,
                                        const ModelOptions& options) {
  const std::string& mode = options.onnx_import;
  if (mode != "auto" && mode != "graph" && mode != "family")
    throw_error(ErrorCode::kInvalidArgument, "onnx import mode '", mode, "' (expected auto, graph or family)");
  BuiltModel op_by_op;
  op_by_op.graph = onnx::import_onnx_graph(file, path);
  op_by_op.info.family = "onnx";
  op_by_op.info.model_type = "onnx";
  op_by_op.info.is_decoder = false;
  const bool kv_io = onnx::onnx_has_kv_io(file);
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
        // A sentence-transformers model's export sits in its directory, or in its onnx/
        // folder: the directory's modules.json says how it pools, as for the safetensors.
        namespace fs = std::filesystem;
        if (view->family == "bert")
          for (const fs::path& dir : {fs::path(path).parent_path(), fs::path(path).parent_path().parent_path()})
            if (!dir.empty() && fs::exists(dir / "modules.json")) {
              if (auto pooling = sentence_transformers_pooling(dir.string())) view->config[kPoolingConfigKey] = *pooling;
              break;
            }
        if (view->family == "llama") take_config_beside(view->config, path);
        auto m = from_built(build_model(view->config, *view->weights), options);
        m->path_ = path;
        m->config_ = view->config;
        const ModelInfo& info = m->info();
        const Probe p = view->kv.empty()
                            ? probe_plain(*m, op_by_op.graph, std::min<int64_t>(8, info.max_positions))
                            : probe_with_past(*m, op_by_op.graph, view->kv,
                                              std::max<int64_t>(1, std::min<int64_t>(8, info.max_positions - 1)));
        const std::string type = view->config.value("model_type", view->family);
        if (p.diff <= kProbeTol) {
          if (view->kv.empty())
            log_info("onnx: ", path, " is a ", type, " export: running kiln's ", view->family,
                     " graph (agrees with the op-by-op import on a probe of ", p.what,
                     ": rel diff ", p.diff, ")");
          else
            log_info("onnx: ", path, " is a ", type, " export with a KV cache (",
                     view->kv.describe(), "): running kiln's ", view->family,
                     " graph, its paged KV cache in place of those tensors "
                     "(agrees with the op-by-op import on a probe of ",
                     p.what, ": rel diff ", p.diff, ")");
          return m;
        }
        reason = str_cat("kiln's ", view->family, " graph differs from the op-by-op import on a probe of ", p.what,
                         " (rel diff ", p.diff, ")");
      } catch (const Error& e) {
        reason = str_cat("it looks like ", view->family, " but ", e.what());
      }
    }
    // The op-by-op graph of such an export keeps its cache as plain inputs and outputs,
    // which kiln's decoding runtime does not drive: say so here rather than fall back.
    if (kv_io)
      throw_error(ErrorCode::kUnsupported, "onnx: '", path,
                  "' is a decoder exported with a KV cache (", onnx::onnx_kv_io_names(file),
                  "); kiln runs such an export only as a recognised family (GPT-2, Llama or Qwen2 "
                  "with past_key_values.{i}.key/value inputs and present.{i}.key/value outputs) "
                  "whose past and present tensors become kiln's paged KV cache, and this one "
                  "cannot be: ",
                  reason,
                  ". To run the graph as it is, with its past/present tensors as plain inputs and "
                  "outputs (no generate), import it op by op: --onnx-import graph");
    if (mode == "family")
      throw_error(ErrorCode::kUnsupported, "onnx: '", path, "' is not a recognised HF export: ", reason,
                  " (use the op-by-op import, --onnx-import graph)");
    why = reason;
  }
  log_info("onnx: ", path, ": imported op by op (", why, "); ", op_by_op.graph.nodes().size(), " nodes",
           kv_io ? str_cat("; its KV cache (", onnx::onnx_kv_io_names(file),
                           ") stays graph inputs/outputs the caller feeds: generate needs the family path")
                 : std::string());
  auto m = from_built(std::move(op_by_op), options);
  m->path_ = path;
  return m;
}

}  // namespace kiln
