// ThreadPool covers every index exactly once, with and without a grain.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "core/thread_pool.h"

namespace kiln {

TEST(ThreadPool, CoversRangeExactlyOnce) {
  ThreadPool pool(3);
  for (int64_t n : {1, 2, 3, 7, 100, 1001}) {
    for (int64_t grain : {1, 4, 16}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.parallel_for(n, [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
      }, grain);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << n << " " << grain;
    }
  }
}

TEST(ThreadPool, RepeatedJobs) {
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  for (int rep = 0; rep < 200; ++rep)
    pool.parallel_for(10, [&](int64_t b, int64_t e, int) { sum += e - b; });
  EXPECT_EQ(sum.load(), 2000);
}

}  // namespace kiln

namespace kiln {

// Many back-to-back tiny loops (the spin hand-off) and loops separated by pauses long
// enough for workers and the caller to fall asleep (the condition-variable path).
TEST(ThreadPool, HandOffsSpinAndSleepWithoutLosingWork) {
  ThreadPool pool(3);
  std::atomic<int64_t> sum{0};
  for (int rep = 0; rep < 20000; ++rep)
    pool.parallel_for(6, [&](int64_t b, int64_t e, int) { sum += e - b; });
  EXPECT_EQ(sum.load(), 120000);
  for (int rep = 0; rep < 20; ++rep) {
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    pool.parallel_for(3, [&](int64_t b, int64_t e, int i) {
      if (i == 1) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // caller must wait
      sum += e - b;
    });
  }
  EXPECT_EQ(sum.load(), 120060);
}

}  // namespace kiln
