// ThreadPool (see thread_pool.h).
#include "core/thread_pool.h"

#include <algorithm>
#include <cstdlib>

namespace kiln {

ThreadPool::ThreadPool(int num_threads) {
  num_threads = std::max(1, num_threads);
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_start_.notify_all();
  for (auto& t : workers_) t.join();
}

static void run_chunk(const std::function<void(int64_t, int64_t, int)>& fn, int64_t n,
                      int64_t grain, int nthreads, int index) {
  int64_t units = (n + grain - 1) / grain;
  int64_t per = units / nthreads, extra = units % nthreads;
  int64_t ub = index * per + std::min<int64_t>(index, extra);
  int64_t ue = ub + per + (index < extra ? 1 : 0);
  int64_t b = std::min(n, ub * grain), e = std::min(n, ue * grain);
  if (b < e) fn(b, e, index);
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn,
                              int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  int nthreads = num_threads();
  if (nthreads == 1 || n <= grain) {
    fn(0, n, 0);
    return;
  }
  std::lock_guard<std::mutex> run_lock(run_mu_);
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = &fn;
    job_n_ = n;
    job_grain_ = grain;
    pending_ = int(workers_.size());
    ++generation_;
  }
  cv_start_.notify_all();
  run_chunk(fn, n, grain, nthreads, 0);
  std::unique_lock<std::mutex> lk(mu_);
  cv_done_.wait(lk, [this] { return pending_ == 0; });
  job_ = nullptr;
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t, int)>* job;
    int64_t n, grain;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_start_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      n = job_n_;
      grain = job_grain_;
    }
    run_chunk(*job, n, grain, num_threads(), index);
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (--pending_ == 0) cv_done_.notify_one();
    }
  }
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool([] {
    if (const char* env = std::getenv("KILN_NUM_THREADS")) {
      int n = std::atoi(env);
      if (n > 0) return n;
    }
    return int(std::max(1u, std::thread::hardware_concurrency()));
  }());
  return pool;
}

}  // namespace kiln
