// /proc/self/status reader (see host_memory.h).
#include "core/host_memory.h"

#include <fstream>
#include <sstream>

namespace kiln {

HostMemory parse_proc_status(const std::string& text) {
  HostMemory m;
  std::istringstream in(text);
  std::string line;
  int64_t shmem = 0;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = line.substr(0, colon);
    int64_t* field = key == "VmRSS" ? &m.resident : key == "RssAnon" ? &m.anon : key == "RssFile" ? &m.file
                   : key == "VmHWM" ? &m.peak : key == "RssShmem" ? &shmem : nullptr;
    if (!field) continue;
    std::istringstream value(line.substr(colon + 1));
    int64_t kb = -1;
    std::string unit;
    if (value >> kb >> unit && kb >= 0 && unit == "kB") *field = kb * 1024;
  }
  if (m.file >= 0) m.file += shmem;
  return m;
}

HostMemory host_memory() {
  std::ifstream f("/proc/self/status");
  if (!f) return {};
  std::stringstream text;
  text << f.rdbuf();
  return parse_proc_status(text.str());
}

}  // namespace kiln
