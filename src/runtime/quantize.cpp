// Calibration driver and quantized model loading (see quantize.h).
#include "runtime/quantize.h"

#include <algorithm>
#include <cmath>
#include <cctype>
#include <climits>
#include <cstring>
#include <filesystem>
#include <set>

#include "core/hadamard.h"
#include "core/log.h"
#include "core/mapped_file.h"
#include "core/status.h"
#include "runtime/encoder_runner.h"
#include "runtime/eval.h"
#include "runtime/llm_runner.h"
#include "runtime/model_tokenizer.h"

namespace kiln {

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t end = s.find(',', pos);
    if (end == std::string::npos) end = s.size();
    if (end > pos) out.push_back(s.substr(pos, end - pos));
    pos = end + 1;
  }
  return out;
}

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Calibration sequences: decoders get consecutive chunks of seq_len tokens of each text;
// encoders one sequence per non-empty line (with the tokenizer's special tokens),
// truncated to 128 tokens.
std::vector<std::vector<int32_t>> calibration_sequences(const Model& model, const QuantOptions& q) {
  auto tokenizer = load_model_tokenizer(model);
  if (!tokenizer)
    throw_error(ErrorCode::kInvalidArgument, "calibration: '", model.path(), "' has no tokenizer to read the calibration text");
  std::vector<std::pair<std::string, std::string>> texts;  // (what, text)
  for (const std::string& src : split_commas(q.calib)) {
    if (src == "default") texts.emplace_back("the built-in calibration set", quant::default_calibration_text());
    else texts.emplace_back("calibration file '" + src + "'", read_text_file(src));
  }
  if (texts.empty()) throw_error(ErrorCode::kInvalidArgument, "calibration: the calibration set is empty (--calib names no file)");
  std::vector<std::vector<int32_t>> seqs;
  const bool decoder = model.info().is_decoder;
  const int64_t len = decoder ? std::min<int64_t>(q.seq_len, model.info().max_positions) : std::min(q.seq_len, 128);
  for (auto& [what, text] : texts) {
    size_t before = seqs.size();
    if (text.find_first_not_of(" \t\r\n") == std::string::npos)
      throw_error(ErrorCode::kInvalidArgument, "calibration: ", what, " is empty");
    if (decoder) {
      std::vector<int32_t> toks = tokenizer->encode(text, /*add_special=*/true);
      for (size_t b = 0; b + 2 <= toks.size(); b += size_t(len))
        seqs.emplace_back(toks.begin() + long(b), toks.begin() + long(std::min(toks.size(), b + size_t(len))));
    } else {
      size_t pos = 0;
      while (pos < text.size()) {
        size_t end = text.find('\n', pos);
        if (end == std::string::npos) end = text.size();
        std::string line = text.substr(pos, end - pos);
        pos = end + 1;
        if (line.find_first_not_of(" \t\r#-|*`") == std::string::npos) continue;
        std::vector<int32_t> toks = tokenizer->encode(line, true);
        if (int64_t(toks.size()) > len) toks.resize(size_t(len));
        if (toks.size() >= 3) seqs.push_back(std::move(toks));  // more than [CLS] [SEP]
      }
    }
    if (seqs.size() == before)
      throw_error(ErrorCode::kInvalidArgument, "calibration: ", what, " tokenizes to no usable sequence (",
                  decoder ? "need at least 2 tokens" : "need a line with at least one word", ")");
  }
  if (int64_t(seqs.size()) > q.max_sequences) {
    // Spread the kept sequences over the whole set rather than taking its beginning.
    std::vector<std::vector<int32_t>> kept;
    for (int32_t i = 0; i < q.max_sequences; ++i) kept.push_back(seqs[size_t(int64_t(i) * int64_t(seqs.size()) / q.max_sequences)]);
    seqs = std::move(kept);
  }
  return seqs;
}

void run_sequences(Model& model, const std::vector<std::vector<int32_t>>& seqs) {
  if (model.info().is_decoder) {
    for (auto& s : seqs) sequence_logits(model, s);  // every position's rows reach the LM head's observer
    return;
  }
  constexpr size_t kBatch = 16;
  for (size_t b = 0; b < seqs.size(); b += kBatch) {
    std::vector<EncoderInput> batch;
    for (size_t i = b; i < std::min(seqs.size(), b + kBatch); ++i) batch.push_back({seqs[i], {}});
    encode(model, batch);
  }
}

// `base` on the CPU backend: calibration observes Linears through ModelOptions::
// linear_observer, which only the CPU backend calls, so a build or load for CUDA still
// calibrates on the CPU (the same f32 model).
ModelOptions on_cpu(ModelOptions base) {
  base.backend = "cpu";
  base.device = 0;
  base.communicator = nullptr;
  // Calibration observes the unsharded model (--tp shards the rewritten one afterwards).
  base.tensor_parallel = 1;
  return base;
}

// The float model a calibration observes: every Linear f32, whatever the build will
// store, no rewrite, `observer` on the Linear inputs, on the CPU. An engine file is
// refused (it holds the stored precision, not the float weights); `mode` is the --quant
// named in the error.
std::unique_ptr<Model> load_calibration_model(const std::string& path, const ModelOptions& base,
                                              std::shared_ptr<const LinearObserver> observer, const char* mode) {
  ModelOptions mo = on_cpu(base);
  mo.weight_dtype = "f32";
  mo.precision.clear();
  mo.pin_precision.clear();
  mo.rewrite = nullptr;
  mo.linear_observer = std::move(observer);
  auto model = Model::load(path, mo);
  if (model->engine())
    throw_error(ErrorCode::kInvalidArgument, "calibration: '", path, "' is an engine; calibrate and quantize the source "
                "model (kiln build --quant ", mode, " -m MODEL_DIR)");
  return model;
}

}  // namespace

