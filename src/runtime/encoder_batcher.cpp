// EncoderBatcher (see encoder_batcher.h).
#include "runtime/encoder_batcher.h"

#include <algorithm>
#include <exception>

#include "core/status.h"

namespace kiln {

// remaining, settled and cancelled are guarded by mu_; the promise is set once, by the
// thread that sets settled.
struct EncoderBatcher::Request {
  uint64_t id = 0;
  std::vector<EncoderInput> inputs;
  std::vector<EncoderOutput> outputs;
  size_t remaining = 0;  // sequences queued or in a forward
  bool settled = false;
  bool cancelled = false;
  std::promise<std::vector<EncoderOutput>> done;
};

EncoderBatcher::EncoderBatcher(Model& model, EncoderBatcherOptions options) : model_(model), opt_(std::move(options)) {
  KILN_THROW_IF(opt_.max_batch_tokens < 1 || opt_.max_batch_sequences < 1 || opt_.max_queued_sequences < 1 ||
                    opt_.max_queue_delay.count() < 0,
                kInvalidArgument, "encoder batching: the batch budgets (", opt_.max_batch_tokens, " tokens, ",
                opt_.max_batch_sequences, " sequences) and the queue limit (", opt_.max_queued_sequences,
                ") must be positive, the queue delay (", opt_.max_queue_delay.count(), " us) not negative");
  worker_ = std::thread([this] { loop(); });
}

EncoderBatcher::~EncoderBatcher() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

EncoderJob EncoderBatcher::submit_job(std::vector<EncoderInput> inputs) {
  check_encoder_inputs(model_.info(), inputs);
  auto req = std::make_shared<Request>();
  EncoderJob job{req->done.get_future(), 0};
  if (inputs.empty()) {
    req->done.set_value({});
    return job;
  }
  req->remaining = inputs.size();
  req->outputs.resize(inputs.size());
  req->inputs = std::move(inputs);
  {
    std::lock_guard lk(mu_);
    if (stop_) throw_error(ErrorCode::kUnsupported, "the encoder batcher is stopping");
    if (int64_t(queue_.size() + req->inputs.size()) > opt_.max_queued_sequences)
      throw_error(ErrorCode::kOutOfMemory, "the encoder queue is full (", queue_.size(), " sequences waiting, at most ",
                  opt_.max_queued_sequences, "); try again later");
    req->id = job.id = next_id_++;
    live_[req->id] = req;
    const auto now = std::chrono::steady_clock::now();
    for (size_t i = 0; i < req->inputs.size(); ++i) queue_.push_back({req, i, now});
  }
  cv_.notify_one();
  return job;
}

bool EncoderBatcher::cancel(uint64_t id) {
  std::shared_ptr<Request> r;
  {
    std::lock_guard lk(mu_);
    auto it = live_.find(id);
    if (it == live_.end()) return false;
    r = it->second.lock();
    if (!r || r->settled) return false;
    r->cancelled = true;
    const size_t before = queue_.size();
    std::erase_if(queue_, [&](const Item& q) { return q.req == r; });
    const size_t dropped = before - queue_.size();
    r->remaining -= dropped;
    stats_.cancelled_sequences += int64_t(dropped);
    if (dropped > 0) cv_.notify_one();  // a batch waiting on a queue delay may have nothing left
    if (r->remaining > 0) return true;  // the forward running the rest settles it
    r->settled = true;
    live_.erase(it);
    stats_.requests += 1;
    stats_.cancelled_requests += 1;
  }
  r->inputs.clear();
  r->done.set_exception(std::make_exception_ptr(Error(ErrorCode::kCancelled, "the encoder request was cancelled")));
  return true;
}

void EncoderBatcher::finish(const std::vector<std::shared_ptr<Request>>& done) {
  for (const auto& r : done) {
    r->inputs.clear();
    if (r->cancelled)
      r->done.set_exception(std::make_exception_ptr(Error(ErrorCode::kCancelled, "the encoder request was cancelled")));
    else
      r->done.set_value(std::move(r->outputs));
  }
}

EncoderBatcherStats EncoderBatcher::stats() const {
  std::lock_guard lk(mu_);
  EncoderBatcherStats s = stats_;
  s.queued = int64_t(queue_.size());
  return s;
}

// The queue's head, in arrival order, while it fits both budgets (the first sequence is
// always taken, however long). Called with mu_ held and the queue not empty.
std::vector<EncoderBatcher::Item> EncoderBatcher::take_batch(std::unique_lock<std::mutex>& lk) {
  auto fits = [&](size_t n, int64_t tokens) {
    return int64_t(n) <= opt_.max_batch_sequences && tokens <= opt_.max_batch_tokens;
  };
  // With a queue delay, wait while what is queued leaves room and the oldest may wait on.
  if (opt_.max_queue_delay.count() > 0) {
    const auto deadline = queue_.front().arrival + opt_.max_queue_delay;
    auto full = [&] {
      int64_t tokens = 0;
      for (size_t i = 0; i < queue_.size(); ++i) {
        tokens += int64_t(queue_[i].req->inputs[queue_[i].index].tokens.size());
        if (!fits(i + 1, tokens)) return true;
      }
      return int64_t(queue_.size()) == opt_.max_batch_sequences;
    };
    while (!stop_ && !queue_.empty() && !full() && std::chrono::steady_clock::now() < deadline)
      cv_.wait_until(lk, deadline);
  }
  std::vector<Item> batch;
  int64_t tokens = 0;
  while (!queue_.empty()) {
    const Item& it = queue_.front();
    const int64_t n = int64_t(it.req->inputs[it.index].tokens.size());
    if (!batch.empty() && !fits(batch.size() + 1, tokens + n)) break;
    tokens += n;
    batch.push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
  return batch;
}

void EncoderBatcher::loop() {
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything queued has run
    std::vector<Item> batch = take_batch(lk);
    if (batch.empty()) continue;  // cancelled while the batch waited
    stats_.running = int64_t(batch.size());
    lk.unlock();
    run_batch(batch);
    lk.lock();
    stats_.running = 0;
  }
}

// One forward over the batch's sequences; each output goes to its request, and a
// request whose last sequence this was completes.
void EncoderBatcher::forward(const std::vector<Item>& batch) {
  std::vector<EncoderInput> inputs;
  inputs.reserve(batch.size());
  int64_t tokens = 0;
  for (const Item& it : batch) {
    inputs.push_back(it.req->inputs[it.index]);
    tokens += int64_t(inputs.back().tokens.size());
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<EncoderOutput> out = encode(model_, inputs, opt_.encode);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<std::shared_ptr<Request>> done;
  {  // counted before any caller sees its result
    std::lock_guard lk(mu_);
    for (size_t i = 0; i < batch.size(); ++i) {
      const std::shared_ptr<Request>& r = batch[i].req;
      r->outputs[batch[i].index] = std::move(out[i]);
      if (--r->remaining > 0) continue;
      live_.erase(r->id);
      if (r->settled) continue;  // failed in an earlier forward
      r->settled = true;
      done.push_back(r);
      stats_.requests += 1;
      if (r->cancelled) stats_.cancelled_requests += 1;
    }
    stats_.forwards += 1;
    stats_.sequences += int64_t(batch.size());
    stats_.tokens += tokens;
    stats_.largest_batch = std::max(stats_.largest_batch, int64_t(batch.size()));
    stats_.busy_seconds += secs;
  }
  finish(done);
}

void EncoderBatcher::run_batch(const std::vector<Item>& batch) {
  auto fail = [&](const std::vector<Item>& items, std::exception_ptr e) {
    std::vector<std::shared_ptr<Request>> failed;
    {
      std::lock_guard lk(mu_);
      for (const Item& it : items) {
        const std::shared_ptr<Request>& r = it.req;
        if (!r->settled) {
          r->settled = true;
          failed.push_back(r);
        }
        --r->remaining;
      }
      for (const auto& r : failed) {  // its sequences still queued would run for nothing
        const size_t before = queue_.size();
        std::erase_if(queue_, [&](const Item& q) { return q.req == r; });
        r->remaining -= before - queue_.size();
      }
      for (const Item& it : items)
        if (it.req->remaining == 0) live_.erase(it.req->id);
      stats_.requests += int64_t(failed.size());
      stats_.failed_requests += int64_t(failed.size());
    }
    for (const auto& r : failed) r->done.set_exception(e);
  };
  try {
    forward(batch);
    return;
  } catch (...) {
    // Several requests shared the forward: run each request's sequences alone, so an
    // input that passed check_encoder_inputs() but fails the model fails only its own request.
    bool several = false;
    for (const Item& it : batch) several = several || it.req != batch.front().req;
    if (!several) return fail(batch, std::current_exception());
  }
  for (size_t i = 0; i < batch.size();) {
    size_t j = i;
    std::vector<Item> one;
    while (j < batch.size() && batch[j].req == batch[i].req) one.push_back(batch[j++]);
    try {
      forward(one);
    } catch (...) {
      fail(one, std::current_exception());
    }
    i = j;
  }
}

}  // namespace kiln
