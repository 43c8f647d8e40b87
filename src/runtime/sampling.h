// Token sampling for one sequence: logit biases (OpenAI's logit_bias), penalties
// (repetition, presence, frequency), then
// greedy or temperature + top-k + top-p + min-p, drawn from a per-sequence seeded RNG so
// that the same seed gives the same output; logprobs (with top-n alternatives) come from
// the model's raw distribution, as OpenAI and vLLM report them. A sampler can also draw
// from a row's top-k candidates (the TopKLogits op) when that is exact: then it gives
// the same token, logprobs and RNG state as from the whole row.
// Tested in tests/runtime/sampling_test.cpp (exact and statistical checks; top-k
// candidates against whole rows over many seeds).
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kiln {

struct SamplingParams {
  float temperature = 1.0f;         // 0: greedy
  int32_t top_k = 0;                // 0 or -1: off
  float top_p = 1.0f;               // (0, 1]
  float min_p = 0.0f;               // [0, 1]: drop tokens below min_p * max probability
  float repetition_penalty = 1.0f;  // > 0; HF/CTRL style, over prompt and output tokens
  float presence_penalty = 0.0f;    // [-2, 2]; OpenAI style, over output tokens
  float frequency_penalty = 0.0f;   // [-2, 2]
  std::optional<uint64_t> seed;     // unset: the executor picks one per request
  int32_t logprobs = -1;            // -1: none; 0: the chosen token's; n: plus top-n (<= 20)
  // OpenAI's logit_bias: (token id, bias in [-100, 100]) added to the logits before the
  // penalties and the draw (the logprobs stay the model's raw distribution, as vLLM's).
  std::vector<std::pair<int32_t, float>> logit_bias;

  bool greedy() const { return temperature <= 0.0f; }
  // Greedy with nothing beside the argmax: no logprobs, logit biases or penalties (their
  // state or output depends on more than the chosen token). Speculative drafts verified
  // against such a sampler cannot change its output (executor, ExecutorOptions::lookup_drafts).
  bool plain_argmax() const {
    return greedy() && logprobs < 0 && logit_bias.empty() && repetition_penalty == 1.0f && presence_penalty == 0.0f &&
           frequency_penalty == 0.0f;
  }
};

// "" when the parameters are usable, else a message naming the bad one (for 4xx errors).
std::string sampling_params_error(const SamplingParams& p);

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0;
};

struct SampledToken {
  int32_t token = -1;
  float logprob = 0;                // of `token` under the raw distribution (if asked)
  std::vector<TokenLogprob> top;    // the top-n alternatives, most likely first
  int32_t rank = 0;  // logprobs_of with_rank: 1 + the tokens with larger logits (0: not computed)
};

// One row of the TopKLogits op's outputs (ir op registry): the k largest logits of a
// row of `vocab`, in descending order (equal values: lower id first; NaN last), their
// ids (-1 pads a row with vocab < k) and their log-softmax over the whole row.
struct TopLogits {
  std::span<const float> logits;
  std::span<const int32_t> ids;
  std::span<const float> logprobs;
  int32_t vocab = 0;
};

class Sampler {
 public:
  Sampler(const SamplingParams& params, uint64_t seed);

  // Tokens the repetition penalty also applies to (the prompt).
  void add_context(std::span<const int32_t> tokens);
  // Chooses the next token. `logits` [vocab] is used as scratch (modified).
  SampledToken sample(std::span<float> logits);
  // Whether sample(TopLogits) with k candidates per row is exactly sample() of the whole
  // row: greedy, or top_k in [1, min(k, vocab - 1)] (top-p and min-p then act on those
  // top_k only); logprobs <= k; no penalties or logit biases (they move logits the
  // candidates lack).
  // Not: plain temperature or top-p without top_k, whose draw and normalization run
  // over the whole vocabulary. Exact for rows without NaN; a row whose values are all
  // -inf or NaN still gives greedy's token 0.
  bool samples_from_top(int32_t k, int32_t vocab) const;
  // The fewest leading candidates of a row that sample(TopLogits) needs when
  // samples_from_top() holds: 1 for greedy (its argmax), top_k otherwise, and at least
  // `logprobs` for the top-n alternatives.
  int32_t top_candidates_needed() const;
  // Chooses the next token from a row's top candidates; requires samples_from_top().
  SampledToken sample(const TopLogits& top);
  // Records an emitted token for the penalties (sample() does this itself).
  void accept(int32_t token);

  const SamplingParams& params() const { return params_; }

 private:
  void apply_penalties(std::span<float> logits) const;
  double uniform();
  // The non-greedy draw both paths share: candidates 0..n-1 in the order the whole-row
  // path visits them, with value(i) and id(i).
  template <typename Value, typename Id>
  int32_t draw(int32_t n, Value value, Id id);

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::unordered_map<int32_t, int32_t> output_counts_;  // presence/frequency
  std::vector<int32_t> seen_;                           // repetition: prompt + output
  std::vector<uint8_t> seen_mask_;
  // Scratch reused across steps (the sampler runs once per token per sequence).
  std::vector<int32_t> idx_;
  std::vector<float> probs_;
};

// Index of the largest value (the lowest such index on ties; 0 when all are NaN or -inf).
int32_t greedy_argmax(const float* x, int32_t n);

// log-softmax value of logits[token] and the top-n (token, logprob) of raw logits; with_rank:
// also its rank (one more pass over the row; vLLM's prompt_logprobs report it).
SampledToken logprobs_of(std::span<const float> logits, int32_t token, int32_t top_n, bool with_rank = false);

}  // namespace kiln
