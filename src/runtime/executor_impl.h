// Executor's internals (see executor.h): the request, choice and loop state that the
// executor thread alone touches, with admission, scheduling and the step. Shared by
// executor.cpp (the thread-safe shell and its threads) and executor_tokens.cpp (sampled
// tokens, prompt logprobs, n > 1 forks and prompt-lookup drafts). Not an API.
#pragma once

#include <algorithm>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/log.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "runtime/executor.h"
#include "runtime/grammar.h"
#include "runtime/kv_cache/prefix_cache.h"
#include "runtime/kv_cache/session_store.h"
#include "runtime/kv_cache/swap_space.h"
#include "runtime/model_tokenizer.h"
#include "runtime/ngram_draft.h"
#include "runtime/sampling_stop.h"
#include "tokenizer/tokenizer.h"

namespace kiln {

struct Executor::Choice {
  Request* req = nullptr;
  int32_t index = 0;
  int64_t key = 0;
  KvSequence kv;
  std::vector<int32_t> tokens;  // prompt + generated; the first kv.length are computed
  int32_t generated = 0;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<tok::StreamDecoder> detok;
  StopStringMatcher stops;
  int32_t cached_blocks = 0;  // full blocks already offered to the prefix cache
  SwappedKv swapped;          // preempted by swap: where its KV waits (kv is empty then)
  std::optional<GrammarState> grammar;  // GenerationRequest::grammar: the document so far ...
  std::shared_ptr<GrammarTokenMask> grammar_mask;  // ... and its grammar's mask
  bool grammar_too_costly = false;  // a mask went past GrammarTokenMask::kMaxMaskWork
  // ExecutorOptions::lookup_drafts: the n-gram index of `tokens`, made at the first draft
  // and brought up to date before each (tokens only ever grow between steps).
  std::unique_ptr<NgramDrafter> drafter;
  int32_t draft_len = 0;  // the next step's draft length (next_draft_length); 0: lookup_drafts
  bool finished = false;
  FinishReason reason = FinishReason::kNone;
  int32_t pending() const { return int32_t(tokens.size()) - kv.length; }
};

struct Executor::Request {
  uint64_t id = 0;
  GenerationRequest req;
  // Shared with the updates in flight to the emitter thread, which may call it after
  // the request has ended here.
  std::shared_ptr<UpdateCallback> cb;
  int64_t arrival = 0;
  uint64_t seed = 0;
  std::vector<std::unique_ptr<Choice>> choices;
  bool forked = false;
  bool admitted_once = false;
  int32_t prompt_lp_next = 1;  // the next prompt token whose logprob is due
  // Prompt logprobs still to compute: the prompt's KV may not come from caches until then.
  bool prompt_lp_due() const { return req.prompt_logprobs >= 0 && prompt_lp_next < int32_t(req.prompt.size()); }
  int32_t cached_tokens = 0;
  int32_t unfinished = 1;
  RequestUpdate update;  // collected during a loop turn, sent at its end
  std::string error;
  ChoiceUpdate& choice_update(int32_t index) {
    for (auto& c : update.choices)
      if (c.index == index) return c;
    update.choices.push_back({});
    update.choices.back().index = index;
    return update.choices.back();
  }
};

struct Executor::Impl {
  Impl(Model& m, const tok::Tokenizer* t, const ExecutorOptions& o)
      : model(m), tokenizer(t), opt(o), runner(m, runner_options(m, o)), kv(runner.kv_manager()),
        prefix(kv), sessions(kv, o.session_idle_timeout, o.max_sessions) {
    if (!runner.decode_buckets().empty() && o.warm_decode) {
      const auto t0 = Clock::now();
      const int64_t n = runner.warm_decode_buckets(o.max_running) + runner.warm_prefill_sizes();
      log_info("decode steps padded to ", runner.decode_buckets().size(), " batch sizes up to ",
               runner.decode_buckets().back(), "; ", n, " warm-up steps (those and prefills of 2 to ",
               o.max_step_tokens, " tokens) in ", since(t0), " s");
    }
    if (tokenizer) {
      model_stops = tokenizer->stop_ids();
      // The vocabulary's byte trie is built beside the first steps, so that the first
      // constrained request does not stall every stream for it (16 ms for 49k tokens on 2
      // cores).
      vocab_trie_future = std::async(std::launch::async, [t = tokenizer] {
                            return std::make_shared<const TokenTrie>(token_pieces(*t));
                          }).share();
    }
    if (model.info().eos_token_id >= 0) model_stops.push_back(int32_t(model.info().eos_token_id));
    if (opt.preemption == PreemptionMode::kSwap) {
      swap = std::make_unique<KvSwapSpace>(kv, *kv.storage(), size_t(opt.swap_space_bytes));
      log_info("preemption by swap: ", swap->num_slots(), " host blocks of ", swap->slot_bytes(), " bytes");
      if (swap->num_slots() < kv.allocator().num_blocks() / 8)
        log_warn("the swap space holds ", swap->num_slots(), " blocks (", swap->slot_bytes(),
                 " bytes each), little next to the pool's ", kv.allocator().num_blocks(),
                 ": most preemptions will recompute (raise --swap-space-mib)");
    }
  }
  ~Impl() {
    // Sequences first: their blocks may be shared with the caches.
    for (auto& [id, r] : requests)
      for (auto& c : r->choices) {
        kv.free(c->kv);
        if (swap) swap->release(c->swapped);
      }
    sessions.clear();
    prefix.clear();
  }
  static bool padded(Model& m, const ExecutorOptions& o) {
    return o.decode_padding == DecodePadding::kOn ||
           (o.decode_padding == DecodePadding::kAuto && m.compiled().captures_steps());
  }
  static LlmRunnerOptions runner_options(Model& m, const ExecutorOptions& o) {
    LlmRunnerOptions r;
    if (padded(m, o)) r.decode_buckets = decode_row_buckets(o.max_running);
    r.block_size = o.block_size;
    r.max_total_tokens = o.kv_tokens;
    r.max_step_tokens = o.max_step_tokens;
    r.kv_cache_fraction = o.kv_cache_fraction;
    r.device_memory = o.device_memory;
    return r;
  }

