// Prompt-lookup (n-gram) speculative decoding, as HF transformers' prompt_lookup_num_tokens
// and llama.cpp's llama-lookup: drafts are the tokens that followed the most recent earlier
// occurrence of the history's last n tokens, and one greedy step verifies them all. The
// output is plain greedy decoding's: a draft is kept only where it equals the model's own
// argmax. Tested in tests/runtime/ngram_draft_test.cpp (the drafter) and
// tests/runtime/lookup_decode_test.cpp (against LlmRunner::generate_greedy).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <unordered_map>
#include <vector>

#include "runtime/llm_runner.h"

namespace kiln {

// Proposes drafts from a token history (prompt + generated so far). Each n-gram size keeps
// an index from n-gram to the position that followed its most recent occurrence, updated as
// tokens are appended (O(max_n^2) per token), so a draft costs O(max_n + k), not a rescan.
class NgramDrafter {
 public:
  static constexpr int32_t kMaxN = 16;
  // Tries n = max_n down to min_n (1 <= min_n <= max_n <= kMaxN); the first match wins.
  explicit NgramDrafter(int32_t min_n = 1, int32_t max_n = 3);

  void append(int32_t token);
  void append(std::span<const int32_t> tokens);

  // Up to k tokens that followed the most recent earlier occurrence of the history's last
  // n tokens (the largest n that has one), stopping at the history's end; none when no
  // n-gram of the suffix occurred before, or k <= 0.
  std::vector<int32_t> draft(int32_t k) const;
  // The n of the last draft() that matched (0: none), for tests and logs.
  int32_t last_match_n() const { return last_n_; }

  const std::vector<int32_t>& history() const { return history_; }

 private:
  // Why the index lags one token: the n-grams ending at the last position are the suffix
  // itself, whose occurrence has no continuation yet. Recording an n-gram only once a token
  // follows it keeps "most recent earlier occurrence" a single lookup.
  void index_ngrams_ending_at(int32_t end);
  static uint64_t hash_step(uint64_t h, int32_t token);

  int32_t min_n_, max_n_;
  std::vector<int32_t> history_;
  // by_n_[n - min_n_]: hash of an n-gram -> the position right after its latest occurrence.
  // A hash collision only costs a draft: draft() compares the tokens themselves.
  std::vector<std::unordered_map<uint64_t, int32_t>> by_n_;
  mutable int32_t last_n_ = 0;
};

// The most drafts a step takes in `kiln generate --lookup` and `kiln serve --lookup`.
constexpr int32_t kMaxLookupDrafts = 64;

// Transformers' assisted-generation "heuristic" schedule for the next step's draft length:
// back up to max_k (by 2) after a step that kept all of its drafts, down by 1 (to 1)
// otherwise, so that text which is not being copied wastes fewer draft rows.
inline int32_t next_draft_length(int32_t k, int32_t max_k, bool kept_all) {
  return kept_all ? (k + 2 < max_k ? k + 2 : max_k) : (k > 1 ? k - 1 : 1);
}

struct LookupDecodeOptions {
  int32_t num_draft = 4;  // at most k drafts a step; 0: one token a step, plain greedy
  // The n-gram sizes matched (NgramDrafter). Why not from 1: a one-token match drafts on
  // free text too, where few hold, and on the CPU backend each draft row costs ~30% of a
  // one-token step (SmolLM2-135M: free text 3.9 -> 5.4-7.2 ms/token at min_n 1, ~3.9 at 2).
  int32_t min_n = 2, max_n = 3;
  // The draft length starts at num_draft and follows next_draft_length.
  bool adaptive = true;
  // Each row's argmax from the model's TopKLogits outputs when it has them (only ids cross
  // from a GPU), else from whole logits rows; where rows are already in host memory (the
  // CPU backend) whole rows are cheaper: TopKLogits also computes log-probabilities.
  bool top_logits = true;
  int64_t max_step_tokens = 2048;  // the prompt is prefilled in chunks of at most this
};

struct LookupDecodeStats {
  int64_t prefill_steps = 0;
  int64_t steps = 0;     // decode steps after the prefill
  int64_t drafted = 0;   // draft tokens fed to verification steps (k of a step: see adaptive)
  int64_t accepted = 0;  // drafts that equalled the model's argmax
  double acceptance() const { return drafted > 0 ? double(accepted) / double(drafted) : 0.0; }
};

struct LookupDecodeResult {
  std::vector<int32_t> tokens;  // as generate_greedy: the stop token, when met, ends it
  LookupDecodeStats stats;
};

// Greedy decoding of `prompt` for at most max_tokens tokens, stopping after a token of
// `stops`, with prompt-lookup drafts verified a step at a time on a KvSequence of its own
// from runner.kv_manager() (freed on return or throw; the runner's own sequences are left
// alone). Each step feeds [last token] + drafts, takes every row's argmax, keeps the drafts
// up to the first that differs, emits that row's argmax (or the bonus row's when all were
// kept) and truncates the KV cache to what was kept. Drafts are clipped so that a step never
// emits past max_tokens, feeds past the model's positions or takes more KV blocks than
// are free. on_token (may be empty) sees each token as it is emitted, the stop
// token included. Throws as LlmRunner::run_chunks does (kOutOfMemory, kOutOfRange).
// The tokens are generate_greedy's where a step's rows do not depend on its row count (the
// CPU backend, tested); on CUDA a verify step of more than one row runs other GEMM kernels
// than a one-token step, whose rounding can turn a near-tie (measured on random-weight
// GPT-2 and TinyLlama shapes: the outputs part after a few dozen tokens).
LookupDecodeResult generate_greedy_lookup(LlmRunner& runner, std::span<const int32_t> prompt, int32_t max_tokens,
                                          std::span<const int32_t> stops, const LookupDecodeOptions& options,
                                          const std::function<void(int32_t)>& on_token = {});

}  // namespace kiln
