// A fixed pool of worker threads for data-parallel loops (parallel_for). The calling
// thread takes part, so a pool of n threads runs n-1 workers. Kernels split their
// outer loop into contiguous chunks, one per thread, so each thread streams its own
// part of the weights. A decode step issues ~100 small parallel loops, so hand-offs
// spin briefly before sleeping on a condition variable: a futex wake-up per loop would
// cost more than many of the loops themselves. Tested in tests/core/thread_pool_test.cpp.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kiln {

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return int(workers_.size()) + 1; }

  // Calls fn(begin, end, thread_index) over [0, n) split into num_threads() contiguous
  // chunks (rounded to multiples of `grain`); returns when all are done.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn,
                    int64_t grain = 1);

  // The process-wide pool (KILN_NUM_THREADS or hardware concurrency).
  static ThreadPool& global();

 private:
  void worker_loop(int index);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_start_, cv_done_;
  // The job is published by bumping generation_ (seq_cst, paired with sleepers_ and
  // caller_sleeping_ in a Dekker-style check so that no wake-up is lost).
  const std::function<void(int64_t, int64_t, int)>* job_ = nullptr;
  int64_t job_n_ = 0, job_grain_ = 1;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> caller_sleeping_{false};
  std::atomic<bool> stop_{false};
  std::mutex run_mu_;  // one parallel_for at a time
};

}  // namespace kiln
