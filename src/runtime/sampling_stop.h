// Stop strings over streamed text: text that could still be the start of a stop string
// is held back until the next piece decides it, so a stop string split across tokens
// is found and never shown. Tested in tests/runtime/sampling_test.cpp.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kiln {

class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::vector<std::string> stops = {});

  // Feeds newly decoded text; returns what can be shown now. After a match, returns
  // the text before the stop string and matched() is true; later calls return "".
  std::string put(std::string_view text);
  // The held-back text at the end of generation (no stop string completed).
  std::string flush();
  bool matched() const { return matched_; }
  const std::string& matched_stop() const { return matched_stop_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool matched_ = false;
  std::string matched_stop_;
};

}  // namespace kiln
