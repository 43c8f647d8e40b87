// What this process holds in host memory, from /proc/self/status (Linux): what `kiln
// bench` reports after loading a model and `kiln serve` exports on /metrics. Anonymous
// memory is what the process itself allocated (weights, panels, KV); file-backed resident
// pages are mapped files (a GGUF's or a safetensors' mapping, an engine), which the
// kernel can drop and re-read. Tested in tests/core/host_memory_test.cpp.
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

}  // namespace kiln
