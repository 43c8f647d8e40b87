// libFuzzer target: the calibration cache (CalibrationTable::parse) on arbitrary bytes,
// then a lookup on whatever loaded. Any crash, sanitizer report or exception other than
// kiln::Error is a bug.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/status.h"
#include "quant/calibration.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto t = kiln::quant::CalibrationTable::parse(text, "fuzz");
    for (auto& [name, c] : t.tensors) (void)t.amax(name, kiln::quant::CalibMethod::kKl);
  } catch (const kiln::Error&) {
    // Expected for malformed input.
  }
  return 0;
}