quant::CalibrationTable calibrate_model(const std::string& path, const ModelOptions& base, const QuantOptions& q,
                                        const std::vector<std::vector<int32_t>>* sequences) {
  auto collectors = std::make_shared<std::map<std::string, quant::TensorCollector>>();
  auto pass = std::make_shared<int>(1);
  auto observer = std::make_shared<LinearObserver>();
  const std::vector<std::string> rotated = q.mode == "w8a8" ? q.hadamard : std::vector<std::string>{};
  observer->on_input = [collectors, pass, rotated](const std::string& node, const float* x, int64_t t, int64_t k) {
    auto [it, made] = collectors->try_emplace(node, node);
    if (made) it->second.set_hadamard(quant::w8a8_rotates(node, rotated));
    if (*pass == 1) it->second.observe_channels(x, t, k);
    else it->second.observe_histogram(x, t, k);
  };
  observer->on_output = [collectors, pass](const std::string& node, const float* y, int64_t t, int64_t n) {
    if (*pass == 1) collectors->at(node).observe_output(y, t, n);
  };
  auto model = load_calibration_model(path, base, observer, "w8a8|fp8");
  auto seqs = sequences ? *sequences : calibration_sequences(*model, q);
  size_t usable = 0;
  for (auto& sq : seqs) usable += sq.empty() ? 0 : 1;
  if (usable == 0) throw_error(ErrorCode::kInvalidArgument, "calibration: the calibration set is empty");
  int64_t tokens = 0;
  for (auto& s : seqs) tokens += int64_t(s.size());
  log_info("calibration: ", seqs.size(), " sequences, ", tokens, " tokens from ", q.calib, "; pass 1 (channel maxima)");
  run_sequences(*model, seqs);

  quant::CalibrationTable table;
  table.model = path;
  table.text = q.calib;
  table.smooth_alpha = q.smooth_alpha;
  table.sequences = int64_t(seqs.size());
  table.tokens = tokens;
  for (auto& [name, c] : *collectors) table.tensors[name].channel_absmax = c.channel_absmax();
  quant::W8A8Options wo;
  wo.smooth_alpha = q.smooth_alpha;
  wo.keep = q.keep;
  wo.hadamard = rotated;
  auto smooth = quant::smooth_factors(model->graph(), table, wo);
  for (auto& [name, c] : *collectors) {
    std::vector<float> inv;
    auto it = smooth.find(name);
    if (it != smooth.end())
      for (float s : it->second) inv.push_back(1.0f / s);
    c.begin_histogram(std::move(inv));
  }
  log_info("calibration: pass 2 (histograms of ", collectors->size(), " Linear inputs)");
  *pass = 2;
  run_sequences(*model, seqs);
  for (auto& [name, c] : *collectors) {
    // A rotated input's statistics are filed under their own name (a table calibrated
    // without the rotation then says so instead of giving the wrong clip).
    if (c.hadamard()) {
      table.tensors.erase(name);
      table.tensors[quant::hadamard_calib_name(name, hadamard_block(int64_t(c.channel_absmax().size())))] = c.finish();
    } else {
      table.tensors[name] = c.finish();
    }
  }
  return table;
}

kiln::QuantFormat awq_weight_format(const std::string& weight_dtype) {
  if (weight_dtype == "q8") return kiln::QuantFormat::kQ8;
  if (weight_dtype == "q4" || weight_dtype == "f32" || weight_dtype == "auto") return kiln::QuantFormat::kQ4;
  throw_error(ErrorCode::kInvalidArgument, "--quant awq|gptq|awq-gptq stores GEMM weights as q4 (the default) or q8; "
              "--weight-dtype ", weight_dtype, " is neither");
}

namespace {

// The AWQ / GPTQ options of a command line's quantization options, for weights of `format`.
quant::AwqOptions awq_options(const QuantOptions& q, kiln::QuantFormat format) {
  quant::AwqOptions ao;
  ao.format = format;
  ao.grid = q.awq_grid;
  ao.keep = q.keep;
  return ao;
}

quant::GptqOptions gptq_options(const QuantOptions& q, kiln::QuantFormat format) {
  quant::GptqOptions go;
  go.format = format;
  go.damp = q.gptq_damp;
  go.act_order = q.gptq_act_order;
  go.keep = q.keep;
  go.awq_scaled = q.mode == "awq-gptq";
  return go;
}

}  // namespace

