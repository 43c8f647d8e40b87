// `kiln eval perplexity`: a decoder's perplexity on a text file, optionally next to a
// reference build of the same model (e.g. --weight-dtype bf16 vs f32) with the mean KL
// divergence of their next-token distributions — what a low-precision mode costs.
#include <chrono>
#include <cstdio>

#include "commands.h"
#include "core/mapped_file.h"
#include "core/status.h"
#include "runtime/eval.h"
#include "runtime/model_tokenizer.h"

namespace kiln::cli {

namespace {

struct EvalArgs {
  ModelArgs model;
  std::string text;
  std::string reference_dtype;
  PerplexityOptions opt;
};

int run_eval(const EvalArgs& a) {
  auto model = Model::load(a.model.model, model_options(a.model));
  auto tokenizer = load_model_tokenizer(*model);
  if (!tokenizer) throw_error(ErrorCode::kInvalidArgument, "'", a.model.model, "' has no tokenizer");
  std::string text = read_text_file(a.text);
  std::vector<int32_t> tokens = tokenizer->encode(text, /*add_special=*/true);
  std::unique_ptr<Model> ref;
  if (!a.reference_dtype.empty())
    ref = Model::load(a.model.model, {a.model.backend, a.reference_dtype, nullptr, a.model.opt_level, a.model.disabled_passes});
  auto t0 = std::chrono::steady_clock::now();
  PerplexityResult r = evaluate_perplexity(*model, tokens, a.opt, ref.get());
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("text %s: %zu tokens, %lld scored (context %d, stride %d), %.1f s\n", a.text.c_str(),
              tokens.size(), (long long)r.scored, a.opt.context, a.opt.stride, s);
  std::printf("| weights | perplexity | vs reference | mean KL (nats) | top-1 agreement |\n|---|---|---|---|---|\n");
  if (ref)
    std::printf("| %s (reference) | %.4f | | | |\n", a.reference_dtype.c_str(), r.ref_perplexity());
  std::printf("| %s | %.4f |", a.model.weight_dtype.c_str(), r.perplexity());
  if (ref)
    std::printf(" %+.3f%% | %.3g | %.2f%% |\n", 100.0 * (r.perplexity() / r.ref_perplexity() - 1.0), r.mean_kl(),
                100.0 * double(r.top1_agree) / double(r.scored));
  else
    std::printf(" | | |\n");
  return 0;
}

}  // namespace

Runner add_eval(CLI::App& app) {
  auto a = std::make_shared<EvalArgs>();
  CLI::App* eval = app.add_subcommand("eval", "accuracy of a model on real data");
  eval->require_subcommand(1);
  CLI::App* cmd = eval->add_subcommand("perplexity", "perplexity of a decoder on a text file");
  add_model_options(cmd, a->model);
  cmd->add_option("--text", a->text, "UTF-8 text file")->required()->check(CLI::ExistingFile);
  cmd->add_option("--reference-dtype", a->reference_dtype,
                  "also run the model with these weights (f32|bf16|f16|q8|q4) and report KL vs them")
      ->check(CLI::IsMember({"f32", "bf16", "f16", "q8", "q4"}));
  cmd->add_option("--context", a->opt.context, "tokens per window")->capture_default_str();
  cmd->add_option("--stride", a->opt.stride, "new tokens scored per window")->capture_default_str();
  cmd->add_option("--max-tokens", a->opt.max_tokens, "score at most this many tokens (0 = all)")
      ->capture_default_str();
  return [a] { return run_eval(*a); };
}

}  // namespace kiln::cli