  Model& model;
  const tok::Tokenizer* tokenizer;
  ExecutorOptions opt;
  LlmRunner runner;
  KvCacheManager& kv;
  PrefixCache prefix;
  SessionStore sessions;
  std::unique_ptr<KvSwapSpace> swap;  // PreemptionMode::kSwap only
  std::vector<int32_t> model_stops;
  // Grammar-constrained choices: the vocabulary's byte trie (built in the background from the
  // start, taken at the first one) and a mask per grammar, which keeps the allowed sets of the
  // states it met for later requests with the same grammar (the server compiles each schema
  // once).
  std::shared_future<std::shared_ptr<const TokenTrie>> vocab_trie_future;
  std::shared_ptr<const TokenTrie> vocab_trie;
  std::map<const Grammar*, std::shared_ptr<GrammarTokenMask>> grammar_masks;
  static constexpr size_t kMaxGrammarMasks = 16;  // at most 16 x GrammarTokenMask::kMaxCacheBytes
  std::map<uint64_t, std::unique_ptr<Request>> requests;
  std::vector<Choice*> waiting, running;
  int64_t next_key = 0;
  int64_t preemptions = 0, steps = 0, step_tokens = 0, generated = 0, last_batch = 0, top_steps = 0;
  int64_t running_peak = 0;    // the most sequences in `running` at once
  int64_t swap_fallbacks = 0;  // swap-mode preemptions that recomputed
  int64_t spec_drafted = 0, spec_accepted = 0;  // ExecutorOptions::lookup_drafts
  int64_t finished = 0, cancelled = 0, failed = 0;
  double schedule_s = 0, engine_s = 0, sample_s = 0;
  using Clock = std::chrono::steady_clock;
  static double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

  bool has_work() const { return !waiting.empty() || !running.empty(); }

  // ---- request lifecycle -------------------------------------------------------

