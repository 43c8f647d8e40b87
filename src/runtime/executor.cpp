// Executor (see executor.h). The executor thread alone touches Impl (sequences, KV
// pool, caches); other threads only reach the inbox, the cancel list and the stats
// snapshot under mu_. One loop turn: take the inbox -> cancel -> expire sessions ->
// admit (capacity; swapped-out sequences come back in) -> plan (micro-batch, reclaim or
// preempt until it fits; then prompt-lookup drafts from the tokens and blocks left) -> run
// -> sample (a draft chunk's rows in order, its KV cut to the drafts kept) -> stream updates.
// The loop state and the step are in executor_impl.h; sampled tokens and drafts in
// executor_tokens.cpp.
#include "runtime/executor.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "runtime/executor_impl.h"

namespace kiln {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
    default: return "";
  }
}

const char* preemption_mode_name(PreemptionMode m) {
  return m == PreemptionMode::kSwap ? "swap" : "recompute";
}

// ---- Executor: the thread-safe shell ----------------------------------------------

Executor::Executor(Model& model, const tok::Tokenizer* tokenizer, const ExecutorOptions& options)
    : opt_(options) {
  // With a memory fraction kv_tokens is only a cap, and 0 means none.
  const bool kv_ok = opt_.kv_cache_fraction > 0 ? opt_.kv_tokens == 0 || opt_.kv_tokens >= opt_.block_size
                                                : opt_.kv_tokens >= opt_.block_size;
  if (opt_.block_size <= 0 || !kv_ok || opt_.max_step_tokens <= 0 || opt_.max_running <= 0)
    throw_error(ErrorCode::kInvalidArgument, "executor options: block_size ", opt_.block_size,
                ", kv_tokens ", opt_.kv_tokens, ", max_step_tokens ", opt_.max_step_tokens,
                ", max_running ", opt_.max_running, " must be positive (kv_tokens >= block_size)");
  if (opt_.kv_cache_fraction < 0 || opt_.kv_cache_fraction > 1)
    throw_error(ErrorCode::kInvalidArgument,
                "kv_cache_fraction must be in (0, 1] (0: size the pool by kv_tokens), got ",
                opt_.kv_cache_fraction);
  if (opt_.lookup_drafts < 0 || opt_.lookup_max_batch < 0 || opt_.lookup_min_n < 1 ||
      opt_.lookup_max_n < opt_.lookup_min_n || opt_.lookup_max_n > NgramDrafter::kMaxN)
    throw_error(ErrorCode::kInvalidArgument, "executor options: lookup_drafts ", opt_.lookup_drafts,
                " and lookup_max_batch ", opt_.lookup_max_batch,
                " must be >= 0 and the n-gram sizes need 1 <= lookup_min_n <= lookup_max_n <= ", NgramDrafter::kMaxN,
                ", got ", opt_.lookup_min_n, " and ", opt_.lookup_max_n);
  if (opt_.swap_space_bytes < 0)
    throw_error(ErrorCode::kInvalidArgument, "swap_space_bytes must not be negative, got ",
                opt_.swap_space_bytes);
  impl_ = std::make_unique<Impl>(model, tokenizer, opt_);
  stats_.kv_blocks_total = stats_.kv_blocks_free = impl_->kv.allocator().num_blocks();
  if (impl_->swap) stats_.swap_blocks_total = impl_->swap->num_slots();
  thread_ = std::thread([this] { loop(); });
}

Executor::~Executor() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

const ModelInfo& Executor::model_info() const { return impl_->model.info(); }

int64_t Executor::max_context() const {
  int64_t pool = int64_t(impl_->kv.allocator().num_blocks() - 1) * opt_.block_size;
  return std::min<int64_t>(model_info().max_positions, pool);
}

