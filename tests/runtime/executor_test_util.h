// Executor test helpers shared by the CPU, tensor-parallel and CUDA executor tests.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/executor.h"

namespace kiln::test_exec {

// Every request queued before the executor's next turn: the first one's first update
// (sent on the executor thread) waits until the others are submitted, so a small pool
// is oversubscribed however the client threads happen to be scheduled. Greedy; a
// request's n choices come back at their indices, with their tokens and finish reasons.
inline std::vector<GenerationResult> run_all_at_once(Executor& ex, const std::vector<GenerationRequest>& reqs) {
  std::vector<GenerationResult> out(reqs.size());
  std::atomic<bool> queued{false};
  std::mutex mu;
  std::condition_variable cv;
  size_t done = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    out[i].choices.resize(size_t(reqs[i].n));
    ex.submit(reqs[i], [&, i](RequestUpdate&& u) {
      while (i == 0 && !queued) std::this_thread::yield();
      for (auto& c : u.choices) {
        auto& choice = out[i].choices.at(size_t(c.index));
        choice.tokens.insert(choice.tokens.end(), c.tokens.begin(), c.tokens.end());
        if (c.finish != FinishReason::kNone) choice.finish = c.finish;
      }
      if (u.done) {
        std::lock_guard lk(mu);
        out[i].error = u.error;
        ++done;
        cv.notify_all();
      }
    });
  }
  queued = true;
  std::unique_lock lk(mu);
  cv.wait(lk, [&] { return done == reqs.size(); });
  return out;
}

// The executor publishes its stats after each loop turn, after the done callbacks: waits
// (at most ~2 s) for them to show nothing running or waiting.
inline ExecutorStats settled_stats(Executor& ex) {
  for (int i = 0; i < 400 && ex.stats().running + ex.stats().waiting > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  return ex.stats();
}

}  // namespace kiln::test_exec