  void accept(std::unique_ptr<Request> r) {
    auto c = std::make_unique<Choice>();
    c->req = r.get();
    c->key = next_key++;
    c->tokens = r->req.prompt;
    init_choice(*c, 0);
    r->update.id = r->id;
    r->update.prompt_tokens = int32_t(r->req.prompt.size());
    waiting.push_back(c.get());
    r->choices.push_back(std::move(c));
    requests[r->id] = std::move(r);
  }

  void init_choice(Choice& c, int32_t index) {
    const Request& r = *c.req;
    c.index = index;
    c.sampler = std::make_unique<Sampler>(r.req.sampling, r.seed + uint64_t(index));
    c.sampler->add_context(r.req.prompt);
    if (tokenizer) c.detok = std::make_unique<tok::StreamDecoder>(*tokenizer);
    c.stops = StopStringMatcher(r.req.stop);
    // json_object is the grammar of the JSON Schema {"type": "object"}: any one object.
    static const std::shared_ptr<const Grammar> kAnyObject =
        grammar_from_json_schema(nlohmann::ordered_json{{"type", "object"}});
    const std::shared_ptr<const Grammar>& g = r.req.grammar ? r.req.grammar : r.req.json_object ? kAnyObject : nullptr;
    if (g && tokenizer) {
      c.grammar.emplace(g);
      c.grammar_mask = grammar_mask(g);
    }
  }

  std::shared_ptr<GrammarTokenMask> grammar_mask(const std::shared_ptr<const Grammar>& g) {
    if (!vocab_trie) vocab_trie = vocab_trie_future.get();
    auto it = grammar_masks.find(g.get());
    if (it != grammar_masks.end()) return it->second;
    if (grammar_masks.size() >= kMaxGrammarMasks)  // drop those no running choice holds
      std::erase_if(grammar_masks, [](const auto& kv) { return kv.second.use_count() == 1; });
    // The mask holds its grammar, so the key cannot be reused by another grammar meanwhile.
    auto mask = std::make_shared<GrammarTokenMask>(g, vocab_trie);
    grammar_masks.emplace(g.get(), mask);
    return mask;
  }

  void drop_from(std::vector<Choice*>& v, Choice* c) { std::erase(v, c); }

  // Gives a sequence's KV back: to its session (kept for the next turn) or to the pool,
  // offering its full blocks to the prefix cache first.
  void release_kv(Choice& c, bool keep_session) {
    if (opt.prefix_caching) c.cached_blocks = prefix.insert(c.kv, c.tokens, c.cached_blocks);
    if (keep_session) {
      std::vector<int32_t> computed(c.tokens.begin(), c.tokens.begin() + c.kv.length);
      sessions.put(c.req->req.session_id, std::move(c.kv), std::move(computed),
                   SessionStore::Clock::now());
      c.kv = {};
    } else {
      kv.free(c.kv);
    }
    c.cached_blocks = 0;
  }

  void finish_choice(Choice& c, FinishReason reason) {
    if (c.finished) return;
    Request& r = *c.req;
    ChoiceUpdate& u = r.choice_update(c.index);
    if (c.detok && (reason == FinishReason::kStop || reason == FinishReason::kLength) &&
        !c.stops.matched()) {
      u.text += c.stops.put(c.detok->flush());
      u.text += c.stops.flush();
    }
    u.finish = reason;
    c.finished = true;
    c.reason = reason;
    drop_from(running, &c);
    drop_from(waiting, &c);
    bool keep = !r.req.session_id.empty() && c.index == 0 && reason != FinishReason::kError &&
                c.kv.length > 0;
    release_kv(c, keep);
    if (swap) swap->release(c.swapped);  // swapped out and never resumed (cancelled)
    --r.unfinished;
  }

  void fail_request(Request& r, const std::string& message) {
    if (r.error.empty()) r.error = message;
    for (auto& c : r.choices) finish_choice(*c, FinishReason::kError);
  }

  void cancel(uint64_t id) {
    auto it = requests.find(id);
    if (it == requests.end()) return;
    for (auto& c : it->second->choices) finish_choice(*c, FinishReason::kCancelled);
  }

  void cancel_all() {
    for (auto& [id, r] : requests)
      for (auto& c : r->choices) finish_choice(*c, FinishReason::kCancelled);
  }