uint64_t Executor::submit(GenerationRequest request, UpdateCallback on_update) {
  const ModelInfo& info = model_info();
  if (request.prompt.empty()) throw_error(ErrorCode::kInvalidArgument, "the prompt is empty");
  for (int32_t t : request.prompt)
    if (t < 0 || t >= info.vocab_size)
      throw_error(ErrorCode::kInvalidArgument, "token id ", t, " is outside the vocabulary (",
                  info.vocab_size, " tokens)");
  if (request.n < 1 || request.n > 16)
    throw_error(ErrorCode::kInvalidArgument, "n must be in [1, 16], got ", request.n);
  if (request.n > opt_.max_running)
    throw_error(ErrorCode::kInvalidArgument, "n (", request.n, ") exceeds max_running (",
                opt_.max_running, "): a request's n choices run at once, and at most max_running ",
                "sequences do (lower n or raise --max-running)");
  if (request.max_tokens < 0 || (request.max_tokens == 0 && request.n != 1))
    throw_error(ErrorCode::kInvalidArgument, "max_tokens must be at least ", request.n == 1 ? 0 : 1,
                request.n == 1 ? "" : " with n > 1", ", got ", request.max_tokens);
  if (request.prompt_logprobs < -1 || request.prompt_logprobs > 20)
    throw_error(ErrorCode::kInvalidArgument, "prompt_logprobs must be in [0, 20] (or -1: none), got ",
                request.prompt_logprobs);
  std::string bad = sampling_params_error(request.sampling);
  if (!bad.empty()) throw_error(ErrorCode::kInvalidArgument, bad);
  for (const auto& [t, bias] : request.sampling.logit_bias)
    if (t >= info.vocab_size)
      throw_error(ErrorCode::kInvalidArgument, "logit_bias: token id ", t, " is outside the vocabulary (",
                  info.vocab_size, " tokens)");
  if (!request.stop.empty() && !impl_->tokenizer)
    throw_error(ErrorCode::kInvalidArgument, "stop strings need a model with a tokenizer");
  if (request.json_object && !impl_->tokenizer)
    throw_error(ErrorCode::kInvalidArgument, "response_format json_object needs a model with a tokenizer");
  if (request.grammar && !impl_->tokenizer)
    throw_error(ErrorCode::kInvalidArgument, "constrained decoding (a grammar, a JSON schema) needs a model with a tokenizer");
  int64_t limit = max_context();
  if (int64_t(request.prompt.size()) + request.max_tokens > limit)
    throw_error(ErrorCode::kOutOfRange, "the prompt (", request.prompt.size(),
                " tokens) plus max_tokens (", request.max_tokens, ") exceeds the context of ",
                limit, " tokens");
  if (!on_update) throw_error(ErrorCode::kInvalidArgument, "no update callback");
  auto r = std::make_unique<Request>();
  r->req = std::move(request);
  r->cb = std::make_shared<UpdateCallback>(std::move(on_update));
  uint64_t id;
  {
    std::lock_guard lk(mu_);
    if (draining_ || stop_) throw_error(ErrorCode::kUnsupported, "the executor is shutting down");
    id = next_id_++;
    r->id = id;
    r->arrival = int64_t(id);
    r->seed = r->req.sampling.seed ? *r->req.sampling.seed
                                   : opt_.seed ^ (id * 0x9e3779b97f4a7c15ull);
    inbox_.push_back(std::move(r));
    ++in_flight_;
  }
  cv_.notify_all();
  return id;
}

void Executor::cancel(uint64_t id) {
  {
    std::lock_guard lk(mu_);
    cancels_.push_back(id);
  }
  cv_.notify_all();
}

GenerationResult Executor::generate(GenerationRequest request) {
  auto result = std::make_shared<GenerationResult>();
  auto done = std::make_shared<std::promise<void>>();
  auto fut = done->get_future();
  int32_t n = request.n;
  result->choices.resize(size_t(n));
  submit(std::move(request), [result, done](RequestUpdate&& u) {
    result->prompt_logprobs.insert(result->prompt_logprobs.end(), u.prompt_logprobs.begin(), u.prompt_logprobs.end());
    for (auto& c : u.choices) {
      auto& out = result->choices.at(size_t(c.index));
      out.tokens.insert(out.tokens.end(), c.tokens.begin(), c.tokens.end());
      out.text += c.text;
      out.logprobs.insert(out.logprobs.end(), c.logprobs.begin(), c.logprobs.end());
      if (c.finish != FinishReason::kNone) out.finish = c.finish;
    }
    if (u.done) {
      result->error = u.error;
      result->prompt_tokens = u.prompt_tokens;
      result->cached_tokens = u.cached_tokens;
      result->completion_tokens = u.completion_tokens;
      done->set_value();
    }
  });
  fut.wait();
  return std::move(*result);
}

bool Executor::drain(std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  draining_ = true;
  if (idle_cv_.wait_for(lk, timeout, [&] { return in_flight_ == 0; })) return true;
  cancel_all_ = true;
  cv_.notify_all();
  idle_cv_.wait(lk, [&] { return in_flight_ == 0; });
  return false;
}

void Executor::cancel_all() {
  {
    std::lock_guard lk(mu_);
    cancel_all_ = true;
  }
  cv_.notify_all();
}

ExecutorStats Executor::stats() const {
  std::lock_guard lk(mu_);
  return stats_;
}

// Delivers the executor's updates on a thread of its own, in order, so that consumers'
// callbacks (an HTTP stream's queue and wake-up, a few microseconds per request: ~0.9 ms
// of a 256-stream step on the H200 host) overlap the next engine step instead of
// delaying it. A request leaves in_flight_ only once its last update is delivered, so
// drain() still means that every consumer has its final update. At most kMaxQueued loop
// turns wait for delivery; beyond that the executor thread waits too.
struct Executor::Emitter {
  static constexpr size_t kMaxQueued = 4;
  Executor& ex;
  std::mutex m;
  std::condition_variable work, space;
  std::deque<Impl::Batch> q;
  bool stop = false;
  std::thread th;

