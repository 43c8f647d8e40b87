// Minimal leveled logging to stderr (KILN_LOG=debug|info|warn|error) and a progress
// line for long loads. Tested indirectly by the CLI tests.
#pragma once

#include <chrono>
#include <string>

#include "core/status.h"

namespace kiln {

enum class LogLevel { kDebug, kInfo, kWarn, kError };
LogLevel log_level();
void log_write(LogLevel level, const std::string& msg);

template <typename... Args>
void log_debug(const Args&... a) {
  if (log_level() <= LogLevel::kDebug) log_write(LogLevel::kDebug, str_cat(a...));
}
template <typename... Args>
void log_info(const Args&... a) {
  if (log_level() <= LogLevel::kInfo) log_write(LogLevel::kInfo, str_cat(a...));
}
template <typename... Args>
void log_warn(const Args&... a) {
  if (log_level() <= LogLevel::kWarn) log_write(LogLevel::kWarn, str_cat(a...));
}

// Prints "label: done/total (pct%)" on one rewritten stderr line, but only once the
// task has run for more than a second, so quick loads stay silent.
class Progress {
 public:
  Progress(std::string label, int64_t total);
  ~Progress();
  void update(int64_t done);

 private:
  std::string label_;
  int64_t total_;
  std::chrono::steady_clock::time_point start_, last_draw_;
  bool shown_ = false;
};

}  // namespace kiln