  // Sends the turn's updates; returns how many requests ended.
  // The updates collected this loop turn, for the emitter thread to deliver, and how many
  // requests they end.
  struct Delivery {
    std::shared_ptr<UpdateCallback> cb;
    RequestUpdate update;
  };
  struct Batch {
    std::vector<Delivery> deliveries;
    int64_t ended = 0;
  };
  Batch flush_updates() {
    Batch b;
    int64_t& ended = b.ended;
    for (auto it = requests.begin(); it != requests.end();) {
      Request& r = *it->second;
      bool done = r.unfinished == 0;
      if (!done && r.update.choices.empty()) {
        ++it;
        continue;
      }
      RequestUpdate u = std::move(r.update);
      r.update = {};
      r.update.id = r.id;
      r.update.prompt_tokens = u.prompt_tokens;
      u.done = done;
      u.cached_tokens = r.cached_tokens;
      if (done) {
        u.error = r.error;
        int32_t total = 0;
        bool any_cancel = false;
        for (auto& c : r.choices) {
          total += c->generated;
          any_cancel |= c->reason == FinishReason::kCancelled;
        }
        u.completion_tokens = total;
        if (!r.error.empty()) ++failed;
        else if (any_cancel) ++cancelled;
        else ++finished;
      }
      b.deliveries.push_back({r.cb, std::move(u)});
      if (done) {
        it = requests.erase(it);
        ++ended;
      } else {
        ++it;
      }
    }
    return b;
  }

  // ---- scheduling --------------------------------------------------------------

  SchedSeq sched_of(const Choice& c) const {
    SchedSeq s;
    s.key = c.key;
    s.priority = c.req->req.priority;
    s.arrival = c.req->arrival;
    s.pending = c.pending();
    s.decoding = c.generated > 0 && c.pending() == 1;
    s.slots = slots_of(c);
    return s;
  }

  // Running slots a sequence takes against max_running: n for the choice of an n > 1
  // request that has not forked yet (its other choices join it once the prompt is
  // prefilled, so they are counted when it is admitted, as vLLM counts a sequence group's
  // n sequences against max_num_seqs), else 1.
  static int32_t slots_of(const Choice& c) { return c.req->forked ? 1 : c.req->req.n; }

  int32_t running_slots() const {
    int32_t taken = 0;
    for (const Choice* c : running) taken += slots_of(*c);
    return taken;
  }

  void start_running(Choice* c) {
    running.push_back(c);
    running_peak = std::max(running_peak, int64_t(running.size()));
  }

  Choice* by_key(const std::vector<Choice*>& v, int64_t key) const {
    for (Choice* c : v)
      if (c->key == key) return c;
    return nullptr;
  }

  bool session_eligible(const Choice& c) const {
    return !c.req->req.session_id.empty() && c.index == 0 && !c.req->admitted_once && !c.req->prompt_lp_due();
  }

  // Blocks a waiting sequence will take: all its tokens minus those it can reuse, plus
  // one for a copy-on-write of a shared partial block.
  int32_t blocks_to_admit(const Choice& c) const {
    const int32_t bs = kv.block_size();
    const int32_t len = int32_t(c.tokens.size());
    int32_t reused = 0;
    if (session_eligible(c)) reused = sessions.peek(c.req->req.session_id, c.tokens) / bs;
    const int32_t reusable = c.swapped.empty() ? (len - 1) / bs : c.swapped.length / bs;
    if (reused == 0 && opt.prefix_caching && !c.req->prompt_lp_due()) reused = prefix.peek(c.tokens, reusable);
    return (len + bs - 1) / bs - reused + 1;
  }

  // Attaches reusable KV (session, else prefix cache) to a sequence being admitted.
  void attach_kv(Choice& c) {
    Request& r = *c.req;
    if (c.kv.length == 0 && session_eligible(c)) c.kv = sessions.take(r.req.session_id, c.tokens);
    if (c.kv.length == 0 && c.kv.blocks.empty() && opt.prefix_caching && !r.prompt_lp_due()) {
      const int32_t len = int32_t(c.tokens.size());
      c.kv = prefix.match(c.tokens, (len - 1) / kv.block_size());
    }
    if (!r.admitted_once) r.cached_tokens = c.kv.length;
    r.admitted_once = true;
    c.cached_blocks = c.kv.length / kv.block_size();
  }

