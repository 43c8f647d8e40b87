// NgramDrafter and generate_greedy_lookup (see ngram_draft.h).
#include "runtime/ngram_draft.h"

#include <algorithm>
#include <array>

#include "core/status.h"

namespace kiln {

NgramDrafter::NgramDrafter(int32_t min_n, int32_t max_n) : min_n_(min_n), max_n_(max_n) {
  if (min_n < 1 || max_n < min_n || max_n > kMaxN)
    throw_error(ErrorCode::kInvalidArgument, "n-gram sizes must satisfy 1 <= min_n <= max_n <= ", kMaxN,
                ", got min_n ", min_n, ", max_n ", max_n);
  by_n_.resize(size_t(max_n - min_n + 1));
}

uint64_t NgramDrafter::hash_step(uint64_t h, int32_t token) {
  // splitmix64's finalizer over the running hash and the token.
  uint64_t x = h ^ (uint64_t(uint32_t(token)) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2));
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void NgramDrafter::index_ngrams_ending_at(int32_t end) {
  uint64_t h = 0;
  for (int32_t n = 1; n <= max_n_ && end - n + 1 >= 0; ++n) {
    h = hash_step(h, history_[size_t(end - n + 1)]);  // extended backwards: the suffix hashes alike
    if (n >= min_n_) by_n_[size_t(n - min_n_)][h] = end + 1;
  }
}

void NgramDrafter::append(int32_t token) {
  if (!history_.empty()) index_ngrams_ending_at(int32_t(history_.size()) - 1);
  history_.push_back(token);
}

void NgramDrafter::append(std::span<const int32_t> tokens) {
  for (int32_t t : tokens) append(t);
}

std::vector<int32_t> NgramDrafter::draft(int32_t k) const {
  last_n_ = 0;
  const int32_t size = int32_t(history_.size());
  if (k <= 0 || size < 2) return {};
  std::array<uint64_t, kMaxN + 1> suffix{};  // suffix[n]: the hash of the last n tokens
  uint64_t h = 0;
  for (int32_t n = 1; n <= max_n_ && n <= size; ++n) suffix[size_t(n)] = h = hash_step(h, history_[size_t(size - n)]);
  for (int32_t n = std::min(max_n_, size - 1); n >= min_n_; --n) {
    const auto& index = by_n_[size_t(n - min_n_)];
    auto it = index.find(suffix[size_t(n)]);
    if (it == index.end()) continue;
    const int32_t next = it->second;  // < size: only n-grams with a follower are indexed
    if (!std::equal(history_.begin() + (next - n), history_.begin() + next, history_.end() - n)) continue;
    last_n_ = n;
    const int32_t end = std::min(size, next + k);
    return {history_.begin() + next, history_.begin() + end};
  }
  return {};
}

namespace {

// The greedy token of every logit row of a step: from TopKLogits' ids (as
// LlmRunner::step_greedy) or whole rows; ties go to the lowest id either way.
std::vector<int32_t> step_argmax(LlmRunner& runner, std::span<const StepChunk> chunks, bool top_logits) {
  std::vector<int32_t> best;
  if (top_logits && runner.top_logits_k() > 0) {
    const StepTopLogits top = runner.run_chunks_top(chunks, 1);
    for (int64_t r = 0; r < top.ids.dim(0); ++r) best.push_back(top.ids.data_as<int32_t>()[r * top.k()]);
  } else {
    const Tensor logits = runner.run_chunks_logits(chunks);
    for (int64_t r = 0; r < logits.dim(0); ++r)
      best.push_back(argmax(logits.data_as<float>() + r * logits.dim(1), logits.dim(1)));
  }
  return best;
}

// Frees the decode's KvSequence however it ends.
struct KvRelease {
  KvCacheManager& kv;
  KvSequence& seq;
  ~KvRelease() { kv.free(seq); }
};

}  // namespace

LookupDecodeResult generate_greedy_lookup(LlmRunner& runner, std::span<const int32_t> prompt, int32_t max_tokens,
                                          std::span<const int32_t> stops, const LookupDecodeOptions& options,
                                          const std::function<void(int32_t)>& on_token) {
  if (prompt.empty()) throw_error(ErrorCode::kInvalidArgument, "empty prompt");
  if (options.num_draft < 0)
    throw_error(ErrorCode::kInvalidArgument, "drafts per step must be >= 0, got ", options.num_draft);
  if (options.max_step_tokens <= 0)
    throw_error(ErrorCode::kInvalidArgument, "max_step_tokens must be positive, got ", options.max_step_tokens);
  NgramDrafter drafter(options.min_n, options.max_n);
  drafter.append(prompt);
  LookupDecodeResult res;
  if (max_tokens <= 0) return res;

  KvCacheManager& kvm = runner.kv_manager();
  KvSequence kv;
  KvRelease release{kvm, kv};
  // Emits one token; true when decoding ends with it.
  auto emit = [&](int32_t token) {
    res.tokens.push_back(token);
    drafter.append(token);
    if (on_token) on_token(token);
    return std::find(stops.begin(), stops.end(), token) != stops.end() || int32_t(res.tokens.size()) >= max_tokens;
  };

  int32_t next = -1;
  for (size_t at = 0; at < prompt.size();) {
    const size_t n = size_t(std::min<int64_t>(options.max_step_tokens, int64_t(prompt.size() - at)));
    const bool last = at + n == prompt.size();
    const StepChunk chunk{&kv, prompt.subspan(at, n), last};
    if (last) next = step_argmax(runner, {&chunk, 1}, options.top_logits).at(0);
    else runner.run_chunks_logits({&chunk, 1});
    ++res.stats.prefill_steps;
    at += n;
  }
  if (emit(next)) return res;

  const int32_t max_positions = int32_t(runner.model().info().max_positions);
  std::vector<int32_t> fed;
  int32_t k = options.num_draft;  // this step's draft length (LookupDecodeOptions::adaptive)
  while (true) {
    // A step emits at most drafts + 1 tokens, and past the model's positions none at all
    // (the step then throws as plain decoding's would).
    const int32_t room = std::min(max_tokens - int32_t(res.tokens.size()) - 1, max_positions - kv.length - 1);
    std::vector<int32_t> drafts = drafter.draft(std::min(k, room));
    // Nor more KV blocks than are free: plain decoding, which may stop sooner, needs none
    // of those that drafts past its end would take.
    while (!drafts.empty() && kvm.blocks_needed(kv, int32_t(drafts.size()) + 1) > kvm.allocator().num_free())
      drafts.pop_back();
    fed.assign(1, next);
    fed.insert(fed.end(), drafts.begin(), drafts.end());
    const StepChunk chunk{&kv, fed, true, !drafts.empty()};
    const std::vector<int32_t> best = step_argmax(runner, {&chunk, 1}, options.top_logits);
    KILN_CHECK(best.size() == fed.size(), "a verification step of ", fed.size(), " tokens gave ", best.size(),
               " rows");
    size_t kept = 0;
    while (kept < drafts.size() && best[kept] == drafts[kept]) ++kept;
    ++res.stats.steps;
    if (options.adaptive && !drafts.empty()) k = next_draft_length(k, options.num_draft, kept == drafts.size());
    res.stats.drafted += int64_t(drafts.size());
    res.stats.accepted += int64_t(kept);
    // The K/V of the rejected drafts go; that of `next` and the kept drafts is what plain
    // decoding would have written.
    kvm.truncate(kv, kv.length - int32_t(drafts.size() - kept));
    for (size_t i = 0; i <= kept; ++i)
      if (emit(best[i])) return res;
    next = best[kept];
  }
}

}  // namespace kiln
