// Logging and progress lines (see log.h).
#include "core/log.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace kiln {

LogLevel log_level() {
  static LogLevel level = [] {
    const char* e = std::getenv("KILN_LOG");
    if (!e) return LogLevel::kWarn;
    if (!std::strcmp(e, "debug")) return LogLevel::kDebug;
    if (!std::strcmp(e, "info")) return LogLevel::kInfo;
    if (!std::strcmp(e, "error")) return LogLevel::kError;
    return LogLevel::kWarn;
  }();
  return level;
}

void log_write(LogLevel level, const std::string& msg) {
  static const char* names[] = {"debug", "info", "warn", "error"};
  std::fprintf(stderr, "[kiln %s] %s\n", names[int(level)], msg.c_str());
}

Progress::Progress(std::string label, int64_t total)
    : label_(std::move(label)), total_(total), start_(std::chrono::steady_clock::now()) {}

Progress::~Progress() {
  if (shown_) {
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    std::fprintf(stderr, "\r%s: done in %.1f s          \n", label_.c_str(), s);
  }
}

void Progress::update(int64_t done) {
  auto now = std::chrono::steady_clock::now();
  if (!shown_ && now - start_ < std::chrono::seconds(1)) return;
  // Redraw at most ten times a second (and always at the end).
  if (shown_ && done < total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  shown_ = true;
  last_draw_ = now;
  int pct = total_ > 0 ? int(100 * done / total_) : 100;
  std::fprintf(stderr, "\r%s: %lld/%lld (%d%%)", label_.c_str(), (long long)done,
               (long long)total_, pct);
  std::fflush(stderr);
}

}  // namespace kiln