  // Under the priority policy a waiting sequence that does not fit displaces running
  // ones less important than itself (recomputed later), then admission runs again.
  void admit() {
    admit_fitting();
    if (opt.policy != SchedulePolicy::kPriority) return;
    for (size_t guard = running.size(); guard > 0 && !waiting.empty() && !running.empty(); --guard) {
      std::vector<SchedSeq> w, r;
      for (Choice* c : waiting) w.push_back(sched_of(*c));
      for (Choice* c : running) r.push_back(sched_of(*c));
      sched_sort(w, opt.policy);
      int64_t victim = preemption_victim(r, opt.policy);
      if (!priority_displaces(w.front(), *std::find_if(r.begin(), r.end(), [&](const SchedSeq& x) {
            return x.key == victim;
          })))
        return;
      preempt(*by_key(running, victim));
      admit_fitting();
    }
  }

  void admit_fitting() {
    if (waiting.empty()) return;
    std::vector<SchedSeq> w;
    for (Choice* c : waiting) {
      SchedSeq s = sched_of(*c);
      s.blocks_needed = blocks_to_admit(*c);
      w.push_back(s);
    }
    sched_sort(w, opt.policy);
    int64_t reserved = 0;
    for (Choice* c : running) reserved += kv.blocks_needed(c->kv, c->pending());
    int64_t avail = int64_t(kv.allocator().num_free()) + prefix.num_evictable() +
                    sessions.num_reclaimable() - reserved;
    std::vector<int64_t> keys = capacity_admit(w, avail, opt.max_running - running_slots());
    // Nothing running and the head still does not fit: admit it anyway; submit() made
    // sure it fits the pool alone (and that its n is within max_running), and planning
    // reclaims caches for it.
    if (keys.empty() && running.empty()) keys.push_back(w.front().key);
    for (int64_t key : keys) {
      Choice* c = by_key(waiting, key);
      // A swapped-out sequence takes its blocks now. When the pool cannot give them yet
      // (the capacity estimate counts cached blocks it may not get) it keeps its place
      // and no one is admitted past it this turn; with nothing running, nothing would
      // ever free them, so it is recomputed instead.
      if (!c->swapped.empty() && !swap_in(*c)) {
        if (!running.empty()) break;
        swap->release(c->swapped);
        ++swap_fallbacks;
      }
      drop_from(waiting, c);
      attach_kv(*c);
      start_running(c);
    }
  }

  // Swap mode copies the victim's KV to host slots first; without room there it is
  // recomputed like in recompute mode.
  //
  // Shared blocks: every block of the sequence is copied, its own and those it shares
  // (a prompt prefix from the prefix cache, the prompt of its n > 1 siblings), and all
  // its references are dropped, exactly as a recompute preemption drops them (full
  // blocks are offered to the prefix cache first). The host copy alone can then restore
  // the sequence, whatever the cache evicts or the siblings do meanwhile; the reference
  // counts of blocks it shared are left to their other holders. Sharing is restored on
  // the way back: swap_in() takes the leading full blocks the prefix cache still holds
  // (the same tokens at the same positions, hence the same K/V) and copies in only the
  // rest. Copying only exclusive blocks while keeping references to the shared ones
  // would free less memory, the purpose of preempting, and would pin blocks the cache
  // could otherwise evict.
  void preempt(Choice& c) {
    if (swap && !c.kv.blocks.empty() && c.kv.length > 0) {
      if (!swap->swap_out(c.kv, c.swapped)) ++swap_fallbacks;
    }
    release_kv(c, false);
    drop_from(running, &c);
    waiting.push_back(&c);
    ++preemptions;
  }

