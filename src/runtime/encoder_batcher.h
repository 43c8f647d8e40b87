// Dynamic batching for encoders (Triton's dynamic batcher is the model): requests from
// any number of threads queue their sequences; one worker thread per model takes what is
// queued, in arrival order, up to a token and a sequence budget, and runs it as one
// ragged encode() forward, so concurrent clients share forwards instead of taking turns.
// With no queue delay (the default) a batch is whatever arrived while the previous
// forward ran: no request waits for others that have not come. A request's sequences may
// be spread over several forwards; it completes when the last of them has run. Inputs
// are validated when submitted, so one client's bad input fails only that client; an
// error inside a forward (e.g. out of device memory) fails the requests with a sequence
// in it. A request may be withdrawn (its client hung up): its sequences still queued are
// dropped and its future fails with kCancelled. Tested in tests/runtime/encoder_batcher_test.cpp and tests/server/.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "runtime/encoder_runner.h"

namespace kiln {

struct EncoderBatcherOptions {
  int64_t max_batch_tokens = 16384;  // tokens per forward (a longer sequence runs alone)
  int max_batch_sequences = 256;     // sequences per forward; 1 = one sequence at a time
  // How long the oldest queued sequence may wait for more to arrive while a batch is
  // below both budgets (Triton's max_queue_delay_microseconds); 0 = never wait.
  std::chrono::microseconds max_queue_delay{0};
  int64_t max_queued_sequences = 65536;  // beyond: submit() fails with kOutOfMemory
  EncodeOptions encode;
};

// A queued request: its outputs (in input order) once they have run, and the id that
// withdraws it.
struct EncoderJob {
  std::future<std::vector<EncoderOutput>> result;
  uint64_t id = 0;
};

struct EncoderBatcherStats {
  int64_t forwards = 0;         // encode() calls run
  int64_t sequences = 0;        // sequences through them
  int64_t tokens = 0;           // tokens through them
  int64_t requests = 0;         // requests completed (ok or failed)
  int64_t failed_requests = 0;  // of which failed
  int64_t cancelled_requests = 0;  // of which withdrawn by cancel()
  int64_t cancelled_sequences = 0;  // sequences dropped from the queue by cancel()
  int64_t largest_batch = 0;    // most sequences in one forward
  int64_t queued = 0;           // sequences waiting now (read from the queue by stats())
  int64_t running = 0;          // sequences in the forward running now
  double busy_seconds = 0;      // time spent in encode()
};

class EncoderBatcher {
 public:
  // `model` (an encoder, or a decoder that embeds: see encode()) must outlive the
  // batcher, and nothing else may run it while the batcher has work (a model runs one
  // forward at a time).
  EncoderBatcher(Model& model, EncoderBatcherOptions options = {});
  ~EncoderBatcher();  // runs what is queued, then stops
  EncoderBatcher(const EncoderBatcher&) = delete;
  EncoderBatcher& operator=(const EncoderBatcher&) = delete;

  // Queues `inputs` (validated here: throws kInvalidArgument / kOutOfRange naming the
  // input, kOutOfMemory when the queue is full, kUnsupported once stopping) and returns
  // their outputs, in order, once they have run; the future holds a forward's error.
  std::future<std::vector<EncoderOutput>> submit(std::vector<EncoderInput> inputs) {
    return submit_job(std::move(inputs)).result;
  }
  EncoderJob submit_job(std::vector<EncoderInput> inputs);
  std::vector<EncoderOutput> run(std::vector<EncoderInput> inputs) { return submit(std::move(inputs)).get(); }
  // Withdraws request `id`: its queued sequences leave the queue, and its future fails
  // with kCancelled (at once, or when a forward already running its other sequences
  // ends; those outputs are dropped). False when the request has already completed.
  bool cancel(uint64_t id);

  EncoderBatcherStats stats() const;

 private:
  struct Request;
  struct Item {  // one sequence of a request
    std::shared_ptr<Request> req;
    size_t index;
    std::chrono::steady_clock::time_point arrival;
  };
  void loop();
  std::vector<Item> take_batch(std::unique_lock<std::mutex>& lk);
  void run_batch(const std::vector<Item>& batch);
  void forward(const std::vector<Item>& batch);
  // Ends the requests of `done` (their last sequence has run): cancelled ones with
  // kCancelled, the rest with their outputs. Called without mu_ held.
  void finish(const std::vector<std::shared_ptr<Request>>& done);

  Model& model_;
  const EncoderBatcherOptions opt_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  std::unordered_map<uint64_t, std::weak_ptr<Request>> live_;  // submitted, not yet finished
  uint64_t next_id_ = 1;
  bool stop_ = false;
  EncoderBatcherStats stats_;
  std::thread worker_;
};

}  // namespace kiln
