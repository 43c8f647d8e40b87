// host_memory: /proc/<pid>/status parsing, and the live reading moving with allocations.
#include "core/host_memory.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <memory>

namespace kiln {
namespace {

TEST(HostMemory, ParsesTheStatusFields) {
  const HostMemory m = parse_proc_status(
      "Name:\tkiln\nVmPeak:\t 9000 kB\nVmHWM:\t    5000 kB\nVmRSS:\t    4000 kB\nRssAnon:\t    3000 kB\n"
      "RssFile:\t     900 kB\nRssShmem:\t     100 kB\nThreads:\t3\n");
  EXPECT_EQ(m.peak, 5000 * 1024);
  EXPECT_EQ(m.resident, 4000 * 1024);
  EXPECT_EQ(m.anon, 3000 * 1024);
  EXPECT_EQ(m.file, 1000 * 1024);
  // Absent or malformed fields stay unknown.
  const HostMemory bad = parse_proc_status("VmRSS:\tlots kB\nRssAnon: 12 MB\nnonsense\n");
  EXPECT_EQ(bad.resident, -1);
  EXPECT_EQ(bad.anon, -1);
  EXPECT_EQ(bad.file, -1);
  EXPECT_EQ(bad.peak, -1);
}

TEST(HostMemory, SeesAnAllocationItTouches) {
  if (!std::ifstream("/proc/self/status")) GTEST_SKIP() << "no /proc/self/status on this system";
  const HostMemory before = host_memory();
  ASSERT_GT(before.anon, 0);
  const size_t bytes = size_t(64) << 20;
  auto block = std::make_unique<char[]>(bytes);
  std::memset(block.get(), 1, bytes);
  const HostMemory after = host_memory();
  EXPECT_GE(after.anon - before.anon, int64_t(bytes) * 3 / 4);
  EXPECT_GE(after.peak, after.resident);
  EXPECT_EQ(block[bytes - 1], 1);
}

TEST(HostMemory, ParsesTheProcessTimes) {
  // A command name with spaces and parentheses; utime 250 and stime 50 ticks, started 1000
  // ticks after boot.
  std::string stat = "4242 (kiln (serve) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 1000 1 2";
  const ProcessTimes t = parse_proc_times(stat, "cpu  1 2 3\nbtime 1700000000\nprocesses 9\n", 100.0);
  EXPECT_DOUBLE_EQ(t.cpu_seconds, 3.0);
  EXPECT_DOUBLE_EQ(t.start_time, 1700000010.0);
  const ProcessTimes bad = parse_proc_times("no parenthesis", "btime 5\n", 100.0);
  EXPECT_EQ(bad.cpu_seconds, -1);
  EXPECT_EQ(bad.start_time, -1);
  EXPECT_EQ(parse_proc_times(stat, "cpu 1\n", 100.0).start_time, -1) << "no btime";
  if (std::ifstream("/proc/self/stat")) {
    const ProcessTimes live = process_times();
    EXPECT_GE(live.cpu_seconds, 0);
    EXPECT_GT(live.start_time, 1e9);
  }
}

}  // namespace
}  // namespace kiln