  // A swapped-out sequence resumes: leading full blocks still in the prefix cache are
  // re-shared, the rest come back from the host into fresh blocks (reclaiming cached
  // blocks and sessions for them). False, changing nothing, when the pool cannot give
  // them now.
  bool swap_in(Choice& c) {
    const int32_t bs = kv.block_size();
    if (opt.prefix_caching) c.kv = prefix.match(c.tokens, c.swapped.length / bs);
    int32_t short_by = int32_t(c.swapped.host.size() - c.kv.blocks.size()) - kv.allocator().num_free();
    if (short_by > prefix.num_evictable() + sessions.num_reclaimable()) {
      log_debug("swap-in of ", c.swapped.host.size(), " blocks waits: ", kv.allocator().num_free(), " free");
      kv.free(c.kv);
      return false;
    }
    if (short_by > 0) short_by -= prefix.evict(short_by);
    if (short_by > 0) sessions.evict(short_by);
    if (!swap->swap_in(c.swapped, c.kv)) {
      kv.free(c.kv);
      return false;
    }
    return true;
  }

  // The step's chunks, made to fit the pool: reclaim cached blocks, then sessions,
  // then preempt the least important running sequences (recomputed or swapped).
  std::vector<ChunkPlan> plan_step() {
    for (;;) {
      std::vector<SchedSeq> run;
      for (Choice* c : running) run.push_back(sched_of(*c));
      sched_sort(run, opt.policy);
      std::vector<ChunkPlan> plan = micro_batch(run, opt.max_step_tokens);
      int64_t need = 0;
      for (auto& p : plan) need += kv.blocks_needed(by_key(running, p.key)->kv, p.tokens);
      int64_t short_by = need - kv.allocator().num_free();
      if (short_by > 0) short_by -= prefix.evict(int32_t(short_by));
      if (short_by > 0) sessions.evict(int32_t(short_by));
      if (need <= kv.allocator().num_free()) return plan;
      Choice* victim = by_key(running, preemption_victim(run, opt.policy));
      if (running.size() == 1) {
        fail_request(*victim->req, str_cat("KV cache too small: the sequence needs ", need,
                                            " more blocks but the pool has ",
                                            kv.allocator().num_blocks(),
                                            " (raise --kv-tokens or --kv-cache-fraction)"));
        continue;
      }
      preempt(*victim);
    }
  }

  // ---- the step ----------------------------------------------------------------

