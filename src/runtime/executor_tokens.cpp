// Executor::Impl's handling of a step's rows (see executor_impl.h): sampled tokens joining
// their choices (stop ids and strings, grammars, limits), prompt logprobs, the n > 1 forks,
// and prompt-lookup drafts (ExecutorOptions::lookup_drafts): adding them to a planned step,
// taking them back out, and keeping those the model's own argmax confirms.
#include "runtime/executor_impl.h"

namespace kiln {

std::vector<std::vector<int32_t>> Executor::Impl::add_drafts(std::vector<ChunkPlan>& plan,
                                                             const std::vector<Choice*>& seqs) {
  std::vector<std::vector<int32_t>> out(plan.size());
  if (opt.lookup_drafts <= 0 || (opt.lookup_max_batch > 0 && int64_t(plan.size()) > opt.lookup_max_batch))
    return out;
  int64_t tokens = 0, spare = kv.allocator().num_free();
  for (size_t i = 0; i < plan.size(); ++i) {
    tokens += plan[i].tokens;
    spare -= kv.blocks_needed(seqs[i]->kv, plan[i].tokens);
  }
  const int64_t max_positions = model.info().max_positions;
  for (size_t i = 0; i < plan.size() && tokens < opt.max_step_tokens && spare >= 0; ++i) {
    Choice& c = *seqs[i];
    if (plan[i].tokens != 1 || c.pending() != 1 || c.finished || !drafts_eligible(c)) continue;
    if (c.draft_len == 0) c.draft_len = opt.lookup_drafts;
    const int64_t room = std::min({int64_t(c.draft_len), int64_t(c.req->req.max_tokens) - c.generated - 1,
                                   max_positions - c.kv.length - 1, opt.max_step_tokens - tokens});
    if (room <= 0) continue;
    if (!c.drafter) c.drafter = std::make_unique<NgramDrafter>(opt.lookup_min_n, opt.lookup_max_n);
    for (size_t h = c.drafter->history().size(); h < c.tokens.size(); ++h) c.drafter->append(c.tokens[h]);
    std::vector<int32_t> d = c.drafter->draft(int32_t(room));
    const int32_t plain = kv.blocks_needed(c.kv, 1);
    auto extra = [&] { return kv.blocks_needed(c.kv, 1 + int32_t(d.size())) - plain; };
    while (!d.empty() && extra() > spare) d.pop_back();
    if (d.empty()) continue;
    spare -= extra();
    tokens += int64_t(d.size());
    plan[i].tokens += int32_t(d.size());
    c.tokens.insert(c.tokens.end(), d.begin(), d.end());
    out[i] = std::move(d);
  }
  return out;
}

void Executor::Impl::drop_drafts(const std::vector<Choice*>& seqs,
                                 const std::vector<std::vector<int32_t>>& drafts, bool failed) {
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (drafts[i].empty()) continue;
    Choice& c = *seqs[i];
    c.tokens.resize(c.tokens.size() - drafts[i].size());
    if (failed && c.kv.length > int32_t(c.tokens.size())) kv.truncate(c.kv, int32_t(c.tokens.size()));
  }
}

void Executor::Impl::take_drafted(Choice& c, std::span<const int32_t> d, const std::function<Row(int64_t)>& row_at,
                  int64_t first_row) {
  if (c.finished) return;
  const int32_t fed_at = int32_t(c.tokens.size()) - 1;  // the position of the token fed before them
  KILN_CHECK(c.kv.length == fed_at + 1 + int32_t(d.size()), "a draft chunk grew its sequence to ", c.kv.length,
             " positions, expected ", fed_at + 1 + int32_t(d.size()));
  // Sampling is free of side effects for the argmax samplers that drafts are for.
  std::vector<SampledToken> out;
  for (size_t j = 0; j <= d.size(); ++j) {
    out.push_back(sample(c, row_at(first_row + int64_t(j))));
    if (j == d.size() || out.back().token != d[j]) break;
  }
  const int32_t kept = int32_t(out.size()) - 1;
  kv.truncate(c.kv, fed_at + 1 + kept);
  spec_drafted += int64_t(d.size());
  if (opt.lookup_adaptive) c.draft_len = next_draft_length(c.draft_len, opt.lookup_drafts, kept == int32_t(d.size()));
  int32_t taken = 0;
  for (; taken < int32_t(out.size()) && !c.finished; ++taken) {
    if (c.kv.length > fed_at + 2 + taken) kv.truncate(c.kv, fed_at + 2 + taken);
    take_token(c, std::move(out[size_t(taken)]));
  }
  spec_accepted += std::min(kept, taken);
  if (!c.finished && opt.prefix_caching) c.cached_blocks = prefix.insert(c.kv, c.tokens, c.cached_blocks);
}

