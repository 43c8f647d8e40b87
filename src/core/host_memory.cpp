// /proc/self/status reader (see host_memory.h).
#include "core/host_memory.h"

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <vector>

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

ProcessTimes parse_proc_times(const std::string& stat, const std::string& proc_stat, double ticks_per_second) {
  ProcessTimes t;
  // The command name (field 2) is in parentheses and may hold spaces: fields resume after
  // the last ')'. Then field 3 is the state; utime, stime are fields 14, 15, starttime 22.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos || !(ticks_per_second > 0)) return t;
  std::istringstream in(stat.substr(close + 1));
  std::vector<std::string> f;  // f[0] = field 3
  for (std::string x; in >> x;) f.push_back(x);
  auto field = [&](size_t n, double* out) {
    if (n - 3 >= f.size()) return false;
    try {
      size_t used = 0;
      *out = double(std::stoull(f[n - 3], &used));
      return used == f[n - 3].size();
    } catch (const std::exception&) {
      return false;
    }
  };
  double utime = 0, stime = 0, start = 0;
  if (field(14, &utime) && field(15, &stime)) t.cpu_seconds = (utime + stime) / ticks_per_second;
  std::istringstream ps(proc_stat);
  for (std::string line; std::getline(ps, line);)
    if (line.rfind("btime ", 0) == 0 && field(22, &start)) {
      try {
        t.start_time = double(std::stoll(line.substr(6))) + start / ticks_per_second;
      } catch (const std::exception&) {
      }
    }
  return t;
}

ProcessTimes process_times() {
  std::ifstream a("/proc/self/stat"), b("/proc/stat");
  if (!a || !b) return {};
  std::stringstream sa, sb;
  sa << a.rdbuf();
  sb << b.rdbuf();
  return parse_proc_times(sa.str(), sb.str(), double(sysconf(_SC_CLK_TCK)));
}

}  // namespace kiln