  void step() {
    auto t0 = Clock::now();
    admit();
    if (running.empty()) return;
    std::vector<ChunkPlan> plan = plan_step();
    if (plan.empty()) return;
    std::vector<Choice*> seqs;
    for (auto& p : plan) seqs.push_back(by_key(running, p.key));
    // Drafts sit in their choices' token vectors, after the pending token, from here until
    // the engine step has run (drop_drafts), so that each chunk's tokens are one span.
    const std::vector<std::vector<int32_t>> drafts = add_drafts(plan, seqs);
    std::vector<StepChunk> chunks;
    for (size_t i = 0; i < plan.size(); ++i) {
      Choice* c = seqs[i];
      StepChunk ch;
      ch.kv = &c->kv;
      ch.tokens = std::span<const int32_t>(c->tokens.data() + c->kv.length, size_t(plan[i].tokens));
      ch.want_logits = plan[i].tokens == c->pending();
      // A draft chunk takes a row per token: each verifies the token fed after it.
      ch.all_logits = !drafts[i].empty() || (c->index == 0 && c->req->prompt_lp_due());
      chunks.push_back(ch);
    }
    // Whole logits rows cross to the host only when some row's sampling needs them.
    // They then bring only as many candidates as the step's samplers need: one (the
    // argmax) when every row is greedy without alternatives, else the model's k (two
    // widths, so two graph variants per batch size at most). Prompt logprobs need whole
    // rows (a token's rank is over the vocabulary); draft chunks, greedy, do not:
    // run_chunks_top gives a row of candidates for every token of an all_logits chunk.
    bool use_top = opt.top_logits && runner.top_logits_k() > 0;
    int32_t need = 1;
    for (size_t i = 0; use_top && i < seqs.size(); ++i) {
      if (chunks[i].all_logits && drafts[i].empty()) use_top = false;
      if (use_top && chunks[i].want_logits && !seqs[i]->finished) {
        use_top = !seqs[i]->grammar && seqs[i]->sampler->samples_from_top(runner.top_logits_k(), runner.vocab());
        need = std::max(need, seqs[i]->sampler->top_candidates_needed());
      }
    }
    if (need > 1) need = runner.top_logits_k();
    Tensor logits;
    StepTopLogits top;
    auto t1 = Clock::now();
    schedule_s += std::chrono::duration<double>(t1 - t0).count();
    try {
      if (use_top) top = runner.run_chunks_top(chunks, need);
      else logits = runner.run_chunks_logits(chunks);
    } catch (const std::exception& e) {
      drop_drafts(seqs, drafts, /*failed=*/true);
      for (Choice* c : seqs) fail_request(*c->req, str_cat("engine step failed: ", e.what()));
      return;
    }
    drop_drafts(seqs, drafts, /*failed=*/false);
    auto t2 = Clock::now();
    engine_s += std::chrono::duration<double>(t2 - t1).count();
    ++steps;
    top_steps += use_top;
    last_batch = int64_t(chunks.size());
    for (auto& ch : chunks) step_tokens += int64_t(ch.tokens.size());
    // Rows of the step's outputs, in chunk order, for the chunks that asked for them.
    const int64_t vocab = use_top ? runner.vocab() : logits.dim(1);
    const std::function<Row(int64_t)> row_at = [&](int64_t r) {
      Row x;
      if (use_top) x.top = top.row(r);
      else x.full = std::span<float>(logits.data_as<float>() + r * vocab, size_t(vocab));
      return x;
    };
    std::vector<std::pair<Choice*, Row>> rows;
    std::vector<std::pair<size_t, int64_t>> draft_runs;  // (chunk, its first row)
    int64_t row = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      Choice& c = *seqs[i];
      if (!drafts[i].empty()) {  // its KV is cut to what it keeps first (take_drafted)
        draft_runs.emplace_back(i, row);
        row += int64_t(chunks[i].tokens.size());
        continue;
      }
      if (opt.prefix_caching) c.cached_blocks = prefix.insert(c.kv, c.tokens, c.cached_blocks);
      if (chunks[i].all_logits) {
        const int64_t n = int64_t(chunks[i].tokens.size());
        if (!c.finished) take_prompt_logprobs(c, logits, row, c.kv.length - int32_t(n), int32_t(n));
        row += n - 1;  // the last is want_logits' row
      }
      if (!chunks[i].want_logits) {
        row += chunks[i].all_logits;
        continue;
      }
      Row r = row_at(row++);
      if (c.finished) continue;
      if (c.req->req.max_tokens == 0) {  // the prompt alone (its logprobs)
        finish_choice(c, FinishReason::kLength);
        continue;
      }
      // n > 1: the other choices fork off here and sample from their own copies first.
      if (!c.req->forked) fork_choices(c, r);
      rows.emplace_back(&c, r);
    }
    // Sampling is independent per sequence (its own sampler and row), so it may run on the
    // thread pool (ExecutorOptions::parallel_sample_values: rows of whole logits); the
    // bookkeeping after it touches shared request state and does not.
    std::vector<SampledToken> drawn(rows.size());
    auto draw = [&](int64_t begin, int64_t end, int) {
      for (int64_t k = begin; k < end; ++k) drawn[size_t(k)] = sample(*rows[size_t(k)].first, rows[size_t(k)].second);
    };
    size_t values = 0;  // logits the step's samplers read
    for (const auto& [c, r] : rows) values += r.full.empty() ? r.top.logits.size() : r.full.size();
    if (rows.size() >= 2 && values >= opt.parallel_sample_values)
      ThreadPool::global().parallel_for(int64_t(rows.size()), draw);
    else draw(0, int64_t(rows.size()), 0);
    for (size_t k = 0; k < rows.size(); ++k) take_token(*rows[k].first, std::move(drawn[k]));
    for (const auto& [i, first] : draft_runs) take_drafted(*seqs[i], drafts[i], row_at, first);
    sample_s += since(t2);
  }

  // One sequence's row of a step: whole logits (sampling scratch) or top candidates.
  struct Row {
    std::span<float> full;
    TopLogits top;
  };

