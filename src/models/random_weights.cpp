// RandomWeightSource (see random_weights.h).
#include "models/random_weights.h"

#include <random>

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
  // Chunks are seeded independently so filling is parallel and still deterministic.
  const int64_t chunk = 1 << 16, n = t.numel();
  ThreadPool::global().parallel_for((n + chunk - 1) / chunk, [&](int64_t b, int64_t e, int) {
    for (int64_t c = b; c < e; ++c) {
      std::mt19937_64 rng(base + uint64_t(c) * 0x9e3779b97f4a7c15ull);
      std::normal_distribution<float> dist(0.0f, stddev_);
      for (int64_t i = c * chunk; i < std::min(n, (c + 1) * chunk); ++i)
        d[i] = (is_norm && !is_bias ? 1.0f : 0.0f) + dist(rng);
    }
  });
  return t;
}

}  // namespace kiln