quant::CalibrationTable calibrate_awq(const std::string& path, const ModelOptions& base, const QuantOptions& q,
                                      kiln::QuantFormat format, const std::vector<std::vector<int32_t>>* sequences) {
  if (q.awq_rows < 1) throw_error(ErrorCode::kInvalidArgument, "awq: needs at least 1 calibration row, got ", q.awq_rows);
  auto collectors = std::make_shared<std::map<std::string, quant::AwqCollector>>();
  auto maxima = std::make_shared<std::map<std::string, quant::TensorCollector>>();
  auto stride = std::make_shared<int64_t>(1);
  auto observer = std::make_shared<LinearObserver>();
  observer->on_input = [collectors, maxima, stride](const std::string& node, const float* x, int64_t t, int64_t k) {
    collectors->try_emplace(node, node, *stride).first->second.observe(x, t, k);
    maxima->try_emplace(node, node).first->second.observe_channels(x, t, k);
  };
  auto model = load_calibration_model(path, base, observer, "awq");
  auto seqs = sequences ? *sequences : calibration_sequences(*model, q);
  int64_t tokens = 0;
  for (auto& sq : seqs) tokens += int64_t(sq.size());
  if (tokens == 0) throw_error(ErrorCode::kInvalidArgument, "calibration: the calibration set is empty");
  *stride = std::max<int64_t>(1, tokens / q.awq_rows);
  log_info("awq calibration: ", seqs.size(), " sequences, ", tokens, " tokens from ", q.calib,
           " (channel means; every ", *stride, "th row kept for the search)");
  run_sequences(*model, seqs);

  quant::CalibrationTable table;
  table.model = path;
  table.text = q.calib;
  table.smooth_alpha = -1.0;  // no SmoothQuant: the AWQ scales below replace it
  table.sequences = int64_t(seqs.size());
  table.tokens = tokens;
  table.awq_format = quant_format_name(format);
  for (auto& [name, c] : *maxima) {
    table.tensors[name].channel_absmax = c.channel_absmax();
    table.tensors[name].rows = collectors->at(name).rows();
  }
  const quant::AwqOptions ao = awq_options(q, format);
  const ir::Graph& g = model->graph();
  const auto groups = quant::awq_groups(g, ao);
  double err = 0, err_plain = 0;
  for (const quant::AwqGroup& grp : groups) {
    const std::string& first = g.nodes()[size_t(grp.linears[0])].name;
    auto c = collectors->find(first);
    if (c == collectors->end() || c->second.sample_rows() == 0)
      throw_error(ErrorCode::kInvalidArgument, "awq calibration: Linear '", first,
                  "' saw no activations on the calibration text");
    std::vector<Tensor> weights;
    std::vector<quant::AwqLayer> layers;
    for (int32_t ni : grp.linears) {
      const Tensor& w = g.weight(g.nodes()[size_t(ni)].inputs[1]);
      weights.push_back(w.dtype() == DType::kF32 ? w : w.to(DType::kF32));
      layers.push_back({weights.back().data_as<float>(), w.dim(0)});
    }
    quant::AwqSearchResult r = quant::awq_search(layers, grp.k, c->second.samples().data(), c->second.sample_rows(),
                                                 c->second.channel_absmean(), grp.tie, ao);
    log_debug("awq: ", first, " (+", grp.linears.size() - 1, "): alpha ", r.alpha, ", output error ",
              r.error_plain > 0 ? r.error / r.error_plain : 1.0, " of plain ", quant_format_name(format),
              ", 1/s into ", quant::awq_fold_name(grp.fold));
    err += r.error;
    err_plain += r.error_plain;
    for (int32_t ni : grp.linears) table.awq[g.nodes()[size_t(ni)].name] = {r.scales, r.alpha, r.error, r.error_plain};
  }
  log_info("awq calibration: ", groups.size(), " groups searched; summed output error ",
           err_plain > 0 ? err / err_plain : 1.0, " of plain ", quant_format_name(format));
  return table;
}

bool gptq_mode(const std::string& mode) { return mode == "gptq" || mode == "awq-gptq"; }

namespace {

// The transformer layer a Linear belongs to: N of a node named "layers.N...." or
// "layer.N....", -1 for the rest (an LM head, a pooler), which come after every layer.
int64_t linear_layer_index(const std::string& name) {
  for (const char* prefix : {"layers.", "layer."}) {
    const size_t n = std::strlen(prefix);
    if (name.compare(0, n, prefix) != 0) continue;
    size_t end = n;
    while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
    if (end > n && end < name.size() && name[end] == '.') return std::stoll(name.substr(n, end - n));
  }
  return -1;
}

}  // namespace

