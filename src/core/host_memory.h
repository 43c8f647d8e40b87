// What this process holds in host memory, from /proc/self/status (Linux): what `kiln
// bench` and `kiln inspect` report after loading a model and `kiln serve` exports on
// /metrics (with the process's CPU and start times). Anonymous memory is what the process
// itself allocated (weights, panels, KV); file-backed resident pages are mapped files (a
// GGUF's or a safetensors' mapping, an engine), which the kernel can drop and re-read.
// Tested in tests/core/host_memory_test.cpp.
#pragma once

#include <cstdint>
#include <string>

namespace kiln {

struct HostMemory {
  int64_t resident = -1;  // VmRSS, bytes; -1 where /proc/self/status is not readable
  int64_t anon = -1;      // RssAnon
  int64_t file = -1;      // RssFile (+ RssShmem)
  int64_t peak = -1;      // VmHWM: the largest resident size so far
};

HostMemory host_memory();
// Parses the text of a /proc/<pid>/status file (fields absent stay -1).
HostMemory parse_proc_status(const std::string& text);

// This process's CPU time and start time (Prometheus' process_cpu_seconds_total and
// process_start_time_seconds), from /proc/self/stat and /proc/stat's btime.
struct ProcessTimes {
  double cpu_seconds = -1;  // user + system; -1 where unreadable
  double start_time = -1;   // seconds since the Unix epoch
};
ProcessTimes process_times();
// From the texts of /proc/<pid>/stat and /proc/stat, with `ticks_per_second` clock ticks.
ProcessTimes parse_proc_times(const std::string& stat, const std::string& proc_stat, double ticks_per_second);

}  // namespace kiln
