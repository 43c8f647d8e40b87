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

namespace {

void run_chunk(const std::function<void(int64_t, int64_t, int)>& fn, int64_t n, int64_t grain,
               int nthreads, int index) {
  int64_t units = (n + grain - 1) / grain;
  int64_t per = units / nthreads, extra = units % nthreads;
  int64_t ub = index * per + std::min<int64_t>(index, extra);
  int64_t ue = ub + per + (index < extra ? 1 : 0);
  int64_t b = std::min(n, ub * grain), e = std::min(n, ue * grain);
  if (b < e) fn(b, e, index);
}

// About 10-50 microseconds of polling before a thread goes to sleep; KILN_POOL_SPIN
// overrides it (0 = always sleep, for machines shared with other busy processes).
const int kSpinIterations = [] {
  const char* e = std::getenv("KILN_POOL_SPIN");
  return e ? std::max(0, std::atoi(e)) : 4000;
}();

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

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
  job_ = &fn;
  job_n_ = n;
  job_grain_ = grain;
  pending_.store(int(workers_.size()));
  generation_.fetch_add(1);  // publishes the job
  if (sleepers_.load() > 0) {
    std::lock_guard<std::mutex> lk(mu_);
    cv_start_.notify_all();
  }
  run_chunk(fn, n, grain, nthreads, 0);
  for (int i = 0; i < kSpinIterations && pending_.load(std::memory_order_acquire) > 0; ++i) cpu_relax();
  if (pending_.load() > 0) {
    std::unique_lock<std::mutex> lk(mu_);
    caller_sleeping_.store(true);
    cv_done_.wait(lk, [this] { return pending_.load() == 0; });
    caller_sleeping_.store(false);
  }
  job_ = nullptr;
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    for (int i = 0; i < kSpinIterations && generation_.load(std::memory_order_acquire) == seen &&
                    !stop_.load(std::memory_order_relaxed);
         ++i)
      cpu_relax();
    if (generation_.load() == seen && !stop_.load()) {
      std::unique_lock<std::mutex> lk(mu_);
      sleepers_.fetch_add(1);
      cv_start_.wait(lk, [&] { return stop_.load() || generation_.load() != seen; });
      sleepers_.fetch_sub(1);
    }
    if (stop_.load()) return;
    seen = generation_.load();
    run_chunk(*job_, job_n_, job_grain_, num_threads(), index);
    if (pending_.fetch_sub(1) == 1 && caller_sleeping_.load()) {
      std::lock_guard<std::mutex> lk(mu_);
      cv_done_.notify_one();
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