quant::CalibrationTable calibrate_gptq(const std::string& path, const ModelOptions& base, const QuantOptions& q,
                                       kiln::QuantFormat format, const std::vector<std::vector<int32_t>>* sequences) {
  if (q.gptq_sequential && q.mode == "awq-gptq")
    throw_error(ErrorCode::kInvalidArgument, "--gptq-sequential is for --quant gptq (awq-gptq's scales are searched on "
                "the f32 model's activations)");
  // Linears reading one input share its Hessian: only the first of each group observes,
  // and only while its group is being calibrated (`active`).
  auto first_of = std::make_shared<std::map<std::string, std::string>>();
  auto active = std::make_shared<std::set<std::string>>();
  auto collectors = std::make_shared<std::map<std::string, quant::GptqCollector>>();
  auto observer = std::make_shared<LinearObserver>();
  observer->on_input = [first_of, active, collectors](const std::string& node, const float* x, int64_t t, int64_t k) {
    auto f = first_of->find(node);
    if (f != first_of->end() && f->second == node && active->count(node))
      collectors->try_emplace(node, node).first->second.observe(x, t, k);
  };
  auto model = load_calibration_model(path, base, observer, q.mode.c_str());
  const quant::AwqOptions ao = awq_options(q, format);
  const ir::Graph& g = model->graph();
  auto groups = quant::awq_groups(g, ao);
  // A GGUF's Linears that keep their file's q4/q8 codes in the quantized model (apply_gptq
  // leaves them) need no Hessian: the calibration model has them dequantized, so the
  // quantized model's graph says which they are.
  if (ends_with(path, ".gguf") && q.mode == "gptq") {
    ModelOptions probe = on_cpu(base);
    probe.weight_dtype = quant_format_name(format);
    probe.rewrite = [](ir::Graph&) {};  // gptq_model_options's rewrite, as far as keeping goes
    probe.rewrite_keeps_file_quant = true;
    probe.linear_observer = nullptr;
    auto quantized = Model::load(path, probe);
    std::set<std::string> kept_codes;
    for (const ir::Node& n : quantized->graph().nodes())
      if (n.op == "Linear" && n.has_attr("weight_quant")) kept_codes.insert(n.name);
    std::erase_if(groups, [&](const quant::AwqGroup& grp) {
      return std::all_of(grp.linears.begin(), grp.linears.end(),
                         [&](int32_t ni) { return kept_codes.count(g.nodes()[size_t(ni)].name) > 0; });
    });
    log_info("gptq calibration: ", kept_codes.size(), " Linears keep the file's codes (no Hessian)");
  }
  // Stages: all groups at once, or (sequential) one transformer layer at a time.
  std::map<int64_t, std::vector<std::string>> stages;  // layer (-1 last) -> first Linears
  for (const quant::AwqGroup& grp : groups) {
    const std::string& first = g.nodes()[size_t(grp.linears[0])].name;
    for (int32_t ni : grp.linears) (*first_of)[g.nodes()[size_t(ni)].name] = first;
    const int64_t layer = linear_layer_index(first);
    stages[q.gptq_sequential ? (layer < 0 ? INT64_MAX : layer) : 0].push_back(first);
  }
  auto seqs = sequences ? *sequences : calibration_sequences(*model, q);
  int64_t tokens = 0;
  for (auto& sq : seqs) tokens += int64_t(sq.size());
  if (tokens == 0) throw_error(ErrorCode::kInvalidArgument, "calibration: the calibration set is empty");
  log_info("gptq calibration: ", seqs.size(), " sequences, ", tokens, " tokens from ", q.calib, " (input Hessians of ",
           groups.size(), " Linear groups", q.gptq_sequential ? str_cat(", in ", stages.size(), " sequential passes") : "",
           ")");

  quant::CalibrationTable table =
      q.mode == "awq-gptq" ? calibrate_awq(path, base, q, format, &seqs) : quant::CalibrationTable{};
  table.model = path;
  table.text = q.calib;
  table.smooth_alpha = -1.0;
  table.sequences = int64_t(seqs.size());
  table.tokens = tokens;
  quant::GptqOptions go = gptq_options(q, format);
  go.partial = true;
  go.memo = std::make_shared<std::map<std::string, quant::GptqResult>>();  // each stage reuses the earlier layers
  bool first_stage = true;
  std::unique_ptr<Model> staged;  // `model` stays: g is its graph
  for (const auto& [layer, firsts] : stages) {
    active->clear();
    active->insert(firsts.begin(), firsts.end());
    if (!first_stage) {  // the model with every layer calibrated so far quantized
      ModelOptions mo = on_cpu(base);
      mo.weight_dtype = "f32";
      mo.precision.clear();
      mo.pin_precision.clear();
      mo.linear_observer = observer;
      auto t = std::make_shared<const quant::CalibrationTable>(table);
      mo.rewrite = [t, go](ir::Graph& graph) { quant::apply_gptq(graph, *t, go); };
      staged = Model::load(path, mo);
      log_debug("gptq calibration: layer ", layer, " on the model with ", t->gptq.size(), " Linears quantized");
    }
    first_stage = false;
    run_sequences(staged ? *staged : *model, seqs);
    for (const quant::AwqGroup& grp : groups) {
      const std::string& first = g.nodes()[size_t(grp.linears[0])].name;
      if (!active->count(first)) continue;
      auto c = collectors->find(first);
      if (c == collectors->end() || c->second.rows() == 0)
        throw_error(ErrorCode::kInvalidArgument, "gptq calibration: Linear '", first,
                    "' saw no activations on the calibration text");
      auto h = c->second.finish();
      collectors->erase(c);
      for (int32_t ni : grp.linears) table.gptq[g.nodes()[size_t(ni)].name] = h;
    }
  }
  return table;
}

