// RandomWeightSource (see random_weights.h).
#include "models/random_weights.h"

#include <cmath>

#include "core/status.h"
#include "core/thread_pool.h"

namespace kiln {

TensorInfo RandomWeightSource::info(const std::string& name) const {
  throw_error(ErrorCode::kNotFound, "random weights hold no tensor '", name, "'");
}

Tensor RandomWeightSource::load(const std::string& name, DType) const {
  throw_error(ErrorCode::kNotFound, "random weights hold no tensor '", name, "'");
}

Tensor RandomWeightSource::make(const std::string& name, const std::vector<int64_t>& shape) const {
  Tensor t(DType::kF32, shape);
  const bool is_norm = name.find("norm") != std::string::npos || name.find("ln_") != std::string::npos ||
                       name.find("LayerNorm.weight") != std::string::npos;
  const bool is_bias = name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
  const uint64_t base = seed_ ^ std::hash<std::string>{}(name);
  float* d = t.data_as<float>();
  // Element i is a function of (base, i) alone (counter-based: parallel, deterministic,
  // ~2 ns an element - the 8B shape's 8 G values in seconds, not minutes): splitmix64 of
  // the index gives four 16-bit uniforms whose sum (Irwin-Hall, n = 4) is scaled to unit
  // variance - a bell curve within +-3.46 sigma, plenty for speed benchmarks.
  const float offset = is_norm && !is_bias ? 1.0f : 0.0f;
  const float scale = stddev_ * std::sqrt(3.0f) / 65536.0f, center = 2.0f * 65535.0f;  // 4 x the 16-bit mean
  const int64_t chunk = 1 << 16, n = t.numel();
  ThreadPool::global().parallel_for((n + chunk - 1) / chunk, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b * chunk; i < std::min(n, e * chunk); ++i) {
      uint64_t z = base + uint64_t(i) * 0x9e3779b97f4a7c15ull;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      z ^= z >> 31;
      const float sum = float(z & 0xffff) + float((z >> 16) & 0xffff) + float((z >> 32) & 0xffff) + float(z >> 48);
      d[i] = offset + (sum - center) * scale;
    }
  });
  return t;
}

}  // namespace kiln
