// Sampler (see sampling.h).
#include "runtime/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/status.h"

namespace kiln {

std::string sampling_params_error(const SamplingParams& p) {
  auto finite = [](float x) { return std::isfinite(x); };
  if (!finite(p.temperature) || p.temperature < 0 || p.temperature > 100)
    return str_cat("temperature must be in [0, 100], got ", p.temperature);
  if (p.top_k < -1) return str_cat("top_k must be -1, 0 (off) or positive, got ", p.top_k);
  if (!finite(p.top_p) || p.top_p <= 0 || p.top_p > 1)
    return str_cat("top_p must be in (0, 1], got ", p.top_p);
  if (!finite(p.min_p) || p.min_p < 0 || p.min_p > 1)
    return str_cat("min_p must be in [0, 1], got ", p.min_p);
  if (!finite(p.repetition_penalty) || p.repetition_penalty <= 0 || p.repetition_penalty > 100)
    return str_cat("repetition_penalty must be in (0, 100], got ", p.repetition_penalty);
  if (!finite(p.presence_penalty) || p.presence_penalty < -2 || p.presence_penalty > 2)
    return str_cat("presence_penalty must be in [-2, 2], got ", p.presence_penalty);
  if (!finite(p.frequency_penalty) || p.frequency_penalty < -2 || p.frequency_penalty > 2)
    return str_cat("frequency_penalty must be in [-2, 2], got ", p.frequency_penalty);
  if (p.logprobs < -1 || p.logprobs > 20)
    return str_cat("logprobs must be in [0, 20], got ", p.logprobs);
  for (const auto& [token, bias] : p.logit_bias) {
    if (token < 0) return str_cat("logit_bias: token id ", token, " is negative");
    if (!finite(bias) || bias < -100 || bias > 100)
      return str_cat("logit_bias: the bias of token ", token, " must be in [-100, 100], got ", bias);
  }
  return {};
}

int32_t greedy_argmax(const float* x, int32_t n) {
  // Eight independent running maxima break the compare chain (4-5x faster over a 128k
  // vocabulary); ties resolve to the lowest index, as a plain scan would.
  constexpr int kLanes = 8;
  float best[kLanes];
  int32_t at[kLanes];
  for (int k = 0; k < kLanes; ++k) {
    best[k] = -std::numeric_limits<float>::infinity();
    at[k] = -1;
  }
  int32_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int k = 0; k < kLanes; ++k)
      if (x[i + k] > best[k]) {
        best[k] = x[i + k];
        at[k] = i + k;
      }
  int32_t chosen = 0;
  float top = -std::numeric_limits<float>::infinity();
  bool found = false;
  for (int k = 0; k < kLanes; ++k)
    if (at[k] >= 0 && (!found || best[k] > top || (best[k] == top && at[k] < chosen))) {
      top = best[k];
      chosen = at[k];
      found = true;
    }
  // The tail compares against -inf when nothing was found: NaN and -inf never win.
  for (; i < n; ++i)
    if (x[i] > top) {
      top = x[i];
      chosen = i;
    }
  return chosen;
}

SampledToken logprobs_of(std::span<const float> logits, int32_t token, int32_t top_n, bool with_rank) {
  // log-sum-exp in double: vocabularies of 150k entries lose digits in float.
  float mx = -std::numeric_limits<float>::infinity();
  for (float x : logits) mx = std::max(mx, x);
  double sum = 0;
  for (float x : logits) sum += std::exp(double(x) - mx);
  const double lse = double(mx) + std::log(sum);
  SampledToken out;
  out.token = token;
  out.logprob = float(double(logits[size_t(token)]) - lse);
  if (with_rank) {
    out.rank = 1;
    for (float x : logits) out.rank += x > logits[size_t(token)];
  }
  if (top_n > 0) {
    int32_t n = std::min<int32_t>(top_n, int32_t(logits.size()));
    std::vector<int32_t> idx(logits.size());
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = int32_t(i);
    auto better = [&](int32_t a, int32_t b) {
      return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
    };
    std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), better);
    for (int32_t i = 0; i < n; ++i)
      out.top.push_back({idx[size_t(i)], float(double(logits[size_t(idx[size_t(i)])]) - lse)});
  }
  return out;
}

Sampler::Sampler(const SamplingParams& params, uint64_t seed) : params_(params), rng_(seed) {}

void Sampler::add_context(std::span<const int32_t> tokens) {
  if (params_.repetition_penalty == 1.0f) return;
  for (int32_t t : tokens) {
    if (t < 0) continue;
    if (size_t(t) >= seen_mask_.size()) seen_mask_.resize(size_t(t) + 1, 0);
    if (!seen_mask_[size_t(t)]) {
      seen_mask_[size_t(t)] = 1;
      seen_.push_back(t);
    }
  }
}

void Sampler::accept(int32_t token) {
  if (params_.presence_penalty != 0 || params_.frequency_penalty != 0) ++output_counts_[token];
  add_context(std::span<const int32_t>(&token, 1));
}

void Sampler::apply_penalties(std::span<float> logits) const {
  const int64_t v = int64_t(logits.size());
  for (const auto& [t, bias] : params_.logit_bias)
    if (t < v) logits[size_t(t)] += bias;
  if (params_.repetition_penalty != 1.0f) {
    const float p = params_.repetition_penalty;
    for (int32_t t : seen_) {
      if (t >= v) continue;
      float& l = logits[size_t(t)];
      l = l > 0 ? l / p : l * p;
    }
  }
  for (auto [t, count] : output_counts_) {
    if (t < 0 || t >= v) continue;
    logits[size_t(t)] -= float(count) * params_.frequency_penalty + params_.presence_penalty;
  }
}