namespace {

quant::CalibrationTable calibration_of_mode(const std::string& path, const ModelOptions& base, const QuantOptions& q) {
  std::string cache = ends_with(q.calib, ".json") ? q.calib : q.cache;
  if (gptq_mode(q.mode)) {
    if (!cache.empty())
      throw_error(ErrorCode::kInvalidArgument, "--quant ", q.mode, " calibrates on text, not a cache ('", cache,
                  "'): its input Hessians (K x K doubles per Linear input) are not cached; build an engine once "
                  "(kiln build --quant ", q.mode, ") to keep the result");
    return calibrate_gptq(path, base, q, awq_weight_format(base.weight_dtype));
  }
  if (!cache.empty() && std::filesystem::exists(cache)) {
    quant::CalibrationTable t = quant::CalibrationTable::load(cache);
    if (q.mode == "awq") {
      const std::string want = quant_format_name(awq_weight_format(base.weight_dtype));
      if (t.awq_format != want)
        throw_error(ErrorCode::kInvalidArgument, "calibration cache '", cache, "' holds ",
                    t.awq_format.empty() ? std::string("no AWQ scales") : "AWQ scales for " + t.awq_format,
                    ", this build asks for AWQ ", want, "; delete the cache (or pass another) to recalibrate");
      log_info("calibration: read AWQ scales of ", t.awq.size(), " Linears from ", cache);
      return t;
    }
    if (!t.awq_format.empty() && t.tensors.begin()->second.amax.empty())
      throw_error(ErrorCode::kInvalidArgument, "calibration cache '", cache, "' holds AWQ scales only (written by "
                  "--quant awq), not the activation clips --quant ", q.mode, " needs; pass another cache");
    const bool same = (t.smooth_alpha < 0 && q.smooth_alpha < 0) || std::fabs(t.smooth_alpha - q.smooth_alpha) < 1e-9;
    if (!same)
      throw_error(ErrorCode::kInvalidArgument, "calibration cache '", cache, "' was measured with smoothing alpha ",
                  t.smooth_alpha, " but this build asks for ", q.smooth_alpha,
                  "; pass the same --smooth-alpha or delete the cache to recalibrate");
    log_info("calibration: read ", t.tensors.size(), " tensors from ", cache);
    return t;
  }
  if (ends_with(q.calib, ".json"))
    throw_error(ErrorCode::kNotFound, "calibration cache '", q.calib, "' does not exist");
  quant::CalibrationTable t = q.mode == "awq" ? calibrate_awq(path, base, q, awq_weight_format(base.weight_dtype))
                                              : calibrate_model(path, base, q);
  if (!q.cache.empty()) {
    t.save(q.cache);
    log_info("calibration: wrote ", q.cache);
  }
  return t;
}

// The precision pass on, in the weight format, as `kiln build` runs it: it keeps the logits
// GEMM f32, so that a direct load (`kiln eval/generate --quant awq|gptq`) measures the model
// an engine of the same options holds; then the plan of `table` as precision pins ahead of
// base's own (a user's pin wins).
void apply_precision_plan(ModelOptions& base, const quant::CalibrationTable& table, const QuantOptions& q,
                          kiln::QuantFormat format) {
  if (base.precision.empty()) base.precision = quant_format_name(format);
  if (q.effective_bits <= 0) return;
  std::vector<passes::PrecisionPin> pins;
  for (const auto& [node, precision] : table.precision_plan) pins.push_back({node, precision});
  pins.insert(pins.end(), base.pin_precision.begin(), base.pin_precision.end());
  base.pin_precision = std::move(pins);
}

// The model outputs a plan compares: encoders, each sequence's sentence embedding (the model's pooling);
// decoders, the log-probabilities of every position's next token ([tokens, vocab] per
// sequence).
std::vector<std::vector<float>> plan_outputs(Model& model, const std::vector<std::vector<int32_t>>& seqs) {
  std::vector<std::vector<float>> out;
  if (model.info().is_decoder) {
    std::vector<double> lp;
    for (const auto& s : seqs) {
      std::vector<float> logits = sequence_logits(model, s);
      const int64_t vocab = int64_t(logits.size() / s.size());  // a row per position
      for (size_t r = 0; r * size_t(vocab) < logits.size(); ++r) {
        float* l = logits.data() + r * size_t(vocab);
        log_softmax(l, vocab, lp);
        std::copy(lp.begin(), lp.end(), l);
      }
      out.push_back(std::move(logits));
    }
    return out;
  }
  constexpr size_t kBatch = 16;
  for (size_t b = 0; b < seqs.size(); b += kBatch) {
    std::vector<EncoderInput> batch;
    for (size_t i = b; i < std::min(seqs.size(), b + kBatch); ++i) batch.push_back({seqs[i], {}});
    for (EncoderOutput& o : encode(model, batch, {.hidden = false})) out.push_back(std::move(o.embedding));
  }
  return out;
}

// How far `got` is from `ref` (plan_outputs of the same sequences): encoders the mean of
// 1 - cosine, decoders the mean KL(ref || got) per token.
double plan_distortion(const std::vector<std::vector<float>>& ref, const std::vector<std::vector<float>>& got,
                       bool decoder, int64_t vocab) {
  double total = 0;
  int64_t count = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const std::vector<float>& a = ref[i];
    const std::vector<float>& b = got[i];
    if (decoder) {
      for (size_t r = 0; r + size_t(vocab) <= a.size(); r += size_t(vocab), ++count)
        for (int64_t j = 0; j < vocab; ++j) {
          const double la = a[r + size_t(j)];
          total += std::exp(la) * (la - double(b[r + size_t(j)]));
        }
    } else {
      total += 1.0 - cosine(a, b);
      ++count;
    }
  }
  return count ? total / double(count) : 0.0;
}

}  // namespace

quant::CalibrationTable calibration_for(const std::string& path, const ModelOptions& base, const QuantOptions& q) {
  quant::CalibrationTable t = calibration_of_mode(path, base, q);
  if (q.effective_bits > 0) plan_effective_bits(path, base, t, q);
  return t;
}

