// Dynamic batching for encoders (Triton's dynamic batcher is the model): requests from
// any number of threads queue their sequences; one worker thread per model takes what is
// queued, in arrival order, up to a token and a sequence budget, and runs it as one
// ragged encode() forward, so concurrent clients share forwards instead of taking turns.
// With no queue delay (the default) a batch is whatever arrived while the previous
// forward ran: no request waits for others that have not come. A request's sequences may
// be spread over several forwards; it completes when the last of them has run. Inputs
// are validated when submitted, so one client's bad input fails only that client; an
// error inside a forward (e.g. out of device memory) fails the requests with a sequence
// in it. Tested in tests/runtime/encoder_batcher_test.cpp and tests/server/.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
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

struct EncoderBatcherStats {
  int64_t forwards = 0;         // encode() calls run
  int64_t sequences = 0;        // sequences through them
  int64_t tokens = 0;           // tokens through them
  int64_t requests = 0;         // requests completed (ok or failed)
  int64_t failed_requests = 0;  // of which failed
  int64_t largest_batch = 0;    // most sequences in one forward
  int64_t queued = 0;           // sequences waiting now (read from the queue by stats())
  int64_t running = 0;          // sequences in the forward running now
  double busy_seconds = 0;      // time spent in encode()
};

class EncoderBatcher {
 public:
  // `model` (an encoder) must outlive the batcher, and nothing else may run it while the
  // batcher has work (a model runs one forward at a time).
  EncoderBatcher(Model& model, EncoderBatcherOptions options = {});
  ~EncoderBatcher();  // runs what is queued, then stops
  EncoderBatcher(const EncoderBatcher&) = delete;
  EncoderBatcher& operator=(const EncoderBatcher&) = delete;

  // Queues `inputs` (validated here: throws kInvalidArgument / kOutOfRange naming the
  // input, kOutOfMemory when the queue is full, kUnsupported once stopping) and returns
  // their outputs, in order, once they have run; the future holds a forward's error.
  std::future<std::vector<EncoderOutput>> submit(std::vector<EncoderInput> inputs);
  std::vector<EncoderOutput> run(std::vector<EncoderInput> inputs) { return submit(std::move(inputs)).get(); }

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

  Model& model_;
  const EncoderBatcherOptions opt_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool stop_ = false;
  EncoderBatcherStats stats_;
  std::thread worker_;
};

}  // namespace kiln
