// Strided perplexity and model-vs-reference KL (see eval.h).
#include "runtime/eval.h"

#include <algorithm>
#include <cmath>

#include "core/status.h"
#include "runtime/llm_runner.h"

namespace kiln {

double PerplexityResult::perplexity() const {
  return scored ? std::exp(nll_sum / double(scored)) : 0.0;
}
double PerplexityResult::ref_perplexity() const {
  return scored ? std::exp(ref_nll_sum / double(scored)) : 0.0;
}

std::vector<float> sequence_logits(Model& model, const std::vector<int32_t>& tokens, bool decode) {
  KILN_THROW_IF(tokens.empty(), kInvalidArgument, "sequence_logits: no tokens");
  LlmRunnerOptions ro;
  ro.max_total_tokens = int64_t(tokens.size()) + 16;
  LlmRunner runner(model, ro);
  const int32_t seq = runner.add_sequence(decode ? std::vector<int32_t>{tokens[0]} : tokens);
  std::vector<float> logits;
  while (runner.has_pending())
    for (auto& o : runner.step(/*all_logits=*/true)) logits.insert(logits.end(), o.logits.begin(), o.logits.end());
  if (decode)
    for (size_t i = 1; i < tokens.size(); ++i) {
      runner.append_tokens(seq, {tokens[i]});
      for (auto& o : runner.step(/*all_logits=*/true)) logits.insert(logits.end(), o.logits.begin(), o.logits.end());
    }
  return logits;
}

void log_softmax(const float* x, int64_t n, std::vector<double>& out) {
  double mx = *std::max_element(x, x + n);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(double(x[i]) - mx);
  double lse = mx + std::log(sum);
  out.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = double(x[i]) - lse;
}

double cosine(const std::vector<float>& a, const std::vector<float>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) ab += double(a[i]) * b[i], aa += double(a[i]) * a[i], bb += double(b[i]) * b[i];
  return aa > 0 && bb > 0 ? ab / std::sqrt(aa * bb) : 0.0;
}

PerplexityResult evaluate_perplexity(Model& model, const std::vector<int32_t>& all_tokens,
                                     const PerplexityOptions& opt, Model* reference) {
  if (opt.context < 2 || opt.stride < 1 || opt.stride > opt.context)
    throw_error(ErrorCode::kInvalidArgument, "perplexity: need context >= 2 and 1 <= stride <= context (got ",
                opt.context, ", ", opt.stride, ")");
  if (opt.context > model.info().max_positions)
    throw_error(ErrorCode::kInvalidArgument, "perplexity: context ", opt.context,
                " exceeds the model's ", model.info().max_positions, " positions");
  if (reference && reference->info().vocab_size != model.info().vocab_size)
    throw_error(ErrorCode::kInvalidArgument, "the reference model's vocabulary (",
                reference->info().vocab_size, ") differs from the model's (", model.info().vocab_size, ")");
  std::vector<int32_t> tokens = all_tokens;
  if (opt.max_tokens > 0 && int64_t(tokens.size()) > opt.max_tokens) tokens.resize(size_t(opt.max_tokens));
  if (tokens.size() < 2)
    throw_error(ErrorCode::kInvalidArgument, "perplexity needs at least 2 tokens of text, got ", tokens.size());
  const int64_t v = model.info().vocab_size;
  PerplexityResult r;
  std::vector<double> lp, ref_lp;
  int64_t scored_until = 1;  // tokens [1, scored_until) already scored
  for (int64_t begin = 0; scored_until < int64_t(tokens.size()); begin += opt.stride) {
    int64_t end = std::min<int64_t>(int64_t(tokens.size()), begin + opt.context);
    std::vector<int32_t> window(tokens.begin() + begin, tokens.begin() + end);
    std::vector<float> logits = sequence_logits(model, window, opt.decode);
    std::vector<float> ref_logits;
    if (reference) ref_logits = sequence_logits(*reference, window, opt.decode);
    // Position p of the window predicts token begin + p + 1.
    for (int64_t target = std::max(scored_until, begin + 1); target < end; ++target) {
      int64_t p = target - begin - 1;
      log_softmax(logits.data() + p * v, v, lp);
      int32_t tok = tokens[size_t(target)];
      r.nll_sum -= lp[size_t(tok)];
      if (reference) {
        log_softmax(ref_logits.data() + p * v, v, ref_lp);
        r.ref_nll_sum -= ref_lp[size_t(tok)];
        double kl = 0;
        for (int64_t i = 0; i < v; ++i) kl += std::exp(ref_lp[size_t(i)]) * (ref_lp[size_t(i)] - lp[size_t(i)]);
        r.kl_sum += std::max(0.0, kl);
        auto amax = [&](const std::vector<double>& x) { return std::max_element(x.begin(), x.end()) - x.begin(); };
        r.top1_agree += amax(lp) == amax(ref_lp);
      }
      ++r.scored;
    }
    scored_until = end;
    if (end == int64_t(tokens.size())) break;
  }
  return r;
}

}  // namespace kiln