PrecisionPlanReport plan_effective_bits(const std::string& path, const ModelOptions& base,
                                        quant::CalibrationTable& table, const QuantOptions& q,
                                        const std::vector<std::vector<int32_t>>* sequences) {
  check_effective_bits(q);
  if (q.effective_bits <= 0)
    throw_error(ErrorCode::kInvalidArgument, "--effective-bits must be in [", kQ4BitsPerWeight, ", ", kQ8BitsPerWeight,
                "], got ", q.effective_bits);
  const kiln::QuantFormat format = awq_weight_format(base.weight_dtype);
  if (format != kiln::QuantFormat::kQ4)
    throw_error(ErrorCode::kInvalidArgument, "--effective-bits promotes q4 Linears to q8: it needs q4 weights, got "
                "--weight-dtype ", base.weight_dtype);
  table.precision_plan.clear();
  QuantOptions mode = q;
  mode.effective_bits = 0;
  const std::string fmt = quant_format_name(format);
  ModelOptions cpu = on_cpu(base);
  cpu.weight_dtype = fmt;
  cpu.precision = fmt;

  // The f32 model's outputs on the calibration text (decoders: the first mix_tokens tokens).
  auto ref_model = load_calibration_model(path, cpu, nullptr, q.mode.c_str());
  const bool decoder = ref_model->info().is_decoder;
  std::vector<std::vector<int32_t>> seqs = sequences ? *sequences : calibration_sequences(*ref_model, q);
  if (decoder) {
    std::vector<std::vector<int32_t>> kept;
    int64_t tokens = 0;
    for (auto& s : seqs) {
      if (tokens >= q.mix_tokens) break;
      if (tokens + int64_t(s.size()) > q.mix_tokens) s.resize(size_t(std::max<int64_t>(q.mix_tokens - tokens, 2)));
      tokens += int64_t(s.size());
      kept.push_back(std::move(s));
    }
    seqs = std::move(kept);
  }
  if (seqs.empty()) throw_error(ErrorCode::kInvalidArgument, "--effective-bits: the calibration set is empty");
  const std::vector<std::vector<float>> ref = plan_outputs(*ref_model, seqs);
  // Decoders: one row of log-probabilities per token of each sequence.
  const int64_t vocab = decoder ? int64_t(ref[0].size() / seqs[0].size()) : 0;
  ref_model.reset();

  // Candidates: the Linears the mode quantizes to q4 in the model as it will be built.
  PrecisionPlanReport report;
  report.measure = decoder ? "KL (nats/token)" : "1 - cosine of the sentence embedding";
  const ModelOptions quantized = quant_model_options(cpu, table, mode);
  {
    ModelOptions find = quantized;
    const quant::AwqOptions ao = awq_options(mode, format);
    auto rows = std::make_shared<std::vector<PrecisionPlanRow>>();
    find.rewrite = [rows, ao, fmt](ir::Graph& g) {
      for (const ir::Node& n : g.nodes())
        if (quant::awq_quantizes(g, n, ao) && !n.has_attr("weight_quant") && n.attr_str("precision", "") == fmt)
          rows->push_back({n.name, g.weight(n.inputs[1]).numel()});
    };
    Model::load(path, find);
    report.rows = *rows;
  }
  if (report.rows.empty())
    throw_error(ErrorCode::kInvalidArgument, "--effective-bits: '", path, "' has no Linear that --quant ", q.mode,
                " stores as q4 (a GGUF's q4 Linears keep their codes; pinned Linears keep their precision)");

  // Each candidate alone at q4, every other Linear f32.
  int64_t total_weights = 0;
  for (PrecisionPlanRow& row : report.rows) {
    ModelOptions one = quantized;
    one.pin_precision = {{"*", "f32"}, {row.node, fmt}};
    auto m = Model::load(path, one);
    row.distortion = plan_distortion(ref, plan_outputs(*m, seqs), decoder, vocab);
    total_weights += row.weights;
    log_debug("effective bits: ", row.node, " alone at q4: ", report.measure, " ", row.distortion);
  }

  // Greedy: the most distortion per extra bit first, while the budget holds.
  std::stable_sort(report.rows.begin(), report.rows.end(), [](const PrecisionPlanRow& a, const PrecisionPlanRow& b) {
    return a.distortion / double(a.weights) > b.distortion / double(b.weights);
  });
  const double budget = (q.effective_bits - kQ4BitsPerWeight) * double(total_weights);
  double used = 0;
  for (PrecisionPlanRow& row : report.rows) {
    report.distortion_q4 += row.distortion;
    const double extra = (kQ8BitsPerWeight - kQ4BitsPerWeight) * double(row.weights);
    if (row.distortion > 0 && used + extra <= budget * (1 + 1e-12)) {
      used += extra;
      row.promoted = true;
      table.precision_plan[row.node] = "q8";
    } else {
      report.distortion_plan += row.distortion;
    }
  }
  report.effective_bits = kQ4BitsPerWeight + used / double(total_weights);
  std::string promoted;
  for (const PrecisionPlanRow& row : report.rows)
    if (row.promoted) promoted += (promoted.empty() ? "" : ", ") + row.node;
  log_info("effective bits: ", table.precision_plan.size(), " of ", report.rows.size(), " Linears q8 (",
           promoted.empty() ? std::string("none") : promoted, "): ", report.effective_bits,
           " bits per weight; summed single-Linear ", report.measure, " ", report.distortion_q4, " all q4 -> ",
           report.distortion_plan, " (", seqs.size(), " calibration sequences)");
  return report;
}

ModelOptions w8a8_model_options(ModelOptions base, const quant::CalibrationTable& table, const QuantOptions& q,
                                std::shared_ptr<quant::W8A8Report> report) {
  quant::W8A8Options wo;
  wo.method = quant::calib_method_parse(q.method);
  wo.smooth_alpha = q.smooth_alpha;
  wo.keep = q.keep;
  wo.hadamard = q.hadamard;
  if (q.act_scale != "static" && q.act_scale != "per-token")
    throw_error(ErrorCode::kInvalidArgument, "unknown activation scale '", q.act_scale, "' (expected static or per-token)");
  wo.per_token = q.act_scale == "per-token";
  auto t = std::make_shared<const quant::CalibrationTable>(table);
  base.weight_dtype = "w8a8";
  base.rewrite = [t, wo, report](ir::Graph& g) {
    quant::W8A8Report r = quant::apply_w8a8(g, *t, wo);
    log_info("w8a8: ", r.quantized, " Linears int8 (", wo.per_token ? "per-token" : quant::calib_method_name(wo.method),
             " activation scales), ", r.kept,
             " kept f32; smoothing folded into ", r.folded_into_norm, " norms, ", r.smoothing_muls, " Mul nodes; ",
             r.rotated, " inputs rotated (--hadamard)");
    if (report) *report = r;
  };
  return base;
}

