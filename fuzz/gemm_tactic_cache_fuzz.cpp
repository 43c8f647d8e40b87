// libFuzzer target: the CUDA backend's GEMM tactic cache file (GemmTacticCache::parse, with
// GemmAlgoConfig::parse on every entry) on arbitrary bytes, then each loaded configuration's
// text parsed back. Any crash, sanitizer report, exception other than kiln::Error, or a
// configuration whose text does not parse back to itself is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "backends/cuda/ops/gemm_search.h"
#include "core/status.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)kiln::cuda::GemmAlgoConfig::parse(text);
  try {
    size_t bad = 0;
    for (auto& [key, e] : kiln::cuda::GemmTacticCache::parse(text, "NVIDIA H200 (132 SMs), cuBLASLt 130100", nullptr, &bad)) {
      const auto back = kiln::cuda::GemmAlgoConfig::parse(e.algo.str());
      if (!back || !(*back == e.algo)) std::abort();
    }
  } catch (const kiln::Error&) {
    // Expected for malformed input.
  }
  return 0;
}