  explicit Emitter(Executor& e) : ex(e), th([this] { run(); }) {}
  ~Emitter() { finish(); }

  void push(Impl::Batch&& b) {
    if (b.deliveries.empty() && b.ended == 0) return;
    std::unique_lock lk(m);
    space.wait(lk, [&] { return q.size() < kMaxQueued; });
    q.push_back(std::move(b));
    work.notify_one();
  }
  // Delivers everything queued, then ends the thread.
  void finish() {
    if (!th.joinable()) return;
    {
      std::lock_guard lk(m);
      stop = true;
    }
    work.notify_one();
    th.join();
  }
  void run() {
    for (;;) {
      Impl::Batch b;
      {
        std::unique_lock lk(m);
        work.wait(lk, [&] { return stop || !q.empty(); });
        if (q.empty()) return;
        b = std::move(q.front());
        q.pop_front();
      }
      space.notify_one();
      const auto t0 = Impl::Clock::now();
      for (auto& d : b.deliveries) {
        try {
          (*d.cb)(std::move(d.update));
        } catch (...) {
          // A failing consumer must not take the executor down.
        }
        d.cb.reset();  // a finished request's callback (and what it holds) goes now
      }
      const double dt = Impl::since(t0);
      std::lock_guard lk(ex.mu_);
      ex.in_flight_ -= b.ended;
      ex.stats_.emit_s += dt;
      if (b.ended > 0) ex.idle_cv_.notify_all();
    }
  }
};

void Executor::loop() {
  Impl& im = *impl_;
  Emitter emitter(*this);
  for (;;) {
    std::vector<std::unique_ptr<Request>> inbox;
    std::vector<uint64_t> cancels;
    bool everything = false;
    {
      std::unique_lock lk(mu_);
      // Idle: wake once a second anyway so idle sessions expire.
      cv_.wait_for(lk, std::chrono::seconds(1), [&] {
        return stop_ || !inbox_.empty() || !cancels_.empty() || im.has_work();
      });
      if (stop_) break;
      inbox.swap(inbox_);
      cancels.swap(cancels_);
      everything = std::exchange(cancel_all_, false);
    }
    for (auto& r : inbox) im.accept(std::move(r));
    for (uint64_t id : cancels) im.cancel(id);
    if (everything) im.cancel_all();
    im.sessions.expire(SessionStore::Clock::now());
    im.step();
    emitter.push(im.flush_updates());

    std::lock_guard lk(mu_);
    ExecutorStats& s = stats_;
    s.waiting = int64_t(im.waiting.size()) + int64_t(inbox_.size());
    s.running = int64_t(im.running.size());
    s.running_peak = im.running_peak;
    s.kv_blocks_total = im.kv.allocator().num_blocks();
    s.kv_blocks_free = im.kv.allocator().num_free();
    s.kv_blocks_cached = im.prefix.num_cached();
    s.prefix_queried_blocks = im.prefix.stats().queried_blocks;
    s.prefix_hit_blocks = im.prefix.stats().hit_blocks;
    s.prefix_evicted_blocks = im.prefix.stats().evicted_blocks;
    s.sessions = im.sessions.size();
    s.session_hits = im.sessions.stats().hits;
    s.session_misses = im.sessions.stats().misses;
    s.session_evictions = im.sessions.stats().evictions;
    s.session_expiries = im.sessions.stats().expiries;
    s.preemptions = im.preemptions;
    if (im.swap) {
      const KvSwapStats& w = im.swap->stats();
      s.swapped_out = w.swapped_out;
      s.swapped_in = w.swapped_in;
      s.swap_out_bytes = w.out_bytes;
      s.swap_in_bytes = w.in_bytes;
      s.swap_blocks_total = im.swap->num_slots();
      s.swap_blocks_used = im.swap->num_slots() - im.swap->num_free();
    }
    s.swap_fallbacks = im.swap_fallbacks;
    s.steps = im.steps;
    s.step_tokens = im.step_tokens;
    s.generated_tokens = im.generated;
    s.top_logits_steps = im.top_steps;
    s.spec_draft_tokens = im.spec_drafted;
    s.spec_accepted_tokens = im.spec_accepted;
    s.last_batch_seqs = im.last_batch;
    s.requests_finished = im.finished;
    s.requests_cancelled = im.cancelled;
    s.requests_failed = im.failed;
    s.schedule_s = im.schedule_s;
    s.engine_s = im.engine_s;
    s.sample_s = im.sample_s;
  }
  // Shutdown: everything still queued or running ends as cancelled.
  std::vector<std::unique_ptr<Request>> inbox;
  {
    std::lock_guard lk(mu_);
    inbox.swap(inbox_);
  }
  for (auto& r : inbox) im.accept(std::move(r));
  im.cancel_all();
  emitter.push(im.flush_updates());
  emitter.finish();
  std::lock_guard lk(mu_);
  in_flight_ = 0;
  idle_cv_.notify_all();
}

}  // namespace kiln