void Executor::Impl::take_prompt_logprobs(Choice& c, const Tensor& logits, int64_t row, int32_t start, int32_t n) {
  Request& r = *c.req;
  const auto& prompt = r.req.prompt;
  const int64_t vocab = logits.dim(1);
  const int32_t first = std::max(r.prompt_lp_next - 1, start);
  const int32_t last = std::min<int32_t>(start + n, int32_t(prompt.size()) - 1);  // positions [first, last)
  if (first >= last) return;
  std::vector<SampledToken> lp(size_t(last - first));
  auto rows = [&](int64_t b, int64_t e, int) {
    for (int64_t k = b; k < e; ++k) {
      const int32_t q = first + int32_t(k);
      const float* x = logits.data_as<float>() + (row + q - start) * vocab;
      lp[size_t(k)] = logprobs_of(std::span<const float>(x, size_t(vocab)), prompt[size_t(q + 1)],
                                  r.req.prompt_logprobs, /*with_rank=*/true);
    }
  };
  if (lp.size() >= 4) ThreadPool::global().parallel_for(int64_t(lp.size()), rows);
  else rows(0, int64_t(lp.size()), 0);
  auto& out = r.update.prompt_logprobs;
  out.insert(out.end(), std::make_move_iterator(lp.begin()), std::make_move_iterator(lp.end()));
  r.prompt_lp_next = last + 1;
}

void Executor::Impl::fork_choices(Choice& parent, const Row& row) {
  Request& r = *parent.req;
  r.forked = true;
  for (int32_t i = 1; i < r.req.n; ++i) {
    auto c = std::make_unique<Choice>();
    c->req = &r;
    c->key = next_key++;
    c->kv = kv.fork(parent.kv);
    c->tokens = parent.tokens;
    c->cached_blocks = parent.cached_blocks;
    init_choice(*c, i);
    Choice* raw = c.get();
    r.choices.push_back(std::move(c));
    ++r.unfinished;
    start_running(raw);
    if (row.full.empty()) {
      take_token(*raw, sample(*raw, row));
    } else {
      std::vector<float> l(row.full.begin(), row.full.end());
      take_token(*raw, sample(*raw, Row{std::span<float>(l), {}}));
    }
  }
}

void Executor::Impl::take_token(Choice& c, SampledToken&& st) {
  Request& r = *c.req;
  if (c.grammar_too_costly)
    return fail_request(r, str_cat("the grammar is too ambiguous to constrain decoding with (a token mask took more "
                                   "than ", GrammarTokenMask::kMaxMaskWork, " parse-stack steps); simplify it"));
  const int32_t token = st.token;
  // The mask left no token (the draw fell back to one): nothing continues the document.
  if (c.grammar && !(c.grammar->complete() && is_stop_id(r, token))) {
    const std::string& piece = vocab_trie->piece(token);
    if (piece.empty() || !c.grammar->accept(piece)) {
      log_warn("executor: request ", r.id, ": no token continues its grammar's document; ending it there");
      return finish_choice(c, FinishReason::kStop);
    }
  }
  c.tokens.push_back(token);
  ++c.generated;
  ++generated;
  ChoiceUpdate& u = r.choice_update(c.index);
  u.tokens.push_back(token);
  if (r.req.sampling.logprobs >= 0) u.logprobs.push_back(std::move(st));
  if (is_stop_id(r, token)) return finish_choice(c, FinishReason::kStop);
  if (c.detok) {
    u.text += c.stops.put(c.detok->put(token));
    if (c.stops.matched()) return finish_choice(c, FinishReason::kStop);
  }
  if (c.grammar && c.grammar->complete() && !c.grammar->can_continue()) return finish_choice(c, FinishReason::kStop);
  if (c.generated >= r.req.max_tokens || int64_t(c.tokens.size()) >= model.info().max_positions)
    return finish_choice(c, FinishReason::kLength);
}

}  // namespace kiln
