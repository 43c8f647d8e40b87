// Token sampling for one sequence: penalties (repetition, presence, frequency), then
// greedy or temperature + top-k + top-p + min-p, drawn from a per-sequence seeded RNG so
// that the same seed gives the same output; logprobs (with top-n alternatives) come from
// the model's raw distribution, as OpenAI and vLLM report them.
// Tested in tests/runtime/sampling_test.cpp (exact and statistical checks).
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <unordered_map>
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

  bool greedy() const { return temperature <= 0.0f; }
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
};

class Sampler {
 public:
  Sampler(const SamplingParams& params, uint64_t seed);

  // Tokens the repetition penalty also applies to (the prompt).
  void add_context(std::span<const int32_t> tokens);
  // Chooses the next token. `logits` [vocab] is used as scratch (modified).
  SampledToken sample(std::span<float> logits);
  // Records an emitted token for the penalties (sample() does this itself).
  void accept(int32_t token);

  const SamplingParams& params() const { return params_; }

 private:
  void apply_penalties(std::span<float> logits) const;
  double uniform();

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

// log-softmax value of logits[token] and the top-n (token, logprob) of raw logits.
SampledToken logprobs_of(std::span<const float> logits, int32_t token, int32_t top_n);

}  // namespace kiln