  // ---- prompt-lookup drafts (ExecutorOptions::lookup_drafts) ----------------------

  // Plain argmax sampling (SamplingParams::plain_argmax), the only kind whose output drafts
  // cannot change, without a grammar, once forked and past its prompt logprobs.
  bool drafts_eligible(const Choice& c) const {
    return c.req->req.sampling.plain_argmax() && !c.grammar && c.req->forked && !c.req->prompt_lp_due();
  }

  // Each decoding choice of the planned step (one pending token) that is eligible gets up
  // to its draft length (lookup_drafts at first, then next_draft_length after each verify
  // step, as `kiln generate --lookup`) of drafts, appended to its tokens and its chunk;
  // returns them per chunk.
  // Drafts only use what the plan leaves: they never emit past max_tokens nor feed past
  // the model's positions, keep the step within max_step_tokens and take only blocks that
  // are free now (plain decoding, which may stop sooner, never needs those).
  std::vector<std::vector<int32_t>> add_drafts(std::vector<ChunkPlan>& plan, const std::vector<Choice*>& seqs);

  // Takes the drafts back out of the token vectors once the step has read them. A step
  // that failed may have grown a sequence past its tokens: its KV is cut back too (after a
  // step that ran, take_drafted cuts it to the drafts kept).
  void drop_drafts(const std::vector<Choice*>& seqs, const std::vector<std::vector<int32_t>>& drafts, bool failed);

  // A draft chunk's rows, in order, each through the usual sampling, up to the first whose
  // token is not the draft fed after it (that token is still plain decoding's next one), or
  // the bonus row after the last draft; then their tokens through take_token (stop ids and
  // strings, max_tokens, streaming) until the choice ends. Only the K/V of tokens the
  // sequence holds stays: the KV is cut to the drafts kept before any token is taken, and
  // again before each so that a token which ends the choice hands on (to the prefix cache, a
  // session) no position past it. One token is pending again afterwards.
  void take_drafted(Choice& c, std::span<const int32_t> d, const std::function<Row(int64_t)>& row_at,
                    int64_t first_row);

  // GenerationRequest::prompt_logprobs of a chunk's rows: `n` rows from `row` of `logits`
  // at positions from `start`; the row at position q gives the logprob of prompt[q + 1].
  // Each is computed once (a chunk recomputed after preemption is skipped), on the thread
  // pool (a row costs a pass over the vocabulary, and a prefill chunk has hundreds).
  void take_prompt_logprobs(Choice& c, const Tensor& logits, int64_t row, int32_t start, int32_t n);

  // A constrained choice's row is masked to the tokens that continue its document first.
  SampledToken sample(Choice& c, const Row& r) const {
    if (r.full.empty()) return c.sampler->sample(r.top);
    // End tokens only where the document may end.
    if (c.grammar && c.grammar_mask->apply(*c.grammar, r.full, end_ids(*c.req)) < 0) {
      c.grammar_too_costly = true;  // take_token fails the request
      return {};
    }
    return c.sampler->sample(r.full);
  }

  // n > 1: the other choices share the prompt's blocks, forked once it is prefilled. Their
  // running slots were taken when the parent was admitted (slots_of).
  void fork_choices(Choice& parent, const Row& row);

  // The ids that end a choice: the request's stop ids, and the model's end tokens unless
  // ignore_eos.
  std::vector<int32_t> end_ids(const Request& r) const {
    std::vector<int32_t> ids = r.req.stop_ids;
    if (!r.req.ignore_eos) ids.insert(ids.end(), model_stops.begin(), model_stops.end());
    return ids;
  }

  bool is_stop_id(const Request& r, int32_t t) const {
    if (std::find(r.req.stop_ids.begin(), r.req.stop_ids.end(), t) != r.req.stop_ids.end())
      return true;
    return !r.req.ignore_eos && std::find(model_stops.begin(), model_stops.end(), t) != model_stops.end();
  }

  // A sampled token joins its sequence: update, stop ids, text + stop strings, limits.
  void take_token(Choice& c, SampledToken&& st);
};

}  // namespace kiln
