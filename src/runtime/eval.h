// Accuracy evaluation of decoders on real text: perplexity over sliding windows, and a
// comparison of two models (e.g. f32 vs a low-precision build of the same weights)
// reporting both perplexities and the mean KL divergence of their next-token
// distributions. Used by `kiln eval`; tested in tests/runtime/eval_test.cpp.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/model.h"

namespace kiln {

struct PerplexityOptions {
  int32_t context = 256;  // tokens per window
  int32_t stride = 128;   // tokens scored per window after the first (<= context)
  int64_t max_tokens = 0; // 0: the whole text
  // Each window fed one token per step after its first (decode steps, the rows a
  // generation's GEMVs see) instead of as one prompt; the same tokens are scored.
  bool decode = false;
};

struct PerplexityResult {
  double nll_sum = 0;      // sum of -log p(token) over scored tokens
  int64_t scored = 0;      // tokens scored
  double perplexity() const;
  double kl_sum = 0;       // with a reference model: sum over scored tokens of KL(ref || model)
  double mean_kl() const { return scored ? kl_sum / double(scored) : 0.0; }
  double ref_nll_sum = 0;  // the reference model's NLL over the same tokens
  double ref_perplexity() const;
  int64_t top1_agree = 0;  // tokens where both models' argmax agree
};

// Scores `tokens` with `model`; with `reference` also computes KL(reference || model)
// and the reference's own perplexity on identical windows. Windows follow
// transformers' strided-perplexity recipe: each window sees up to `context` tokens and
// scores only the ones the previous window did not.
PerplexityResult evaluate_perplexity(Model& model, const std::vector<int32_t>& tokens,
                                     const PerplexityOptions& options, Model* reference = nullptr);

// The logits of every position of `tokens` ([tokens, vocab], in token order) through a
// runner of their own: as one prompt, or (decode) the first token and then one token per
// step. Also the calibration and --effective-bits passes' decoder forward.
std::vector<float> sequence_logits(Model& model, const std::vector<int32_t>& tokens, bool decode = false);
// log-softmax of one row of n logits, in double.
void log_softmax(const float* x, int64_t n, std::vector<double>& out);
// Cosine similarity of two equal-length vectors (0 when either is zero).
double cosine(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace kiln