ModelOptions fp8_model_options(ModelOptions base, const quant::CalibrationTable& table, const QuantOptions& q,
                               std::shared_ptr<quant::Fp8Report> report) {
  quant::Fp8Options fo;
  fo.method = quant::calib_method_parse(q.method);
  fo.smooth_alpha = q.smooth_alpha;
  fo.keep = q.keep;
  fo.gate_up_out = q.fp8_gate_up_out;
  if (q.act_scale != "static")
    throw_error(ErrorCode::kInvalidArgument, "--quant fp8 takes static activation scales only (got --act-scale ",
                q.act_scale, ")");
  auto t = std::make_shared<const quant::CalibrationTable>(table);
  base.weight_dtype = "fp8";
  base.rewrite = [t, fo, report](ir::Graph& g) {
    quant::Fp8Report r = quant::apply_fp8(g, *t, fo);
    log_info("fp8: ", r.quantized, " Linears E4M3 (", quant::calib_method_name(fo.method),
             " activation clips, per-tensor scales), ", r.kept, " kept by --keep, ", r.kept_shape,
             " kept for shape (K or N not a multiple of 16); smoothing folded into ", r.folded_into_norm, " norms, ",
             r.smoothing_muls, " Mul nodes");
    if (fo.gate_up_out) log_info("fp8: ", r.gate_up_out, " gate|up Linears round their output to E4M3");
    if (report) *report = r;
  };
  return base;
}

ModelOptions awq_model_options(ModelOptions base, const quant::CalibrationTable& table, const QuantOptions& q,
                               std::shared_ptr<quant::AwqReport> report) {
  const quant::AwqOptions ao = awq_options(q, awq_weight_format(base.weight_dtype));
  auto t = std::make_shared<const quant::CalibrationTable>(table);
  base.weight_dtype = quant_format_name(ao.format);
  apply_precision_plan(base, table, q, ao.format);
  base.rewrite = [t, ao, report](ir::Graph& g) {
    quant::AwqReport r = quant::apply_awq(g, *t, ao);
    log_info("awq: ", r.scaled, " Linears scaled for ", quant_format_name(ao.format), ", ", r.kept,
             " kept f32; 1/s folded into ", r.folded_into_norm, " norms, ", r.folded_into_v, " V projections, ",
             r.folded_into_up, " up projections; ", r.muls, " Mul nodes");
    if (report) *report = r;
  };
  return base;
}

ModelOptions gptq_model_options(ModelOptions base, const quant::CalibrationTable& table, const QuantOptions& q,
                                std::shared_ptr<quant::GptqReport> report) {
  const quant::GptqOptions go = gptq_options(q, awq_weight_format(base.weight_dtype));
  const quant::AwqOptions ao = awq_options(q, go.format);
  auto t = std::make_shared<const quant::CalibrationTable>(table);
  base.weight_dtype = quant_format_name(go.format);
  apply_precision_plan(base, table, q, go.format);
  // A GGUF's Linears stored in the format keep their codes (apply_gptq leaves them), unless
  // AWQ's scales must multiply them first.
  base.rewrite_keeps_file_quant = !go.awq_scaled;
  base.rewrite = [t, go, ao, report](ir::Graph& g) {
    if (go.awq_scaled) {
      quant::AwqReport a = quant::apply_awq(g, *t, ao);
      log_info("awq: ", a.scaled, " Linears scaled for ", quant_format_name(ao.format), "; 1/s folded into ",
               a.folded_into_norm, " norms, ", a.folded_into_v, " V projections, ", a.folded_into_up,
               " up projections; ", a.muls, " Mul nodes");
    }
    quant::GptqReport r = quant::apply_gptq(g, *t, go);
    log_info("gptq: ", r.quantized, " Linears ", quant_format_name(go.format), " (damping ", go.damp, "), ", r.kept,
             " kept f32; summed output error ", r.error_rtn > 0 ? r.error / r.error_rtn : 1.0, " of plain rounding");
    if (report) *report = r;
  };
  return base;
}

void quant_mode_check(const QuantOptions& q) {
  if (q.mode != "w8a8" && q.mode != "fp8" && q.mode != "awq" && !gptq_mode(q.mode))
    throw_error(ErrorCode::kInvalidArgument, "unknown --quant mode '", q.mode,
                "' (expected w8a8, fp8, awq, gptq or awq-gptq)");
  if (!(q.gptq_damp >= 0.0) || !std::isfinite(q.gptq_damp))
    throw_error(ErrorCode::kInvalidArgument, "--gptq-damp must be a finite value >= 0, got ", q.gptq_damp);
  quant::calib_method_parse(q.method);
  if (q.act_scale != "static" && q.act_scale != "per-token")
    throw_error(ErrorCode::kInvalidArgument, "unknown activation scale '", q.act_scale, "' (expected static or per-token)");
  if (q.mode == "fp8" && q.act_scale != "static")
    throw_error(ErrorCode::kInvalidArgument, "--quant fp8 takes static activation scales only (got --act-scale ",
                q.act_scale, ")");
  check_effective_bits(q);
  if (q.fp8_gate_up_out && q.mode != "fp8")
    throw_error(ErrorCode::kInvalidArgument, "--fp8-gate-up-out applies to --quant fp8 only (got --quant ", q.mode, ")");
  if (!q.hadamard.empty() && q.mode != "w8a8")
    throw_error(ErrorCode::kInvalidArgument, "--hadamard applies to --quant w8a8 only (got --quant ", q.mode, ")");
}

ModelOptions quant_model_options(const ModelOptions& base, const quant::CalibrationTable& table, const QuantOptions& q) {
  quant_mode_check(q);
  if (q.mode == "awq") return awq_model_options(base, table, q);
  if (gptq_mode(q.mode)) return gptq_model_options(base, table, q);
  return q.mode == "fp8" ? fp8_model_options(base, table, q) : w8a8_model_options(base, table, q);
}