// 53 random bits -> [0, 1); std::uniform_real_distribution is implementation-defined,
// and the same seed must give the same tokens on every build.
double Sampler::uniform() { return double(rng_() >> 11) * 0x1.0p-53; }

template <typename Value, typename Id>
int32_t Sampler::draw(int32_t n, Value value, Id id) {
  const float inv_t = 1.0f / params_.temperature;
  float mx = -std::numeric_limits<float>::infinity();
  for (int32_t i = 0; i < n; ++i) mx = std::max(mx, value(i));
  probs_.resize(size_t(n));
  double sum = 0;
  for (int32_t i = 0; i < n; ++i) {
    probs_[size_t(i)] = std::exp((value(i) - mx) * inv_t);
    sum += probs_[size_t(i)];
  }
  // min-p: relative to the most likely token, whose unnormalized weight is 1.
  if (params_.min_p > 0)
    for (int32_t i = 0; i < n; ++i)
      if (probs_[size_t(i)] < params_.min_p) {
        sum -= probs_[size_t(i)];
        probs_[size_t(i)] = 0;
      }
  // top-p over the sorted survivors: keep the smallest prefix reaching top_p.
  if (params_.top_p < 1.0f) {
    double acc = 0, limit = double(params_.top_p) * sum;
    int32_t keep = 0;
    while (keep < n) {
      acc += probs_[size_t(keep)];
      ++keep;
      if (acc >= limit) break;
    }
    n = keep;
    sum = acc;
  }
  double u = uniform() * sum, acc = 0;
  int32_t chosen = id(0);
  for (int32_t i = 0; i < n; ++i) {
    if (probs_[size_t(i)] <= 0) continue;
    acc += probs_[size_t(i)];
    chosen = id(i);
    if (u < acc) break;
  }
  return chosen;
}

SampledToken Sampler::sample(std::span<float> logits) {
  const int32_t v = int32_t(logits.size());
  KILN_CHECK(v > 0, "sampling from empty logits");
  std::vector<float> raw;
  if (params_.logprobs >= 0) raw.assign(logits.begin(), logits.end());
  apply_penalties(logits);

  int32_t chosen = 0;
  if (params_.greedy()) {
    chosen = greedy_argmax(logits.data(), v);
  } else {
    auto better = [&](int32_t a, int32_t b) {
      return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
    };
    idx_.resize(size_t(v));
    for (int32_t i = 0; i < v; ++i) idx_[size_t(i)] = i;
    int32_t n = v;
    bool sorted = false;
    if (params_.top_k > 0 && params_.top_k < v) {
      n = params_.top_k;
      std::partial_sort(idx_.begin(), idx_.begin() + n, idx_.end(), better);
      sorted = true;
    }
    if (params_.top_p < 1.0f && !sorted) std::sort(idx_.begin(), idx_.end(), better);
    chosen = draw(n, [&](int32_t i) { return logits[size_t(idx_[size_t(i)])]; },
                  [&](int32_t i) { return idx_[size_t(i)]; });
  }
  SampledToken out;
  if (params_.logprobs >= 0) out = logprobs_of(raw, chosen, params_.logprobs);
  out.token = chosen;
  accept(chosen);
  return out;
}

bool Sampler::samples_from_top(int32_t k, int32_t vocab) const {
  if (params_.repetition_penalty != 1.0f || params_.presence_penalty != 0 || params_.frequency_penalty != 0 ||
      !params_.logit_bias.empty())
    return false;
  if (k < 1 || params_.logprobs > k) return false;
  if (params_.greedy()) return true;
  return params_.top_k > 0 && params_.top_k <= k && params_.top_k < vocab;
}

int32_t Sampler::top_candidates_needed() const {
  return std::max({1, params_.greedy() ? 1 : params_.top_k, params_.logprobs});
}

SampledToken Sampler::sample(const TopLogits& top) {
  const int32_t k = int32_t(top.ids.size());
  KILN_CHECK(samples_from_top(k, top.vocab) && top.logits.size() == size_t(k) && top.logprobs.size() == size_t(k),
             "sampling from ", k, " top candidates of ", top.vocab, " that cannot give the whole row's result");
  int32_t chosen = 0;
  if (params_.greedy()) {
    // greedy_argmax: the lowest id of the largest value, 0 when every value is -inf or NaN.
    if (top.ids[0] >= 0 && top.logits[0] > -std::numeric_limits<float>::infinity()) chosen = top.ids[0];
  } else {
    chosen = draw(params_.top_k, [&](int32_t i) { return top.logits[size_t(i)]; },
                  [&](int32_t i) { return top.ids[size_t(i)]; });
  }
  SampledToken out;
  if (params_.logprobs >= 0) {
    // The chosen token is among the candidates, except greedy's token 0 of a row with
    // no number above -inf, where the row's log-sum-exp and so every log-prob is NaN.
    out.logprob = std::numeric_limits<float>::quiet_NaN();
    for (int32_t j = 0; j < k; ++j)
      if (top.ids[size_t(j)] == chosen) {
        out.logprob = top.logprobs[size_t(j)];
        break;
      }
    for (int32_t j = 0; j < std::min(params_.logprobs, k) && top.ids[size_t(j)] >= 0; ++j)
      out.top.push_back({top.ids[size_t(j)], top.logprobs[size_t(j)]});
  }
  out.token = chosen;
  accept(chosen);
  return out;
}

}  // namespace kiln
