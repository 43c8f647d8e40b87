// `kiln eval perplexity`: a decoder's perplexity on a text file, optionally next to a
// reference build of the same model (e.g. --weight-dtype bf16 vs f32, or --quant w8a8/fp8 vs
// f32 with --compare-quant) with the mean KL divergence of their next-token
// distributions — what a low-precision mode costs. `kiln eval embeddings`: an encoder's
// embeddings of a file of sentences vs the f32 model's (cosine similarity, label
// agreement). --per-layer N lists the quantized Linears with the largest output error.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "commands.h"
#include "core/mapped_file.h"
#include "core/status.h"
#include "engine/engine.h"
#include "runtime/encoder_runner.h"
#include "runtime/eval.h"
#include "runtime/model_tokenizer.h"

namespace kiln::cli {

namespace {

struct EvalArgs {
  ModelArgs model;
  std::string text;
  std::string reference_dtype;
  // The float model the reference runs (default: the model itself, or for an engine the
  // model directory it was built from).
  std::string reference;
  std::string compare_quant;
  int per_layer = 0;
  PerplexityOptions opt;
  int32_t max_sentences = 500;
};

std::string model_label(const ModelArgs& m) {
  if (!m.pins.empty()) {
    ModelArgs unpinned = m;
    unpinned.pins.clear();
    std::string s = model_label(unpinned) + ", pinned ";
    for (size_t i = 0; i < m.pins.size(); ++i) s += (i ? "," : "") + m.pins[i];
    return s;
  }
  if (m.kv_cache_dtype != "auto") {
    ModelArgs weights = m;
    weights.kv_cache_dtype = "auto";
    return model_label(weights) + ", KV " + m.kv_cache_dtype + (m.kv_rotate == "off" ? " (--kv-rotate off)" : "");
  }
  if (m.quant.mode.empty()) return m.weight_dtype;
  if (m.quant.mode == "awq" || gptq_mode(m.quant.mode)) {
    std::string s = std::string(quant_format_name(awq_weight_format(m.weight_dtype))) + " + " + m.quant.mode;
    if (m.quant.effective_bits > 0) {
      char buf[48];
      std::snprintf(buf, sizeof buf, ", q4/q8 mix <= %.2f bits", m.quant.effective_bits);
      s += buf;
    }
    for (size_t i = 0; i < m.quant.keep.size(); ++i) s += (i ? "," : " (keep ") + m.quant.keep[i];
    return s + (m.quant.keep.empty() ? "" : ")");
  }
  std::string s = m.quant.mode + " (" + (m.quant.act_scale == "per-token" ? std::string("per-token") : m.quant.method);
  if (m.quant.smooth_alpha >= 0) {
    char buf[32];
    std::snprintf(buf, sizeof buf, ", alpha %.2f", m.quant.smooth_alpha);
    s += buf;
  } else {
    s += ", no smoothing";
  }
  for (size_t i = 0; i < m.quant.keep.size(); ++i) s += (i ? "," : ", keep ") + m.quant.keep[i];
  return s + ")";
}

// Loads the model under test (with the per-layer error observer when asked) and, when
// comparing, the reference.
struct Loaded {
  std::unique_ptr<Model> model, ref;
  LayerErrorCollector errors;
};
void load_pair(EvalArgs& a, Loaded& l) {
  if (!a.compare_quant.empty()) {
    a.model.quant.mode = a.compare_quant;
    if (a.reference_dtype.empty()) a.reference_dtype = "f32";
  }
  ModelOptions mo = model_options(a.model);
  if (a.per_layer > 0) {
    if (a.model.quant.mode.empty()) throw_error(ErrorCode::kInvalidArgument, "--per-layer needs --quant or --compare-quant");
    mo.linear_observer = l.errors.observer();
  }
  l.model = kiln::load_model(a.model.model, mo, a.model.quant);
  if (a.reference_dtype.empty()) return;
  // An engine holds its built precision: the reference is the model it was built from
  // (else every comparison would be of the engine with itself).
  std::string ref = a.reference;
  if (ref.empty()) ref = l.model->engine() ? l.model->engine()->build.source : a.model.model;
  if (l.model->engine() && (ref.empty() || !std::filesystem::exists(ref)))
    throw_error(ErrorCode::kInvalidArgument, "eval: '", a.model.model, "' is an engine built from '", ref,
                "', which is not here; pass the float model it was built from with --reference MODEL");
  if (std::filesystem::is_regular_file(ref) && is_engine_file(ref))
    throw_error(ErrorCode::kInvalidArgument, "eval: the reference '", ref, "' is an engine; pass the float model "
                "(a model directory, .gguf or .onnx) with --reference");
  if (ref != a.model.model) std::fprintf(stderr, "reference: %s (%s weights)\n", ref.c_str(), a.reference_dtype.c_str());
  l.ref = Model::load(ref, {a.model.backend, a.reference_dtype, nullptr, a.model.opt_level, a.model.disabled_passes});
}

void print_per_layer(const EvalArgs& a, const Loaded& l) {
  if (a.per_layer <= 0) return;
  auto rows = l.errors.rows_by_error();
  std::printf("\nper-layer output error of the quantized Linears vs f32 on the same input (worst %d of %zu)\n", a.per_layer,
              rows.size());
  std::printf("| Linear | relative RMS error | max abs error | rows |\n|---|---|---|---|\n");
  for (size_t i = 0; i < rows.size() && int(i) < a.per_layer; ++i)
    std::printf("| %s | %.4f | %.4g | %lld |\n", rows[i].node.c_str(), rows[i].rel_rmse, rows[i].max_abs,
                (long long)rows[i].rows);
}

int run_perplexity(EvalArgs a) {
  Loaded l;
  load_pair(a, l);
  auto tokenizer = load_model_tokenizer(*l.model);
  if (!tokenizer) throw_error(ErrorCode::kInvalidArgument, "'", a.model.model, "' has no tokenizer");
  std::string text = read_text_file(a.text);
  std::vector<int32_t> tokens = tokenizer->encode(text, /*add_special=*/true);
  auto t0 = std::chrono::steady_clock::now();
  PerplexityResult r = evaluate_perplexity(*l.model, tokens, a.opt, l.ref.get());
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("text %s: %zu tokens, %lld scored (context %d, stride %d), %.1f s\n", a.text.c_str(),
              tokens.size(), (long long)r.scored, a.opt.context, a.opt.stride, s);
  std::printf("| weights | perplexity | vs reference | mean KL (nats) | top-1 agreement |\n|---|---|---|---|---|\n");
  if (l.ref)
    std::printf("| %s (reference) | %.4f | | | |\n", a.reference_dtype.c_str(), r.ref_perplexity());
  std::printf("| %s | %.4f |", model_label(a.model).c_str(), r.perplexity());
  if (l.ref)
    std::printf(" %+.3f%% | %.3g | %.2f%% |\n", 100.0 * (r.perplexity() / r.ref_perplexity() - 1.0), r.mean_kl(),
                100.0 * double(r.top1_agree) / double(r.scored));
  else
    std::printf(" | | |\n");
  print_per_layer(a, l);
  return 0;
}

int run_embeddings(EvalArgs a) {
  if (a.reference_dtype.empty()) a.reference_dtype = "f32";
  Loaded l;
  load_pair(a, l);
  if (l.model->info().is_decoder)
    throw_error(ErrorCode::kInvalidArgument, "eval embeddings: '", a.model.model, "' is a decoder (use eval perplexity)");
  auto tokenizer = load_model_tokenizer(*l.model);
  if (!tokenizer) throw_error(ErrorCode::kInvalidArgument, "'", a.model.model, "' has no tokenizer");
  std::string text = read_text_file(a.text);
  std::vector<EncoderInput> inputs;
  size_t pos = 0;
  while (pos < text.size() && int32_t(inputs.size()) < a.max_sentences) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::vector<int32_t> ids = tokenizer->encode(line, true);
    if (ids.size() > 128) ids.resize(128);
    inputs.push_back({ids, {}});
  }
  if (inputs.empty()) throw_error(ErrorCode::kInvalidArgument, "eval embeddings: '", a.text, "' has no non-empty line");
  double sum = 0, lo = 1;
  int64_t agree = 0, with_labels = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (size_t b = 0; b < inputs.size(); b += 32) {
    std::vector<EncoderInput> batch(inputs.begin() + long(b), inputs.begin() + long(std::min(inputs.size(), b + 32)));
    auto q = encode(*l.model, batch);
    auto f = encode(*l.ref, batch);
    for (size_t i = 0; i < q.size(); ++i) {
      const double c = cosine(q[i].embedding, f[i].embedding);
      sum += c;
      lo = std::min(lo, c);
      if (!q[i].logits.empty()) {
        ++with_labels;
        agree += std::max_element(q[i].logits.begin(), q[i].logits.end()) - q[i].logits.begin() ==
                 std::max_element(f[i].logits.begin(), f[i].logits.end()) - f[i].logits.begin();
      }
    }
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("text %s: %zu sentences (one per line, <= 128 tokens), %.1f s\n", a.text.c_str(), inputs.size(), s);
  std::printf("| weights | sentence embedding cosine vs %s: mean | min | label agreement |\n|---|---|---|---|\n",
              a.reference_dtype.c_str());
  std::printf("| %s | %.5f | %.5f |", model_label(a.model).c_str(), sum / double(inputs.size()), lo);
  if (with_labels) std::printf(" %.2f%% |\n", 100.0 * double(agree) / double(with_labels));
  else std::printf(" (no classifier) |\n");
  print_per_layer(a, l);
  return 0;
}

void add_common(CLI::App* cmd, EvalArgs& a) {
  add_model_options(cmd, a.model);
  cmd->add_option("--compare-quant", a.compare_quant,
                  "quantize the model (w8a8, fp8, awq, gptq or awq-gptq; --calib etc. apply) and compare it with the "
                  "f32 model on the same text")
      ->check(CLI::IsMember({"w8a8", "fp8", "awq", "gptq", "awq-gptq"}));
  cmd->add_option("--reference", a.reference,
                  "the float model the reference runs (default: the model itself; for an engine, the model it was "
                  "built from, as recorded in it)");
  cmd->add_option("--per-layer", a.per_layer,
                  "list the N quantized Linears whose quantized output differs most from f32 on the same input");
}

}  // namespace

Runner add_eval(CLI::App& app) {
  auto a = std::make_shared<EvalArgs>();
  auto which = std::make_shared<int>(0);
  CLI::App* eval = app.add_subcommand("eval", "accuracy of a model on real data");
  eval->require_subcommand(1);
  CLI::App* cmd = eval->add_subcommand("perplexity", "perplexity of a decoder on a text file");
  add_common(cmd, *a);
  add_kv_dtype_option(cmd, a->model.kv_cache_dtype, a->model.kv_calib, a->model.kv_rotate);  // the reference (if any) keeps the auto cache
  cmd->add_option("--text", a->text, "UTF-8 text file")->required()->check(CLI::ExistingFile);
  cmd->add_option("--reference-dtype", a->reference_dtype,
                  "also run the model with these weights (f32|bf16|f16|q8|q4) and report KL vs them")
      ->check(CLI::IsMember({"f32", "bf16", "f16", "q8", "q4"}));
  cmd->add_option("--context", a->opt.context, "tokens per window")->capture_default_str();
  cmd->add_option("--stride", a->opt.stride, "new tokens scored per window")->capture_default_str();
  cmd->add_option("--max-tokens", a->opt.max_tokens, "score at most this many tokens (0 = all)")
      ->capture_default_str();
  cmd->add_flag("--decode", a->opt.decode,
                "feed each window one token per step (the decode path generation runs) instead of as one prompt");
  cmd->callback([which] { *which = 1; });
  CLI::App* emb = eval->add_subcommand("embeddings", "an encoder's embeddings vs the f32 model's (cosine, labels)");
  add_common(emb, *a);
  emb->add_option("--text", a->text, "UTF-8 text file, one sentence per line")->required()->check(CLI::ExistingFile);
  emb->add_option("--max-sentences", a->max_sentences, "sentences at most")->capture_default_str();
  emb->callback([which] { *which = 2; });
  return [a, which] { return *which == 2 ? run_embeddings(*a) : run_perplexity(*a); };
}

}  // namespace kiln::cli