quant::CalibrationTable synthetic_calibration(const ir::Graph& g, double amax, const std::vector<std::string>& hadamard) {
  quant::CalibrationTable t;
  t.model = "random weights";
  t.text = str_cat("none: every activation clip set to ", amax, " (speed measurements only)");
  t.smooth_alpha = -1.0;
  for (const ir::Node& n : g.nodes()) {
    if (n.op != "Linear" || n.inputs.size() < 2 || !g.is_weight(n.inputs[1])) continue;
    const Tensor& w = g.weight(n.inputs[1]);
    if (w.rank() != 2) continue;
    const int64_t b = quant::w8a8_rotates(n.name, hadamard) ? hadamard_block(w.dim(1)) : 0;
    const double clip = b ? amax * std::sqrt(double(b)) : amax;
    quant::TensorCalib& c = t.tensors[b ? quant::hadamard_calib_name(n.name, b) : n.name];
    c.channel_absmax.assign(size_t(w.dim(1)), float(clip));
    for (const char* m : {"max", "percentile", "mse", "kl", "mse_fp8", "kl_fp8"}) c.amax[m] = clip;
    c.out_amax = amax;
    c.rows = 1;
  }
  return t;
}

void check_hadamard_has_quant(const QuantOptions& q) {
  if (!q.hadamard.empty() && q.mode.empty())
    throw_error(ErrorCode::kInvalidArgument, "--hadamard applies to --quant w8a8 only (got no --quant)");
}

std::unique_ptr<Model> load_random_model(const std::string& config, const ModelOptions& base, const QuantOptions& q) {
  check_effective_bits(q);
  check_hadamard_has_quant(q);
  if (q.mode.empty()) return Model::load_random(config, base);
  quant_mode_check(q);
  if (q.mode == "awq" || gptq_mode(q.mode))
    throw_error(ErrorCode::kInvalidArgument, "--quant ", q.mode, " calibrates on real activations; random weights "
                "have none (measure speed with --weight-dtype q4, which stores the same format)");
  if (q.smooth_alpha >= 0)
    log_info("random weights: no calibration data, so no SmoothQuant migration (--smooth-alpha ignored)");
  QuantOptions unsmoothed = q;
  unsmoothed.smooth_alpha = -1.0;
  // The Linear names exist once the graph does: the table is made inside the rewrite.
  ModelOptions o = quant_model_options(base, quant::CalibrationTable{}, unsmoothed);
  o.rewrite = [base, unsmoothed](ir::Graph& g) {
    // quant_mode_check above refused --hadamard beside any mode but w8a8.
    ModelOptions inner = quant_model_options(base, synthetic_calibration(g, 8.0, unsmoothed.hadamard), unsmoothed);
    inner.rewrite(g);
  };
  return Model::load_random(config, o);
}

void check_effective_bits(const QuantOptions& q) {
  if (q.effective_bits == 0) return;
  if (q.mode != "awq" && !gptq_mode(q.mode))
    throw_error(ErrorCode::kInvalidArgument, "--effective-bits mixes q4 and q8 weights by calibration: it takes --quant "
                "awq, gptq or awq-gptq", q.mode.empty() ? std::string(" (no --quant given)") : ", not --quant " + q.mode);
  if (!(q.effective_bits >= kQ4BitsPerWeight && q.effective_bits <= kQ8BitsPerWeight))
    throw_error(ErrorCode::kInvalidArgument, "--effective-bits must be in [", kQ4BitsPerWeight, ", ", kQ8BitsPerWeight,
                "] (q4 stores 5 bits per weight with its scales, q8 8.5), got ", q.effective_bits);
  if (q.mix_tokens < 1) throw_error(ErrorCode::kInvalidArgument, "--mix-tokens must be >= 1, got ", q.mix_tokens);
}

std::unique_ptr<Model> load_model(const std::string& path, const ModelOptions& base, const QuantOptions& q) {
  check_effective_bits(q);
  check_hadamard_has_quant(q);
  if (q.mode.empty()) return Model::load(path, base);
  quant_mode_check(q);  // fail before calibrating
  if (std::filesystem::is_regular_file(path) && is_engine_file(path))
    throw_error(ErrorCode::kInvalidArgument, "'", path, "' is an engine: its precision was fixed when it was built; "
                "quantize when building (kiln build --quant ", q.mode, ") or pass the model directory");
  quant::CalibrationTable table = calibration_for(path, base, q);
  return Model::load(path, quant_model_options(base, table, q));
}

std::shared_ptr<const LinearObserver> LayerErrorCollector::observer() {
  auto obs = std::make_shared<LinearObserver>();
  auto acc = acc_;
  obs->on_quant_output = [acc](const std::string& node, const float* y, const float* yf, int64_t t, int64_t n) {
    Acc& a = (*acc)[node];
    for (int64_t i = 0; i < t * n; ++i) {
      const double d = double(y[i]) - double(yf[i]);
      a.err2 += d * d;
      a.ref2 += double(yf[i]) * double(yf[i]);
      a.max_abs = std::max(a.max_abs, std::fabs(d));
    }
    a.rows += t;
  };
  return obs;
}

std::vector<LayerErrorCollector::Row> LayerErrorCollector::rows_by_error() const {
  std::vector<Row> rows;
  for (auto& [name, a] : *acc_)
    rows.push_back({name, a.ref2 > 0 ? std::sqrt(a.err2 / a.ref2) : 0.0, a.max_abs, a.rows});
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.rel_rmse > b.rel_rmse; });
  return rows;
}

}  // namespace kiln
